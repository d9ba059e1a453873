"""The JSON codec of stored values: decoding what a store reads back, encoding what it
writes, copying and comparing JSON values strictly.

Every store encodes with ``to_json`` and decodes with ``loads_json`` or ``from_json``, so a
value reads back the same on each; orjson is used where installed and where it gives exactly
what the ``json`` module gives.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable
from typing import Any

__all__ = ["copy_json", "digits", "from_json", "json_equal", "loads_json", "to_json"]


# The scanner json.loads runs, without its wrapping (an attribute JSONDecoder sets).
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def from_json(text: str) -> Any:
    """``json.loads(text)``, a few times faster for the small documents stores read back.

    The text is scanned directly; anything but one JSON value filling the whole string
    (whitespace around it, an error) is left to ``json.loads``, which reads or refuses it.
    """
    if type(text) is str:
        try:
            value, end = _scan_json(text, 0)
        except StopIteration:
            pass
        else:
            if end == len(text):
                return value
    return json.loads(text)


def _optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:  # pragma: no cover - tests monkeypatch _orjson to None instead
        return None


_orjson: Any = _optional("orjson")
"""orjson, when installed (the openai-agents extra): ``loads_json``'s decoder, and
``to_json``'s encoder for plain values."""

_ORJSON_STRICT = (
    0
    if _orjson is None
    else _orjson.OPT_PASSTHROUGH_SUBCLASS
    | _orjson.OPT_PASSTHROUGH_DATETIME
    | _orjson.OPT_PASSTHROUGH_DATACLASS
)
"""orjson's options that make it refuse, rather than encode, what ``json`` would not."""


_DIGITS_AS_ZERO = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
"""A ``bytes.translate`` table: every ASCII digit becomes ``0``, every other byte a space."""
_LONG_DIGIT_RUN = b"0" * 19
"""19 digits in a row: the shortest integer beyond 64 bits (-9223372036854775809) has 19."""


def loads_json(text: str) -> Any:
    """``json.loads(text)``: the same value (types included) or the same error, decoded by
    orjson when it is installed and reads ``text`` as ``json.loads`` does.

    orjson differs from ``json.loads`` in two ways, both routed to ``json.loads``:

    - it reads an integer beyond 64 bits as a float: a text with 19 or more ASCII digits in
      a row anywhere (in a string too: a false alarm only costs speed) is decoded by
      ``json.loads``, found by one ``bytes.translate`` and one substring search;
    - it refuses what ``json.loads`` accepts (``NaN``, ``Infinity``, numbers beyond the
      float range, which ``json.loads`` reads as infinities, lone surrogates): a text that
      orjson refuses is given to ``json.loads``, which reads it or raises its own error.

    Everything else, floats (both round correctly), duplicate keys (the last value, at the
    first key's place), escapes and whitespace, is read alike (``tests/unit/test_json_decode.py``
    compares the two on generated documents).
    """
    if _orjson is None or type(text) is not str:
        return json.loads(text)
    try:
        raw = text.encode()
    except UnicodeEncodeError:  # a lone surrogate: orjson refuses it
        return json.loads(text)
    if _LONG_DIGIT_RUN in raw.translate(_DIGITS_AS_ZERO):
        return json.loads(text)
    try:
        return _orjson.loads(raw)
    except ValueError:  # orjson.JSONDecodeError
        return json.loads(text)


def to_json(value: Any) -> str:
    """Encode a JSON value as text that every backend reads back with the same types.

    Postgres' jsonb keeps numbers as decimals and prints ``1e16`` as ``10000000000000000``,
    which would come back as an int; floats with an integral value are therefore written
    with a decimal point (``10000000000000000.0``), which jsonb keeps as written.
    """
    if _orjson is not None and _plain(value):
        try:
            text: str = _orjson.dumps(value, option=_ORJSON_STRICT).decode()
            return text
        except TypeError:  # orjson.JSONEncodeError: an int beyond 64 bits, a non-str key...
            pass
    if _has_integral_float(value):
        return _encode(value)
    return _COMPACT.encode(value)


def _plain(value: Any) -> bool:
    """Whether orjson encodes ``value`` as ``to_json``'s standard-library path does: plain
    ``dict``, ``list``, ``str``, ``int``, ``bool`` and ``None``, and floats that are finite
    and not integral in exponent form (floats then print in their shortest round-trip form
    on both paths, which may write them differently, e.g. ``1e-7`` for ``1e-07``: the
    same number to every reader). Anything else, subclasses and tuples included, takes the
    standard-library path. What orjson then still refuses (an int beyond 64 bits, a key that
    is not a str, a lone surrogate, nesting past 255 levels) takes that path too."""
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is str:
            continue
        if kind is dict:
            extend(item.values())
        elif kind is list:
            extend(item)
        elif kind is float:
            if not math.isfinite(item) or _is_exponent_integral(item):
                return False
        elif kind is not int and kind is not bool and item is not None:
            return False
    return True


# One encoder, made once: json.dumps with arguments builds a new one on every call.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _is_exponent_integral(value: float) -> bool:
    # Also -0.0: Postgres numbers have no negative zero, so every backend stores 0.0.
    negative_zero = value == 0 and math.copysign(1.0, value) < 0
    return value.is_integer() and ("e" in repr(value) or negative_zero)


def _has_integral_float(value: Any) -> bool:
    # Iterative, and strings (most of any content) skipped first: this runs on every value
    # written, so it is a loop over a stack rather than recursive generators.
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        item = pop()
        if type(item) is str:
            continue
        if isinstance(item, float):
            if _is_exponent_integral(item):
                return True
        elif isinstance(item, dict):
            extend(item.values())
        elif isinstance(item, list):
            extend(item)
    return False


def _encode(value: Any) -> str:
    if isinstance(value, float) and _is_exponent_integral(value):
        return f"{int(value)}.0"  # int(-0.0) == 0
    if isinstance(value, dict):
        items = (_key(k) + ":" + _encode(v) for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _key(key: Any) -> str:
    """An object key as the json module writes it (an int, float, bool or None key becomes
    its JSON text in quotes, anything else but a str is a TypeError)."""
    if isinstance(key, str):
        return json.dumps(key, ensure_ascii=False)
    return _COMPACT.encode({key: 0})[1:-3]


def digits(value: int) -> str:
    try:
        return str(abs(value))
    except ValueError:  # over sys.get_int_max_str_digits()
        return "9" * 5000


_SHARED_AS_IS = frozenset({str, int, bool, type(None)})
"""Immutable values ``copy_json`` returns as they are without a call of its own."""


def copy_json(value: Any) -> Any:
    """Deep-copy a JSON value (much faster than ``copy.deepcopy`` for plain data).

    The copy holds plain types only, as every SQL backend gives them back: a subclass of
    ``str``, ``int`` or ``float`` (a ``str`` or ``int`` enum, say) becomes its value.
    """
    if isinstance(value, dict):
        return {
            k if type(k) is str else _plain_key(k): v if type(v) in _SHARED_AS_IS else copy_json(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [v if type(v) in _SHARED_AS_IS else copy_json(v) for v in value]
    if isinstance(value, float):
        return 0.0 if value == 0 else float.__float__(value)  # -0.0 as SQL backends store it
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__index__(value)
    return value


def _plain_key(key: Any) -> Any:
    """A key of a plain type: a ``str`` subclass's value (anything else is left to refuse)."""
    return str.__str__(key) if isinstance(key, str) else key


def json_equal(a: Any, b: Any) -> bool:
    """Compare JSON values strictly: ``1``, ``1.0`` and ``True`` are three different values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
