"""The package's Alembic revisions, loaded as modules by path (their frozen tables and SQL)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from durable_sessions.migrate import script_location

VERSIONS = Path(script_location()) / "versions"


def load_revision(filename: str) -> ModuleType:
    """The module of the revision file ``filename`` (e.g. ``"0003_search.py"``)."""
    spec = importlib.util.spec_from_file_location(
        f"revision_{Path(filename).stem}", VERSIONS / filename
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
