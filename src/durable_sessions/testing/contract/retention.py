"""Retention: delete, purge and delete_user."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from durable_sessions import (
    Event,
    Filter,
    Manager,
    SessionNotFoundError,
    Store,
)

from ._common import (
    ORG,
    OTHER_APP,
    OTHER_ORG,
    OTHER_USER,
    USER,
    ContractBase,
    past,
    shared_state_of,
)

__all__ = ["RetentionContract"]


class RetentionContract(ContractBase):
    """Deleting sessions, purging idle ones, erasing a user."""

    # -- delete, purge, delete_user ---------------------------------------------------------------

    async def test_delete_removes_the_events_and_a_recreated_session_starts_afresh(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER, id="again", state={"p": 1, "user:u": 1})
        for _ in range(3):
            await store.append_event(ORG, "again", Event(author="user"))

        await manager.delete(ORG, "again")

        with pytest.raises(SessionNotFoundError):
            await store.list_events(ORG, "again")
        with pytest.raises(SessionNotFoundError):
            await manager.get(ORG, session.id)
        recreated = await manager.create(ORG, USER, id="again")
        assert recreated.state == {"user:u": 1}  # shared state outlives one session
        assert await store.list_events(ORG, "again") == []
        assert (await store.append_event(ORG, "again", Event(author="user"))).seq == 1
        assert (await manager.get(ORG, "again")).message_count == 1

    async def test_purge_removes_only_sessions_idle_since_the_cutoff(
        self, manager: Manager, store: Store
    ) -> None:
        old = [(await manager.create(ORG, USER)).id for _ in range(2)]
        kept = await manager.create(ORG, USER)
        other_org = await manager.create(OTHER_ORG, USER)
        await store.append_event(ORG, old[0], Event(author="user"))
        last_old = max([(await manager.get(ORG, session_id)).updated_at for session_id in old])
        await past(last_old, by=timedelta(seconds=0.25))
        await manager.touch(kept)
        touched = (await manager.get(ORG, kept.id)).updated_at
        midway = last_old + (touched - last_old) / 2

        def cutoff() -> timedelta:
            # An age whose cutoff, taken now, falls midway between the old sessions' last
            # write and the touch: a pause of up to half the gap (an eighth of a second at
            # least) between this and the store reading its clock is harmless.
            return datetime.now(timezone.utc) - midway

        assert await manager.purge(ORG, older_than=cutoff(), dry_run=True) == 2
        assert len(await manager.list(Filter(ORG))) == 3

        assert await manager.purge(ORG, older_than=cutoff()) == 2

        assert [s.id for s in await manager.list(Filter(ORG))] == [kept.id]
        for session_id in old:
            with pytest.raises(SessionNotFoundError):
                await store.list_events(ORG, session_id)
        assert (await manager.get(OTHER_ORG, other_org.id)).id == other_org.id
        assert await manager.purge(ORG, older_than=cutoff()) == 0

    async def test_delete_user_erases_sessions_events_and_user_state(
        self, manager: Manager, store: Store
    ) -> None:
        other_app = Manager(store, app_name=OTHER_APP)
        doomed = [
            await manager.create(ORG, USER, state={"user:u": 1, "app:a": 1}),
            await manager.create(ORG, USER),
            await other_app.create(ORG, USER, state={"user:u": 1}),
        ]
        await store.append_event(ORG, doomed[1].id, Event(author="user"))
        bystander = await manager.create(ORG, OTHER_USER, state={"user:b": 1})
        elsewhere = await manager.create(OTHER_ORG, USER, state={"user:u": 1})

        assert await manager.delete_user(ORG, USER) == 3

        for session in doomed:
            with pytest.raises(SessionNotFoundError):
                await manager.get(ORG, session.id)
            with pytest.raises(SessionNotFoundError):
                await store.list_events(ORG, session.id)
        assert await shared_state_of(manager, ORG, USER) == {"app:a": 1}
        assert await shared_state_of(other_app, ORG, USER) == {}
        assert (await manager.get(ORG, bystander.id)).state == {"user:b": 1, "app:a": 1}
        assert (await manager.get(OTHER_ORG, elsewhere.id)).state == {"user:u": 1}
        assert await manager.delete_user(ORG, USER) == 2  # the two made by shared_state_of
