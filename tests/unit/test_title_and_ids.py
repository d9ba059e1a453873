"""derive_title and new_id: short titles that never split a character, ordered unique ids."""

from __future__ import annotations

import re
import time
import unicodedata
import uuid

import pytest

pytest.importorskip("hypothesis", reason="hypothesis (the test group) is not installed")

from hypothesis import given
from hypothesis import strategies as st

from durable_sessions import InvalidArgumentError, derive_title, new_id

ELLIPSIS = "…"
ZWJ = "\u200d"
FAMILY = "👨\u200d👩\u200d👧\u200d👦"  # four people joined by three zero-width joiners
FLAGS = "🇫🇷🇩🇪🇯🇵"  # three flags, each a pair of regional indicators
WAVE_MEDIUM = "👋🏽"  # waving hand + skin tone modifier
E_ACUTE = "e\u0301"  # "e" + combining acute accent
A_TWO_MARKS = "a\u0301\u0323"  # "a" + two combining marks


def fold(text: str) -> str:
    """What the title is taken from: whitespace runs folded to single spaces."""
    return " ".join(text.split())


# -- derive_title: examples ------------------------------------------------------------------


def test_a_message_that_fits_is_kept_whole() -> None:
    assert derive_title("Plan a trip to Lisbon") == "Plan a trip to Lisbon"
    assert derive_title("x" * 60) == "x" * 60


def test_whitespace_is_folded_including_newlines_and_tabs() -> None:
    message = "  Plan\n a\ttrip \r\n\n to \t  Lisbon  "
    assert derive_title(message) == "Plan a trip to Lisbon"


def test_a_long_message_is_cut_at_the_last_word_boundary() -> None:
    message = "The quick brown fox jumps over the lazy dog"
    assert derive_title(message, max_length=18) == "The quick brown" + ELLIPSIS
    # When the cut falls exactly on a space, the whole last word is kept.
    assert derive_title(message, max_length=20) == "The quick brown fox" + ELLIPSIS


def test_the_default_title_is_at_most_60_characters() -> None:
    title = derive_title("word " * 40)
    assert len(title) <= 60
    assert title.endswith("word" + ELLIPSIS)


def test_a_single_overlong_word_is_cut_hard() -> None:
    assert derive_title("a" * 100, max_length=10) == "a" * 9 + ELLIPSIS
    assert derive_title("supercalifragilistic is long", max_length=6) == "super" + ELLIPSIS


@pytest.mark.parametrize("message", ["", "   ", "\n\t \r\n"])
def test_a_blank_message_gives_an_empty_title(message: str) -> None:
    assert derive_title(message) == ""


@pytest.mark.parametrize(
    "unit",
    [
        pytest.param(FAMILY, id="zwj-family"),
        pytest.param(FLAGS[:2], id="flag"),
        pytest.param(WAVE_MEDIUM, id="skin-tone"),
        pytest.param(E_ACUTE, id="combining-mark"),
        pytest.param(A_TWO_MARKS, id="two-combining-marks"),
    ],
)
def test_a_cut_never_splits_a_user_perceived_character(unit: str) -> None:
    text = unit * 5
    for max_length in range(1, len(text)):
        title = derive_title(text, max_length=max_length)
        assert len(title) <= max_length
        assert title.endswith(ELLIPSIS)
        kept = title[: -len(ELLIPSIS)]
        assert kept == unit * (len(kept) // len(unit)), (max_length, title)
    assert derive_title(text, max_length=len(unit) + 1) == unit + ELLIPSIS


def test_distinct_flags_stay_paired() -> None:
    for max_length in range(1, len(FLAGS)):
        kept = derive_title(FLAGS, max_length=max_length)[: -len(ELLIPSIS)]
        assert kept in ("", FLAGS[:2], FLAGS[:4])
    assert derive_title(FLAGS, max_length=5) == FLAGS[:4] + ELLIPSIS


def test_an_emoji_sequence_at_a_word_cut_is_kept_or_dropped_whole() -> None:
    message = f"Hello {FAMILY} and friends"
    for max_length in range(1, len(fold(message))):
        title = derive_title(message, max_length=max_length)
        assert not title[: -len(ELLIPSIS)].endswith(ZWJ)
        if FAMILY[0] in title:
            assert FAMILY in title


@pytest.mark.parametrize("max_length", [0, -1, -60])
def test_max_length_below_one_is_refused(max_length: int) -> None:
    with pytest.raises(InvalidArgumentError):
        derive_title("hello", max_length=max_length)


# -- derive_title: properties ----------------------------------------------------------------

# Plain text, plus text dense in the characters that make cutting hard.
TRICKY = [
    "a",
    "b",
    "é",
    "界",
    " ",
    "  ",
    "\n",
    "\t",
    ZWJ,
    "\u0301",
    "\u0323",
    "\ufe0f",
    "\U0001f3fd",
    "👨",
    "👩",
    "🇫",
    "🇷",
    ELLIPSIS,
]
messages = st.text() | st.lists(st.sampled_from(TRICKY), max_size=80).map("".join)


@st.composite
def titled(draw: st.DrawFn) -> tuple[str, int]:
    """A message and a max_length in 1..200, often short enough to force a cut."""
    message = draw(messages)
    folded_length = len(fold(message))
    max_length = draw(
        st.integers(min_value=1, max_value=200)
        | st.integers(min_value=1, max_value=max(1, min(200, folded_length)))
    )
    return message, max_length


def _joins_what_precedes(ch: str) -> bool:
    """Whether ``ch`` continues the character before it (a mark, joiner, selector, tone)."""
    cp = ord(ch)
    return (
        unicodedata.category(ch) in ("Mn", "Mc", "Me")
        or ch == ZWJ
        or 0xFE00 <= cp <= 0xFE0F
        or 0x1F3FB <= cp <= 0x1F3FF
    )


@given(messages, st.integers(min_value=1, max_value=200))
def test_a_title_is_never_longer_than_max_length(message: str, max_length: int) -> None:
    assert len(derive_title(message, max_length=max_length)) <= max_length


@given(titled())
def test_a_title_is_the_folded_text_or_a_prefix_of_it(case: tuple[str, int]) -> None:
    message, max_length = case
    title = derive_title(message, max_length=max_length)
    folded = fold(message)
    if len(folded) <= max_length:
        assert title == folded
    else:
        assert title.endswith(ELLIPSIS)
        assert folded.startswith(title[: -len(ELLIPSIS)])


@given(titled())
def test_a_title_never_ends_inside_a_character(case: tuple[str, int]) -> None:
    message, max_length = case
    title = derive_title(message, max_length=max_length)
    folded = fold(message)
    if len(folded) <= max_length:
        return
    kept = title[: -len(ELLIPSIS)]
    if not kept:
        return
    following = folded[len(kept)]
    # A joiner may end the title only when nothing was joined to it (a space came next).
    assert not (kept.endswith(ZWJ) and not following.isspace())
    assert not _joins_what_precedes(following)


@given(titled())
def test_deriving_a_title_from_a_title_changes_nothing(case: tuple[str, int]) -> None:
    message, max_length = case
    title = derive_title(message, max_length=max_length)
    assert derive_title(title, max_length=max_length) == title


# -- new_id ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ids() -> list[str]:
    """Ten thousand ids made one after another."""
    return [new_id() for _ in range(10_000)]


def test_ids_are_unique(ids: list[str]) -> None:
    assert len(set(ids)) == len(ids)


def test_ids_sort_in_creation_order(ids: list[str]) -> None:
    assert ids == sorted(ids)


def test_ids_are_url_safe(ids: list[str]) -> None:
    assert all(re.fullmatch(r"[0-9a-f-]{36}", i) for i in ids)


def test_ids_are_uuid_version_7(ids: list[str]) -> None:
    for i in ids:
        parsed = uuid.UUID(i)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == i


def test_an_id_carries_the_time_it_was_made() -> None:
    before = time.time_ns() // 1_000_000
    made = uuid.UUID(new_id()).int >> 80  # the 48-bit Unix time in milliseconds
    after = time.time_ns() // 1_000_000
    # A burst of ids may run a few milliseconds ahead of the clock, never behind it.
    assert before <= made <= after + 50
