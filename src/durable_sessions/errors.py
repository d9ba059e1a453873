"""The exception tree of durable-sessions.

Every error the library raises derives from ``SessionError``; the same condition raises
the same class on every store (in-memory, SQLite, Postgres)::

    SessionError
    ├── SessionNotFoundError     no session with that id in that organisation
    ├── SessionExistsError       a session with that id already exists in that organisation
    ├── StaleSessionError        the stored session changed since this copy was read
    ├── InvalidArgumentError     an argument is malformed (empty org id, naive datetime, ...)
    │   └── InvalidStateError    a state key, state value or event payload is not storable
    ├── MissingScopeError        no session is bound in the current context
    ├── SchemaNotMigratedError   the database schema is missing or behind the code
    └── StoreError               the database failed an operation; nothing of it was written
        ├── StoreUnavailableError    the database could not be reached or dropped the connection
        ├── DeletionIncompleteError  purge/delete_user waited too long for rows held by writers
        ├── DecryptionError          a stored value cannot be decrypted with the store's keyring
        └── SchemaTooNewError        a newer durable-sessions migrated the database

Messages carry ids and keys, never a connection URL or password.
"""

from __future__ import annotations

__all__ = [
    "DecryptionError",
    "DeletionIncompleteError",
    "InvalidArgumentError",
    "InvalidStateError",
    "MissingScopeError",
    "SchemaNotMigratedError",
    "SchemaTooNewError",
    "SessionError",
    "SessionExistsError",
    "SessionNotFoundError",
    "StaleSessionError",
    "StoreError",
    "StoreUnavailableError",
]


class SessionError(Exception):
    """Base class of every error raised by durable-sessions."""


class SessionNotFoundError(SessionError, LookupError):
    """Raised when no session has the given id in the given organisation."""

    def __init__(self, org_id: str, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found in organisation {org_id!r}")
        self.org_id = org_id
        self.session_id = session_id


class SessionExistsError(SessionError):
    """Raised when creating a session whose id is already taken in its organisation."""

    def __init__(self, org_id: str, session_id: str, detail: str = "") -> None:
        super().__init__(
            f"session {session_id!r} already exists in organisation {org_id!r}"
            + (f" {detail}" if detail else "")
        )
        self.org_id = org_id
        self.session_id = session_id


class StaleSessionError(SessionError):
    """Raised when saving a copy of a session that changed in the store since it was read."""

    def __init__(
        self, org_id: str, session_id: str, expected_version: int, detail: str = ""
    ) -> None:
        what = detail or f"changed since it was read (this copy has version {expected_version})"
        super().__init__(
            f"session {session_id!r} in organisation {org_id!r} {what}; "
            "reload it and apply the change again"
        )
        self.org_id = org_id
        self.session_id = session_id
        self.expected_version = expected_version


class InvalidArgumentError(SessionError, ValueError):
    """Raised when an argument is malformed: an empty org id, a naive datetime, a bad limit."""


class InvalidStateError(InvalidArgumentError):
    """Raised when a state key, state value or event payload cannot be stored as JSON."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"invalid state key {key!r}: {reason}")
        self.key = key
        self.reason = reason


class MissingScopeError(SessionError, LookupError):
    """Raised when the current context has no bound organisation or conversation id."""


class SchemaNotMigratedError(SessionError):
    """Raised when the database schema is missing or older than this version of the library."""


class StoreError(SessionError):
    """Raised when the database fails an operation; the operation wrote nothing."""


class StoreUnavailableError(StoreError):
    """Raised when the database cannot be reached, the connection broke mid-operation, no
    pooled connection became free in time, or the database did not answer within the
    driver's timeout (asyncpg's ``command_timeout``; the statement is then cancelled before
    this is raised). Worth retrying; when a write may have completed first, the message
    says so: read back before retrying."""


class DeletionIncompleteError(StoreError):
    """Raised when ``purge`` or ``delete_user`` gives up waiting for rows held by writers
    (or, on SQLite, for readers that keep the erased pages in the write-ahead log).

    The batches it deleted stay deleted; ``remaining`` sessions still match. Running the
    same call again, once the writers let go, finishes the job.
    """

    def __init__(
        self, operation: str, org_id: str, deleted: int, remaining: int, *, reason: str = ""
    ) -> None:
        why = reason or (
            f"{remaining} matching sessions are left, held or still being written by "
            "concurrent writers"
        )
        super().__init__(
            f"{operation} in organisation {org_id!r} stopped at the lock timeout: {why} "
            f"({deleted} were deleted); run it again"
        )
        self.operation = operation
        self.org_id = org_id
        self.deleted = deleted
        self.remaining = remaining


class DecryptionError(StoreError):
    """Raised when a stored value cannot be decrypted: its data key was destroyed (the user
    was erased), the keyring lacks the master key that wrapped it, the keyring is not the
    one the data was written with, or the value was tampered with or moved to another row.

    Never raised for a store without a keyring. The message names the key, never a secret.
    """


class SchemaTooNewError(StoreError):
    """Raised when the database is at a revision this version does not know: a newer
    durable-sessions migrated it. Upgrade the package; migrating cannot help."""

    def __init__(self, revision: str, head: str) -> None:
        super().__init__(
            f"this database is at revision {revision}, newer than this durable-sessions knows "
            f"(head {head}); upgrade durable-sessions"
        )
        self.revision = revision
        self.head = head
