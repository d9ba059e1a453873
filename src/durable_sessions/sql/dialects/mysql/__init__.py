"""MySQL and MariaDB (asyncmy): the runner, the session settings and the programs."""

__all__: list[str] = []
