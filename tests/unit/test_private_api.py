"""The private APIs durable-sessions uses are checked at import: a missing one is a clear
ImportError naming it and the versions, never an AttributeError mid-operation."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import aiosqlite
import pytest
from pydantic import BaseModel
from sqlalchemy import util
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool
from sqlalchemy.sql.dml import UpdateBase

from durable_sessions.sql import _private


def test_the_installed_versions_have_every_private_api() -> None:
    _private.check()


@pytest.mark.parametrize(
    ("owner", "name", "named"),
    [
        (aiosqlite.Connection, "_execute", "aiosqlite.Connection._execute"),
        (aiosqlite.Connection, "_conn", "aiosqlite.Connection._conn"),
        (Pool, "_invalidate", "sqlalchemy.pool.Pool._invalidate"),
        (Engine, "_has_events", "sqlalchemy.engine.Engine._has_events"),
        (util, "greenlet_spawn", "sqlalchemy.util.greenlet_spawn"),
        (UpdateBase, "_returning", "statement._returning"),
    ],
)
def test_a_missing_private_api_is_a_clear_import_error(
    owner: object, name: str, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(owner, name)
    with pytest.raises(ImportError) as caught:
        _private.check()
    message = str(caught.value)
    assert named in message
    assert "SQLAlchemy " in message  # the installed versions checked
    assert "aiosqlite " in message
    assert _private.TESTED in message


def test_importing_the_module_fails_clearly_in_a_fresh_process() -> None:
    code = (
        "import aiosqlite; del aiosqlite.Connection._execute\n"
        "try:\n"
        "    import durable_sessions.sql._private\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "aiosqlite.Connection._execute" in done.stdout
    assert "tested with" in done.stdout


def test_the_accessors_reach_what_they_name() -> None:
    from sqlalchemy import column, insert, table

    stmt = insert(table("t", column("a"))).returning(column("a"))
    assert len(_private.returning_columns(stmt)) == 1
    assert _private.returning_columns(insert(table("t", column("a")))) == ()


# -- pydantic (the ADK adapter's models) ------------------------------------------------------


def pydantic_names() -> list[Any]:
    """(where the name lives, the name, what the error calls it) for each pydantic name."""
    from pydantic._internal import _model_construction

    probe = _private.pydantic_probe()
    decorators = probe.__dict__["__pydantic_decorators__"]
    field_validator = next(iter(decorators.field_validators.values()))
    return [
        pytest.param(
            _model_construction,
            "init_private_attributes",
            "_model_construction.init_private_attributes",
            id="init_private_attributes",
        ),
        *(
            pytest.param(BaseModel, name, f"pydantic.BaseModel.{name}", id=name)
            for name in _private.BASE_MODEL_NAMES
        ),
        *(
            pytest.param(probe, name, f"{name} (of each model class)", id=name)
            for name in _private.MODEL_CLASS_NAMES
        ),
        *(
            pytest.param(decorators, group, f"DecoratorInfos.{group}", id=group)
            for _, group in _private.DECORATOR_GROUPS
        ),
        pytest.param(field_validator, "func", "Decorator.func", id="Decorator.func"),
        pytest.param(field_validator.info, "fields", "Decorator.info.fields", id="info.fields"),
    ]


@pytest.mark.parametrize(("owner", "name", "named"), pydantic_names())
def test_a_missing_pydantic_name_is_a_clear_import_error(
    owner: object, name: str, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(owner, name)
    with pytest.raises(ImportError) as caught:
        _private.check()
    message = str(caught.value)
    assert named in message
    assert "pydantic " in message  # the installed versions checked
    assert "pydantic-core " in message
    assert _private.TESTED in message
    _private.check(models=False)  # a store alone does not need pydantic's names


def test_importing_the_adk_adapter_fails_clearly_when_a_pydantic_name_is_gone() -> None:
    code = (
        "from durable_sessions.sql import _private  # a store needs no pydantic name\n"
        "del _private.pydantic_probe().__pydantic_post_init__  # as if pydantic had dropped it\n"
        "try:\n"
        "    import durable_sessions.adk\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "__pydantic_post_init__" in done.stdout
    assert "tested with" in done.stdout


def test_importing_a_store_does_not_import_pydantic() -> None:
    code = "import sys, durable_sessions, durable_sessions.sql\nprint('pydantic' in sys.modules)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
