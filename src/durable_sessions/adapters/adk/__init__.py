"""Google ADK over any store: the session service, and the importer of ADK's own databases."""

from __future__ import annotations

try:
    import google.adk  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "durable_sessions.adk needs Google ADK, which is not installed: "
        f'pip install "durable-sessions[adk]" ({exc})'
    ) from exc

from .importer import AdkImportCounts, AdkImportError, import_adk
from .memory import DurableMemoryService
from .records import durable_session_id
from .service import DurableSessionService

__all__ = [
    "AdkImportCounts",
    "AdkImportError",
    "DurableMemoryService",
    "DurableSessionService",
    "durable_session_id",
    "import_adk",
]
