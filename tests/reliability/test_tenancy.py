"""Tenancy: two organisations with the same app names, user ids and session ids never see
or change each other's data, whatever they do (a hypothesis property test per backend).

After every operation by one organisation, the other's full observable state (its sessions
listed, each one's merged state and transcript) must be exactly what it was, and neither
organisation's state may hold a value written by the other: every value, title and event an
organisation writes is tagged with its name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from itertools import count
from typing import Any

import pytest

pytest.importorskip("hypothesis", reason="hypothesis (the test group) is not installed")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from durable_sessions import (
    Event,
    Filter,
    InMemoryStore,
    InvalidArgumentError,
    Manager,
    SessionExistsError,
    SessionNotFoundError,
    SQLStore,
    Store,
)
from reliability.figures import Figures
from reliability.helpers import OwnedLoop, observe_org, reset_tables

ORGS = ("org-a", "org-b")
APPS = ("app1", "app2")
USERS = ("u1", "u2")
SIDS = ("s1", "s2")
FORK_SIDS = ("s2", "s3")
KEYS = ("k", "user:k", "app:k", "temp:k", "k2", "user:k2", "app:k2")
KINDS = (
    "create",
    "save",
    "append_event",
    "fork",
    "delete",
    "purge",
    "delete_user",
    "touch",
    "list",
    "list_empty_org",
)


@dataclass(frozen=True)
class Op:
    """One operation by one organisation; each kind uses the fields it needs."""

    kind: str
    org: str
    app: str
    user: str
    sid: str
    other_sid: str
    key: str
    flag: bool


ops_strategy = st.builds(
    Op,
    kind=st.sampled_from(("create", "create", *KINDS)),  # enough sessions to work on
    org=st.sampled_from(ORGS),
    app=st.sampled_from(APPS),
    user=st.sampled_from(USERS),
    sid=st.sampled_from(SIDS),
    other_sid=st.sampled_from(FORK_SIDS),
    key=st.sampled_from(KEYS),
    flag=st.booleans(),
)


def marker(org: str) -> str:
    """The tag carried by every value an organisation writes."""
    return f"<written by {org}>"


@dataclass
class Tally:
    """What the property test did, for the figures table."""

    operations: int = 0
    checks: int = 0
    passed: int = 0
    errors: int = 0


class Tenants:
    """Runs operations of both organisations on one store and checks their isolation."""

    def __init__(self, store: Store, tally: Tally) -> None:
        self.store = store
        self.tally = tally
        self.serial = count()

    def tag(self, org: str) -> str:
        return f"{marker(org)} #{next(self.serial)}"

    async def apply(self, op: Op) -> None:
        store, org, tag = self.store, op.org, self.tag(op.org)
        if op.kind == "create":
            state = {key: tag for key in KEYS}
            await Manager(store, app_name=op.app).create(
                org, op.user, id=op.sid, state=state, title=tag
            )
        elif op.kind == "save":
            session = await store.get(org, op.sid)
            if op.flag:
                session.delete(op.key)
            else:
                session.set(op.key, tag)
                session.title = tag
            await store.update(session)
        elif op.kind == "append_event":
            event = Event("agent", content=tag, state_delta={op.key: tag}, tokens=1)
            await store.append_event(org, op.sid, event)
        elif op.kind == "fork":
            await store.fork(org, op.sid, new_session_id=op.other_sid, with_events=op.flag)
        elif op.kind == "delete":
            await store.delete(org, op.sid)
        elif op.kind == "purge":
            older_than = timedelta(0) if op.flag else timedelta(days=1)
            await store.purge(org, older_than=older_than)
        elif op.kind == "delete_user":
            await store.delete_user(org, op.user)
        elif op.kind == "touch":
            await store.touch(org, op.sid, messages=1, tokens=2, title=tag)
        elif op.kind == "list":
            found = await store.list(
                Filter(org, user_id=op.user if op.flag else None, app_name=op.app)
            )
            assert all(s.org_id == org and s.app_name == op.app for s in found)
        else:  # list_empty_org: never a scan across tenants
            for empty in ("", None):
                try:
                    await store.list(Filter(empty))  # type: ignore[arg-type]
                except InvalidArgumentError:
                    continue
                raise AssertionError(f"list(Filter({empty!r})) was not refused")

    async def run(self, ops: list[Op]) -> None:
        seen = {org: await observe_org(self.store, org) for org in ORGS}
        for op in ops:
            other = ORGS[1] if op.org == ORGS[0] else ORGS[0]
            self.tally.operations += 1
            try:
                await self.apply(op)
            except (SessionNotFoundError, SessionExistsError):
                self.tally.errors += 1
            self.tally.checks += 1
            assert await observe_org(self.store, other) == seen[other], f"{op} changed {other}"
            seen[op.org] = await observe_org(self.store, op.org)
            for org in ORGS:
                stranger = ORGS[1] if org == ORGS[0] else ORGS[0]
                text = json.dumps(seen[org], ensure_ascii=False)
                assert marker(stranger) not in text, f"{stranger}'s data shows in {org}"
                assert all(s["org_id"] == org for s in seen[org]["list"])
            self.tally.passed += 1


def test_organisations_never_see_or_change_each_other(
    backend: str, sync_url: str | None, figures: Figures
) -> None:
    loop = OwnedLoop()
    tally = Tally()
    engine: AsyncEngine | None = None
    sql_store: SQLStore | None = None
    if sync_url is not None:
        engine = create_async_engine(sync_url)
        sql_store = SQLStore(engine)

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(ops=st.lists(ops_strategy, min_size=4, max_size=16))
    def check(ops: list[Op]) -> None:
        store: Store
        if engine is None or sql_store is None:
            store = InMemoryStore()
        else:
            loop.run(reset_tables(engine))
            store = sql_store
        loop.run(Tenants(store, tally).run(ops))

    try:
        check()
    finally:
        if engine is not None:
            loop.run(engine.dispose())
        loop.close()
    figures.record(
        "tenancy: 2 orgs, same app/user/session ids",
        backend,
        operations=tally.operations,
        expected=tally.checks,
        found=tally.passed,
        errors=tally.errors,
    )


@pytest.mark.parametrize("empty", ["", None])
async def test_list_with_an_empty_org_is_refused(store: Store, empty: Any) -> None:
    await Manager(store).create("org-a", "u1")
    with pytest.raises(InvalidArgumentError):
        await store.list(Filter(empty))
    with pytest.raises(InvalidArgumentError):
        Filter(empty, user_id="u1")
