"""Run the ``durable-sessions`` command as ``python -m durable_sessions``."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
