"""The package's import graph: no cycle, and no import from a lower layer up to a higher one.

The layers, lowest first: errors; state and fulltext; the model; the cursor, context, the
``Store`` protocol and the keyring (``crypto``); the input checks (``prepare``); long-term
memories' rules and the envelope of encrypted stores (``sealing``); the stores (``memory``,
``sql``); what is built on any store (``manager``, ``service``, ``testing``, the package's
public names); the adapters; the command line and the web viewer. A module imports from
its own layer or below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "durable_sessions"

LAYERS: list[tuple[str, ...]] = [
    ("errors", "jsoncodec", "_tasks"),
    ("state", "fulltext"),
    ("model",),
    ("cursor", "context", "store", "crypto"),
    ("prepare",),
    ("memories", "sealing"),
    ("memory", "sql"),
    ("manager", "service", "testing", ""),
    ("adapters", "adk", "openai_agents"),
    ("cli", "web", "__main__"),
]
"""Each layer's top-level modules and packages (``""``: the package's ``__init__``, the
public names, which the contract suite imports as a store's author does)."""


def _modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, package)
    return found


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its body."""
    path, package = MODULES[name]
    here = name if package else name.rsplit(".", 1)[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                targets.add(candidate if candidate in MODULES else module)
        elif isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
    return {t for t in targets if t in MODULES and t != name}


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> int:
    top = name.split(".")[1] if "." in name else ""
    for rank, members in enumerate(LAYERS):
        if top in members:
            return rank
    raise AssertionError(f"{name} is in no layer: add it to LAYERS")


def test_every_module_is_in_a_layer() -> None:
    for name in MODULES:
        _layer(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_from_a_higher_layer(name: str) -> None:
    upward = sorted(t for t in GRAPH[name] if _layer(t) > _layer(name))
    assert not upward, f"{name} imports from a higher layer: {upward}"


def test_the_package_has_no_import_cycle() -> None:
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, path)
        path.pop()
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [])
    assert not cycles, cycles
