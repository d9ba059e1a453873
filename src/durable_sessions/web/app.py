"""The viewer's routes and pages: sessions, one session's state and transcript, search."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import (
    InvalidArgumentError,
    SchemaNotMigratedError,
    SessionError,
    SessionNotFoundError,
    StoreUnavailableError,
)
from ..fulltext import event_text, snippet
from ..model import Event, Filter, Session
from ..state import APP_PREFIX, TEMP_PREFIX, USER_PREFIX
from ..store import Store
from .guard import CatchAll, ReadOnly, SecurityHeaders, TokenGate

__all__ = ["EVENTS_PER_PAGE", "HITS_PER_PAGE", "SESSIONS_PER_PAGE", "SHOWN_CHARS", "create_app"]

SESSIONS_PER_PAGE = 50
"""Sessions on one page of the list."""
EVENTS_PER_PAGE = 50
"""Events on one page of a transcript."""
HITS_PER_PAGE = 50
"""Search hits shown, best first."""
SHOWN_CHARS = 2000
"""The most characters of one value a page shows (a title, a state value, an event's text
or JSON); a longer value is cut, and the page says how many more characters it has, so a
page stays small, and is made in time linear in what is stored, whatever that is."""

_HERE = Path(__file__).parent


def create_app(store: Store, *, org_id: str | None = None, token: str | None = None) -> Starlette:
    """Build the read-only web viewer over ``store``, an ASGI application.

    Pages: ``/`` (open an organisation), ``/orgs/ORG`` (its sessions, newest first),
    ``/orgs/ORG/sessions/ID`` (one session: metadata, state by scope, transcript) and
    ``/orgs/ORG/search?q=...``. Nothing writes: any method but GET and HEAD answers 405.
    Every page escapes what it shows and carries a Content-Security-Policy that allows no
    script. Mount it inside another ASGI application (``Mount("/viewer", app=...)``): its
    links follow the mount's path.

    Args:
        store: Any ``Store``; the viewer only reads from it.
        org_id: Show this organisation only: ``/`` leads to it, and every URL of another
            organisation answers 404. None lets the visitor open any organisation by id.
        token: When given, every request needs it: ``Authorization: Bearer TOKEN``, or
            ``?token=TOKEN`` once, which sets an HttpOnly cookie (SameSite=Strict).

    Raises:
        InvalidArgumentError: ``org_id`` is not a valid id, or ``token`` is empty.
    """
    if org_id is not None:
        Filter(org_id=org_id)  # checks the id
    if token is not None and not token:
        raise InvalidArgumentError("token must not be empty (pass None for no token)")
    viewer = _Viewer(store, org_id)
    routes: list[BaseRoute] = [
        Route("/", viewer.home, methods=["GET"]),
        Route("/orgs", viewer.open_org, methods=["GET"]),
        Route("/orgs/{org_id}", viewer.sessions, methods=["GET"]),
        Route("/orgs/{org_id}/search", viewer.search, methods=["GET"]),
        Route("/orgs/{org_id}/sessions/{session_id:path}", viewer.session, methods=["GET"]),
        Route("/favicon.ico", _favicon, methods=["GET"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    middleware = [
        Middleware(SecurityHeaders),
        *([Middleware(TokenGate, token=token)] if token is not None else []),
        Middleware(ReadOnly),
        Middleware(CatchAll),
    ]
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            HTTPException: viewer.http_error,
            SessionError: viewer.store_error,
        },
    )


async def _favicon(request: Request) -> Response:
    """``/favicon.ico``, which browsers ask for on pages that name no icon (401s, text)."""
    return FileResponse(_HERE / "static" / "favicon.svg", media_type="image/svg+xml")


def _link(root: str, *segments: str, fragment: str = "", **query: Any) -> str:
    """The path of a viewer page below ``root``, each segment quoted whole."""
    path = root + "/" + "/".join(quote(segment, safe="") for segment in segments)
    kept = {name: value for name, value in query.items() if value not in (None, "")}
    return path + ("?" + urlencode(kept) if kept else "") + (f"#{fragment}" if fragment else "")


def _when(moment: datetime) -> str:
    """A timestamp as people read it, in UTC."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _iso(moment: datetime) -> str:
    """A timestamp in ISO 8601, UTC (for ``<time datetime=...>``)."""
    return moment.astimezone(timezone.utc).isoformat()


def _pretty(value: Any) -> str:
    """A JSON value, indented for reading."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def _cut(value: str, limit: int = SHOWN_CHARS) -> str:
    """``value`` whole when it has at most ``limit`` characters; else its first ``limit``
    and how many more there are."""
    if len(value) <= limit:
        return value
    more = len(value) - limit
    return f"{value[:limit]}… ({more:,} more character{'' if more == 1 else 's'})"


def _event_json(event: Event) -> str:
    """The whole event, as the JSON a reader folds open beneath it (cut when long)."""
    return _cut(
        _pretty(
            {
                "seq": event.seq,
                "id": event.id,
                "author": event.author,
                "invocation_id": event.invocation_id,
                "timestamp": _iso(event.timestamp),
                "tokens": event.tokens,
                "content": event.content,
                "state_delta": event.state_delta,
            }
        )
    )


def _scopes(session: Session) -> list[tuple[str, list[tuple[str, str]]]]:
    """A session's state by scope (session, user, app), each key with its value as JSON
    (cut when long)."""
    scoped: dict[str, list[tuple[str, str]]] = {"session": [], "user:": [], "app:": []}
    for key, value in sorted(session.state.items()):
        if key.startswith(USER_PREFIX):
            scoped["user:"].append((key, _cut(_pretty(value))))
        elif key.startswith(APP_PREFIX):
            scoped["app:"].append((key, _cut(_pretty(value))))
        elif not key.startswith(TEMP_PREFIX):
            scoped["session"].append((key, _cut(_pretty(value))))
    return list(scoped.items())


def _count_param(request: Request, name: str) -> int:
    """A non-negative integer query parameter; 0 when absent."""
    text = request.query_params.get(name, "")
    if not text:
        return 0
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise InvalidArgumentError(f"{name} must be a whole number")
    return int(text)


class _Viewer:
    """The page handlers, sharing the store, the pinned organisation and the templates."""

    def __init__(self, store: Store, org_id: str | None) -> None:
        self.store = store
        self.org_id = org_id
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["when"] = _when
        self.templates.filters["iso"] = _iso
        self.templates.filters["cut"] = _cut

    # -- helpers -----------------------------------------------------------------------------

    def _page(
        self, request: Request, name: str, *, status: int = 200, org: str | None, **context: Any
    ) -> HTMLResponse:
        root = str(request.scope.get("root_path", "")).rstrip("/")

        def link(*segments: str, fragment: str = "", **query: Any) -> str:
            return _link(root, *segments, fragment=fragment, **query)

        html = self.templates.get_template(name).render(
            link=link,
            org=org if org is not None else self.org_id,
            pinned=self.org_id is not None,
            q=request.query_params.get("q", ""),
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def _org(self, request: Request) -> str:
        """The organisation the URL names; 404 when the viewer is pinned to another."""
        org = str(request.path_params["org_id"])
        if self.org_id is not None and org != self.org_id:
            raise HTTPException(404)
        Filter(org_id=org)  # checks the id
        return org

    def _redirect(self, request: Request, *segments: str, **query: Any) -> Response:
        root = str(request.scope.get("root_path", "")).rstrip("/")
        return RedirectResponse(_link(root, *segments, **query), status_code=303)

    # -- pages -------------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        """``/``: the pinned organisation's sessions, or a form to open one."""
        if self.org_id is not None:
            return self._redirect(request, "orgs", self.org_id)
        return self._page(request, "home.html", org=None)

    async def open_org(self, request: Request) -> Response:
        """``/orgs?org=ORG[&q=WORDS]``: the home form's target; redirect to the org's page."""
        org = request.query_params.get("org", "") or self.org_id or ""
        if not org:
            raise InvalidArgumentError("name an organisation to open")
        if self.org_id is not None and org != self.org_id:
            raise HTTPException(404)
        Filter(org_id=org)
        q = request.query_params.get("q", "")
        if q.strip():
            return self._redirect(request, "orgs", org, "search", q=q)
        return self._redirect(request, "orgs", org)

    async def sessions(self, request: Request) -> Response:
        """``/orgs/ORG``: its sessions, most recently updated first, a page at a time."""
        org = self._org(request)
        params = request.query_params
        app, user = params.get("app", ""), params.get("user", "")
        cursor = params.get("cursor") or None
        page = await self.store.list_page(
            Filter(
                org_id=org,
                user_id=user or None,
                app_name=app or None,
                limit=SESSIONS_PER_PAGE,
            ),
            cursor=cursor,
        )
        return self._page(
            request,
            "sessions.html",
            org=org,
            sessions=page.sessions,
            app=app,
            user=user,
            first_page=cursor is None,
            next_cursor=page.next_cursor,
        )

    async def session(self, request: Request) -> Response:
        """``/orgs/ORG/sessions/ID?after_seq=N``: metadata, state, and events after N."""
        org = self._org(request)
        session_id = str(request.path_params["session_id"])
        after_seq = _count_param(request, "after_seq")
        session = await self.store.get(org, session_id)
        events = await self.store.list_events(
            org, session_id, after_seq=after_seq, limit=EVENTS_PER_PAGE + 1
        )
        more = len(events) > EVENTS_PER_PAGE
        events = events[:EVENTS_PER_PAGE]
        shown = [(event, _cut(event_text(event.content)), _event_json(event)) for event in events]
        return self._page(
            request,
            "session.html",
            org=org,
            session=session,
            scopes=_scopes(session),
            events=shown,
            after_seq=after_seq,
            previous_after=max(0, after_seq - EVENTS_PER_PAGE) if after_seq else None,
            next_after=events[-1].seq if more else None,
        )

    async def search(self, request: Request) -> Response:
        """``/orgs/ORG/search?q=WORDS``: the events holding every word, best first."""
        org = self._org(request)
        params = request.query_params
        q, app, user = params.get("q", ""), params.get("app", ""), params.get("user", "")
        hits: list[tuple[str, Event, str]] = []
        if q.strip():
            found = await self.store.search(
                org, q, user_id=user or None, app_name=app or None, limit=HITS_PER_PAGE
            )
            hits = [(hit.session_id, hit.event, snippet(hit.event.content, q)) for hit in found]
        return self._page(
            request, "search.html", org=org, hits=hits, searched=bool(q.strip()), app=app, user=user
        )

    # -- errors ------------------------------------------------------------------------------

    def _error(self, request: Request, status: int, title: str, detail: str) -> Response:
        org = request.path_params.get("org_id")
        if self.org_id is not None or not isinstance(org, str):
            org = None  # pinned: the form searches the pinned organisation, never another
        return self._page(request, "error.html", status=status, org=org, title=title, detail=detail)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        """A 404 (no such page, or another organisation's) or another HTTP error, as a page."""
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if status == 404:
            return self._error(request, 404, "Not found", "There is no such page here.")
        return self._error(request, status, f"Error {status}", "The request was not understood.")

    async def store_error(self, request: Request, exc: Exception) -> Response:
        """What the store refused, as a page: 404, 400 or 503 (never a traceback)."""
        if isinstance(exc, SessionNotFoundError):
            return self._error(request, 404, "Session not found", str(exc))
        if isinstance(exc, InvalidArgumentError):
            return self._error(request, 400, "Bad request", str(exc))
        if isinstance(exc, (StoreUnavailableError, SchemaNotMigratedError)):
            return self._error(request, 503, "Database unavailable", str(exc))
        return self._error(request, 500, "Store error", str(exc))
