"""Pages: list_page's cursors and list_events' forward reads."""

from __future__ import annotations

from dataclasses import replace

import pytest

from durable_sessions import (
    Event,
    Filter,
    InvalidArgumentError,
    Manager,
    Page,
    SessionNotFoundError,
    Store,
)

from ._common import (
    APP,
    ORG,
    OTHER_ORG,
    OTHER_USER,
    USER,
    ContractBase,
    five_events,
    seqs,
)

__all__ = ["PagingContract"]


class PagingContract(ContractBase):
    """Paging through sessions and reading transcripts forward."""

    # -- pages: list_page -------------------------------------------------------------------------

    async def test_list_page_walks_every_session_once_in_list_order(
        self, manager: Manager, store: Store
    ) -> None:
        for n in range(7):
            await manager.create(ORG, USER if n % 2 else OTHER_USER, title=f"s{n}")
        await manager.create(OTHER_ORG, USER)
        for filter in (Filter(ORG, limit=3), Filter(ORG, user_id=USER, limit=2)):
            pages = [await store.list_page(filter)]
            while pages[-1].next_cursor is not None:
                pages.append(await manager.list_page(filter, cursor=pages[-1].next_cursor))
            walked = [s.id for page in pages for s in page.sessions]
            everything = await store.list(replace(filter, limit=0))
            assert walked == [s.id for s in everything]
            assert all(len(page.sessions) == filter.limit for page in pages[:-1])
            assert 1 <= len(pages[-1].sessions) <= filter.limit
            assert all(s.state == {} for page in pages for s in page.sessions)

    async def test_list_page_a_full_last_page_has_no_cursor(
        self, manager: Manager, store: Store
    ) -> None:
        assert await store.list_page(Filter(ORG)) == Page([], None)
        for _ in range(4):
            await manager.create(ORG, USER)
        first = await store.list_page(Filter(ORG, limit=2))
        assert first.next_cursor is not None
        last = await store.list_page(Filter(ORG, limit=2), cursor=first.next_cursor)
        assert len(last.sessions) == 2
        assert last.next_cursor is None
        whole = await store.list_page(Filter(ORG, limit=4))
        assert len(whole.sessions) == 4
        assert whole.next_cursor is None

    async def test_list_page_holds_100_sessions_when_the_limit_is_0(
        self, manager: Manager, store: Store
    ) -> None:
        for _ in range(101):
            await manager.create(ORG, USER)
        first = await store.list_page(Filter(ORG))
        assert len(first.sessions) == 100
        rest = await store.list_page(Filter(ORG), cursor=first.next_cursor)
        assert len(rest.sessions) == 1
        assert rest.next_cursor is None
        # The page size may change between pages of one walk.
        small = await store.list_page(Filter(ORG, limit=1), cursor=first.next_cursor)
        assert [s.id for s in small.sessions] == [s.id for s in rest.sessions]

    async def test_list_page_with_state_returns_what_get_returns(
        self, manager: Manager, store: Store
    ) -> None:
        for n in range(3):
            await manager.create(ORG, USER, state={"n": n, "user:u": "shared", "app:a": [n]})
        cursor = None
        seen = 0
        while True:
            page = await store.list_page(Filter(ORG, limit=2, with_state=True), cursor=cursor)
            for session in page.sessions:
                assert session.state == (await store.get(ORG, session.id)).state
                seen += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == 3

    async def test_list_page_during_writes_never_repeats_and_misses_no_quiet_session(
        self, manager: Manager, store: Store
    ) -> None:
        quiet = [(await manager.create(ORG, USER)).id for _ in range(6)]
        written = [(await manager.create(ORG, USER)).id for _ in range(3)]
        walked: list[str] = []
        cursor = None
        step = 0
        while True:
            page = await store.list_page(Filter(ORG, limit=2), cursor=cursor)
            walked += [s.id for s in page.sessions]
            if step < len(written):  # between pages: a create and a write of an old session
                await manager.create(ORG, USER)
                await store.touch(ORG, written[step], messages=1)
            step += 1
            cursor = page.next_cursor
            if cursor is None:
                break
        assert len(walked) == len(set(walked))
        assert all(walked.count(session_id) == 1 for session_id in quiet)

    async def test_list_page_refuses_altered_and_foreign_cursors_alike(
        self, manager: Manager, store: Store
    ) -> None:
        for _ in range(3):
            await manager.create(ORG, USER, state={"secret": 1})
        await manager.create(OTHER_ORG, USER)
        cursor = (await store.list_page(Filter(ORG, limit=1))).next_cursor
        assert isinstance(cursor, str)
        altered = cursor[:-2] + ("A" if cursor[-2] != "A" else "B") + cursor[-1]
        for bad in (
            altered, cursor[:-4], cursor + "x", "", "not a cursor", "' OR 1=1 --",
            "eyJ1IjogMX0", "A" * 5000, 123, b"bytes",
        ):  # fmt: skip
            with pytest.raises(InvalidArgumentError):
                await store.list_page(Filter(ORG, limit=1), cursor=bad)  # type: ignore[arg-type]
        for foreign in (
            Filter(OTHER_ORG, limit=1),
            Filter(ORG, user_id=USER, limit=1),
            Filter(ORG, app_name=APP, limit=1),
            Filter(ORG, parent_id="p", limit=1),
        ):
            with pytest.raises(InvalidArgumentError, match="another listing"):
                await store.list_page(foreign, cursor=cursor)
        # Another page size or with_state is the same listing.
        page = await store.list_page(Filter(ORG, limit=5, with_state=True), cursor=cursor)
        assert len(page.sessions) == 2

    # -- forward reads: list_events(after_seq=...) ------------------------------------------------

    async def test_list_events_after_seq_reads_forward_page_by_page(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        stamps = await five_events(store, session.id)
        await store.append_events(ORG, session.id, [Event("user", content=f"m{i}") for i in (5, 6)])
        assert await seqs(store, ORG, session.id, after_seq=0, limit=3) == [1, 2, 3]
        assert await seqs(store, ORG, session.id, after_seq=3, limit=3) == [4, 5, 6]
        assert await seqs(store, ORG, session.id, after_seq=6, limit=3) == [7]
        assert await seqs(store, ORG, session.id, after_seq=7, limit=3) == []
        assert await seqs(store, ORG, session.id, after_seq=2**63 - 1) == []
        assert await seqs(store, ORG, session.id, after_seq=4) == [5, 6, 7]
        assert await seqs(store, ORG, session.id, after_seq=1, limit=0) == []
        assert await seqs(store, ORG, session.id, after_seq=1, limit=2, after=stamps[2]) == [4, 5]
        read = await manager.list_events(ORG, session.id, after_seq=5, limit=1)
        assert [(e.seq, e.content) for e in read] == [(6, "m5")]
        # Without after_seq, limit still keeps the newest.
        assert await seqs(store, ORG, session.id, limit=2) == [6, 7]
        # Paging forward over a rewound transcript reads what is there now.
        await store.truncate_events(ORG, session.id, after_seq=3)
        await store.append_event(ORG, session.id, Event("user", content="again"))
        assert await seqs(store, ORG, session.id, after_seq=2, limit=5) == [3, 4]

    async def test_list_events_after_seq_refuses_bad_values_and_unknown_sessions_alike(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        for bad in (-1, True, 1.5, "1", 2**63):
            with pytest.raises(InvalidArgumentError, match="after_seq must be an integer"):
                await store.list_events(ORG, session.id, after_seq=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await store.list_events(ORG, session.id, after_seq=0, limit=-1)
        assert await store.list_events(ORG, session.id, after_seq=0) == []
        with pytest.raises(SessionNotFoundError):
            await store.list_events(ORG, "missing", after_seq=0, limit=5)
        with pytest.raises(SessionNotFoundError):
            await store.list_events(OTHER_ORG, session.id, after_seq=3)
