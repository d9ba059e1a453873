"""The key table of an encrypted SQL store: ``ds_keys``, read and written through the runner."""

from __future__ import annotations

import base64
import builtins
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import bindparam, delete, insert, select, update

from ..sealing import KeyRecord
from .compiled import Compiled
from .dialect import DialectOps
from .runner import Mode, Program, Query
from .schema import keys

__all__ = ["SQLKeyTable"]

K = keys

Run = Callable[[Program[Any], Mode, str], Awaitable[Any]]
Shape = Callable[[str, Callable[[], Any]], Compiled]


def _record(row: Any) -> KeyRecord:
    return KeyRecord(
        org_id=row.org_id,
        key_id=row.key_id,
        kind=row.kind,
        owner=row.owner,
        master_id=row.master_id,
        wrapped=base64.b64decode(row.wrapped),
        created_at=row.created_at,
    )


def _rows(stmt: Compiled, params: dict[str, Any]) -> Program[builtins.list[KeyRecord]]:
    return [_record(row) for row in (yield Query(stmt, params)).rows]


def _write(stmt: Compiled, params: dict[str, Any]) -> Program[int]:
    return (yield Query(stmt, params)).rowcount


_SCOPE = (
    (K.c.org_id == bindparam("k_org"))
    & (K.c.kind == bindparam("k_kind"))
    & (K.c.owner == bindparam("k_owner"))
)


def _newest() -> Any:
    return select(K).where(_SCOPE).order_by(K.c.created_at.desc(), K.c.key_id.desc()).limit(1)


def _scope() -> Any:
    return select(K).where(_SCOPE)


def _find() -> Any:
    return select(K).where(K.c.org_id == bindparam("k_org"), K.c.key_id == bindparam("k_key"))


_ADDED = {
    "org_id": bindparam("k_org"), "key_id": bindparam("k_key"), "kind": bindparam("k_kind"),
    "owner": bindparam("k_owner"), "master_id": bindparam("v_master"),
    "wrapped": bindparam("v_wrapped"),
    "created_at": bindparam("v_created", type_=K.c.created_at.type),
}  # fmt: skip


def _add() -> Any:
    return insert(K).values(_ADDED)


def _add_if_absent(ops: DialectOps) -> Any:
    return ops.insert_if_absent(K).values(_ADDED)


def _drop() -> Any:
    return delete(K).where(_SCOPE)


def _stale() -> Any:
    # Across organisations: rotation re-wraps every key of the database (one Postgres; on
    # Citus a multi-shard read, run by hand as an operator's task).
    return (
        select(K)
        .where(K.c.master_id != bindparam("v_master"))
        .order_by(K.c.org_id, K.c.key_id)
        .limit(bindparam("k_limit"))
    )


def _rewrap() -> Any:
    return (
        update(K)
        .where(
            K.c.org_id == bindparam("k_org"),
            K.c.key_id == bindparam("k_key"),
            K.c.master_id == bindparam("v_old"),
        )
        .values(master_id=bindparam("v_master"), wrapped=bindparam("v_wrapped"))
    )


class SQLKeyTable:
    """``sealing.KeyTable`` over ``ds_keys``: each call one statement through the runner.

    Args:
        shape: Compiles a statement of the store's dialect once (``Statements.shape``).
        run: Runs a program in a mode (``Runner.run``).
        ops: The store's dialect operations (the insert that keeps a stored key).
    """

    def __init__(self, shape: Shape, run: Run, ops: DialectOps) -> None:
        self._shape = shape
        self._run = run
        self._ops = ops

    async def newest(self, org_id: str, kind: str, owner: str) -> KeyRecord | None:
        """Return the newest data key of a scope, None when it has none."""
        params = {"k_org": org_id, "k_kind": kind, "k_owner": owner}
        found = await self._run(_rows(self._shape("keys:newest", _newest), params), "read", "keys")
        return found[0] if found else None

    async def scope(self, org_id: str, kind: str, owner: str) -> builtins.list[KeyRecord]:
        """Return every data key of a scope."""
        params = {"k_org": org_id, "k_kind": kind, "k_owner": owner}
        found: builtins.list[KeyRecord]
        found = await self._run(_rows(self._shape("keys:scope", _scope), params), "read", "keys")
        return found

    async def find(self, org_id: str, key_id: str) -> KeyRecord | None:
        """Return a data key by id, None when it is not there."""
        params = {"k_org": org_id, "k_key": key_id}
        found = await self._run(_rows(self._shape("keys:find", _find), params), "read", "keys")
        return found[0] if found else None

    async def add(self, record: KeyRecord) -> None:
        """Store a new data key."""
        await self._run(
            _write(self._shape("keys:add", _add), self._params(record)), "atomic", "keys"
        )

    @staticmethod
    def _params(record: KeyRecord) -> dict[str, Any]:
        return {
            "k_org": record.org_id, "k_key": record.key_id, "k_kind": record.kind,
            "k_owner": record.owner, "v_master": record.master_id,
            "v_wrapped": base64.b64encode(record.wrapped).decode("ascii"),
            "v_created": record.created_at,
        }  # fmt: skip

    async def add_if_absent(self, record: KeyRecord) -> None:
        """Store a data key unless its id is taken in its organisation (keep the other)."""
        stmt = self._shape("keys:add_if_absent", lambda: _add_if_absent(self._ops))
        await self._run(_write(stmt, self._params(record)), "atomic", "keys")

    async def drop(self, org_id: str, kind: str, owner: str) -> None:
        """Delete every data key of a scope."""
        params = {"k_org": org_id, "k_kind": kind, "k_owner": owner}
        await self._run(_write(self._shape("keys:drop", _drop), params), "atomic", "keys")

    async def stale(self, master_id: str, limit: int) -> builtins.list[KeyRecord]:
        """Return up to ``limit`` data keys wrapped by another master key."""
        params = {"v_master": master_id, "k_limit": limit}
        found: builtins.list[KeyRecord]
        found = await self._run(_rows(self._shape("keys:stale", _stale), params), "read", "keys")
        return found

    async def rewrap(self, record: KeyRecord, master_id: str, wrapped: bytes) -> None:
        """Replace a data key's wrapping (unless another rotation did it meanwhile)."""
        params = {
            "k_org": record.org_id, "k_key": record.key_id, "v_old": record.master_id,
            "v_master": master_id, "v_wrapped": base64.b64encode(wrapped).decode("ascii"),
        }  # fmt: skip
        await self._run(_write(self._shape("keys:rewrap", _rewrap), params), "atomic", "keys")
