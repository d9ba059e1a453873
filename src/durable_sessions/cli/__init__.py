"""The ``durable-sessions`` command: migrate, inspect, export and import, demo."""

from __future__ import annotations

from .main import main

__all__ = ["main"]
