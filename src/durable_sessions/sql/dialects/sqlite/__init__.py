"""SQLite through aiosqlite: its runner, its statements and its connection settings."""

__all__: list[str] = []
