"""The read-only web viewer: ``create_app`` builds an ASGI application over any store."""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        'the web viewer needs the optional "web" extra: pip install "durable-sessions[web]" '
        f"({exc})"
    ) from exc

from .app import create_app

__all__ = ["create_app"]
