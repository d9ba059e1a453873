"""The SQL store: one SQLAlchemy Core schema, its dialect differences, and SQLStore."""

from __future__ import annotations

from .store import SQLStore

__all__ = ["SQLStore"]
