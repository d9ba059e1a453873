"""Tracing works: OpenTelemetry's SQLAlchemy and asyncpg instrumentations on the store's engine.

Every operation of every store works with the instrumentations attached, and each statement
yields a span with its SQL (the SDK's in-memory exporter collects them). A listener on the
engine's cursor events gets what SQLAlchemy gives it (a real cursor and execution context),
and a listener's error fails the operation before anything commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Filter, Manager, SessionService, SQLStore, StoreError
from support.sql import SQL_BACKENDS

pytestmark = pytest.mark.parametrize("backend", SQL_BACKENDS)


@pytest.fixture
def spans(engine: AsyncEngine, backend: str) -> Iterator[InMemorySpanExporter]:
    """The spans of the instrumented engine (and of asyncpg itself on Postgres)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # skip_dep_check: the instrumentation declares SQLAlchemy < 2.1; the lowest-versions run
    # of this suite checks it on a version it supports, this one on the newest.
    sqlalchemy = SQLAlchemyInstrumentor()
    sqlalchemy.instrument(engine=engine.sync_engine, tracer_provider=provider, skip_dep_check=True)
    asyncpg = AsyncPGInstrumentor()
    if backend == "postgres":
        asyncpg.instrument(tracer_provider=provider, skip_dep_check=True)
    yield exporter
    if backend == "postgres":
        asyncpg.uninstrument()
    sqlalchemy.uninstrument()


def statement_spans(exporter: InMemorySpanExporter) -> list[str]:
    """The SQL of every span that carries a statement."""
    found = []
    for span in exporter.get_finished_spans():
        sql = (span.attributes or {}).get("db.statement")
        if isinstance(sql, str):
            found.append(sql)
    return found


async def test_every_operation_works_and_each_statement_has_a_span(
    engine: AsyncEngine, spans: InMemorySpanExporter
) -> None:
    store = SQLStore(engine)
    manager = Manager(store, app_name="app")
    service = SessionService(store, org_id="org")

    def traced() -> list[str]:
        found = statement_spans(spans)
        spans.clear()
        return found

    session = await manager.create("org", "u", state={"k": 1, "user:u": 1, "app:a": 1})
    assert any("INSERT" in sql.upper() for sql in traced())
    session = await manager.get("org", session.id)
    assert traced()
    session.set("k", 2)
    session.delete("user:u")
    await manager.save(session)
    assert traced()
    await manager.touch(session, messages=1, tokens=2, first_message="hello")
    await manager.append_event(session, Event("user", {"text": "hi"}, state_delta={"app:a": 2}))
    assert traced()
    assert [e.content for e in await store.list_events("org", session.id)] == [{"text": "hi"}]
    assert (await store.get_with_events("org", session.id, limit=5)).events
    assert len(await manager.list(Filter("org", with_state=True))) == 1
    child = await manager.fork("org", session.id, with_events=True)
    assert (await store.append_events("org", child.id, [Event("a"), Event("b")]))[-1].seq == 3
    assert [e.seq for e in await store.truncate_events("org", child.id, after_seq=1)] == [2, 3]
    got = await service.get(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert await store.get_shared_state("org", "app", "u") == {"app:a": 2}
    assert traced()
    await manager.delete("org", child.id)
    assert await manager.purge("org", older_than=timedelta(days=1)) == 0
    assert await manager.delete_user("org", "u") == 1
    assert traced()
    assert await manager.list(Filter("org")) == []


async def test_a_listener_gets_a_real_cursor_and_context(engine: AsyncEngine) -> None:
    seen: list[tuple[Any, Any]] = []

    def before(conn: Any, cursor: Any, statement: str, params: Any, ctx: Any, many: Any) -> None:
        seen.append((cursor, ctx))

    event.listen(engine.sync_engine, "before_cursor_execute", before)
    try:
        manager = Manager(SQLStore(engine))
        session = await manager.create("org", "u")
        await manager.get("org", session.id)
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", before)
    assert seen
    assert all(cursor is not None and ctx is not None for cursor, ctx in seen)


async def test_a_failing_listener_fails_the_write_before_it_commits(engine: AsyncEngine) -> None:
    class Boom(Exception):
        pass

    def after(conn: Any, cursor: Any, statement: str, params: Any, ctx: Any, many: Any) -> None:
        if statement.lstrip().upper().startswith(("INSERT", "WITH")):
            raise Boom("listener failed")

    store = SQLStore(engine)
    event.listen(engine.sync_engine, "after_cursor_execute", after)
    try:
        with pytest.raises((Boom, StoreError)):
            await Manager(store).create("org", "u", id="s")
    finally:
        event.remove(engine.sync_engine, "after_cursor_execute", after)
    # Nothing of the failed create was committed: the id is free.
    assert await store.list(Filter("org")) == []
    await Manager(store).create("org", "u", id="s")
