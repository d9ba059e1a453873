"""The public surface: one sorted ``__all__`` that matches what the package exports."""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import types
from pathlib import Path

import pytest

import durable_sessions

# Every name DESIGN.md's "Public API" section lists; more is welcome, renaming is not.
DESIGNED_NAMES = {
    "Session",
    "Event",
    "Filter",
    "Store",
    "InMemoryStore",
    "SQLStore",
    "Manager",
    "SessionService",
    "USER_PREFIX",
    "APP_PREFIX",
    "TEMP_PREFIX",
    "new_id",
    "derive_title",
    "current_org_id",
    "current_conversation_id",
    "SessionError",
    "SessionNotFoundError",
    "SessionExistsError",
    "StaleSessionError",
    "InvalidStateError",
    "MissingScopeError",
}

PACKAGE_DIR = Path(durable_sessions.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
    return ".".join(("durable_sessions", *parts)).removesuffix(".__init__")


# Every module of the package, by source file; ``__main__`` is a script, not an API module.
MODULE_FILES = {
    _module_name(path): path
    for path in sorted(PACKAGE_DIR.rglob("*.py"))
    if path.name != "__main__.py"
}


def _module_ast(module_name: str) -> ast.Module:
    return ast.parse(MODULE_FILES[module_name].read_text(encoding="utf-8"))


def _isort_key(name: str) -> tuple[int, list[int | str]]:
    """The order ruff's RUF022 enforces: CONSTANTS, then CamelCase, then the rest."""
    if name.isupper():
        category = 0
    elif name[:1].isupper():
        category = 1
    else:
        category = 2
    natural: list[int | str] = [
        int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)
    ]
    return category, natural


def _public_names(module: types.ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        # ``from __future__ import annotations`` leaves a compiler flag, not an export.
        and type(value).__module__ != "__future__"
    }


def test_all_is_sorted_without_duplicates() -> None:
    names = list(durable_sessions.__all__)
    assert len(names) == len(set(names))
    assert names == sorted(names, key=_isort_key)


def test_all_matches_the_exported_names() -> None:
    assert set(durable_sessions.__all__) == _public_names(durable_sessions)


def test_all_includes_every_designed_name() -> None:
    assert set(durable_sessions.__all__) >= DESIGNED_NAMES


def _attribute_docstring(name: str) -> str | None:
    """Return the docstring written under ``NAME = ...`` in any module of the package."""
    for module_name in MODULE_FILES:
        body = _module_ast(module_name).body
        for node, following in itertools.pairwise(body):
            if name in _assigned_names(node):
                if (
                    isinstance(following, ast.Expr)
                    and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)
                ):
                    return following.value.value
                return None
    return None


def _assigned_names(node: ast.stmt) -> set[str]:
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _top_level_names(body: list[ast.stmt]) -> set[str]:
    """The names a module binds at top level, including inside ``try`` and ``if`` blocks."""
    names: set[str] = set()
    for node in body:
        names |= _assigned_names(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                names |= _top_level_names(block)
        elif isinstance(node, ast.If):
            names |= _top_level_names(node.body) | _top_level_names(node.orelse)
    return names


@pytest.mark.parametrize("name", sorted(durable_sessions.__all__))
def test_every_export_has_a_docstring(name: str) -> None:
    value = getattr(durable_sessions, name)
    if inspect.isclass(value) or inspect.isroutine(value):
        # A class's own docstring, not one inherited from a base class.
        doc = vars(value).get("__doc__") if inspect.isclass(value) else value.__doc__
    else:
        doc = _attribute_docstring(name)
    assert doc is not None
    assert doc.strip(), f"{name} has an empty docstring"


DOCUMENTED_CLASSES = [
    durable_sessions.Session,
    durable_sessions.Manager,
    durable_sessions.SessionService,
    durable_sessions.InMemoryStore,
    durable_sessions.SQLStore,
    durable_sessions.Store,
]


def _public_methods(cls: type) -> list[str]:
    names = []
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = inspect.getattr_static(cls, name)
        if isinstance(attr, (staticmethod, classmethod)):
            attr = attr.__func__
        if inspect.isfunction(attr) or isinstance(attr, property):
            names.append(name)
    return names


@pytest.mark.parametrize("cls", DOCUMENTED_CLASSES, ids=lambda cls: cls.__name__)
def test_every_public_method_has_a_docstring(cls: type) -> None:
    undocumented = [
        name
        for name in _public_methods(cls)
        if not (inspect.getattr_static(cls, name).__doc__ or "").strip()
    ]
    assert undocumented == []


def test_the_store_protocol_has_methods_to_document() -> None:
    # Guards the test above against passing because it found nothing to check.
    assert {"create", "get", "update", "delete", "list", "append_event", "list_events"} <= set(
        _public_methods(durable_sessions.Store)
    )


@pytest.mark.parametrize("module_name", sorted(MODULE_FILES))
def test_every_submodule_declares_all(module_name: str) -> None:
    # Read from the source, so that modules needing an optional extra are checked too.
    body = _module_ast(module_name).body
    declared = [
        node.value
        for node in body
        if "__all__" in _assigned_names(node) and isinstance(node, (ast.Assign, ast.AnnAssign))
    ]
    assert declared, f"{module_name} does not declare __all__"
    names = ast.literal_eval(declared[0])
    assert len(names) == len(set(names))
    assert set(names) <= _top_level_names(body)


def test_the_module_list_is_complete() -> None:
    # Guards the test above against passing because it found no module to check.
    assert {"durable_sessions", "durable_sessions.model", "durable_sessions.sql.store"} <= set(
        MODULE_FILES
    )
