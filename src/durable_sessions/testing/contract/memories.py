"""Long-term memory: memories of a user, searched by shared words, ranked, erased."""

from __future__ import annotations

import asyncio
import unicodedata
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from durable_sessions import (
    InMemoryStore,
    InvalidArgumentError,
    InvalidStateError,
    Manager,
    Memory,
    Store,
)

from ._common import APP, ORG, OTHER_APP, OTHER_ORG, OTHER_USER, USER, ContractBase, is_utc

__all__ = ["MemoriesContract"]

BASE = datetime(2024, 6, 1, 9, 0, tzinfo=timezone.utc)


def _at(minutes: int) -> datetime:
    return BASE + timedelta(minutes=minutes)


class MemoriesContract(ContractBase):
    """``add_memories``, ``search_memories`` and ``delete_memories``."""

    @staticmethod
    async def _remember(store: Store, *texts: str, user: str = USER, **kw: Any) -> None:
        """Add one memory per text, a minute apart (oldest first), ids ``m0``, ``m1``..."""
        memories = [
            Memory(text, id=f"m{i}", timestamp=_at(i), **kw) for i, text in enumerate(texts)
        ]
        await store.add_memories(ORG, APP, user, memories)

    @staticmethod
    async def _ids(store: Store, text: str, *, user: str = USER, **kw: Any) -> list[str | None]:
        return [m.id for m in await store.search_memories(ORG, APP, user, text, **kw)]

    async def test_a_memory_keeps_what_it_was_given_and_gets_an_id_and_a_time(
        self, store: Store
    ) -> None:
        content = {"parts": [{"text": "I live in Lisbon"}], "role": "user"}
        given = Memory(
            "I live in Lisbon",
            content=content,
            author="user",
            timestamp=_at(0),
            id="home",
            metadata={"source": "chat", "n": 1.0},
            session_id="s1",
            seq=7,
        )
        (added,) = await store.add_memories(ORG, APP, USER, [given])
        assert added == given
        (bare,) = await store.add_memories(ORG, APP, USER, [Memory("plain words")])
        assert bare.id
        assert bare.timestamp is not None
        assert is_utc(bare.timestamp)
        assert (bare.author, bare.content, bare.metadata, bare.session_id, bare.seq) == (
            None, None, {}, None, None,
        )  # fmt: skip
        (found,) = await store.search_memories(ORG, APP, USER, "lisbon")
        assert found == given
        assert found.metadata is not None
        assert type(found.metadata["n"]) is float
        found.content["parts"].clear()  # a copy: the stored memory is untouched
        assert (await store.search_memories(ORG, APP, USER, "lisbon"))[0] == given
        assert await store.search_memories(ORG, APP, USER, "plain") == [bare]

    async def test_adding_an_id_the_user_has_adds_nothing(self, store: Store) -> None:
        await store.add_memories(ORG, APP, USER, [Memory("the first words", id="a")])
        again = [Memory("other words", id="a"), Memory("new words", id="b")]
        added = await store.add_memories(ORG, APP, USER, again)
        assert [m.id for m in added] == ["b"]
        assert [m.text for m in await store.search_memories(ORG, APP, USER, "first other")] == [
            "the first words"
        ]
        # The same id of another user, app or organisation is another memory.
        assert await store.add_memories(ORG, APP, OTHER_USER, [Memory("x", id="a")])
        assert await store.add_memories(ORG, OTHER_APP, USER, [Memory("x", id="a")])
        assert await store.add_memories(OTHER_ORG, APP, USER, [Memory("x", id="a")])
        assert await store.add_memories(ORG, APP, USER, []) == []

    async def test_search_matches_any_shared_whole_word_without_case(self, store: Store) -> None:
        await self._remember(
            store,
            "Book a FLIGHT to Lisbon",
            "flights are booked",
            "the hotel in Porto",
        )
        assert await self._ids(store, "flight") == ["m0"]
        found = await self._ids(store, "LISBON porto")
        assert set(found) == {"m0", "m2"}, found
        assert await self._ids(store, "fli") == []  # whole words only
        assert await self._ids(store, "nothing matches") == []
        assert await self._ids(store, "") == []
        assert await self._ids(store, "?! ... --") == []  # no word: nothing

    async def test_the_query_is_data_never_syntax(self, store: Store) -> None:
        await self._remember(store, 'flight "to" Lisbon', "a OR b AND c", "NEAR(x y) * ^ :")
        for query in (
            '"', "'", "flight\"", "NOT flight", "a OR", "x:y", "NEAR(", "*", "'; DROP TABLE x",
            "\\", "flight & !lisbon | (", "-flight", "col:flight", "\x00flight", "\ud800flight",
        ):  # fmt: skip
            await store.search_memories(ORG, APP, USER, query)
        assert await self._ids(store, "flight OR nothing") == ["m1", "m0"]  # words, both
        assert await self._ids(store, "NEAR") == ["m2"]

    async def test_a_rare_word_outweighs_common_ones_and_ties_go_newest_first(
        self, store: Store
    ) -> None:
        common = [f"what is my plan for the day {i}" for i in range(12)]
        await self._remember(store, "the zebra eats grass", *common)
        # "what", "is", "my", "the" are in nearly every memory: "zebra" decides.
        found = await self._ids(store, "what is the name of my zebra", limit=3)
        assert found[0] == "m0"
        # Equal scores: newest first.
        assert await self._ids(store, "plan", limit=3) == ["m12", "m11", "m10"]
        # More shared words weigh more, when their weights are alike.
        await store.add_memories(
            ORG, APP, OTHER_USER,
            [
                Memory("deploy is ready", id="a", timestamp=_at(0)),
                Memory("ready", id="b", timestamp=_at(1)),
                Memory("deploy status is ready", id="c", timestamp=_at(2)),
                Memory("unrelated", id="d", timestamp=_at(3)),
            ],
        )  # fmt: skip
        assert await self._ids(store, "deploy status ready", user=OTHER_USER) == ["c", "a", "b"]

    async def test_many_memories_rank_as_the_in_memory_store_ranks_them(self, store: Store) -> None:
        """2,500 memories, some words in most of them (their counts capped), some in a few:
        every store returns what ``InMemoryStore`` returns, whichever way it gets there."""
        texts = []
        for n in range(2500):
            words = ["common", f"rare{n}", f"group{n % 40}"]
            if n % 5:
                words.append("often")
            if n % 3:
                words.append("usual")
            if n % 9 == 0:
                words.append("some")
            if n % 250 == 0:
                words.append("seldom")
            texts.append(" ".join(words))
        memories = [Memory(t, id=f"m{n:04d}", timestamp=_at(n % 700)) for n, t in enumerate(texts)]
        reference = InMemoryStore()
        for target in (store, reference):
            await target.add_memories(ORG, APP, USER, memories)
        for query in (
            "common", "often common", "some", "seldom common often", "rare7 common",
            "rare7 rare2000 group3 often", "group3 group4 group5 some", "seldom group9",
            "what about rare1234 and often",
        ):  # fmt: skip
            for limit in (1, 10, 60):
                expected = await reference.search_memories(ORG, APP, USER, query, limit=limit)
                found = await store.search_memories(ORG, APP, USER, query, limit=limit)
                assert [m.id for m in found] == [m.id for m in expected], (query, limit)
        # More wanted than the memories of the rarest words hold: every memory is ranked.
        query = "rare7 often usual common"
        expected = await reference.search_memories(ORG, APP, USER, query, limit=2500)
        found = await store.search_memories(ORG, APP, USER, query, limit=2500)
        assert [m.id for m in found] == [m.id for m in expected]
        # Deleting memories changes the weights alike.
        for n in range(0, 2500, 7):
            for target in (store, reference):
                await target.delete_memories(ORG, APP, USER, memory_id=f"m{n:04d}")
        for query in ("seldom common often", "some group3", "rare14 usual", "rare15 usual"):
            expected = await reference.search_memories(ORG, APP, USER, query, limit=30)
            found = await store.search_memories(ORG, APP, USER, query, limit=30)
            assert [m.id for m in found] == [m.id for m in expected], query

    async def test_concurrent_adds_and_deletes_of_one_user_count_every_memory(
        self, store: Store
    ) -> None:
        """Writers of one user's memories racing each other (the first of them making the
        user's counts) leave the weights as one writer after the other would."""
        texts = [f"shared word{n % 3} note{n}" for n in range(24)]
        memories = [Memory(t, id=f"m{n:02d}", timestamp=_at(n)) for n, t in enumerate(texts)]
        reference = InMemoryStore()
        await reference.add_memories(ORG, APP, USER, memories)
        await asyncio.gather(
            *[store.add_memories(ORG, APP, USER, memories[n : n + 3]) for n in range(0, 24, 3)],
            *[store.add_memories(ORG, APP, USER, memories[n : n + 2]) for n in range(0, 24, 4)],
        )
        gone = [f"m{n:02d}" for n in range(0, 24, 5)]
        late = [Memory("word1 late", id="late", timestamp=_at(30))]
        await asyncio.gather(
            *[store.delete_memories(ORG, APP, USER, memory_id=m) for m in gone],
            store.add_memories(ORG, APP, USER, late),
        )
        for m in gone:
            await reference.delete_memories(ORG, APP, USER, memory_id=m)
        await reference.add_memories(ORG, APP, USER, late)
        for query in ("shared word1", "word0 note7", "word2 late shared"):
            expected = await reference.search_memories(ORG, APP, USER, query, limit=30)
            found = await store.search_memories(ORG, APP, USER, query, limit=30)
            assert [m.id for m in found] == [m.id for m in expected], query

    async def test_search_returns_at_most_limit(self, store: Store) -> None:
        await self._remember(store, *[f"note {i} about work" for i in range(30)])
        assert len(await self._ids(store, "work")) == 20
        assert await self._ids(store, "work", limit=3) == ["m29", "m28", "m27"]
        bad_limits: list[Any] = [0, -1, True, 1.5, "3", 2**63]
        for bad in bad_limits:
            with pytest.raises(InvalidArgumentError):
                await store.search_memories(ORG, APP, USER, "work", limit=bad)

    async def test_a_query_of_any_length_works(self, store: Store) -> None:
        await self._remember(store, "the password hint is the name of the cat")
        long_message = " ".join(f"filler{i}" for i in range(30_000))
        assert await self._ids(store, "cat " + long_message) == ["m0"]
        assert await self._ids(store, "x" * 100_000) == []
        assert await self._ids(store, "cat " + "y" * 300) == ["m0"]  # a word past 255 chars

    async def test_only_that_users_memories_of_that_app_and_organisation(
        self, store: Store
    ) -> None:
        await store.add_memories(ORG, APP, USER, [Memory("secret plan alpha", id="mine")])
        await store.add_memories(ORG, APP, OTHER_USER, [Memory("secret plan beta", id="user")])
        await store.add_memories(ORG, OTHER_APP, USER, [Memory("secret plan gamma", id="app")])
        await store.add_memories(OTHER_ORG, APP, USER, [Memory("secret plan delta", id="org")])
        assert await self._ids(store, "secret beta gamma delta") == ["mine"]
        assert await self._ids(store, "secret", user=OTHER_USER) == ["user"]
        found = await store.search_memories(OTHER_ORG, APP, USER, "secret alpha")
        assert [m.id for m in found] == ["org"]
        assert await store.search_memories(ORG, APP, "nobody", "secret") == []
        # An app name that reads like another app and user in one is not one.
        await store.add_memories(ORG, "a/b", "c", [Memory("slash secret", id="slash")])
        assert await store.search_memories(ORG, "a", "b/c", "slash") == []

    async def test_chinese_and_japanese_are_found_by_any_two_shared_characters(
        self, store: Store
    ) -> None:
        await self._remember(
            store,
            "私の名前は太郎です",
            "我喜欢机器学习",
            "私はPythonでADKを使っています",
            "제 이름은 민수입니다",
            "Меня зовут Алексей",
        )
        assert await self._ids(store, "太郎") == ["m0"]
        assert await self._ids(store, "天気") == []
        assert await self._ids(store, "机器学习") == ["m1"]
        assert await self._ids(store, "天气预报") == []
        assert await self._ids(store, "python") == ["m2"]
        assert await self._ids(store, "使って") == ["m2"]
        assert await self._ids(store, "thon") == []
        assert await self._ids(store, "민수입니다") == ["m3"]
        assert await self._ids(store, "алексей") == ["m4"]

    async def test_composed_and_decomposed_accents_are_one_word(self, store: Store) -> None:
        await self._remember(store, unicodedata.normalize("NFD", "Meet at the Café"))
        assert await self._ids(store, "café") == ["m0"]
        assert await self._ids(store, unicodedata.normalize("NFD", "CAFÉ")) == ["m0"]
        assert await self._ids(store, "cafe") == []

    async def test_delete_one_memory_or_all_of_them(self, store: Store) -> None:
        await self._remember(store, "apples", "pears", "plums")
        await store.add_memories(ORG, APP, OTHER_USER, [Memory("apples", id="m0")])
        assert await store.delete_memories(ORG, APP, USER, memory_id="m1") == 1
        assert await store.delete_memories(ORG, APP, USER, memory_id="m1") == 0
        assert await store.delete_memories(ORG, APP, USER, memory_id="nope") == 0
        assert await self._ids(store, "apples pears plums") == ["m2", "m0"]
        assert await store.delete_memories(ORG, APP, USER) == 2
        assert await self._ids(store, "apples pears plums") == []
        assert await self._ids(store, "apples", user=OTHER_USER) == ["m0"]
        assert await store.delete_memories(ORG, APP, USER) == 0
        # Deleted ids can be added again.
        assert await store.add_memories(ORG, APP, USER, [Memory("apples", id="m0")])

    async def test_a_memory_outlives_its_session_but_not_its_user(
        self, manager: Manager, store: Store
    ) -> None:
        session = await manager.create(ORG, USER)
        await self._remember(store, "the wifi password is swordfish", session_id=session.id)
        await store.add_memories(ORG, OTHER_APP, USER, [Memory("swordfish again", id="x")])
        await store.add_memories(ORG, APP, OTHER_USER, [Memory("swordfish too", id="y")])
        await manager.delete(ORG, session.id)
        (kept,) = await store.search_memories(ORG, APP, USER, "swordfish")
        assert kept.session_id == session.id
        assert await store.delete_user(ORG, USER, dry_run=True) == 0
        assert await self._ids(store, "swordfish") == ["m0"]  # a dry run deletes nothing
        await store.delete_user(ORG, USER)
        assert await self._ids(store, "swordfish") == []
        assert await store.search_memories(ORG, OTHER_APP, USER, "swordfish") == []
        assert await self._ids(store, "swordfish", user=OTHER_USER) == ["y"]

    async def test_bad_memories_are_refused_and_nothing_is_written(self, store: Store) -> None:
        good = Memory("good words", id="good")
        bad_items: list[Any] = [
            Memory("x", timestamp=datetime(2024, 1, 1)),  # naive
            Memory("x", id=""),
            Memory("x", id="a" * 256),
            Memory("x", author="a" * 256),
            Memory("x", session_id=""),
            Memory("x", seq=-1),
            Memory("x", seq=True),
            Memory("x", metadata=["not", "a", "dict"]),  # type: ignore[arg-type]
            Memory("nul \x00 inside"),
            Memory("\ud800 lone surrogate"),
            Memory(b"bytes"),  # type: ignore[arg-type]
            {"text": "a dict"},
        ]
        for bad in bad_items:
            with pytest.raises(InvalidArgumentError):
                await store.add_memories(ORG, APP, USER, [good, bad])
        with pytest.raises(InvalidArgumentError):
            await store.add_memories(ORG, APP, USER, [good, Memory("twice", id="good")])
        with pytest.raises(InvalidStateError):
            await store.add_memories(
                ORG, APP, USER, [good, Memory("x", content={"f": float("nan")})]
            )
        with pytest.raises(InvalidArgumentError):
            await store.add_memories(ORG, APP, USER, good)  # type: ignore[arg-type]
        for org, app, user in (("", APP, USER), (ORG, APP, ""), (ORG, 7, USER)):
            with pytest.raises(InvalidArgumentError):
                await store.add_memories(org, app, user, [good])  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError):
                await store.search_memories(org, app, user, "good")  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError):
                await store.delete_memories(org, app, user)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await store.search_memories(ORG, APP, USER, None)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await store.delete_memories(ORG, APP, USER, memory_id="")
        assert await self._ids(store, "good words twice") == []
