"""jsoncodec.to_json's orjson path writes what its standard-library path writes (the same text,
or the same number written another way), and state.checked_copy refuses and copies exactly
as validate_value followed by copy_json."""

from __future__ import annotations

import enum
import json
import uuid
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any

import pytest

pytest.importorskip("orjson", reason="orjson (the openai-agents extra) is not installed")
pytest.importorskip("hypothesis", reason="hypothesis (the test group) is not installed")

import orjson  # the test group installs it: the fast path is what these tests exercise
from hypothesis import example, given, settings
from hypothesis import strategies as st

from durable_sessions import InvalidStateError, jsoncodec
from durable_sessions.jsoncodec import copy_json, to_json
from durable_sessions.state import MAX_DEPTH, checked_copy, validate_value
from support.json_values import same, values


def stdlib_to_json(value: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    with monkeypatch.context() as patch:
        patch.setattr(jsoncodec, "_orjson", None)
        return outcome(to_json, value)


def outcome(encode: Any, value: Any) -> tuple[Any, ...]:
    try:
        return ("text", encode(value))
    except Exception as exc:
        return ("error", type(exc), str(exc))


def test_the_fast_path_is_taken() -> None:
    assert jsoncodec._orjson is orjson
    batch = [{"n": 1, "content": {"role": "user", "content": [{"text": "héllo\u2028"}]}}]
    assert to_json(batch) == orjson.dumps(batch).decode()


@settings(max_examples=500, deadline=None)
@given(values)
@example({"a": [1, 2.5, None, True, "é\u2028\x1f\\u0000"]})
@example([1e16, -0.0, {"k": 1e-7}])
@example({"\ud800": 1})
@example([2**64, 2**64 - 1, -(2**63) - 1])
def test_to_json_writes_what_the_standard_library_path_writes(value: Any) -> None:
    with pytest.MonkeyPatch.context() as patch:
        theirs = stdlib_to_json(value, patch)
    ours = outcome(to_json, value)
    assert ours[0] == theirs[0], (value, ours, theirs)
    if ours[0] == "error":
        assert ours[1:] == theirs[1:]
        return
    # The same value to every reader; the same text unless a float is written another way
    # (1e-7 against 1e-07, 0.0000338 against 3.38e-05).
    assert same(json.loads(ours[1]), json.loads(theirs[1])), (ours, theirs)
    if not any(isinstance(x, float) for x in _leaves(value)):
        assert ours[1] == theirs[1]


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


class Color(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    HIGH = 3


class Text(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        uuid.UUID(int=1),  # orjson would write these; the standard library refuses them
        Color.RED,
        datetime(2026, 1, 1, tzinfo=timezone.utc),
        {"when": datetime(2026, 1, 1, tzinfo=timezone.utc)},
        (1, 2),  # the standard library writes tuples as lists
        Level.HIGH,
        Text("x"),
        OrderedDict(a=1),
        {"nested": [{"deep": (1, [Color.RED])}]},
        float("nan"),
        [float("inf")],
        {1: "int key", None: "none key", 2.5: "float key"},  # json writes them as text
        2**100,
    ],
    ids=repr,
)
def test_what_orjson_would_write_otherwise_takes_the_standard_library_path(
    value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert outcome(to_json, value) == stdlib_to_json(value, monkeypatch)


def test_deeper_than_orjson_goes_is_still_written() -> None:
    value: Any = "leaf"
    for _ in range(300):
        value = [value]
    assert to_json(value) == "[" * 300 + '"leaf"' + "]" * 300


# -- checked_copy -----------------------------------------------------------------------------


def separate_outcome(value: Any, max_bytes: int | None) -> tuple[Any, ...]:
    try:
        validate_value("key", value, max_bytes)
    except InvalidStateError as exc:
        return ("error", str(exc))
    return ("copy", copy_json(value))


def fused_outcome(value: Any, max_bytes: int | None) -> tuple[Any, ...]:
    try:
        return ("copy", checked_copy("key", value, max_bytes))
    except InvalidStateError as exc:
        return ("error", str(exc))


def nested(depth: int, leaf: Any, container: str) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if container == "list" else {"k": value}
    return value


@settings(max_examples=500, deadline=None)
@given(values, st.sampled_from([None, 1, 16, 200, 10_000]))
@example(nested(MAX_DEPTH, "s", "list"), None)
@example(nested(MAX_DEPTH + 1, "s", "list"), None)
@example(nested(MAX_DEPTH, "s\x00", "dict"), None)
@example(nested(MAX_DEPTH + 1, "\ud800", "dict"), None)
@example(nested(MAX_DEPTH, 1, "dict"), None)
@example(["ok", "bad\x00", "\ud800"], None)
@example({"a": "x" * 30, "b": -0.0}, 40)
@example({"0": -0.0, "": [1e-07]}, 1)
def test_checked_copy_is_validate_value_then_copy_json(value: Any, max_bytes: int | None) -> None:
    ours, theirs = fused_outcome(value, max_bytes), separate_outcome(value, max_bytes)
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] == "error":
        assert ours[1] == theirs[1]
    else:
        assert same(ours[1], theirs[1])


def test_checked_copy_shares_no_container_with_the_value() -> None:
    value = {"a": [{"b": "c"}, [1.5, -0.0]], "d": OrderedDict(e=[])}
    copied = checked_copy("key", value)
    assert copied == value
    assert same(copied["a"][1], [1.5, 0.0])
    assert type(copied["d"]) is dict
    value["a"][0]["b"] = "changed"
    value["a"][1].append(2)
    value["d"]["e"].append(3)
    assert copied == {"a": [{"b": "c"}, [1.5, 0.0]], "d": {"e": []}}


@pytest.mark.parametrize(
    "value",
    [
        {0: 1e16},
        {1.5: [2.0], True: 1e16, None: {"k": 3.0}},
        {float("inf"): 1e16},
        {(1, 2): 1e16},
    ],
    ids=["int key", "float, bool and None keys", "infinite key", "tuple key"],
)
def test_keys_that_are_not_str_beside_an_integral_float_are_written_as_json_writes_them(
    value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The integral-float path writes each key itself; validation refuses such keys before
    # any write, but to_json alone must still give JSON or the json module's error.
    ours = outcome(to_json, value)
    expected = outcome(lambda v: json.dumps(v, ensure_ascii=False, allow_nan=False), value)
    assert ours[0] == expected[0], (ours, expected)
    if ours[0] == "text":
        assert same(json.loads(ours[1]), json.loads(expected[1])), (ours, expected)
    else:
        assert ours[1] is expected[1]
