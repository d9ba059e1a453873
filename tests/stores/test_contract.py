"""The Store contract (``durable_sessions.testing``), run against memory, SQLite and Postgres.

The ``store`` fixture of ``conftest.py`` is parametrised over the three backends, so every
test of the shipped suite runs once on each.
"""

from __future__ import annotations

from durable_sessions.testing import StoreContract


class TestStoreContract(StoreContract):
    """The shipped contract suite, over this project's own stores."""
