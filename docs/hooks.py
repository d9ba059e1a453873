"""MkDocs hook: fail the build when a public name is missing from the API reference.

A name is public when it is in the ``__all__`` of a module listed in ``PUBLIC``. It is
documented when a page under ``reference/`` renders it with a mkdocstrings directive
(``::: durable_sessions.Manager``), or renders the module that defines it
(``::: durable_sessions.errors``). Each documented class and function must carry a
docstring of its own. ``mkdocs build --strict`` (``nox -s docs``) runs this hook.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

PUBLIC = {
    "durable_sessions": None,
    "durable_sessions.adk": None,
    "durable_sessions.crypto": None,
    "durable_sessions.openai_agents": None,
    "durable_sessions.testing": None,
    "durable_sessions.sql.dialects.citus": ["distribution_sql"],
}
"""Modules whose public names the reference must cover; None means the module's ``__all__``."""

DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.M)


def public_names() -> list[tuple[str, str, Any]]:
    """Every ``(module, name, object)`` the reference must document."""
    found = []
    for module_name, names in PUBLIC.items():
        module = importlib.import_module(module_name)
        for name in names if names is not None else module.__all__:
            found.append((module_name, name, getattr(module, name)))
    return found


def _resolve(target: str) -> Any:
    """The module or object a directive's identifier names."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise PluginError(f"the reference names {target!r}, which cannot be imported")


def documented(docs_dir: Path) -> tuple[set[str], set[int]]:
    """The ``module.name`` paths and object ids the reference pages render."""
    paths: set[str] = set()
    ids: set[int] = set()
    for page in sorted((docs_dir / "reference").glob("*.md")):
        for target in DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            obj = _resolve(target)
            paths.add(target)
            ids.add(id(obj))
            if inspect.ismodule(obj):
                names = getattr(obj, "__all__", [n for n in vars(obj) if not n.startswith("_")])
                for name in names:
                    paths.add(f"{target}.{name}")
                    ids.add(id(getattr(obj, name)))
    return paths, ids


def check(docs_dir: Path) -> list[str]:
    """What is wrong with the reference: each public name missing or without a docstring."""
    paths, ids = documented(docs_dir)
    problems = []
    for module_name, name, obj in public_names():
        shown = f"{module_name}.{name}" in paths
        if not shown and not isinstance(obj, (str, int, float)):
            shown = id(obj) in ids
        if not shown:
            problems.append(f"{module_name}.{name} is not in the API reference (docs/reference/)")
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and not obj.__doc__:
            problems.append(f"{module_name}.{name} has no docstring")
    return problems


def on_pre_build(config: Any) -> None:
    """Stop the build on the first public name the reference leaves out."""
    problems = check(Path(config["docs_dir"]))
    if problems:
        raise PluginError("API reference incomplete:\n  " + "\n  ".join(problems))
