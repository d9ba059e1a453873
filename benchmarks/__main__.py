"""``python -m benchmarks``: list the suites, run one, or remake the reports from results."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .suites import SUITES

RESULTS = Path("benchmarks/results")
QUICK_RESULTS = RESULTS / "quick"
"""Where ``--quick`` runs write, so that they never replace the published figures."""
DOCS_IMAGES = Path("docs/images")
"""Where the performance page finds the charts."""


def _list() -> int:
    width = max(map(len, SUITES))
    for name, suite in SUITES.items():
        missing = suite.missing()
        state = f"unavailable: {missing} is not installed" if missing else suite.summary
        print(f"{name:<{width}}  {state}")
    return 0


def _run(name: str, quick: bool, out: Path | None, extra: list[str]) -> int:
    suite = SUITES[name]
    missing = suite.missing()
    if missing is not None:
        print(f"suite {name!r} is unavailable: {missing} is not installed", file=sys.stderr)
        return 2
    module = importlib.import_module(suite.module)
    argv = list(suite.fixed)
    if quick:
        argv += list(getattr(module, "QUICK_ARGS", suite.quick))
    out = out or (QUICK_RESULTS if quick else RESULTS)
    if suite.takes_out:
        argv += ["--out", str(out)]
    argv += extra
    print(f"== {name}: python -m {suite.module} {' '.join(argv)}", flush=True)
    status = int(module.main(argv) or 0)
    if status == 0:
        _report(out, [name])
    return status


def _report(results: Path, names: list[str] | None = None) -> int:
    import shutil

    from .summary import write_summaries

    for path in write_summaries(results, names):
        print(f"written {path}")
    if results.resolve() == RESULTS.resolve():  # the published figures: the docs show them
        for chart in sorted(results.glob("*.png")):
            shutil.copyfile(chart, DOCS_IMAGES / chart.name)
            print(f"copied {chart} to {DOCS_IMAGES}")
    return 0


def _remake(results: Path) -> int:
    """Render every results file's Markdown (and charts) again, then the summaries."""
    import json

    from .report import load_results, save_results

    if (results / "results.json").exists():
        save_results(load_results(results), results)
        print(f"written {results / 'results.md'} and the charts")
    for stem in ("adk_adapter", "adk_adapter_mysql"):
        if (results / f"{stem}.json").exists():
            from .adk_report import render

            data = json.loads((results / f"{stem}.json").read_text(encoding="utf-8"))
            (results / f"{stem}.md").write_text(render(data), encoding="utf-8")
            print(f"written {results / stem}.md")
    return _report(results)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run it."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="durable-sessions' benchmark suites. Options after `--` go to the suite.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("list", help="name every suite, and whether it can run here")
    run = commands.add_parser("run", help="run one suite and write its results")
    run.add_argument("name", choices=list(SUITES), metavar="NAME", help=", ".join(SUITES))
    run.add_argument(
        "--quick", action="store_true", help=f"a short check run, written to {QUICK_RESULTS}"
    )
    run.add_argument("--out", type=Path, help=f"results directory (default {RESULTS})")
    report = commands.add_parser(
        "report", help="remake results.md, the charts and the performance page's tables"
    )
    report.add_argument("--results", type=Path, default=RESULTS)
    args, extra = parser.parse_known_args(argv)
    if extra and extra[0] == "--":
        extra = extra[1:]
    if args.command == "list":
        return _list()
    if args.command == "run":
        return _run(args.name, args.quick, args.out, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return _remake(args.results)


if __name__ == "__main__":
    raise SystemExit(main())
