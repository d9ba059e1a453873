"""The Store contract over encrypted stores: with a keyring, every answer is the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_sessions import InMemoryStore, SQLStore, Store
from durable_sessions.crypto import LocalKeyring
from durable_sessions.testing import StoreContract
from support.sql import MYSQL, SQL_BACKENDS

ENCRYPTED_BACKENDS = [pytest.param("memory", marks=pytest.mark.memory), *SQL_BACKENDS, MYSQL]
"""Every store but distributed mode, which refuses a keyring (its search index cannot read
a blind index)."""


@pytest.fixture(params=ENCRYPTED_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Which store the test runs against, each with a keyring."""
    return str(request.param)


@pytest.fixture
def store(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Store:
    """An empty store of every kind, encrypting with a keyring of its own."""
    keyring = LocalKeyring(tmp_path / "keys.json")
    if backend == "memory":
        return InMemoryStore(keyring=keyring)
    return SQLStore(request.getfixturevalue("engine"), keyring=keyring)


class TestEncryptedStoreContract(StoreContract):
    """The shipped contract suite, over encrypted stores."""
