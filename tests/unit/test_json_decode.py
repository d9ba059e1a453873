"""jsoncodec.loads_json: json.loads' value (types included) or its error, decoded by orjson
where orjson reads the text alike; what orjson reads otherwise goes to json.loads."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

pytest.importorskip("orjson", reason="orjson (the openai-agents extra) is not installed")
pytest.importorskip("hypothesis", reason="hypothesis (the test group) is not installed")

import orjson  # the test group installs it: the fast path is what these tests exercise
from hypothesis import example, given, settings
from hypothesis import strategies as st

from durable_sessions import jsoncodec
from durable_sessions.jsoncodec import loads_json
from support.json_values import same, values


def outcome(decode: Any, text: str) -> tuple[Any, ...]:
    try:
        return ("value", decode(text))
    except Exception as exc:
        return ("error", type(exc), str(exc))


def check(text: str) -> None:
    """loads_json(text) is json.loads(text): the same value, or the same error."""
    ours, theirs = outcome(loads_json, text), outcome(json.loads, text)
    assert ours[0] == theirs[0], (text[:200], ours, theirs)
    if ours[0] == "value":
        assert same(ours[1], theirs[1]), (text[:200], ours[1], theirs[1])
    else:
        assert ours[1:] == theirs[1:]


# Numbers as written by anyone: long mantissas, exponents past the float range, -0.
numbers = st.from_regex(
    r"-?(0|[1-9][0-9]{0,30})(\.[0-9]{1,30})?([eE][+-]?[0-9]{1,4})?", fullmatch=True
)


@settings(max_examples=400)
@given(values, st.booleans(), st.sampled_from([None, 1]))
def test_a_document_json_dumps_wrote_is_read_as_json_loads_reads_it(
    value: Any, ascii_only: bool, indent: int | None
) -> None:
    check(json.dumps(value, ensure_ascii=ascii_only, indent=indent))
    check(json.dumps([value, value]))


@settings(max_examples=400)
@given(numbers)
@example("-9223372036854775809")
@example("18446744073709551616")
@example("1e400")
@example("-1e400")
@example("1.7976931348623159e308")
@example("2.4703282292062328e-324")
@example("0.1000000000000000055511151231257827021181583404541015625")
def test_numbers_are_read_with_json_loads_types_and_values(number: str) -> None:
    check(number)
    check(f'[{number}, {{"n": {number}}}]')


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers()), max_size=6))
def test_duplicate_keys_keep_the_last_value_at_the_first_place(pairs: list[Any]) -> None:
    check("{" + ",".join(f'"{k}": {v}' for k, v in pairs) + "}")


@pytest.mark.parametrize(
    "text",
    [
        "[NaN, Infinity, -Infinity]",
        '{"a": NaN}',
        '"\\ud800"',
        '["\\udfff", "\\ud83d\\ude00", "\\u00e9", "é", "😀", "\\u0000", "\\u2028"]',
        '{"a": 1, "a": 2.5, "b": [], "a": null}',
        "[-0.0, -0, 0.0, 1E5, 1e-400, -1e-400, 5e-324, 1.5e+3]",
        "\ufeff[1]",
        " \t\r\n[1] \n",
        "\x0c[1]",
        "[1]x",
        "[01]",
        '"\t"',
        "",
        "[" * 1100 + "]" * 1100,
        "[" * 5000 + "]" * 5000,
        "1" * 5000,
        '{"id": "12345678901234567890"}',
        '{"n": 123456789012345678}',
    ],
)
def test_edge_cases_read_as_json_loads_reads_them(text: str) -> None:
    check(text)


def test_a_lone_surrogate_written_raw_is_read_by_json_loads() -> None:
    check(json.dumps(["\ud800"], ensure_ascii=False))


def test_orjson_decodes_documents_it_reads_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    class Spy:
        @staticmethod
        def loads(raw: bytes) -> Any:
            calls.append(raw)
            return orjson.loads(raw)

    monkeypatch.setattr(jsoncodec, "_orjson", Spy)
    assert loads_json('[{"role": "user", "n": 123456789012345678}]') == [
        {"role": "user", "n": 123456789012345678}
    ]
    assert len(calls) == 1
    # 19 digits in a row (even in a string): json.loads, orjson not asked.
    assert loads_json('["-9223372036854775809", -9223372036854775809]') == [
        "-9223372036854775809",
        -9223372036854775809,
    ]
    assert len(calls) == 1
    # Refused by orjson, read by json.loads.
    value = loads_json("[NaN]")
    assert len(calls) == 2
    assert math.isnan(value[0])


def test_without_orjson_it_is_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsoncodec, "_orjson", None)
    for text in ['[{"a": 1.5}]', "[NaN]", "18446744073709551616", '"\\ud800"', "[1,]"]:
        check(text)
