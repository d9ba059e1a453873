"""Ids, names and state keys compare exactly on every store: no case folding, no trailing
space padding, no Unicode normalisation (MySQL's text collations do all three)."""

from __future__ import annotations

import unicodedata

from durable_sessions import Filter, Manager, Store

NFC = unicodedata.normalize("NFC", "böb")
NFD = unicodedata.normalize("NFD", "böb")
NAMES = ["bob", "Bob", "bob ", NFC, NFD]


def test_the_names_differ() -> None:
    assert len(set(NAMES)) == 5
    assert NFC != NFD


async def test_five_users_that_collations_would_merge(store: Store) -> None:
    manager = Manager(store, app_name="app")
    for name in NAMES:
        await manager.create("org", name, id=f"s-{NAMES.index(name)}")
    for index, name in enumerate(NAMES):
        listed = await store.list(Filter("org", user_id=name))
        assert [(s.id, s.user_id) for s in listed] == [(f"s-{index}", name)]


async def test_session_ids_and_orgs_that_collations_would_merge(store: Store) -> None:
    for index, name in enumerate(NAMES):
        await Manager(store, app_name="app").create("org", "ada", id=name)
        await Manager(store, app_name="app").create(name, "ada", id="same")
        assert (await store.get("org", name)).id == name
        assert (await store.get(name, "same")).org_id == name
        assert len(await store.list(Filter("org"))) == index + 1
    for name in NAMES:
        assert [s.org_id for s in await store.list(Filter(name))] == [name]


async def test_state_keys_and_apps_that_collations_would_merge(store: Store) -> None:
    for name in NAMES:
        manager = Manager(store, app_name=name)
        session = await manager.create("org", "ada")
        session.state.update({f"user:{n}": n for n in NAMES} | {n: n for n in NAMES})
        await manager.save(session)
    for name in NAMES:
        session = (await store.list(Filter("org", app_name=name, with_state=True)))[0]
        assert session.app_name == name
        assert {k: v for k, v in session.state.items() if not k.startswith("user:")} == {
            n: n for n in NAMES
        }
        assert {k: v for k, v in session.state.items() if k.startswith("user:")} == {
            f"user:{n}": n for n in NAMES
        }
