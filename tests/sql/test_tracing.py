"""Tracing works: OpenTelemetry's SQLAlchemy and asyncpg instrumentations on the store's engine.

Every operation of every store works with the instrumentations attached, and each statement
yields a span with its SQL (the SDK's in-memory exporter collects them). A listener on the
engine's cursor events gets what SQLAlchemy gives it (a real cursor and execution context),
and a listener's error fails the operation before anything commits.
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import pytest

pytest.importorskip(
    "opentelemetry.instrumentation.sqlalchemy",
    reason="OpenTelemetry's instrumentations (the test group) are not installed",
)
pytest.importorskip(
    "opentelemetry.instrumentation.asyncpg",
    reason="OpenTelemetry's instrumentations (the test group) are not installed",
)

import sqlalchemy
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from durable_sessions import Event, Filter, Manager, SessionService, SQLStore, StoreError
from durable_sessions.sql.transfer import export_jsonl, import_jsonl
from support.sql import STORE_SQL_BACKENDS, data_statements, statements

T = TypeVar("T")

pytestmark = pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)


SQLALCHEMY_SCOPE = "opentelemetry.instrumentation.sqlalchemy"
SUPPORTED = sqlalchemy.__version__.startswith("2.0.")
"""The instrumentation (0.65b0 and earlier) declares SQLAlchemy < 2.1: on 2.0 the README's
call is used exactly as written; on 2.1 with ``skip_dep_check=True``, as the README says."""


@pytest.fixture
def spans(engine: AsyncEngine, backend: str) -> Iterator[InMemorySpanExporter]:
    """The spans of the instrumented engine (and of asyncpg itself on Postgres)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = SQLAlchemyInstrumentor()
    if SUPPORTED:  # the README's line
        instrumentor.instrument(engine=engine.sync_engine, tracer_provider=provider)
    else:
        instrumentor.instrument(
            engine=engine.sync_engine, tracer_provider=provider, skip_dep_check=True
        )
    asyncpg = AsyncPGInstrumentor()
    if backend == "postgres":
        asyncpg.instrument(tracer_provider=provider, skip_dep_check=True)
    yield exporter
    if backend == "postgres":
        asyncpg.uninstrument()
    instrumentor.uninstrument()


def statement_spans(exporter: InMemorySpanExporter, scope: str) -> list[str]:
    """The SQL of every span of one instrumentation that carries a statement, in order."""
    found = []
    for span in exporter.get_finished_spans():
        sql = (span.attributes or {}).get("db.statement")
        if isinstance(sql, str) and span.instrumentation_scope.name.startswith(scope):
            found.append(sql)
    return found


async def test_every_operation_works_and_each_statement_has_one_span(
    engine: AsyncEngine, backend: str, spans: InMemorySpanExporter
) -> None:
    store = SQLStore(engine)
    manager = Manager(store, app_name="app")
    service = SessionService(store, org_id="org")
    steps: dict[str, int] = {}

    async def traced(name: str, operation: Awaitable[T]) -> T:
        """Run one operation: each statement it sends has exactly one span with its SQL."""
        spans.clear()
        with statements(engine) as seen:
            result = await operation
        sent = [sql for sql, _ in seen]
        assert sent, name
        assert statement_spans(spans, SQLALCHEMY_SCOPE) == sent, name
        if backend == "postgres":  # asyncpg's own spans carry every statement too
            driver = statement_spans(spans, "opentelemetry.instrumentation.asyncpg")
            assert set(data_statements([(s, None) for s in sent])) <= set(driver), name
        steps[name] = len(sent)
        return result

    session = await traced("create", manager.create("org", "u", id="s", state={"k": 1}))
    out = io.BytesIO()
    await traced("export", export_jsonl(store, out))
    await traced("delete", manager.delete("org", "s"))
    counts = await traced("import", import_jsonl(store, out.getvalue().splitlines()))
    assert counts.sessions == 1
    session = await traced("get", manager.get("org", session.id))
    session.set("k", 2)
    session.set("user:u", 1)
    await traced("save", manager.save(session))
    await traced("touch", manager.touch(session, messages=1, tokens=2, first_message="hello"))
    event = Event("user", {"text": "the needle"}, state_delta={"app:a": 2})
    await traced("append_event", manager.append_event(session, event))
    listed = await traced("list_events", store.list_events("org", session.id))
    assert [e.content for e in listed] == [{"text": "the needle"}]
    after = await traced("list_events after_seq", store.list_events("org", session.id, after_seq=0))
    assert len(after) == 1
    assert (await traced("get_with_events", store.get_with_events("org", session.id))).events
    assert len(await traced("list", manager.list(Filter("org", with_state=True)))) == 1
    page = await traced("list_page", store.list_page(Filter("org", limit=1)))
    assert [s.id for s in page.sessions] == [session.id]
    hits = await traced("search", store.search("org", "needle"))
    assert [h.session_id for h in hits] == [session.id]
    child = await traced("fork", manager.fork("org", session.id, with_events=True))
    appended = await traced("append_events", store.append_events("org", child.id, [Event("a")]))
    assert appended[-1].seq == 2
    removed = await traced("truncate_events", store.truncate_events("org", child.id, after_seq=1))
    assert [e.seq for e in removed] == [2]
    got = await traced(
        "service get", service.get(app_name="app", user_id="u", session_id=session.id)
    )
    assert got is not None
    shared = await traced("get_shared_state", store.get_shared_state("org", "app", "u"))
    assert shared == {"user:u": 1, "app:a": 2}
    await traced("delete", manager.delete("org", child.id))
    assert await traced("purge", manager.purge("org", older_than=timedelta(days=1))) == 0
    assert await traced("delete_user", manager.delete_user("org", "u")) == 1
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
