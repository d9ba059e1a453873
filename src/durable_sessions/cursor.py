"""The page cursor of ``list_page``: an opaque, checksummed position bound to its listing."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from datetime import datetime, timedelta, timezone

from .errors import InvalidArgumentError
from .model import Filter, Session
from .state import validate_id

__all__ = ["decode_cursor", "encode_cursor"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_CURSOR_TAG = "p1"  # the cursor format's version
_CURSOR_CHECK = b"durable-sessions page cursor\0"
# "P" first: base64url may start with "-", which a command line would take for an option.
_CURSOR_TEXT = re.compile(r"P([A-Za-z0-9_-]{1,4096})")
_MALFORMED = (
    "cursor is not one this store made (malformed or altered): pass a Page.next_cursor "
    "as it was returned, or None for the first page"
)
_FOREIGN = (
    "cursor belongs to another listing: pass the same org_id, user_id, app_name and "
    "parent_id as the call that returned it"
)


def _listing(filter: Filter) -> str:
    """What a cursor is bound to: the filter's organisation and narrowing (not its page
    size or ``with_state``, which may change from page to page)."""
    key = json.dumps([filter.org_id, filter.user_id, filter.app_name, filter.parent_id])
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def encode_cursor(filter: Filter, last: Session) -> str:
    """The cursor of the page that follows ``last`` in ``filter``'s listing: opaque,
    checksummed, and bound to the listing (organisation and narrowing)."""
    micros = (last.updated_at - _EPOCH) // timedelta(microseconds=1)
    payload = json.dumps(
        [_CURSOR_TAG, micros, last.id, _listing(filter)], separators=(",", ":")
    ).encode("utf-8")
    check = hashlib.sha256(_CURSOR_CHECK + payload).digest()[:8]
    return "P" + base64.urlsafe_b64encode(check + payload).decode("ascii").rstrip("=")


def decode_cursor(filter: Filter, cursor: object) -> tuple[datetime, str]:
    """The position a cursor names: the (updated_at, id) of the last session it passed."""
    if not isinstance(cursor, str):
        raise InvalidArgumentError(
            f"cursor must be a string (a Page.next_cursor) or None, not {type(cursor).__name__}"
        )
    found = _CURSOR_TEXT.fullmatch(cursor)
    if found is None:
        raise InvalidArgumentError(_MALFORMED)
    try:
        text = found.group(1)
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        check, payload = raw[:8], raw[8:]
        if hashlib.sha256(_CURSOR_CHECK + payload).digest()[:8] != check:
            raise ValueError("checksum")
        tag, micros, session_id, listing = json.loads(payload.decode("utf-8"))
        if tag != _CURSOR_TAG or type(micros) is not int or not isinstance(listing, str):
            raise ValueError("fields")
        validate_id("session_id", session_id)
        updated_at = _EPOCH + timedelta(microseconds=micros)
    except (ValueError, TypeError, OverflowError, binascii.Error, InvalidArgumentError):
        raise InvalidArgumentError(_MALFORMED) from None
    if listing != _listing(filter):
        raise InvalidArgumentError(_FOREIGN)
    return updated_at, session_id
