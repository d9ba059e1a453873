"""The viewer's ASGI middleware: security headers, read-only methods, the token, and errors."""

from __future__ import annotations

import hashlib
import hmac
import logging
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, quote, urlencode

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "COOKIE_NAME",
    "READ_METHODS",
    "CatchAll",
    "ReadOnly",
    "SecurityHeaders",
    "TokenGate",
]

logger = logging.getLogger("durable_sessions.web")

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
"""Every response's policy: the viewer's own stylesheet and icon, no script at all."""

READ_METHODS = frozenset({"GET", "HEAD"})
"""The only methods the viewer answers; any other gets 405."""

COOKIE_NAME = "durable_sessions_token"
"""The cookie that ``?token=`` sets: a keyed digest of the token, never the token itself."""

_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


async def _plain(send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]]) -> None:
    """Send a short text/plain response."""
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class SecurityHeaders:
    """Add the Content-Security-Policy and the other security headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to the response's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in _HEADERS}
                kept = [(n, v) for n, v in message.get("headers", []) if n.lower() not in names]
                message = {**message, "headers": [*kept, *_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class ReadOnly:
    """Answer 405 to every method but GET and HEAD, on every path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a request that is not a read; pass reads on."""
        if scope["type"] == "http" and scope["method"] not in READ_METHODS:
            await _plain(send, 405, "405: this viewer is read-only", [(b"allow", b"GET, HEAD")])
            return
        await self.app(scope, receive, send)


class TokenGate:
    """Answer 401 to every request without the token.

    The token comes as ``Authorization: Bearer TOKEN``, or once as ``?token=TOKEN``, which
    sets an HttpOnly, SameSite=Strict cookie and redirects to the same URL without it.
    Every comparison takes the same time whatever the text compared (``hmac.compare_digest``).
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()
        self._cookie = hmac.new(self._token, b"durable-sessions viewer", hashlib.sha256).hexdigest()

    def _matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def _authorised(self, scope: Scope) -> bool:
        ok = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, given = value.decode("latin-1").partition(" ")
                ok |= scheme.lower() == "bearer" and self._matches(given.strip())
            elif name == b"cookie":
                cookies: SimpleCookie = SimpleCookie()
                try:
                    cookies.load(value.decode("latin-1"))
                except Exception:  # a malformed cookie header authorises nothing
                    continue
                morsel = cookies.get(COOKIE_NAME)
                if morsel is not None:
                    ok |= hmac.compare_digest(morsel.value.encode(), self._cookie.encode())
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Let an authorised request through; trade a good ``?token=`` for the cookie."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = parse_qsl(
            scope.get("query_string", b"").decode("utf-8", "replace"), keep_blank_values=True
        )
        given = [value for name, value in query if name == "token"]
        if len(given) == 1 and self._matches(given[0]) and scope["method"] in READ_METHODS:
            await self._set_cookie(scope, send, [(n, v) for n, v in query if n != "token"])
            return
        if not self._authorised(scope):
            await _plain(
                send,
                401,
                "401: this viewer needs its token (open it once with ?token=TOKEN, or send "
                "Authorization: Bearer TOKEN)",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)

    async def _set_cookie(self, scope: Scope, send: Send, rest: list[tuple[str, str]]) -> None:
        raw = scope.get("raw_path")
        path = raw.decode("latin-1") if raw else quote(scope["path"])
        location = path + ("?" + urlencode(rest) if rest else "")
        cookie_path = scope.get("root_path") or "/"
        secure = "; Secure" if scope.get("scheme") == "https" else ""
        cookie = (
            f"{COOKIE_NAME}={self._cookie}; Path={quote(cookie_path)}; HttpOnly; "
            f"SameSite=Strict{secure}"
        )
        await _plain(
            send,
            303,
            "303: see the same page without the token",
            [(b"location", location.encode("latin-1")), (b"set-cookie", cookie.encode())],
        )


class CatchAll:
    """Answer 500 with a short text when anything unexpected escapes, never a traceback.

    The error goes to the ``durable_sessions.web`` logger; the response, when none has
    started yet, says only that the server logged it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the application; turn an escaped exception into a plain 500."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            logger.exception("the viewer failed to answer %s %s", scope["method"], scope["path"])
            if started:
                raise
            await _plain(send, 500, "500: the viewer failed; the server's log says why", [])
