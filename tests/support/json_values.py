"""JSON values for the encoder and decoder tests: integers around 64 bits, and a strict
comparison of decoded values."""

from __future__ import annotations

from typing import Any

BEYOND_64_BITS = [
    2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, -(2**63), -(2**63) - 1, -(2**64),
    10**18, 10**19, -(10**18), -(10**19) + 1, 10**40, -(10**40), 2**200,
]  # fmt: skip


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
