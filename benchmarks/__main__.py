"""``python -m benchmarks``: run the side-by-side benchmarks, the scaling curves, or a profile."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
