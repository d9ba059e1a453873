"""The runner's greenlet_spawn keeps SQLAlchemy's contract while reusing its greenlets.

``durable_sessions.sql._private.greenlet_spawn`` runs the pool's checkout (and the other
sync SQLAlchemy calls the runner makes) in a greenlet kept from an earlier call, where
SQLAlchemy's own makes a new one each time. These tests hold it to what SQLAlchemy's
gives: ``await_only`` works inside, the caller's context variables are seen, errors and
cancellations travel both ways, concurrent calls do not share a greenlet, and threads
keep their own.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import weakref
from typing import Any

import pytest
from greenlet import getcurrent
from sqlalchemy.util import await_only

from durable_sessions.sql import _private

_who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def _awaiting(value: Any) -> Any:
    """Sync code that awaits, as a pool's checkout awaits the driver."""
    await_only(asyncio.sleep(0))
    return value


async def test_the_installed_sqlalchemy_accepts_a_reused_greenlet() -> None:
    assert _private._REUSABLE


async def test_a_call_awaits_and_returns_in_the_greenlet_of_the_last_call() -> None:
    first = await _private.greenlet_spawn(lambda: (getcurrent(), _awaiting(1)))
    second = await _private.greenlet_spawn(lambda: (getcurrent(), _awaiting(2)))
    assert first[1] == 1
    assert second[1] == 2
    assert first[0] is second[0]  # kept, not made again
    assert first[0] is not getcurrent()


async def test_calls_that_await_at_once_each_have_their_own_greenlet() -> None:
    release = asyncio.Event()
    seen: list[Any] = []

    def call(index: int) -> int:
        seen.append(getcurrent())
        await_only(release.wait())
        return index

    tasks = [asyncio.ensure_future(_private.greenlet_spawn(call, i)) for i in range(5)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*tasks) == [0, 1, 2, 3, 4]
    assert len({id(g) for g in seen}) == 5


async def test_an_error_is_the_callers_and_the_greenlet_serves_again() -> None:
    class Refused(Exception):
        pass

    raised = Refused("no")

    def failing() -> None:
        await_only(asyncio.sleep(0))
        raise raised

    with pytest.raises(Refused) as caught:
        await _private.greenlet_spawn(failing)
    assert caught.value is raised
    assert await _private.greenlet_spawn(_awaiting, "again") == "again"


async def test_a_driver_error_is_thrown_in_where_the_call_awaits() -> None:
    async def driver() -> None:
        raise ConnectionResetError("gone")

    def call() -> str:
        try:
            await_only(driver())
        except ConnectionResetError as exc:
            return f"handled {exc}"
        return "not raised"

    assert await _private.greenlet_spawn(call) == "handled gone"


async def test_a_cancellation_reaches_the_call_and_then_the_caller() -> None:
    entered = asyncio.Event()
    seen: list[str] = []

    def call() -> None:
        entered.set()
        try:
            await_only(asyncio.sleep(60))
        except asyncio.CancelledError:
            seen.append("cancelled inside")
            raise

    task = asyncio.ensure_future(_private.greenlet_spawn(call))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled inside"]
    assert await _private.greenlet_spawn(_awaiting, "after") == "after"


async def test_each_call_sees_its_callers_context_variables() -> None:
    def read() -> str:
        await_only(asyncio.sleep(0))
        return _who.get()

    async def as_(name: str) -> str:
        _who.set(name)
        return await _private.greenlet_spawn(read)

    # One task after another reuses one greenlet; each sees its own value.
    assert await asyncio.create_task(as_("alice")) == "alice"
    assert await asyncio.create_task(as_("bob")) == "bob"
    assert await _private.greenlet_spawn(read) == "nobody"


async def test_another_threads_loop_has_greenlets_of_its_own() -> None:
    here = await _private.greenlet_spawn(lambda: _awaiting(getcurrent()))
    found: list[Any] = []

    def other_thread() -> None:
        found.append(asyncio.run(_private.greenlet_spawn(lambda: _awaiting(getcurrent()))))

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(30)
    assert found
    assert found[0] is not here
    assert await _private.greenlet_spawn(lambda: _awaiting(getcurrent())) is here


async def test_idle_greenlets_kept_are_bounded() -> None:
    release = asyncio.Event()

    def call() -> None:
        await_only(release.wait())

    tasks = [asyncio.ensure_future(_private.greenlet_spawn(call)) for _ in range(100)]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(*tasks)
    assert len(_private._idle_greenlets()) == _private._IDLE_MAX


async def test_without_a_reusable_greenlet_each_call_gets_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_private, "_REUSABLE", False)
    first = await _private.greenlet_spawn(lambda: _awaiting(getcurrent()))
    second = await _private.greenlet_spawn(lambda: _awaiting(getcurrent()))
    assert first is not second
    assert first.dead


async def test_an_idle_greenlet_keeps_nothing_of_the_last_call() -> None:
    class Result:
        pass

    class Failure(Exception):
        pass

    made: list[weakref.ref[Any]] = []

    def returning() -> Result:
        await_only(asyncio.sleep(0))
        result = Result()
        made.append(weakref.ref(result))
        return result

    def raising() -> None:
        await_only(asyncio.sleep(0))
        error = Failure()
        made.append(weakref.ref(error))
        raise error

    _who.set("caller")
    await _private.greenlet_spawn(returning)
    with pytest.raises(Failure):
        await _private.greenlet_spawn(raising)
    gc.collect()
    assert [ref() for ref in made] == [None, None]  # neither kept alive while idle
    assert all(g.gr_context is None for g in _private._idle_greenlets())
