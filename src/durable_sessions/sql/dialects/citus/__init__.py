"""Postgres distributed by organisation (Citus's shape): statements that stay on one shard.

``distribution_sql()`` is the one way to distribute the tables (see the scaling guide).
"""

from __future__ import annotations

from .programs import SETTING, distribution_sql

__all__ = ["SETTING", "distribution_sql"]
