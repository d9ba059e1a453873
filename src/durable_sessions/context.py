"""The ambient scope: which organisation and conversation the current task works for."""

from __future__ import annotations

from contextvars import ContextVar, Token
from types import TracebackType

from .errors import MissingScopeError
from .model import Session

__all__ = [
    "Binding",
    "bind_session",
    "current_conversation_id",
    "current_org_id",
    "reset_binding",
]

_org_id: ContextVar[str | None] = ContextVar("durable_sessions_org_id", default=None)
_conversation_id: ContextVar[str | None] = ContextVar(
    "durable_sessions_conversation_id", default=None
)


def current_org_id() -> str:
    """Return the organisation id bound in the current context.

    Raises:
        MissingScopeError: no session is bound.
    """
    value = _org_id.get()
    if value is None:
        raise MissingScopeError(
            "no organisation is bound: resume or bind a session before this call"
        )
    return value


def current_conversation_id() -> str:
    """Return the conversation (session) id bound in the current context.

    Raises:
        MissingScopeError: no session is bound.
    """
    value = _conversation_id.get()
    if value is None:
        raise MissingScopeError(
            "no conversation is bound: resume or bind a session before this call"
        )
    return value


def bind_session(session: Session) -> tuple[Token[str | None], Token[str | None]]:
    """Bind a session's org and conversation ids in the current context; return reset tokens."""
    return _org_id.set(session.org_id), _conversation_id.set(session.id)


def reset_binding(tokens: tuple[Token[str | None], Token[str | None]]) -> None:
    """Restore the binding that ``bind_session`` replaced."""
    _conversation_id.reset(tokens[1])
    _org_id.reset(tokens[0])


class Binding:
    """A ``with`` block that binds a session's identity and restores the outer one on exit."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._tokens: tuple[Token[str | None], Token[str | None]] | None = None

    def __enter__(self) -> Session:
        if self._tokens is not None:
            raise RuntimeError("this binding is already entered")
        self._tokens = bind_session(self.session)
        return self.session

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tokens, self._tokens = self._tokens, None
        if tokens is not None:
            reset_binding(tokens)
