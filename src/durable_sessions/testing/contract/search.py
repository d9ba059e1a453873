"""Search: words of the transcript, ranked, scoped to a tenant."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from durable_sessions import (
    Event,
    InvalidArgumentError,
    Manager,
    Store,
)

from ._common import (
    APP,
    ORG,
    OTHER_APP,
    OTHER_ORG,
    OTHER_USER,
    USER,
    ContractBase,
)

__all__ = ["SearchContract"]


class SearchContract(ContractBase):
    """Full-text search of transcripts."""

    # -- search -----------------------------------------------------------------------------------

    async def _said(self, store: Store, session_id: str, *contents: Any, org: str = ORG) -> None:
        """Append one event per content, a second apart (oldest first), from 2024-05-01."""
        base = datetime(2024, 5, 1, tzinfo=timezone.utc)
        have = len(await store.list_events(org, session_id))
        for n, content in enumerate(contents, start=have):
            event = Event("user", content=content, timestamp=base + timedelta(seconds=n))
            await store.append_event(org, session_id, event)

    @staticmethod
    async def _found(store: Store, text: str, **kwargs: Any) -> list[tuple[str, int]]:
        return [(hit.session_id, hit.event.seq) for hit in await store.search(ORG, text, **kwargs)]

    async def test_search_finds_every_word_whole_in_string_values_at_any_depth(
        self, manager: Manager, store: Store
    ) -> None:
        s = await manager.create(ORG, USER, id="s")
        await self._said(
            store,
            s.id,
            {"parts": [{"text": "Book a FLIGHT to Lisbon"}], "role": "user"},  # ADK's shape
            {"text": "flights are booked"},
            "a plain string: flight, Lisbon!",
            {"deep": [[{"x": ["the flight", 7]}]], "flight": 1, "n": 12},
            {"lisbon": "key only", "count": 42},
            None,
        )
        assert await self._found(store, "flight") == [("s", 4), ("s", 3), ("s", 1)]
        assert await self._found(store, "Lisbon flight") == [("s", 3), ("s", 1)]
        assert await self._found(store, "LISBON") == [("s", 3), ("s", 1)]  # not a key
        assert await self._found(store, "fli") == []  # whole words only
        assert await self._found(store, "flights booked") == [("s", 2)]
        assert await self._found(store, "42") == []  # numbers are not text
        assert await self._found(store, "user") == [("s", 1)]  # every string value
        assert await self._found(store, "flight nowhere") == []
        (hit,) = await store.search(ORG, "booked")
        assert hit.event == (await store.list_events(ORG, s.id))[1]

    async def test_search_ranks_by_occurrences_then_newest(
        self, manager: Manager, store: Store
    ) -> None:
        a = await manager.create(ORG, USER, id="a")
        b = await manager.create(ORG, USER, id="b")
        await self._said(store, a.id, "tea", "tea for two, tea for me", "tea time")
        await self._said(store, b.id, "TEA! tea, Tea", "coffee", "no tea")
        # b's events are 3 seconds newer, seq for seq: b1 (3 x), a2 (2 x), then one each.
        assert await self._found(store, "tea") == [
            ("b", 1), ("a", 2), ("b", 3), ("a", 3), ("a", 1),
        ]  # fmt: skip
        assert await self._found(store, "tea two") == [("a", 2)]
        assert await self._found(store, "tea", limit=2) == [("b", 1), ("a", 2)]
        assert await self._found(store, "tea tea TEA") == await self._found(store, "tea")

    async def test_search_narrows_by_user_app_and_session_and_never_crosses_tenants(
        self, manager: Manager, store: Store
    ) -> None:
        mine = await manager.create(ORG, USER, id="mine")
        theirs = await manager.create(ORG, OTHER_USER, id="theirs")
        other_app = await Manager(store, app_name=OTHER_APP).create(ORG, USER, id="billing")
        twin = await Manager(store, app_name=APP).create(OTHER_ORG, USER, id="mine")
        for session in (mine, theirs, other_app):
            await self._said(store, session.id, f"invoice of {session.id}")
        await self._said(store, twin.id, "invoice of the other org", org=OTHER_ORG)
        assert sorted(await self._found(store, "invoice")) == [
            ("billing", 1), ("mine", 1), ("theirs", 1),
        ]  # fmt: skip
        assert sorted(await self._found(store, "invoice", user_id=USER)) == [
            ("billing", 1), ("mine", 1),
        ]  # fmt: skip
        assert await self._found(store, "invoice", app_name=APP, user_id=USER) == [("mine", 1)]
        assert await self._found(store, "invoice", app_name=OTHER_APP) == [("billing", 1)]
        assert await self._found(store, "invoice", session_id="theirs") == [("theirs", 1)]
        assert await self._found(store, "invoice", session_id="nope") == []
        assert await self._found(store, "org") == []
        assert [h.event.content for h in await store.search(OTHER_ORG, "org")] == [
            "invoice of the other org"
        ]

    async def test_search_text_is_data_never_syntax(self, manager: Manager, store: Store) -> None:
        s = await manager.create(ORG, USER, id="s")
        await self._said(
            store,
            s.id,
            "hello world",
            "hello or world, not near",
            'she said "hello" (body:col) and NEAR(x y) ^start *',
            "drop table ds_events",
        )
        for text, expected in [
            ('"hello', [3, 2, 1]),  # an unbalanced quote
            ("hello OR world", [2]),  # OR is a word, not an operator
            ("NOT world", [2]),
            ("-world hello", [2, 1]),  # - is not "without"
            ("hello*", [3, 2, 1]),  # * is not a prefix
            ("hel*", []),
            ("body:col", [3]),  # no column filter
            ("NEAR(x y)", [3]),
            ("^start", [3]),
            ("'; DROP TABLE ds_events; --", [4]),
            ("hello AND", [3]),  # AND is a word too
            ("\\ ' \" % _ hello", [3, 2, 1]),
        ]:
            assert [seq for _, seq in await self._found(store, text)] == expected, text
        assert len(await store.list_events(ORG, s.id)) == 4

    async def test_search_follows_appends_rewinds_forks_and_deletions(
        self, manager: Manager, store: Store
    ) -> None:
        s = await manager.create(ORG, USER, id="s")
        await self._said(store, s.id, "alpha one", "alpha two")
        await store.append_events(ORG, s.id, [Event("user", content=["alpha", "three"])])
        assert await self._found(store, "alpha") == [("s", 3), ("s", 2), ("s", 1)]
        await store.truncate_events(ORG, s.id, after_seq=1)
        assert await self._found(store, "alpha") == [("s", 1)]
        await store.append_event(ORG, s.id, Event("user", content="alpha again"))
        assert [h.event.content for h in await store.search(ORG, "again")] == ["alpha again"]
        child = await store.fork(ORG, s.id, new_session_id="child", with_events=True)
        assert sorted(await self._found(store, "again")) == [("child", 2), ("s", 2)]
        await store.fork(ORG, s.id, new_session_id="bare")
        assert sorted(await self._found(store, "one")) == [("child", 1), ("s", 1)]
        await store.delete(ORG, child.id)
        assert await self._found(store, "one") == [("s", 1)]
        await store.truncate_events(ORG, s.id, after_seq=0)
        assert await self._found(store, "alpha") == []
        other = await manager.create(ORG, OTHER_USER, id="o")
        await self._said(store, other.id, "omega")
        await store.delete_user(ORG, OTHER_USER)
        assert await self._found(store, "omega") == []
        late = await manager.create(ORG, USER, id="late")
        await self._said(store, late.id, "omega")
        await store.purge(ORG, older_than=timedelta(0))
        assert await self._found(store, "omega") == []

    async def test_search_words_are_unicode_letters_and_digits_without_case(
        self, manager: Manager, store: Store
    ) -> None:
        s = await manager.create(ORG, USER, id="s")
        await self._said(
            store,
            s.id,
            "Café CRÈME",
            "cafe creme",
            "ΣΊΣΥΦΟΣ and Привет",
            "thanks🙏 see you",
            "日本語 テキスト",
            "order_id=A-1234; e-mail bob@example.com https://example.com/a/b?q=1",
            "x2 3.14 v1.2.3",
        )
        for text, expected in [
            ("café", [1]),  # accents are kept: café is not cafe
            ("CAFE", [2]),
            ("crème café", [1]),
            ("σίσυφος", [3]),  # final sigma folds like any sigma
            ("ПРИВЕТ", [3]),
            ("thanks", [4]),  # an emoji ends a word
            ("日本語", [5]),
            ("1234 order", [6]),  # _ - = ; @ . / ? : separate words
            ("example com", [6]),
            ("bob", [6]),
            ("https", [6]),
            ("3 14", [7]),
            ("x2", [7]),
            ("2", [7]),
        ]:
            assert [seq for _, seq in await self._found(store, text)] == expected, text

    async def test_search_refuses_bad_input_alike(self, manager: Manager, store: Store) -> None:
        s = await manager.create(ORG, USER, id="s")
        await self._said(store, s.id, "hello")
        for text in ("", "   ", "!!! ... ???", "🙏", "x" * 256, "hello " * 84, "a\x00b"):
            with pytest.raises(InvalidArgumentError):
                await store.search(ORG, text)
        assert await self._found(store, ("hello " * 83).strip()) == [("s", 1)]  # 497 characters
        for limit in (0, -1, True, 1.5, "5", 2**63):
            with pytest.raises(InvalidArgumentError, match="limit"):
                await store.search(ORG, "hello", limit=limit)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await store.search("", "hello")
        with pytest.raises(InvalidArgumentError):
            await store.search(ORG, 5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await store.search(ORG, "hello", user_id="")
