"""Side-by-side benchmarks: durable-sessions vs Google ADK's DatabaseSessionService vs the
raw driver floor, on SQLite and Postgres; plus scaling curves and a profile of the hot paths.

Run ``python -m benchmarks --help`` from the repository root.
"""
