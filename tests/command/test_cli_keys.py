"""`durable-sessions keys rotate` and `keys reencrypt`, and --keyring on every command."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from durable_sessions import Event, Manager, SQLStore
from durable_sessions.cli import main
from durable_sessions.crypto import LocalKeyring


def _fill(url: str, keyring: Path | None) -> str:
    async def fill() -> str:
        store = SQLStore.from_url(url, keyring=LocalKeyring(keyring) if keyring else None)
        await store.migrate()
        session = await Manager(store, app_name="app").create("default", "alice")
        await store.append_event("default", session.id, Event("user", content="hello quokka"))
        await store.close()
        return session.id

    return asyncio.run(fill())


def test_keys_rotate_rewraps_and_removes_the_old_master_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, keys = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "keys.json"
    _fill(url, keys)
    old = LocalKeyring(keys).current_master()
    assert main(["keys", "rotate", "--url", url, "--keyring", str(keys), "--remove-old"]) == 0
    out = capsys.readouterr().out
    assert "Re-wrapped 2 data keys" in out  # alice's and the organisation index's
    assert old not in json.loads(keys.read_text())["masters"]
    assert main(["search", "quokka", "--url", url, "--keyring", str(keys)]) == 0
    assert "hello quokka" in capsys.readouterr().out


def test_keys_reencrypt_seals_a_plaintext_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db.sqlite"
    url, keys = f"sqlite:///{db}", tmp_path / "keys.json"
    _fill(url, None)
    assert main(["keys", "reencrypt", "--url", url, "--keyring", str(keys)]) == 0
    assert "Re-encrypted 1 rows" in capsys.readouterr().out  # the event (the rest is empty)
    assert b"quokka" not in db.read_bytes()
    assert main(["--keyring", str(keys), "search", "quokka", "--url", url]) == 0
    assert "hello quokka" in capsys.readouterr().out


def test_keys_commands_need_a_keyring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert main(["keys", "rotate", "--url", url]) == 2
    assert "needs --keyring" in capsys.readouterr().err


def test_export_stays_encrypted_and_imports_with_the_keyring_or_decrypted_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, keys = f"sqlite:///{tmp_path / 'db.sqlite'}", str(tmp_path / "keys.json")
    _fill(url, tmp_path / "keys.json")
    sealed, plain = tmp_path / "sealed.jsonl", tmp_path / "plain.jsonl"
    assert main(["export", "--url", url, "--keyring", keys, "-o", str(sealed)]) == 0
    assert "2 data keys" in capsys.readouterr().out
    assert b"quokka" not in sealed.read_bytes()
    assert main(["export", "--url", url, "--decrypt", "-o", str(plain)]) == 2
    assert "needs --keyring" in capsys.readouterr().err
    assert main(["export", "--url", url, "--keyring", keys, "--decrypt", "-o", str(plain)]) == 0
    assert b"hello quokka" in plain.read_bytes()

    without = f"sqlite:///{tmp_path / 'without.sqlite'}"
    assert main(["import", "--url", without, "-i", str(sealed)]) == 1
    assert "the export is encrypted" in capsys.readouterr().err
    assert not (tmp_path / "without.sqlite").exists()  # a failed restore leaves nothing

    copy = f"sqlite:///{tmp_path / 'copy.sqlite'}"
    assert main(["import", "--url", copy, "--keyring", keys, "-i", str(sealed)]) == 0
    assert "2 data keys" in capsys.readouterr().out
    assert main(["search", "quokka", "--url", copy, "--keyring", keys]) == 0
    assert "hello quokka" in capsys.readouterr().out
    assert main(["import", "--url", without, "-i", str(plain)]) == 0
    capsys.readouterr()
    assert main(["search", "quokka", "--url", without]) == 0
    assert "hello quokka" in capsys.readouterr().out
