"""Postgres through asyncpg: its runner, its statements and its transaction isolation."""

__all__: list[str] = []
