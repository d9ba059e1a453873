"""The private APIs of SQLAlchemy, aiosqlite and pydantic that durable-sessions relies on, checked.

The hot paths skip layers of SQLAlchemy and aiosqlite (see ``runner.py``), and the ADK
adapter builds pydantic models without revalidating what it stored itself
(``adapters/adk/_models.py``), which means using a few names those projects do not promise
to keep. ``check()`` verifies that every one of them exists in the installed versions, and
raises ``ImportError`` naming what is missing, the installed versions and the tested range,
instead of failing later with an ``AttributeError`` in the middle of an operation, or worse,
a wrong result. It runs when this module is imported (SQLAlchemy and aiosqlite) and when the
ADK adapter is (pydantic too). The accessors below are the one place that reaches for them;
none of them changes the state of a dependency (a pool's queue, a class), they only read it
or build an object of the caller's.

The versions tested are the ranges in ``pyproject.toml`` (``nox -s lowest newest`` runs the
suite on both ends).
"""

from __future__ import annotations

import asyncio
import importlib
import sqlite3
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from importlib import metadata
from typing import Any

import sqlalchemy
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool, QueuePool, SingletonThreadPool, StaticPool
from sqlalchemy.pool.base import _ConnectionFairy, reset_none, reset_rollback
from sqlalchemy.sql.dml import UpdateBase
from sqlalchemy.util.queue import AsyncAdaptedQueue

__all__ = [
    "TESTED",
    "aiosqlite_connection",
    "aiosqlite_execute",
    "check",
    "checkin_reset",
    "checkin_without_io",
    "checkout_without_io",
    "core_schema",
    "engine_has_events",
    "greenlet_spawn",
    "has_custom_init",
    "has_post_init",
    "invalidate_pool",
    "is_root_model",
    "model_maker",
    "model_validators",
    "new_model",
    "private_attributes",
    "returning_columns",
    "sets_only_private_defaults",
]

TESTED = "SQLAlchemy 2.0.30 to 2.1.x, aiosqlite 0.20 to 0.22, pydantic 2.12.5 to 2.14.x"
"""The versions whose private APIs the suite runs on (the bounds in pyproject.toml)."""


def _installed(distribution: str) -> str:
    try:
        return f"{distribution} {metadata.version(distribution)}"
    except metadata.PackageNotFoundError:  # pragma: no cover - vendored or renamed
        return f"{distribution} (version unknown)"


def _aiosqlite() -> Any:
    try:
        import aiosqlite
    except ImportError:
        return None  # the 'sqlite' extra is not installed: no SQLite engine can run
    return aiosqlite


def check(*, models: bool = True) -> None:
    """Check that every private API used exists in the installed versions.

    Args:
        models: Check pydantic's too, when it is installed (the ``adk`` extra). Importing
            this module checks only SQLAlchemy's and aiosqlite's, so that a store does not
            import pydantic; the ADK adapter runs the whole check when it is imported.

    Raises:
        ImportError: Something is missing; the message names it, the installed versions
            and the tested range.
    """
    missing: list[str] = []
    checked = [_installed("SQLAlchemy")]
    from sqlalchemy import util

    if not callable(getattr(util, "greenlet_spawn", None)):
        missing.append("sqlalchemy.util.greenlet_spawn")
    if not callable(getattr(Pool, "_invalidate", None)):
        missing.append("sqlalchemy.pool.Pool._invalidate")
    if not callable(getattr(_ConnectionFairy, "_close_special", None)):
        missing.append("sqlalchemy.pool.base._ConnectionFairy._close_special")
    if not hasattr(Engine, "_has_events"):
        missing.append("sqlalchemy.engine.Engine._has_events")
    if not hasattr(UpdateBase, "_returning"):
        missing.append("sqlalchemy.sql.dml.UpdateBase._returning (statement._returning)")
    aiosqlite = _aiosqlite()
    if aiosqlite is not None:
        checked.append(_installed("aiosqlite"))
        connection = getattr(aiosqlite, "Connection", None)
        if not callable(getattr(connection, "_execute", None)):
            missing.append("aiosqlite.Connection._execute")
        if not hasattr(connection, "_conn"):
            missing.append("aiosqlite.Connection._conn")
    if models and _pydantic() is not None:
        checked += [_installed("pydantic"), _installed("pydantic-core")]
        missing += _missing_from_pydantic()
    if missing:
        raise ImportError(
            "durable-sessions relies on private APIs that the installed "
            f"{', '.join(checked)} do not have: {', '.join(missing)}. It is tested with "
            f"{TESTED}; install versions in that range (pip install 'durable-sessions[sqlite]' "
            "or 'durable-sessions[adk]' picks them)."
        )


# -- pydantic: building models as their own validation would ---------------------------------

MODEL_CLASS_NAMES = (
    "__pydantic_core_schema__",
    "__pydantic_custom_init__",
    "__pydantic_decorators__",
    "__pydantic_post_init__",
    "__private_attributes__",
)
"""What each model class carries of its own (``BaseModel``'s metaclass sets them) and the
accessors read."""

BASE_MODEL_NAMES = (
    "__pydantic_extra__",
    "__pydantic_fields_set__",
    "__pydantic_private__",
    "__pydantic_root_model__",
)
"""What ``BaseModel`` has for every model: the slots of an instance besides ``__dict__``
that ``new_model`` fills, and the root-model flag."""

DECORATOR_GROUPS = (
    ("model", "model_validators"),
    ("field", "field_validators"),
    ("root", "root_validators"),
    ("v1", "validators"),
)
"""The groups of validators in ``__pydantic_decorators__`` (pydantic's ``DecoratorInfos``)."""


def _pydantic() -> Any:
    try:
        return importlib.import_module("pydantic")
    except ImportError:
        return None  # the 'adk' extra is not installed: nothing builds models


_probes: dict[str, Any] = {}


def pydantic_probe() -> Any:
    """A model class with one validator of each kind the accessors read and a private
    attribute, made once: what ``check`` reads pydantic's names on."""
    probe = _probes.get("model")
    if probe is None:
        import pydantic

        class Probe(pydantic.BaseModel):
            x: int = 0
            _hidden: int = 1

            @pydantic.field_validator("x")
            @classmethod
            def _field(cls, value: int) -> int:
                return value

            @pydantic.model_validator(mode="before")
            @classmethod
            def _model(cls, data: Any) -> Any:
                return data

        probe = _probes["model"] = Probe
    return probe


def _missing_from_pydantic() -> list[str]:
    import pydantic

    missing: list[str] = []
    try:
        from pydantic._internal import _model_construction

        if not callable(getattr(_model_construction, "init_private_attributes", None)):
            raise ImportError
    except ImportError:
        missing.append("pydantic._internal._model_construction.init_private_attributes")
    for name in BASE_MODEL_NAMES:
        if not hasattr(pydantic.BaseModel, name):
            missing.append(f"pydantic.BaseModel.{name}")
    probe = pydantic_probe()
    for name in MODEL_CLASS_NAMES:
        if name not in probe.__dict__:
            missing.append(f"{name} (of each model class)")
    decorators = probe.__dict__.get("__pydantic_decorators__")
    if decorators is None:
        return missing
    for _, group in DECORATOR_GROUPS:
        if not isinstance(getattr(decorators, group, None), dict):
            missing.append(f"pydantic's DecoratorInfos.{group}")
    found = getattr(decorators, "field_validators", None)
    for decorator in found.values() if isinstance(found, dict) else ():
        if not hasattr(decorator, "func"):
            missing.append("pydantic's Decorator.func")
        if not isinstance(getattr(getattr(decorator, "info", None), "fields", None), tuple):
            missing.append("pydantic's Decorator.info.fields (FieldValidatorDecoratorInfo)")
    return missing


def core_schema(cls: Any) -> Any:
    """The core schema pydantic built for a model class (``__pydantic_core_schema__``)."""
    return cls.__pydantic_core_schema__


def has_custom_init(cls: Any) -> bool:
    """Whether a model class defines its own ``__init__`` (``__pydantic_custom_init__``)."""
    return bool(cls.__pydantic_custom_init__)


def has_post_init(cls: Any) -> bool:
    """Whether validation calls ``model_post_init`` (``__pydantic_post_init__``)."""
    return bool(cls.__pydantic_post_init__)


def is_root_model(cls: Any) -> bool:
    """Whether a model class is a ``RootModel`` (``__pydantic_root_model__``)."""
    return bool(getattr(cls, "__pydantic_root_model__", False))


def private_attributes(cls: Any) -> dict[str, Any]:
    """A model class's private attributes, by name (``__private_attributes__``)."""
    attributes: dict[str, Any] = cls.__private_attributes__
    return attributes


def sets_only_private_defaults(cls: Any) -> bool:
    """Whether a model's ``model_post_init`` is pydantic's own, which only sets its private
    attributes' defaults (``_model_construction.init_private_attributes``)."""
    from pydantic._internal._model_construction import init_private_attributes

    hook = getattr(cls.model_post_init, "__func__", cls.model_post_init)
    return hook is init_private_attributes


def model_validators(cls: Any) -> Iterator[tuple[str, Callable[..., Any], tuple[str, ...]]]:
    """Each validator of a model class (``__pydantic_decorators__``): its kind (``model``,
    ``field``, ``root``, ``v1``), its function and the fields it checks (field validators)."""
    decorators = cls.__pydantic_decorators__
    for kind, group in DECORATOR_GROUPS:
        for decorator in getattr(decorators, group).values():
            yield kind, decorator.func, tuple(getattr(decorator.info, "fields", ()))


_set = object.__setattr__


def model_maker(cls: Any) -> Callable[[dict[str, Any], set[str], Any], Any]:
    """``new_model`` for one class, with what it needs bound once: ``make(fields,
    fields_set, private)``, for many models of that class."""
    new = cls.__new__

    def make(fields: dict[str, Any], fields_set: set[str], private: Any) -> Any:
        instance = new(cls)
        _set(instance, "__dict__", fields)
        _set(instance, "__pydantic_fields_set__", fields_set)
        _set(instance, "__pydantic_extra__", None)
        _set(instance, "__pydantic_private__", private)
        return instance

    return make


def new_model(cls: Any, fields: dict[str, Any], fields_set: set[str], private: Any) -> Any:
    """A new instance of a model class with these field values (every field, in declaration
    order), set fields and private attributes (a dict, or None), as ``model_construct``
    builds one: ``__dict__``, ``__pydantic_fields_set__``, ``__pydantic_extra__`` (None),
    ``__pydantic_private__``. Nothing is validated and no hook is called."""
    instance = cls.__new__(cls)
    _set(instance, "__dict__", fields)
    _set(instance, "__pydantic_fields_set__", fields_set)
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", private)
    return instance


check(models=False)


def greenlet_spawn(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Run sync SQLAlchemy code that awaits the driver: ``sqlalchemy.util.greenlet_spawn``'s
    contract, in a greenlet kept from an earlier call of this thread where there is one.

    SQLAlchemy makes a new greenlet for every call, and its first switch costs more than
    the pool checkout it runs (on Postgres, a checkout and check-in took 14.5 µs that way
    and 6.1 µs here in a hot loop; a 2-item ``append_events`` went from 331 to 292 µs of
    client CPU). Here a finished call's greenlet waits for the next one instead
    (``_ReusedGreenlet``); everything else is as SQLAlchemy does it: ``fn`` runs in the
    caller's context (its context variables), each driver await inside it is awaited by
    the caller, a cancellation or error of that await is thrown in at the same point, and
    what ``fn`` returns or raises is the call's. Where SQLAlchemy's own ``await_`` would not
    accept such a greenlet (``_REUSABLE`` is False: checked once, at import), each call
    goes to ``sqlalchemy.util.greenlet_spawn``.
    """
    if _REUSABLE:
        return _spawn_reused(fn, args)
    spawn: Callable[..., Awaitable[Any]] = sqlalchemy.util.greenlet_spawn
    return spawn(fn, *args)


def _greenlet_module() -> Any:
    """The ``greenlet`` package (untyped), or None where it is not installed."""
    try:
        return importlib.import_module("greenlet")
    except ImportError:  # pragma: no cover - SQLAlchemy's asyncio extra installs it
        return None


_greenlets: Any = _greenlet_module()


def _await_provider() -> type | None:
    """SQLAlchemy's greenlet class, whose instances its ``await_`` switches out of: made
    lazily by ``sqlalchemy.util.concurrency._concurrency_shim`` on 2.1,
    ``sqlalchemy.util._concurrency_py3k._AsyncIoGreenlet`` on 2.0. None if not found."""
    try:
        from sqlalchemy.util import concurrency

        shim = getattr(concurrency, "_concurrency_shim", None)
        if shim is not None:
            found = shim._AsyncIoGreenlet
        else:  # SQLAlchemy 2.0
            from sqlalchemy.util import _concurrency_py3k  # type: ignore[attr-defined]

            found = _concurrency_py3k._AsyncIoGreenlet
    except Exception:  # a module or name gone, greenlet missing: SQLAlchemy's way then
        return None
    if _greenlets is None or not isinstance(found, type):
        return None
    return found if issubclass(found, _greenlets.greenlet) else None


class _Finished:
    """What a reused greenlet's call ended with: its value, or the exception it raised."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self.value = value
        self.error = error


_IDLE_MAX = 64
"""Greenlets kept waiting for a call, per thread: as many as calls that awaited at once."""

_idle = threading.local()


def _idle_greenlets() -> list[Any]:
    kept: list[Any] | None = getattr(_idle, "greenlets", None)
    if kept is None:
        kept = _idle.greenlets = []
    return kept


_Provider: Any = _await_provider()

if _Provider is not None:

    class _ReusedGreenlet(_Provider):  # type: ignore[misc]
        """A greenlet that SQLAlchemy's ``await_`` switches out of, running one call after
        another: after each, it hands back a ``_Finished`` and waits for the next."""

        def __init__(self) -> None:
            _Provider.__init__(self, self._serve, _greenlets.getcurrent())
            self.call: tuple[Callable[..., Any], tuple[Any, ...]] | None = None

        def _serve(self) -> None:
            while True:
                assert self.call is not None
                fn, args = self.call
                self.call = None
                try:
                    finished = _Finished(fn(*args), None)
                except _greenlets.GreenletExit:  # this greenlet is being destroyed
                    raise
                except BaseException as exc:  # fn's, whatever it is, is the caller's
                    finished = _Finished(None, exc)
                del fn, args
                self.parent.switch(finished)

    def _take(kept: list[Any]) -> Any:
        """An idle greenlet of ``kept`` (this thread's), or a new one, ready to run in the
        caller's greenlet and context (SQLAlchemy 2.1 switches back to ``parent``, 2.0 to
        ``driver``)."""
        worker = kept.pop() if kept else _ReusedGreenlet()
        here = _greenlets.getcurrent()
        worker.parent = here
        worker.driver = here
        worker.gr_context = here.gr_context
        return worker

    def _accepted() -> bool:
        """Whether SQLAlchemy's ``await_`` switches out of a reused greenlet, and back in,
        as it does out of its own: checked by driving one probe call by hand."""
        await_ = getattr(sqlalchemy.util, "await_", None) or sqlalchemy.util.await_only
        probe = asyncio.sleep(0)
        try:
            worker = _take(_idle_greenlets())
            worker.call = (await_, (probe,))
            asked = worker.switch()
            if asked is not probe:
                return False
            finished = worker.switch("answer")
        except Exception:
            return False
        finally:
            probe.close()
        if not isinstance(finished, _Finished) or finished.value != "answer":
            return False
        worker.gr_context = None
        _idle_greenlets().append(worker)
        return True

    _REUSABLE = _accepted()
else:  # pragma: no cover - every SQLAlchemy in the tested range has the class
    _REUSABLE = False


async def _spawn_reused(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``greenlet_spawn``'s loop, in a reused greenlet (see ``greenlet_spawn``)."""
    kept = _idle_greenlets()
    worker = _take(kept)
    worker.call = (fn, args)
    result = worker.switch()
    while not isinstance(result, _Finished):
        try:
            value = await result  # a driver await of fn's: awaited here
        except BaseException:
            result = worker.throw(*sys.exc_info())
        else:
            result = worker.switch(value)
    # Idle, the greenlet keeps nothing of this call: not its result (the worker's frame
    # holds the emptied ``_Finished``), not the caller's context.
    worker.gr_context = None
    if len(kept) < _IDLE_MAX:
        kept.append(worker)
    value, error = result.value, result.error
    result.value = result.error = None
    if error is not None:
        raise error
    return value


def checkin_reset(fairy: Any) -> None:
    """Check ``fairy`` in, telling the pool its transaction is already reset
    (``_ConnectionFairy._close_special(transaction_reset=True)``): the pool's reset events
    still fire, but the rollback is skipped."""
    fairy._close_special(True)


_NO_IO_RESETS = (reset_rollback, reset_none)
"""Reset-on-return styles that do nothing on a connection whose transaction is reset."""


def checkin_without_io(pool: Pool, fairy: Any) -> bool:
    """Whether ``checkin_reset(fairy)`` cannot reach the driver, so that it may run outside
    a greenlet: no pool ``reset`` or ``checkin`` listener, a reset-on-return of rollback
    (skipped: the transaction is already reset) or none, no finalizer left on the connection
    record (``_ConnectionRecord.finalize_callback``), and a pool that will not close the
    connection on return (``_may_close_on_return``). Fail-closed: whatever it cannot read
    (a private name gone in another SQLAlchemy version) answers False, and the caller
    checks in through a greenlet, as always correct."""
    dispatch = pool.dispatch
    if dispatch.reset or dispatch.checkin:
        return False
    if getattr(pool, "_reset_on_return", None) not in _NO_IO_RESETS:
        return False
    record = getattr(fairy, "_connection_record", None)
    if record is None or getattr(record, "finalize_callback", True):
        return False
    return not _may_close_on_return(pool)


def checkout_without_io(pool: Pool) -> Any | None:
    """Check a connection out of ``pool`` in plain calls, when nothing in that checkout can
    reach the driver; return it, or None when the caller must check out through a greenlet
    (always correct). Fail-closed: whatever it cannot read (a private name gone in another
    SQLAlchemy version) answers None.

    It only reads the pool: the connection lent is the one the pool's own queue takes next
    (the oldest idle one of a FIFO pool, the newest of a ``pool_use_lifo`` pool), by the
    pool's own ``connect()``. That is when the pool is a queue pool with no pre-ping whose
    next idle connection is taken without waiting (the overflow is not used up), is open
    and needs no reconnect (no recycle age, no pool-wide or soft invalidation since it
    opened), and there is no ``checkout`` listener but those that run once per connection
    and have run on that one (a ``done_key`` attribute naming the key they set in the
    connection record's ``info``).
    """
    try:
        if not isinstance(pool, QueuePool):
            return None
        waiting = pool._pool
        if not isinstance(waiting, AsyncAdaptedQueue):
            return None
        idle = waiting._queue._queue  # type: ignore[attr-defined]  # asyncio.Queue's deque or list
        if not idle:
            return None
        record = idle[-1] if waiting.use_lifo else idle[0]  # what the queue's get() takes
        if pool._pre_ping or pool._recycle > -1 or pool._invalidate_time:
            return None
        if -1 < pool._max_overflow <= pool._overflow:  # QueuePool._do_get would wait
            return None
        for listener in pool.dispatch.checkout:
            done_key = getattr(listener, "done_key", None)
            if done_key is None or not record.info.get(done_key):
                return None
        if record.dbapi_connection is None or record._soft_invalidate_time > record.starttime:
            return None
    except (AttributeError, IndexError):
        return None
    return pool.connect()


def _may_close_on_return(pool: Pool) -> bool:
    """Whether checking a connection in to ``pool`` may close one, which awaits the driver.

    A queue pool closes a returned connection only when its queue is already full (an
    overflow connection); other pools (null, static) may close on any return.
    """
    if isinstance(pool, (StaticPool, SingletonThreadPool)):
        return False
    if isinstance(pool, QueuePool):
        size = pool.size()
        return size > 0 and pool.checkedin() >= size
    return True


def engine_has_events(engine: Engine) -> bool:
    """Whether anything listens to the engine's events (``Engine._has_events``)."""
    return bool(engine._has_events)


def invalidate_pool(pool: Pool, connection: Any, exc: BaseException) -> None:
    """Retire every pooled connection made before ``connection`` (``Pool._invalidate``)."""
    pool._invalidate(connection, exc)


def returning_columns(statement: Any) -> tuple[Any, ...]:
    """The RETURNING columns of an INSERT, UPDATE or DELETE (``statement._returning``)."""
    return tuple(getattr(statement, "_returning", ()) or ())


def aiosqlite_connection(connection: Any) -> sqlite3.Connection:
    """The ``sqlite3.Connection`` inside an ``aiosqlite.Connection`` (``_conn``)."""
    conn: sqlite3.Connection = connection._conn
    return conn


def aiosqlite_execute(connection: Any, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Run ``fn(*args)`` in the connection's worker thread (``Connection._execute``)."""
    execute: Callable[..., Awaitable[Any]] = connection._execute
    return execute(fn, *args)
