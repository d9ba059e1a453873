"""durable-sessions: durable identity, metadata, scoped state and transcripts for agents."""

from __future__ import annotations

from .context import current_conversation_id, current_org_id
from .errors import (
    DecryptionError,
    DeletionIncompleteError,
    InvalidArgumentError,
    InvalidStateError,
    MissingScopeError,
    SchemaNotMigratedError,
    SchemaTooNewError,
    SessionError,
    SessionExistsError,
    SessionNotFoundError,
    StaleSessionError,
    StoreError,
    StoreUnavailableError,
)
from .manager import Manager
from .memory import InMemoryStore
from .model import Event, Filter, Memory, Page, SearchHit, Session, derive_title, new_id
from .service import SessionService
from .sql.store import SQLStore
from .state import APP_PREFIX, TEMP_PREFIX, USER_PREFIX
from .store import Store

__version__ = "0.1.0"

__all__ = [
    "APP_PREFIX",
    "TEMP_PREFIX",
    "USER_PREFIX",
    "DecryptionError",
    "DeletionIncompleteError",
    "Event",
    "Filter",
    "InMemoryStore",
    "InvalidArgumentError",
    "InvalidStateError",
    "Manager",
    "Memory",
    "MissingScopeError",
    "Page",
    "SQLStore",
    "SchemaNotMigratedError",
    "SchemaTooNewError",
    "SearchHit",
    "Session",
    "SessionError",
    "SessionExistsError",
    "SessionNotFoundError",
    "SessionService",
    "StaleSessionError",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "current_conversation_id",
    "current_org_id",
    "derive_title",
    "new_id",
]
