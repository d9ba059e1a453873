"""Google ADK: ``DurableSessionService``, ``DurableMemoryService`` and ``import_adk``, at
their public import path.

Requires the ``adk`` extra: ``pip install "durable-sessions[adk]"``.
"""

from __future__ import annotations

from .adapters.adk import (
    AdkImportCounts,
    AdkImportError,
    DurableMemoryService,
    DurableSessionService,
    durable_session_id,
    import_adk,
)

__all__ = [
    "AdkImportCounts",
    "AdkImportError",
    "DurableMemoryService",
    "DurableSessionService",
    "durable_session_id",
    "import_adk",
]
