"""Python's garbage collector as a host application sets it up, watched for any change.

A library is a guest in its host's process: ``watched_collector`` (a context manager) sets the
collector up as one kind of host does (``HOSTS``: on, off, its own thresholds), replaces
every ``gc`` function that would change it or run a collection with a recorder for the
test's duration, and checks at the end that the switch and thresholds are as the host left
them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import pytest

HOSTS = {
    "default": (True, None),
    "tuned thresholds": (True, (5_000, 20, 20)),
    "collector off": (False, None),
}
"""How a host may set its collector up: on or off, the default thresholds or its own."""

CHANGES = ("collect", "disable", "enable", "set_threshold", "freeze", "unfreeze")
"""The ``gc`` functions that run a collection or change the collector's settings."""


class CollectorWatch:
    """The calls made to ``gc``'s ``CHANGES``, recorded instead of run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in CHANGES:
            monkeypatch.setattr(gc, name, self._recorder(name))

    def _recorder(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> int:
            self.calls.append(name)
            return 0

        return record


@contextlib.contextmanager
def watched_collector(host: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CollectorWatch]:
    """Set the collector up as ``host`` does, watch it, then check it is as it was."""
    enabled, thresholds = HOSTS[host]
    was, before = gc.isenabled(), gc.get_threshold()
    try:
        (gc.enable if enabled else gc.disable)()
        gc.set_threshold(*(thresholds or before))
        expected = (gc.isenabled(), gc.get_threshold())
        with monkeypatch.context() as patch:
            yield CollectorWatch(patch)
        assert (gc.isenabled(), gc.get_threshold()) == expected
    finally:
        gc.set_threshold(*before)
        (gc.enable if was else gc.disable)()
