"""The benchmark suite as one command: its registry, its import graph, and the performance
page's tables kept in step with the results files they are made from. (No benchmark is run
here: speed is measured by ``python -m benchmarks run NAME``, never asserted by a test.)"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture
def benchmarks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the repository's ``benchmarks`` package importable."""
    monkeypatch.syspath_prepend(str(ROOT))


def test_list_names_every_suite() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    names = [line.split()[0] for line in done.stdout.splitlines()]
    for kept in ("side-by-side", "adk", "openai", "scaling", "paging-search"):
        assert kept in names
    assert "Traceback" not in done.stderr


def test_an_unknown_suite_is_refused_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "no-such-suite"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "invalid choice" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.usefixtures("benchmarks")
def test_a_suite_not_yet_merged_is_unavailable_not_an_error() -> None:
    from benchmarks.suites import Suite

    assert Suite("benchmarks.not_merged_yet", "", ()).missing() == "benchmarks.not_merged_yet"
    assert Suite("benchmarks.cli", "", (), needs=("no_such.package",)).missing() == (
        "no_such.package"
    )


@pytest.mark.usefixtures("benchmarks")
def test_every_available_suite_has_a_main() -> None:
    import importlib

    from benchmarks.suites import SUITES

    for name, suite in SUITES.items():
        if suite.missing() is None:
            module = importlib.import_module(suite.module)
            assert callable(getattr(module, "main", None)), name


def _imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
            found.add(node.module.split(".")[1])  # type: ignore[union-attr]
    return found


def test_no_import_cycle_in_benchmarks() -> None:
    graph = {p.stem: _imports(p) for p in BENCHMARKS.glob("*.py")}
    state: dict[str, int] = {}  # 1 on the path being walked, 2 done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue  # a registered suite not merged yet
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join([*path, node, nxt])}"
            if state.get(nxt) is None:
                walk(nxt, [*path, node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [])


@pytest.mark.usefixtures("benchmarks")
def test_the_performance_tables_are_made_from_the_results_files(tmp_path: Path) -> None:
    """``docs/performance.md`` includes ``summary/*.md``: they say what the results hold."""
    from benchmarks.summary import SUMMARIES, write_summaries

    results = BENCHMARKS / "results"
    for source in results.glob("*.json"):
        shutil.copy(source, tmp_path / source.name)
    written = write_summaries(tmp_path)
    assert {p.stem for p in written} == set(SUMMARIES)
    for path in written:
        kept = results / "summary" / path.name
        assert kept.read_text(encoding="utf-8") == path.read_text(encoding="utf-8"), (
            f"{kept} is stale: run python -m benchmarks report"
        )
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    for name in SUMMARIES:
        assert f'--8<-- "benchmarks/results/summary/{name}.md"' in page
