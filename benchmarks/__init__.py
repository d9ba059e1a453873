"""durable-sessions' benchmark suites, one command for all of them.

    python -m benchmarks list                 # every suite, and whether it can run here
    python -m benchmarks run NAME [--quick]   # run one; its results go to benchmarks/results/
    python -m benchmarks report               # remake the Markdown, charts and docs tables

Postgres is the server named by ``DURABLE_SESSIONS_BENCH_POSTGRES_URL`` (an admin URL: fresh
databases are created and dropped), by default ``postgresql+asyncpg://postgres@127.0.0.1:5432/postgres``.
The suites are registered in ``benchmarks.suites``.
"""
