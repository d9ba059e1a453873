"""Awaiting to the end: what must finish once begun, whatever cancels its caller."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["to_the_end"]

T = TypeVar("T")


async def to_the_end(aw: Awaitable[T]) -> T:
    """Await ``aw`` in a task of its own, to its end, even if the caller is cancelled meanwhile.

    What must not be cut short once begun, such as what decides a connection's fate (roll
    back, terminate, check in: nor may the connection reach the pool while something still
    uses it) or an erasure's destruction of keys: a cancellation that arrives meanwhile is
    raised once ``aw`` has finished.
    """
    task = asyncio.ensure_future(aw)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation is what propagates
        raise cancelled
    return task.result()
