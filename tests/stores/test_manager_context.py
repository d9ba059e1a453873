"""Binding a session to the current context: bind, resume, and per-task isolation."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from durable_sessions import (
    Manager,
    MissingScopeError,
    Session,
    SessionNotFoundError,
    Store,
    current_conversation_id,
    current_org_id,
)

ORG = "org-a"
OTHER_ORG = "org-b"
USER = "alice"

T = TypeVar("T")


@pytest.fixture
def manager(store: Store) -> Manager:
    """A Manager over the store under test."""
    return Manager(store, app_name="app")


async def in_fresh_context(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` as a task whose context starts empty: nothing bound, nothing leaked."""
    return await contextvars.Context().run(asyncio.ensure_future, coro)


def bound() -> tuple[str, str] | None:
    """The (org id, conversation id) bound now, or None when nothing is."""
    try:
        org_id = current_org_id()
    except MissingScopeError:
        with pytest.raises(MissingScopeError):
            current_conversation_id()
        return None
    return org_id, current_conversation_id()


def ids(session: Session) -> tuple[str, str]:
    return session.org_id, session.id


async def test_nothing_bound_raises_missing_scope() -> None:
    async def check() -> None:
        with pytest.raises(MissingScopeError):
            current_org_id()
        with pytest.raises(MissingScopeError):
            current_conversation_id()

    await in_fresh_context(check())


async def test_bind_binds_for_the_block_and_restores_on_exit(manager: Manager) -> None:
    session = await manager.create(ORG, USER)

    async def check() -> None:
        with manager.bind(session) as entered:
            assert entered is session
            assert current_org_id() == ORG
            assert current_conversation_id() == session.id
        assert bound() is None

    await in_fresh_context(check())


async def test_bind_restores_on_an_exception(manager: Manager) -> None:
    session = await manager.create(ORG, USER)

    async def check() -> None:
        with pytest.raises(RuntimeError, match="agent failed"), manager.bind(session):
            raise RuntimeError("agent failed")
        assert bound() is None

    await in_fresh_context(check())


async def test_nested_binds_restore_the_outer_one(manager: Manager) -> None:
    outer = await manager.create(ORG, USER)
    inner = await manager.create(OTHER_ORG, USER)

    async def check() -> None:
        with manager.bind(outer):
            with manager.bind(inner):
                assert bound() == ids(inner)
            assert bound() == ids(outer)
        assert bound() is None

    await in_fresh_context(check())


async def test_awaited_resume_binds_in_the_calling_task(manager: Manager) -> None:
    created = await manager.create(ORG, USER, state={"step": 3})

    async def check() -> None:
        session = await manager.resume(ORG, created.id)
        assert (session.id, session.state) == (created.id, {"step": 3})
        assert bound() == (ORG, created.id)
        await asyncio.sleep(0)  # still bound after the task is suspended and resumed
        assert bound() == (ORG, created.id)

    await in_fresh_context(check())


async def test_resume_as_a_block_binds_for_the_block_only(manager: Manager) -> None:
    outer = await manager.create(ORG, USER)
    created = await manager.create(ORG, USER, state={"step": 3})

    async def check() -> None:
        async with manager.resume(ORG, created.id) as session:
            assert session.state == {"step": 3}
            assert bound() == (ORG, created.id)
        assert bound() is None

        async def fail_inside_the_block() -> None:
            async with manager.resume(ORG, created.id):
                assert bound() == (ORG, created.id)
                raise RuntimeError("boom")

        with manager.bind(outer):
            with pytest.raises(RuntimeError, match="boom"):
                await fail_inside_the_block()
            assert bound() == ids(outer)

    await in_fresh_context(check())


async def test_concurrent_tasks_each_see_their_own_session(manager: Manager) -> None:
    first = await manager.create(ORG, USER)
    second = await manager.create(ORG, USER)
    first_bound, second_bound, first_checked = asyncio.Event(), asyncio.Event(), asyncio.Event()
    seen: dict[str, list[tuple[str, str] | None]] = {"first": [], "second": []}

    async def run_first() -> None:
        await manager.resume(ORG, first.id)
        first_bound.set()
        await second_bound.wait()  # the other task has now bound its own session
        seen["first"].append(bound())
        first_checked.set()

    async def run_second() -> None:
        await first_bound.wait()
        async with manager.resume(ORG, second.id):
            second_bound.set()
            await first_checked.wait()
            seen["second"].append(bound())
        seen["second"].append(bound())

    await asyncio.gather(in_fresh_context(run_first()), in_fresh_context(run_second()))

    assert seen == {"first": [(ORG, first.id)], "second": [(ORG, second.id), None]}


async def test_resume_of_an_unknown_session_raises_and_binds_nothing(manager: Manager) -> None:
    elsewhere = await manager.create(OTHER_ORG, USER)

    async def check() -> None:
        with pytest.raises(SessionNotFoundError):
            await manager.resume(ORG, "nope")
        assert bound() is None
        with pytest.raises(SessionNotFoundError):
            await manager.resume(ORG, elsewhere.id)  # exists, but in another organisation
        assert bound() is None
        with manager.bind(elsewhere):
            with pytest.raises(SessionNotFoundError):
                async with manager.resume(ORG, "nope"):
                    pass
            assert bound() == ids(elsewhere)

    await in_fresh_context(check())
