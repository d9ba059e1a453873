"""Model-based: random operations run on an ``InMemoryStore`` and on a ``SQLStore`` (a SQLite
file; Postgres) must give the same observable results.

A hypothesis ``RuleBasedStateMachine`` applies every operation to both stores in turn and
compares what comes back: sessions (state with JSON types, versions, counters, titles,
parents), listings in order, events (seqs, ids, content, deltas, timestamps), counts, and the
exact exception class when an operation fails. At the end of each run the whole observable
state of every organisation is compared too. The SQL store runs on an event loop the
machine owns; the engine is created and disposed inside it.

``-0.0`` is left out of the generated values: the SQL stores give it back as ``0.0`` and the
memory store does not, a gap of its own (``test_negative_zero_reads_back_as_zero_everywhere``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar, TypeVar

import pytest

pytest.importorskip("hypothesis", reason="hypothesis (the test group) is not installed")

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    multiple,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import Event, Filter, InMemoryStore, Session, SessionError, SQLStore, Store
from reliability.figures import Figures
from reliability.helpers import OwnedLoop, event_view, observe_org, reset_tables, session_view
from support.sql import PG_DISTRIBUTED, STORE_SQL_BACKENDS

_T = TypeVar("_T")

pytestmark = pytest.mark.parametrize("backend", [*STORE_SQL_BACKENDS, PG_DISTRIBUTED])

ORGS = ("o1", "o2")
DELETE = object()
"""A change that deletes its key."""

GOOD_KEYS = st.sampled_from(["k1", "k2", "user:k1", "user:k2", "app:k1", "app:k2", "temp:k1"])
BAD_KEYS = st.sampled_from(["", "user:", "nul\x00", "app:\ud800"])


def rarely(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``good``; one draw in 16 from ``bad`` (both stores must then refuse alike)."""
    # Not 0: hypothesis favours the bounds of a range, which would make ``bad`` common.
    return st.integers(0, 15).flatmap(lambda n: bad if n == 9 else good)


KEYS = rarely(GOOD_KEYS, BAD_KEYS)
SAFE_FLOATS = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda f: not (f == 0 and math.copysign(1.0, f) < 0)
)
TEXT = st.text(st.characters(exclude_characters="\x00"), max_size=6)  # NUL: in BAD_VALUES
SCALARS = st.none() | st.booleans() | st.integers() | SAFE_FLOATS | TEXT
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=6,
)
BAD_VALUES = st.sampled_from([math.nan, math.inf, "nul\x00", "\udc00", (1, 2), {1: "x"}])
VALUES = rarely(JSON_VALUES, BAD_VALUES)
UTC_PLUS_2 = timezone(timedelta(hours=2))
STAMPS = st.sampled_from(
    [
        datetime(2024, 1, 1, tzinfo=timezone.utc),
        datetime(2024, 1, 1, 2, 0, 0, 1, tzinfo=UTC_PLUS_2),
        datetime(2024, 6, 1, 12, 30, tzinfo=timezone.utc),
        datetime(2025, 1, 1, 0, 0, 0, 999_999, tzinfo=UTC_PLUS_2),
    ]
)
AFTER = st.none() | STAMPS | st.just(datetime(2024, 1, 1))  # the last one is naive
SIDS = st.sampled_from(["s1", "s2", "s3"])
TITLES = rarely(st.sampled_from(["", "t1", "a longer title"]), st.just("nul\x00"))


@dataclass
class Outcome:
    """What an operation gave: a comparable value, or the class of the error it raised."""

    value: Any = None
    error: type[BaseException] | None = None


@dataclass
class Tally:
    """What the state machines did, for the figures table."""

    steps: int = 0
    compared: int = 0
    same: int = 0
    errors: int = 0


class StoresAgree(RuleBasedStateMachine):
    """Runs every operation on an InMemoryStore and a SQLStore and compares the results."""

    url: ClassVar[str]
    tally: ClassVar[Tally]

    copies = Bundle("copies")

    def __init__(self) -> None:
        super().__init__()
        self.runner = OwnedLoop()
        self.engine = create_async_engine(self.url)
        self.runner.run(reset_tables(self.engine))
        self.memory: Store = InMemoryStore()
        self.sql: Store = SQLStore(self.engine)
        self.event_serial = 0

    def teardown(self) -> None:
        try:
            self.compare_everything()
        finally:
            self.runner.run(self.engine.dispose())
            self.runner.close()

    # -- running and comparing -------------------------------------------------------------

    async def _outcome(self, work: Awaitable[_T], view: Callable[[_T], Any]) -> Outcome:
        try:
            return Outcome(value=view(await work))
        except SessionError as exc:
            return Outcome(error=type(exc))

    def both(self, op: Callable[[Store], Awaitable[_T]], view: Callable[[_T], Any]) -> Outcome:
        """Run ``op`` on each store (fresh inputs for each) and require the same outcome."""
        self.tally.steps += 1
        mem = self.runner.run(self._outcome(op(self.memory), view))
        sql = self.runner.run(self._outcome(op(self.sql), view))
        self.tally.compared += 1
        assert mem == sql, f"memory gave {mem}, SQL gave {sql}"
        self.tally.same += 1
        if mem.error is not None:
            self.tally.errors += 1
        return mem

    def compare_everything(self) -> None:
        """The whole observable state of every organisation is the same in both stores."""
        for org in ORGS:
            mem = self.runner.run(observe_org(self.memory, org, with_times=False))
            sql = self.runner.run(observe_org(self.sql, org, with_times=False))
            self.tally.compared += 1
            assert mem == sql, f"organisation {org} differs"
            self.tally.same += 1

    @staticmethod
    def meta(session: Session) -> dict[str, Any]:
        return session_view(session, with_times=False)

    # -- rules -----------------------------------------------------------------------------

    @initialize(
        states=st.lists(st.dictionaries(GOOD_KEYS, JSON_VALUES, max_size=4), min_size=3, max_size=3)
    )
    def seed(self, states: list[dict[str, Any]]) -> None:
        """Start from sessions to work on: the same ids in both organisations."""
        for (org, sid, user), state in zip(
            [("o1", "s1", "u1"), ("o2", "s1", "u1"), ("o1", "s2", "u2")], states, strict=True
        ):
            self.create(org=org, sid=sid, user=user, app="a1", state=state, title="")

    @rule(
        org=st.sampled_from(ORGS),
        sid=SIDS,
        user=st.sampled_from(["u1", "u2"]),
        app=st.sampled_from(["a1", "a2"]),
        state=st.dictionaries(KEYS, VALUES, max_size=4),
        title=TITLES,
    )
    def create(
        self, org: str, sid: str, user: str, app: str, state: dict[str, Any], title: str
    ) -> None:
        self.both(
            lambda s: s.create(
                Session(
                    id=sid, org_id=org, user_id=user, app_name=app, title=title, state=dict(state)
                )
            ),
            self.meta,
        )

    @rule(org=st.sampled_from(ORGS), sid=SIDS)
    def get(self, org: str, sid: str) -> None:
        self.both(lambda s: s.get(org, sid), self.meta)

    @rule(target=copies, org=st.sampled_from(ORGS), sid=SIDS)
    def load_copy(self, org: str, sid: str) -> Any:
        pair: dict[str, Session] = {}

        async def load(store: Store) -> Session:
            session = await store.get(org, sid)
            pair["memory" if store is self.memory else "sql"] = session
            return session

        outcome = self.both(load, self.meta)
        return multiple() if outcome.error else multiple(pair)

    @rule(
        pair=copies,
        changes=st.lists(st.tuples(KEYS, st.just(DELETE) | VALUES), max_size=4),
        title=st.none() | TITLES,
    )
    def save_copy(
        self, pair: dict[str, Session], changes: list[tuple[str, Any]], title: str | None
    ) -> None:
        for copy in pair.values():
            for key, value in changes:
                if value is DELETE:
                    copy.state.pop(key, None)
                else:
                    copy.state[key] = value  # past Session.set, so the store must refuse
            if title is not None:
                copy.title = title
        self.both(lambda s: s.update(pair["memory" if s is self.memory else "sql"]), self.meta)

    @rule(
        org=st.sampled_from(ORGS),
        sid=SIDS,
        changes=st.lists(st.tuples(KEYS, st.just(DELETE) | VALUES), min_size=1, max_size=4),
        title=st.none() | TITLES,
        interfere=st.sampled_from([None, "touch", "append", "save"]),
    )
    def save_fresh(
        self,
        org: str,
        sid: str,
        changes: list[tuple[str, Any]],
        title: str | None,
        interfere: str | None,
    ) -> None:
        """Read a session, change it, save it (the usual turn of a service); or let another
        writer touch, append to or save the session between the read and the save."""

        async def turn(store: Store) -> Session:
            session = await store.get(org, sid)
            if interfere == "touch":
                await store.touch(org, sid, messages=1)
            elif interfere == "append":
                event = Event("other", content="x", state_delta={"k2": "other"}, id="x")
                event.timestamp = datetime(2024, 1, 1, tzinfo=timezone.utc)
                await store.append_event(org, sid, event)
            elif interfere == "save":
                rival = await store.get(org, sid)
                rival.set("user:k2", "rival")
                await store.update(rival)
            for key, value in changes:
                if value is DELETE:
                    session.state.pop(key, None)
                else:
                    session.state[key] = value
            if title is not None:
                session.title = title
            return await store.update(session)

        self.both(turn, self.meta)

    @rule(
        org=st.sampled_from(ORGS),
        sid=SIDS,
        author=st.sampled_from(["user", "agent", ""]),
        content=VALUES,
        delta=st.dictionaries(KEYS, VALUES, max_size=3),
        tokens=st.integers(0, 100),
        stamp=STAMPS,
        expected=st.none() | st.integers(1, 6),
    )
    def append_event(
        self,
        org: str,
        sid: str,
        author: str,
        content: Any,
        delta: dict[str, Any],
        tokens: int,
        stamp: datetime,
        expected: int | None,
    ) -> None:
        self.event_serial += 1
        event_id = f"e{self.event_serial}"

        def event() -> Event:
            return Event(
                author,
                content=content,
                state_delta=dict(delta),
                tokens=tokens,
                id=event_id,
                timestamp=stamp,
            )

        self.both(
            lambda s: s.append_event(org, sid, event(), expected_version=expected), event_view
        )

    @rule(
        org=st.sampled_from(ORGS),
        sid=SIDS,
        limit=st.none() | st.integers(0, 4),
        after=AFTER,
    )
    def list_events(self, org: str, sid: str, limit: int | None, after: datetime | None) -> None:
        self.both(
            lambda s: s.list_events(org, sid, limit=limit, after=after),
            lambda events: [event_view(e) for e in events],
        )

    @rule(
        org=st.sampled_from(ORGS),
        sid=SIDS,
        messages=st.integers(0, 3),
        tokens=st.integers(0, 50),
        title=TITLES,
    )
    def touch(self, org: str, sid: str, messages: int, tokens: int, title: str) -> None:
        self.both(
            lambda s: s.touch(org, sid, messages=messages, tokens=tokens, title=title), self.meta
        )

    @rule(
        org=st.sampled_from(ORGS),
        sid=SIDS,
        new_sid=st.sampled_from(["s2", "s3", "s4"]),
        with_events=st.booleans(),
    )
    def fork(self, org: str, sid: str, new_sid: str, with_events: bool) -> None:
        self.both(
            lambda s: s.fork(org, sid, new_session_id=new_sid, with_events=with_events), self.meta
        )

    @rule(org=st.sampled_from(ORGS), sid=SIDS)
    def delete(self, org: str, sid: str) -> None:
        self.both(lambda s: s.delete(org, sid), lambda _: None)

    @rule(org=st.sampled_from(ORGS), user=st.sampled_from(["u1", "u2"]))
    def delete_user(self, org: str, user: str) -> None:
        self.both(lambda s: s.delete_user(org, user), lambda n: n)

    @rule(
        org=st.sampled_from(ORGS),
        everything=rarely(st.just(False), st.just(True)),
        dry_run=st.booleans(),
    )
    def purge(self, org: str, everything: bool, dry_run: bool) -> None:
        older_than = timedelta(0) if everything else timedelta(days=1)
        self.both(lambda s: s.purge(org, older_than=older_than, dry_run=dry_run), lambda n: n)

    @rule(
        org=st.sampled_from(ORGS),
        user=st.none() | st.sampled_from(["u1", "u2"]),
        app=st.none() | st.sampled_from(["a1", "a2"]),
        limit=st.integers(0, 3),
        parent=st.none() | st.sampled_from(["s1", "s2"]),
    )
    def list_sessions(
        self, org: str, user: str | None, app: str | None, limit: int, parent: str | None
    ) -> None:
        wanted = Filter(org, user_id=user, app_name=app, limit=limit, parent_id=parent)
        self.both(lambda s: s.list(wanted), lambda found: [self.meta(m) for m in found])


def test_memory_and_sql_stores_agree(backend: str, sync_url: str | None, figures: Figures) -> None:
    assert sync_url is not None
    database: str = sync_url

    class Machine(StoresAgree):
        url = database
        tally = Tally()

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
    figures.record(
        "model: InMemoryStore vs SQLStore, same results",
        backend,
        operations=Machine.tally.steps,
        expected=Machine.tally.compared,
        found=Machine.tally.same,
        errors=Machine.tally.errors,
    )
