"""SQLStore: the Store contract over SQLAlchemy Core (work in progress)."""

from __future__ import annotations

__all__ = ["SQLStore"]


class SQLStore:
    """Placeholder while the SQL store is written."""
