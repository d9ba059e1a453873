"""The Store contract, shipped: one suite that any ``Store`` implementation can run.

One module per section of the contract; ``StoreContract`` runs them all.
"""

from __future__ import annotations

from .events import EventsContract
from .fork import ForkContract
from .hardening import HardeningContract
from .memories import MemoriesContract
from .paging import PagingContract
from .reads import ReadsContract
from .retention import RetentionContract
from .search import SearchContract
from .service import ServiceContract
from .sessions import SessionsContract
from .state import StateContract
from .transcript import TranscriptContract

__all__ = ["StoreContract"]


class StoreContract(
    SessionsContract,
    StateContract,
    EventsContract,
    ServiceContract,
    ForkContract,
    RetentionContract,
    ReadsContract,
    TranscriptContract,
    PagingContract,
    SearchContract,
    MemoriesContract,
    HardeningContract,
):
    """The ``Store`` contract as a pytest test class: subclass it and give it a ``store``.

    Every test takes a fixture named ``store`` returning an empty store of the kind under
    test (a fresh one per test) and checks what every ``Store`` must do: creation and ids,
    tenancy, optimistic saves and conflicts, scoped state, counters, transcripts and their
    reads, forks, retention, search, long-term memories and the refusals of bad input. The
    in-memory and SQL stores of this package run through it unchanged; so can yours::

        import pytest
        from durable_sessions.testing import StoreContract

        class TestMyStore(StoreContract):
            @pytest.fixture
            def store(self) -> MyStore:
                return MyStore()

    The tests are coroutines: run them with pytest-asyncio (``asyncio_mode = "auto"``, or
    the ``asyncio`` mark, which this class carries). Install the ``testing`` extra.
    """
