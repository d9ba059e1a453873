"""State keys: prefix scoping, JSON validation and change tracking."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import InvalidArgumentError, InvalidStateError
from .jsoncodec import digits, json_equal, to_json

__all__ = [
    "APP_PREFIX",
    "DEFAULT_MAX_VALUE_BYTES",
    "MAX_ID_BYTES",
    "MAX_ID_LENGTH",
    "MAX_INT64",
    "MAX_KEY_BYTES",
    "MAX_KEY_LENGTH",
    "TEMP_PREFIX",
    "USER_PREFIX",
    "Scope",
    "ScopedDelta",
    "check_text",
    "checked_copy",
    "diff_state",
    "scope_of",
    "split_delta",
    "validate_id",
    "validate_key",
    "validate_value",
]

USER_PREFIX = "user:"
"""Keys with this prefix are shared by every session of the same (org, app, user)."""
APP_PREFIX = "app:"
"""Keys with this prefix are shared by every session of the same (org, app)."""
TEMP_PREFIX = "temp:"
"""Keys with this prefix live only in the in-process session object; they are never stored."""

Scope = Literal["private", "user", "app", "temp"]

MAX_ID_LENGTH = 255
"""The most characters (code points) an id may have: org, session, user, event ids, app names."""
MAX_ID_BYTES = 512
"""The most bytes an id may have as UTF-8 (128 characters of 4 bytes, 255 of up to 2)."""
MAX_KEY_LENGTH = 1024
"""The most characters a state key may have, its scope prefix included."""
MAX_KEY_BYTES = 1024
"""The most bytes a state key may have as UTF-8, its scope prefix included.

Both byte limits exist for Postgres, whose b-tree indexes refuse an entry over 2,704 bytes
(8 kB pages). The widest entry is ``ds_user_state``'s primary key (org_id, app_name,
user_id, key): an 8-byte header, three ids of at most 512 bytes behind 4-byte lengths and
alignment, and a key of at most 1,019 bytes (the ``user:`` prefix is not stored) come to
2,584 bytes at most, 120 under the limit (a key of 1,144 bytes would be the most it takes).
Every other index holds fewer or narrower fields. SQLite and memory have no such limit, and
refuse the same ids and keys, so that what one store holds every store holds.
"""
MAX_INT64 = 2**63 - 1
"""The largest stored integer (a 64-bit signed one): counters, versions, seqs and limits."""
MAX_DEPTH = 64
DEFAULT_MAX_VALUE_BYTES = 1 << 20
"""Stores refuse a state value or event content larger than this (1 MiB) unless told otherwise."""


def scope_of(key: str) -> Scope:
    """Return the scope a state key lives in, decided by its prefix."""
    if key.startswith(USER_PREFIX):
        return "user"
    if key.startswith(APP_PREFIX):
        return "app"
    if key.startswith(TEMP_PREFIX):
        return "temp"
    return "private"


def check_text(text: str) -> str | None:
    """Return why ``text`` cannot be stored in every backend, or None when it can."""
    if "\x00" in text:
        return "contains the NUL character \\u0000, which Postgres cannot store"
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate, which is not valid Unicode"
    return None


def _utf8_size(text: str) -> int:
    """The length of ``text`` in UTF-8 bytes (valid Unicode: ``check_text`` passed)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


_ASCII_ID_LENGTH = min(MAX_ID_LENGTH, MAX_ID_BYTES)
"""The longest ASCII id under both limits (one byte a character)."""


def validate_id(name: str, value: object, *, allow_empty: bool = False) -> str:
    """Check an identifier (org id, session id, user id, app name) and return it."""
    # The common case in one test: ASCII (one byte a character, so under both limits) and
    # no NUL. Anything else takes the checks below, which say what is wrong.
    if (
        type(value) is str
        and value.isascii()
        and 0 < len(value) <= _ASCII_ID_LENGTH
        and "\x00" not in value
    ):
        return value
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a string, not {type(value).__name__}")
    if not value and not allow_empty:
        raise InvalidArgumentError(f"{name} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgumentError(f"{name} is longer than {MAX_ID_LENGTH} characters")
    problem = check_text(value)
    if problem:
        raise InvalidArgumentError(f"{name} {value!r} {problem}")
    size = _utf8_size(value)
    if size > MAX_ID_BYTES:
        raise InvalidArgumentError(
            f"{name} is {size} bytes as UTF-8, over the limit of {MAX_ID_BYTES} bytes "
            f"(ids have at most {MAX_ID_LENGTH} characters and {MAX_ID_BYTES} bytes)"
        )
    return value


_BARE_PREFIXES = frozenset((USER_PREFIX, APP_PREFIX, TEMP_PREFIX))
_ASCII_KEY_LENGTH = min(MAX_KEY_LENGTH, MAX_KEY_BYTES)
"""The longest ASCII key under both limits (one byte a character)."""


def validate_key(key: object) -> str:
    """Check that ``key`` can name a state entry; raise ``InvalidStateError`` if not."""
    if (
        type(key) is str
        and key.isascii()
        and 0 < len(key) <= _ASCII_KEY_LENGTH
        and "\x00" not in key
        and key not in _BARE_PREFIXES
    ):
        return key
    if not isinstance(key, str):
        raise InvalidStateError(repr(key), f"keys must be strings, not {type(key).__name__}")
    if not key:
        raise InvalidStateError(key, "keys must not be empty")
    if key in (USER_PREFIX, APP_PREFIX, TEMP_PREFIX):
        raise InvalidStateError(key, "a key must have a name after its scope prefix")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidStateError(key[:40] + "...", f"keys are limited to {MAX_KEY_LENGTH} chars")
    problem = check_text(key)
    if problem:
        raise InvalidStateError(key, f"the key {problem}")
    size = _utf8_size(key)
    if size > MAX_KEY_BYTES:
        raise InvalidStateError(
            key[:40] + "...",
            f"the key is {size} bytes as UTF-8, over the limit of {MAX_KEY_BYTES} bytes "
            f"(keys have at most {MAX_KEY_LENGTH} characters and {MAX_KEY_BYTES} bytes, "
            "scope prefix included)",
        )
    return key


def validate_value(key: str, value: object, max_bytes: int | None = None) -> None:
    """Check that ``value`` is a JSON value every backend stores and returns unchanged.

    Args:
        key: The key the value is stored under, named in the error.
        value: The value to check.
        max_bytes: The largest size allowed for the value encoded as UTF-8 JSON, if any.

    Raises:
        InvalidStateError: the value is not storable, or larger than ``max_bytes``.
    """
    try:
        bound = _scan(value, 0)
    except _Unstorable as exc:
        raise InvalidStateError(key, str(exc)) from None
    # The scan bounds the encoded size from above; only a value that might be too large
    # is encoded to measure it exactly.
    if max_bytes is not None and bound > max_bytes:
        size = len(to_json(value).encode())
        if size > max_bytes:
            raise InvalidStateError(
                key,
                f"the value is {size} bytes as JSON, over the store's limit of {max_bytes} "
                "bytes (max_value_bytes)",
            )


def checked_copy(key: str, value: object, max_bytes: int | None = None) -> Any:
    """``validate_value(key, value, max_bytes)``, then ``copy_json(value)``, in one walk.

    Refuses what ``validate_value`` refuses, with the same error, and returns what
    ``copy_json`` returns: the copy that a store keeps of a value it is given.

    Raises:
        InvalidStateError: the value is not storable, or larger than ``max_bytes``.
    """
    size = [0]
    try:
        copied = _checked(value, 0, size)
    except _Unstorable as exc:
        raise InvalidStateError(key, str(exc)) from None
    if max_bytes is not None and size[0] > max_bytes:
        validate_value(key, value, max_bytes)  # measures it exactly, as validate_value does
    return copied


def _checked(value: object, depth: int, size: list[int]) -> Any:
    """``_scan`` and ``copy_json`` at once: the checked copy; ``size[0]`` grows by the
    scan's bound. A string inside a container is checked in the container's loop (most
    leaves are strings), with the scan's checks in the scan's order."""
    if depth > MAX_DEPTH:
        raise _Unstorable(f"the value is nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        size[0] += 5
        return value
    if isinstance(value, str):
        problem = check_text(value)
        if problem is not None:
            raise _Unstorable(f"a string value {problem}")
        size[0] += 6 * len(value) + 2
        return value if type(value) is str else str.__str__(value)
    if isinstance(value, int):
        size[0] += _scan(value, depth)
        return value if type(value) is int else int.__index__(value)
    if isinstance(value, float):
        size[0] += _scan(value, depth)
        return 0.0 if value == 0 else float.__float__(value)  # -0.0 becomes 0.0, as copy_json
    inner = depth < MAX_DEPTH  # whether an item may be checked without the depth test
    if isinstance(value, list):
        total = 2 + len(value)
        out: list[Any] = []
        append = out.append
        for item in value:
            if inner and type(item) is str:
                if "\x00" in item or not item.isascii():
                    _check_string(item)
                total += 6 * len(item) + 2
                append(item)
            else:
                append(_checked(item, depth + 1, size))
        size[0] += total
        return out
    if isinstance(value, dict):
        total = 2
        copied: dict[str, Any] = {}
        for k, item in value.items():
            if not isinstance(k, str):
                raise _Unstorable(f"a nested object has the non-string key {k!r}")
            problem = check_text(k)
            if problem is not None:
                raise _Unstorable(f"a nested key {problem}")
            total += 6 * len(k) + 4
            if type(k) is not str:
                k = str.__str__(k)
            if inner and type(item) is str:
                if "\x00" in item or not item.isascii():
                    _check_string(item)
                total += 6 * len(item) + 2
                copied[k] = item
            else:
                copied[k] = _checked(item, depth + 1, size)
        size[0] += total
        return copied
    kind = type(value).__name__
    raise _Unstorable(f"{kind} is not a JSON value (use dict, list, str, int, float, bool or None)")


def _check_string(text: str) -> None:
    """Refuse a string value that ``check_text`` refuses, as ``_scan`` does."""
    problem = check_text(text)
    if problem is not None:
        raise _Unstorable(f"a string value {problem}")


class _Unstorable(Exception):
    """Why a value cannot be stored (internal to the scan)."""


def _scan(value: object, depth: int) -> int:
    """Check a value; return an upper bound of its size as UTF-8 JSON, in bytes."""
    if depth > MAX_DEPTH:
        raise _Unstorable(f"the value is nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return 5
    if isinstance(value, str):
        problem = check_text(value)
        if problem is not None:
            raise _Unstorable(f"a string value {problem}")
        return 6 * len(value) + 2  # every character escaped as \uXXXX at worst
    if isinstance(value, int):
        bits = value.bit_length()
        # Python refuses to print integers this long as text, so no backend could store them.
        if bits > 4000 * 3 and len(digits(value)) > 4000:
            raise _Unstorable("the integer has more than 4000 digits")
        return bits // 3 + 2
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Unstorable(f"{value!r} is not a JSON number")
        return 330  # the longest is an integral float written out in full, plus ".0"
    if isinstance(value, list):
        return 2 + sum(_scan(item, depth + 1) + 1 for item in value)
    if isinstance(value, dict):
        total = 2
        for k, item in value.items():
            if not isinstance(k, str):
                raise _Unstorable(f"a nested object has the non-string key {k!r}")
            problem = check_text(k)
            if problem is not None:
                raise _Unstorable(f"a nested key {problem}")
            total += 6 * len(k) + 4 + _scan(item, depth + 1)
        return total
    kind = type(value).__name__
    raise _Unstorable(f"{kind} is not a JSON value (use dict, list, str, int, float, bool or None)")


@dataclass
class ScopedDelta:
    """A set of state changes split by scope, with the prefixes of shared keys removed."""

    private_set: dict[str, Any] = field(default_factory=dict)
    private_deleted: set[str] = field(default_factory=set)
    user_set: dict[str, Any] = field(default_factory=dict)
    user_deleted: set[str] = field(default_factory=set)
    app_set: dict[str, Any] = field(default_factory=dict)
    app_deleted: set[str] = field(default_factory=set)
    # The values a saved copy read for the shared keys it deletes: the delete applies only
    # while the key still holds that value (see ``prepare_update``).
    user_expected: dict[str, Any] = field(default_factory=dict)
    app_expected: dict[str, Any] = field(default_factory=dict)

    @property
    def has_shared(self) -> bool:
        """Whether the delta touches ``user:`` or ``app:`` state."""
        return bool(self.user_set or self.user_deleted or self.app_set or self.app_deleted)


def diff_state(
    current: Mapping[str, Any], persisted: Mapping[str, Any]
) -> tuple[dict[str, Any], set[str]]:
    """Return the keys set (with values) and deleted in ``current`` relative to ``persisted``."""
    changed = {
        k: v for k, v in current.items() if k not in persisted or not json_equal(v, persisted[k])
    }
    deleted = {k for k in persisted if k not in current}
    return changed, deleted


def split_delta(
    changed: Mapping[str, Any], deleted: Iterable[str] = (), max_bytes: int | None = None
) -> ScopedDelta:
    """Validate changes and split them by scope; ``temp:`` keys are dropped.

    Raises:
        InvalidStateError: a key or value cannot be stored; nothing should be written.
    """
    delta = ScopedDelta()
    for key, value in changed.items():
        validate_key(key)
        # temp: values are checked too, so that every entry point refuses the same input.
        value = checked_copy(key, value, max_bytes)
        scope = scope_of(key)
        if scope == "temp":
            continue
        if scope == "private":
            delta.private_set[key] = value
        elif scope == "user":
            delta.user_set[key[len(USER_PREFIX) :]] = value
        else:
            delta.app_set[key[len(APP_PREFIX) :]] = value
    for key in deleted:
        validate_key(key)
        scope = scope_of(key)
        if scope == "private":
            delta.private_deleted.add(key)
        elif scope == "user":
            delta.user_deleted.add(key[len(USER_PREFIX) :])
        elif scope == "app":
            delta.app_deleted.add(key[len(APP_PREFIX) :])
    return delta
