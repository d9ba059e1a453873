"""JSON values for the encoder and decoder tests: integers around 64 bits, a hypothesis
strategy of any JSON value Python holds, and a strict comparison of decoded values."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

BEYOND_64_BITS = [
    2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, -(2**63), -(2**63) - 1, -(2**64),
    10**18, 10**19, -(10**18), -(10**19) + 1, 10**40, -(10**40), 2**200,
]  # fmt: skip

any_char = st.characters(exclude_categories=())
"""Every character, lone surrogates and NUL included (json.dumps escapes them)."""
keys = st.text(any_char, max_size=8)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(BEYOND_64_BITS)
    | st.floats()  # NaN, infinities, -0.0 and integral floats included
    | st.sampled_from([1e16, -0.0, 1e-7, 1.5e300, 2.0**70, 5e-324, 0.1])
    | st.text(any_char, max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(keys, inner, max_size=6),
    max_leaves=40,
)
"""Any JSON value as Python holds it (dicts, lists, str, int, float, bool, None), up to
40 leaves; json.dumps writes every one and json.loads reads it back."""


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values decoded by Python, strictly: the same types all the way down,
    floats bit for bit (``-0.0`` is not ``0.0``; NaN is NaN), keys in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
