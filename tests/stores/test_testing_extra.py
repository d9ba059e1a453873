"""``durable_sessions.testing`` works for a store author outside this project's test tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

THIRD_PARTY_TESTS = '''
import pytest
from durable_sessions import InMemoryStore
from durable_sessions.testing import StoreContract


class ForgetfulStore(InMemoryStore):
    """A store that drops the last event of every transcript it returns: not a Store."""

    async def list_events(self, org_id, session_id, **kwargs):
        return (await super().list_events(org_id, session_id, **kwargs))[:-1]


class TestMine(StoreContract):
    @pytest.fixture
    def store(self):
        return {store}()
'''


def run_suite(tmp_path: Path, store: str, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_mine.py").write_text(THIRD_PARTY_TESTS.format(store=store))
    # Strict mode: the suite must carry its own asyncio mark, not rely on the caller's config.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
         "asyncio_mode=strict", "--rootdir", str(tmp_path), *options,
         str(tmp_path / "test_mine.py")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_a_store_author_runs_the_contract_on_their_store(tmp_path: Path) -> None:
    result = run_suite(tmp_path, "InMemoryStore")
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout
    assert "failed" not in result.stdout


@pytest.mark.slow
def test_the_contract_catches_a_store_that_breaks_it(tmp_path: Path) -> None:
    result = run_suite(tmp_path, "ForgetfulStore", "-x")  # one failure is the answer
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed" in result.stdout
