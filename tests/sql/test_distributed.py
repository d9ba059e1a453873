"""Distributed mode (Citus, #17): Citus's router rules over every statement the mode can run,
how the mode is chosen, what it runs, the plans of the reads on one Postgres, and the
the scaling guide's recipe for distributing the schema.

The contract suite and the reliability scenarios run in distributed mode too, as the
``postgres-distributed`` backend (``tests/conftest.py``), forced on plain Postgres; no Citus
server exists here, so the rules Citus routes by are checked on the statements themselves
(``tests/support/citus_rules.py``).
"""

from __future__ import annotations

import inspect
import itertools
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Text, cast, select
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.sql import Executable

from durable_sessions import Event, Filter, InvalidArgumentError, Manager, SQLStore
from durable_sessions.sql.compiled import compile_statement
from durable_sessions.sql.dialect import dialect_ops
from durable_sessions.sql.dialects.citus.programs import (
    GENERATED_VECTOR,
    SETTING,
    DistributedStatements,
    detect_schema,
    make_distributed,
)
from durable_sessions.sql.dialects.postgresql.programs import PostgresStatements
from durable_sessions.sql.runner import Result
from durable_sessions.sql.schema import VERSION_TABLE, metadata
from durable_sessions.sql.statements import META, SESSION_KEY, S
from durable_sessions.state import ScopedDelta
from support.citus_rules import recording, violations
from support.sql import PG_DISTRIBUTED, data_statements, raw_pg, statements

DIALECT = PGDialect_asyncpg()
OPS = dialect_ops("postgresql", "asyncpg")
CITUS_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "citus.md"
POSTGRES = pytest.param("postgres", marks=pytest.mark.postgres)


def compile_every_shape(q: DistributedStatements) -> list[str]:
    """Compile every dynamic shape of ``q``: each public method whose parameters are all
    booleans, with every combination of them (list, events, contents, get with events,
    batch appends, and any shape added later in that form), and both retentions. Returns
    the names of the shape methods."""
    names = []
    for name in dir(q):
        method = getattr(q, name)
        if name.startswith("_") or not callable(method):
            continue
        parameters = list(inspect.signature(method).parameters.values())
        if not parameters or any(p.annotation not in ("bool", bool) for p in parameters):
            continue
        for values in itertools.product((False, True), repeat=len(parameters)):
            pairs = list(zip(parameters, values, strict=True))
            args = [v for p, v in pairs if p.kind is not p.KEYWORD_ONLY]
            kwargs = {p.name: v for p, v in pairs if p.kind is p.KEYWORD_ONLY}
            built = method(*args, **kwargs)
            if isinstance(built, Executable):
                names.append(name)
                q.shape(("every shape", name, *values), lambda built=built: built)
    for kind in ("purge", "delete_user"):
        q.retention(kind)
    return sorted(set(names))


# -- Citus's router rules -------------------------------------------------------------------


def test_every_statement_distributed_mode_can_run_is_routed_to_one_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each statement references only the schema's tables, filters every table it reads or
    writes on ``org_id = :k_org`` (never through another table's column), and is no
    data-modifying CTE: checked as each is compiled (``citus_rules.recording``)."""
    with recording(monkeypatch) as seen:
        q = DistributedStatements(OPS, DIALECT)
        shapes = compile_every_shape(q)
        truncation = q.truncation_steps()
    assert {"list_query", "events_query", "event_contents", "pg_get_with_events"} <= set(shapes)
    assert "append_many" in shapes
    compiled = [compile_statement(stmt, DIALECT).sql for stmt in seen]
    assert not [sql for sql in compiled if sql.lstrip().upper().startswith("WITH")]
    # Every step of every write, the shared-state read and the locks are among them.
    for attribute in ("insert_session", "upsert_user", "upsert_app", "insert_event",
                      "copy_events", "update", "append_private", "newest_seq",
                      "delete_user_keys", "delete_app_keys", "parent", "lock_session",
                      "shared", "get", "touch", "lock_timeout"):  # fmt: skip
        assert getattr(q, attribute).sql in compiled, attribute
    assert all(step.sql in compiled for step in truncation)
    assert len(seen) >= 60


def test_the_rules_refuse_what_citus_cannot_route() -> None:
    """The check is not vacuous: the one-statement writes of plain Postgres mode, and the
    shared-state subqueries correlated on ``ds_sessions.org_id``, are refused."""
    q = PostgresStatements(OPS, DIALECT)
    for statement in (
        q._pg_fork(),
        q._pg_append_many((False, False, False, False)),
        q._pg_append_many((True, True, False, False)),
        q._pg_truncate(),
        q._pg_truncate(pop=True),
    ):
        assert any("data-modifying CTE" in v for v in violations(statement))
    correlated = select(
        *META,
        S.c.state,
        q._user_agg(S.c.org_id, S.c.app_name, S.c.user_id),
        q._app_agg(S.c.org_id, S.c.app_name),
    ).where(SESSION_KEY)
    assert violations(correlated) == [
        "SELECT from ds_app_state is not filtered on ds_app_state.org_id = :k_org",
        "SELECT from ds_user_state is not filtered on ds_user_state.org_id = :k_org",
    ]
    assert violations(select(*META).where(S.c.id == "x")) == [
        "SELECT from ds_sessions is not filtered on ds_sessions.org_id = :k_org"
    ]


@pytest.mark.parametrize("backend", [PG_DISTRIBUTED])
async def test_distributed_mode_runs_only_the_statements_it_checked(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What runs is what was checked: every statement of a workload touching every
    operation is one the distributed statements compiled (so none is a WITH)."""
    with recording(monkeypatch) as seen:
        store = SQLStore(engine, distributed=True)
        manager = Manager(store, app_name="app")
        with statements(engine) as ran:
            await _every_operation(store, manager)
    checked = {compile_statement(stmt, DIALECT).sql for stmt in seen}
    data = data_statements(ran)
    assert data
    assert [sql for sql in data if sql not in checked] == []


def test_every_distributed_write_is_one_transaction() -> None:
    """Writes of several statements run as one transaction on one connection (the runner's
    "write" mode); delete (its events go by ON DELETE CASCADE) and touch are one statement."""
    programs = make_distributed(OPS, DIALECT)
    key = {"k_org": "o", "k_id": "s"}
    jobs = [
        programs.create({"org_id": "o", "app_name": "", "user_id": "u"}, ScopedDelta()),
        programs.update(key, ScopedDelta()),
        programs.append(dict(key), Event("user"), ScopedDelta()),
        programs.append_many(dict(key), [Event("user")], ScopedDelta()),
        programs.fork(key),
        *programs.truncate(key),
        *programs.pop(dict(key)),
    ]
    assert [job.mode for job in jobs] == ["write"] * 7
    assert programs.delete({**key, "k_app": None, "k_user": None}).mode == "atomic"
    for job in jobs:
        job.program.close()


async def _every_operation(store: SQLStore, manager: Manager) -> None:
    session = await manager.create("org", "alice", state={"p": 1, "user:u": 1, "app:a": 1})
    await manager.get("org", session.id)
    await store.append_event("org", session.id, Event("user", state_delta={"p": 2, "user:u": 2}))
    await store.append_events("org", session.id, [Event("user"), Event("agent", tokens=3)])
    loaded = await manager.get("org", session.id)
    loaded.delete("user:u")
    loaded.delete("app:a")
    loaded.set("q", 1)
    await manager.save(loaded)
    await store.get_with_events("org", session.id, limit=2)
    await store.list_events("org", session.id)
    await store.list_event_contents("org", session.id, limit=1)
    await store.touch("org", session.id, messages=1, tokens=1, title="t")
    child = await manager.fork("org", session.id, with_events=True)
    await store.truncate_events("org", child.id, after_seq=1)
    assert await store.pop_event("org", child.id) is not None
    assert await store.pop_event("org", child.id) is None
    await manager.list(Filter("org", user_id="alice", with_state=True, limit=5))
    await manager.list_page(Filter("org", limit=1))
    await store.get_shared_state("org", "app", "alice")
    await store.delete("org", child.id, app_name="app", user_id="alice")
    await store.purge("org", older_than=timedelta(days=1))
    await store.delete_user("org", "alice")


# -- choosing the mode ----------------------------------------------------------------------


def _decide(citus: bool, setting: str | None) -> bool:
    program = detect_schema(DIALECT)
    next(program)
    row = type("Row", (), {"citus": citus, "setting": setting, "vectors": None})()
    try:
        program.send(Result([row], 1))
    except StopIteration as stop:
        return bool(stop.value.distributed)
    raise AssertionError("one statement decides")


def test_the_mode_follows_the_citus_extension_unless_the_setting_says_otherwise() -> None:
    assert _decide(citus=True, setting=None) is True
    assert _decide(citus=False, setting=None) is False
    assert _decide(citus=True, setting="") is True
    assert _decide(citus=True, setting="off") is False
    assert _decide(citus=False, setting="on") is True
    assert _decide(citus=False, setting=" TRUE ") is True
    with pytest.raises(InvalidArgumentError, match=SETTING):
        _decide(citus=False, setting="sometimes")


@pytest.mark.parametrize("backend", [POSTGRES, PG_DISTRIBUTED])
async def test_the_mode_is_decided_once_on_first_use(backend: str, engine: AsyncEngine) -> None:
    store = SQLStore(engine)
    assert store.distributed is None
    manager = Manager(store, app_name="app")
    with statements(engine) as ran:
        session = await manager.create("org", "alice")
        await manager.get("org", session.id)
        await manager.fork("org", session.id)
    assert sum("pg_extension" in sql for sql, _ in ran) == 1
    assert store.distributed is (backend == "postgres-distributed")
    # The one-statement writes of plain mode are data-modifying CTEs; distributed mode has none.
    ctes = [sql for sql in data_statements(ran) if sql.startswith("WITH")]
    assert bool(ctes) is (backend == "postgres")


@pytest.mark.parametrize("backend", [PG_DISTRIBUTED])
async def test_an_explicit_mode_wins(engine: AsyncEngine) -> None:
    store = SQLStore(engine, distributed=False)  # on a database whose setting is on
    assert store.distributed is False
    with statements(engine) as ran:
        await Manager(store).create("org", "alice")
    # It still reads the schema once (the kind of search vector column), not the mode.
    assert store.distributed is False
    written = [sql for sql in data_statements(ran) if "pg_attribute" not in sql]
    assert written[0].startswith("WITH")


@pytest.mark.parametrize("backend", [PG_DISTRIBUTED])
async def test_an_explicit_distributed_mode_asks_nothing(engine: AsyncEngine) -> None:
    store = SQLStore(engine, distributed=True)
    assert store.distributed is True
    with statements(engine) as ran:
        await Manager(store).create("org", "alice")
    assert not any("pg_extension" in sql or "pg_attribute" in sql for sql, _ in ran)


@pytest.mark.postgres
async def test_a_setting_that_is_neither_on_nor_off_is_refused(fresh_pg_url: Any) -> None:
    url = fresh_pg_url()
    async with raw_pg(url) as conn:
        name = await conn.fetchval("SELECT current_database()")
        await conn.execute(f"ALTER DATABASE \"{name}\" SET {SETTING} = 'sometimes'")
    engine = create_async_engine(url)
    try:
        store = SQLStore(engine)
        await store.migrate()
        with pytest.raises(InvalidArgumentError, match="must be on or off"):
            await store.get("org", "id")
        assert store.distributed is None
    finally:
        await engine.dispose()


@pytest.mark.sqlite
async def test_sqlite_has_no_distributed_mode(sqlite_url: str) -> None:
    engine = create_async_engine(sqlite_url)
    try:
        with pytest.raises(InvalidArgumentError, match="Postgres"):
            SQLStore(engine, distributed=True)
        assert SQLStore(engine, distributed=False).distributed is False
        assert SQLStore(engine).distributed is False
    finally:
        await engine.dispose()


# -- plans on one Postgres ------------------------------------------------------------------


def _shape(plan: dict[str, Any]) -> list[tuple[str, ...]]:
    """The plan's nodes, depth first: (relationship, node type, relation, index)."""
    node = (
        plan.get("Parent Relationship", ""),
        plan["Node Type"],
        plan.get("Relation Name", ""),
        plan.get("Index Name", ""),
    )
    return [node, *[n for child in plan.get("Plans", ()) for n in _shape(child)]]


SEED = """
INSERT INTO ds_sessions
SELECT 'org' || o, 's' || n, 'u' || (n % 50), 'app', '', '{}'::jsonb, NULL, now(), now(),
       0, 0, 0, 1, ''
FROM generate_series(1, 20) o, generate_series(1, 500) n;
INSERT INTO ds_user_state
SELECT 'org' || o, 'app', 'u' || u, 'k' || k, '1'::jsonb, now()
FROM generate_series(1, 20) o, generate_series(0, 49) u, generate_series(1, 10) k;
INSERT INTO ds_app_state
SELECT 'org' || o, 'app', 'k' || k, '1'::jsonb, now()
FROM generate_series(1, 20) o, generate_series(1, 200) k;
"""


async def _explain(conn: Any, statement: Any, params: dict[str, Any]) -> dict[str, Any]:
    compiled = compile_statement(statement, DIALECT)
    text = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {compiled.sql}", *compiled.bind(params))
    plan: dict[str, Any] = json.loads(text)[0]["Plan"]
    return plan


@pytest.mark.parametrize("backend", [POSTGRES])
async def test_reads_bound_on_the_org_plan_as_the_correlated_ones_did(
    engine: AsyncEngine, backend_url: str
) -> None:
    """On one Postgres, filtering the shared-state subqueries on the bound org (instead of
    correlating on ``ds_sessions.org_id``) gives the same plan at the same cost: the same
    nodes, the shared state read through its primary keys. Compared for ``get`` and for
    ``list`` with state, on 10,000 sessions of 20 organisations after ANALYZE."""
    async with raw_pg(backend_url) as conn:
        await conn.execute(SEED)
    q = PostgresStatements(OPS, DIALECT)
    listed = (
        select(*META, cast(S.c.state, Text).label("state"))
        .where(q.whole_org())  # the listing's own filter, whatever the state columns
        .order_by(S.c.updated_at.desc(), S.c.id.desc())
        .subquery("listed")
    )
    correlated = [
        S.c.state,
        q._user_agg(S.c.org_id, S.c.app_name, S.c.user_id),
        q._app_agg(S.c.org_id, S.c.app_name),
    ]
    pairs = [
        (
            select(*META, *correlated).where(SESSION_KEY),
            select(*META, *q.state_columns()).where(SESSION_KEY),
            {"k_org": "org7", "k_id": "s77"},
        ),
        (
            # list reads each owner's shared state once (with_owner_state), correlated or not
            q.with_owner_state(listed, listed.c.org_id),
            q.list_query(False, False, False, False, True),
            {"k_org": "org7"},
        ),
    ]
    async with raw_pg(backend_url) as conn:
        await conn.execute("ANALYZE")
        for before, after, params in pairs:
            old = await _explain(conn, before, params)
            new = await _explain(conn, after, params)
            assert _shape(new) == _shape(old), (old, new)
            assert new["Total Cost"] <= old["Total Cost"] + 1e-6, (old, new)
            relations = {relation for _, _, relation, _ in _shape(new) if relation}
            assert relations == {"ds_sessions", "ds_user_state", "ds_app_state"}
            # The shared state is read through an index, never scanned whole.
            assert not [n for n in _shape(new) if n[1] == "Seq Scan" and n[2] != "ds_sessions"]


# -- the scaling guide's recipe ----------------------------------------------------------------


def _guide_recipe() -> list[str]:
    text = CITUS_GUIDE.read_text(encoding="utf-8")
    (block,) = re.findall(r"^ *```sql\n(.*?)^ *```", text, re.S | re.M)
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_the_guide_recipe_is_distribution_sql() -> None:
    from durable_sessions.sql.dialects.citus import distribution_sql

    assert _guide_recipe() == distribution_sql()
    readme = (CITUS_GUIDE.parents[2] / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"^```sql\n(.*?)^```", readme, re.S | re.M)
    assert [line.strip() for line in block.splitlines() if line.strip()] == distribution_sql()


def test_the_recipe_distributes_every_table_of_the_schema_sessions_first() -> None:
    from durable_sessions.sql.dialects.citus import distribution_sql

    recipe = distribution_sql()
    assert recipe[: len(GENERATED_VECTOR)] == GENERATED_VECTOR  # before any distribution
    distributing = recipe[len(GENERATED_VECTOR) :]
    named = [re.search(r"create_distributed_table\('(\w+)', 'org_id'", s)[1] for s in distributing]  # type: ignore[index]
    assert named[0] == "ds_sessions"
    assert sorted(named) == sorted(t.name for t in metadata.sorted_tables)
    assert VERSION_TABLE not in " ".join(recipe)  # Alembic's table stays local
    for statement in distributing[1:]:
        assert statement.endswith("colocate_with => 'ds_sessions');")


STUB = """
CREATE TABLE distributed_log (n serial, relation text, colocated text);
CREATE FUNCTION create_distributed_table(
    table_name regclass, distribution_column text, colocate_with text DEFAULT 'default'
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM pg_attribute WHERE attrelid = table_name AND attname = distribution_column;
    IF NOT FOUND THEN RAISE EXCEPTION 'no column % in %', distribution_column, table_name; END IF;
    PERFORM 1 FROM pg_trigger WHERE tgrelid = table_name AND NOT tgisinternal;
    IF FOUND THEN RAISE EXCEPTION 'cannot distribute % because it has triggers', table_name; END IF;
    IF colocate_with <> 'default' AND NOT EXISTS (
        SELECT 1 FROM distributed_log WHERE relation = colocate_with
    ) THEN
        RAISE EXCEPTION '% is not distributed yet', colocate_with;
    END IF;
    INSERT INTO distributed_log (relation, colocated) VALUES (table_name::text, colocate_with);
END $$;
"""


@pytest.mark.postgres
async def test_the_recipe_runs_on_a_migrated_database(fresh_pg_url: Any) -> None:
    """Every statement of the recipe runs, in order, after ``migrate``, against a stand-in
    for Citus's ``create_distributed_table`` that checks what Citus would: the table and
    its column exist, and a colocation target was distributed before. Every table that
    ``migrate`` made is distributed, but Alembic's version table."""
    from durable_sessions.sql.dialects.citus import distribution_sql

    url = fresh_pg_url()
    engine = create_async_engine(url)
    try:
        await SQLStore(engine).migrate()
    finally:
        await engine.dispose()
    async with raw_pg(url) as conn:
        await conn.execute(STUB)
        for statement in _guide_recipe():
            await conn.execute(statement)
        done = [r[0] for r in await conn.fetch("SELECT relation FROM distributed_log ORDER BY n")]
        made = {
            r["tablename"]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename <> 'distributed_log'"
            )
        }
        generated = await conn.fetchval(
            "SELECT attgenerated::text FROM pg_attribute WHERE attrelid = 'ds_events'::regclass"
            " AND attname = 'search_vector' AND NOT attisdropped"
        )
    distributing = distribution_sql()[len(GENERATED_VECTOR) :]
    assert done == [re.search(r"'(\w+)'", s)[1] for s in distributing]  # type: ignore[index]
    assert done[0] == "ds_sessions"
    assert set(done) == made - {VERSION_TABLE}
    assert generated == "s"  # computed by Postgres again, as distributed mode wants
    engine = create_async_engine(url)
    try:  # distributed mode writes events there, and finds them
        store = SQLStore(engine, distributed=True)
        await Manager(store).create("org", "alice", id="s")
        await store.append_event("org", "s", Event("user", content={"text": "found ALONE"}))
        await store.append_events("org", "s", [Event("user", content="found in a batch")])
        await store.fork("org", "s", new_session_id="f", with_events=True)
        hits = await store.search("org", "found")
        assert sorted((h.session_id, h.event.seq) for h in hits) == [
            ("f", 1), ("f", 2), ("s", 1), ("s", 2)
        ]  # fmt: skip
    finally:
        await engine.dispose()
