"""The house rules a source check can hold (fast, no JAX): module and function
sizes, no private names across modules, no import circles between modules.

Sizes: a module of at most 600 lines; a function of at most 80 lines of code
(lines that are not blank, a comment or the docstring). An exception is
listed by name in :data:`OVER` with its size, so it cannot grow; an entry
that no longer applies must leave the list.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jaxqueue"

MODULE_LINES = 600
FUNCTION_CODE_LINES = 80

#: Modules and functions over the limits, each with its size (``"path"`` or
#: ``"path:function"``): none today; an entry here must say why it cannot be split.
OVER: dict[str, int] = {}


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _docstring_lines(tree) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def _code_lines(node, text: list[str], docs: set[int]) -> int:
    count = 0
    for number in range(node.lineno, node.end_lineno + 1):
        line = text[number - 1].strip()
        if line and not line.startswith("#") and number not in docs:
            count += 1
    return count


def _sizes() -> dict[str, int]:
    """Every module over :data:`MODULE_LINES` and function over :data:`FUNCTION_CODE_LINES`.

    A nested function counts inside its parent too (its lines are the parent's)."""
    over = {}
    for path in _modules():
        source = path.read_text(encoding="utf-8")
        text = source.splitlines()
        if len(text) > MODULE_LINES:
            over[_rel(path)] = len(text)
        tree = ast.parse(source)
        docs = _docstring_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = _code_lines(node, text, docs)
                if size > FUNCTION_CODE_LINES:
                    over[f"{_rel(path)}:{node.name}"] = size
    return over


def test_modules_and_functions_within_their_sizes():
    found = _sizes()
    new = {k: v for k, v in found.items() if k not in OVER}
    grown = {k: (OVER[k], v) for k, v in found.items() if k in OVER and v > OVER[k]}
    gone = sorted(k for k in OVER if k not in found)
    assert not new, (
        f"over the limits ({MODULE_LINES} lines a module, {FUNCTION_CODE_LINES} of code a function): {new}"
    )
    assert not grown, f"grew past their listed size: {grown}"
    assert not gone, f"within the limits now: remove them from OVER: {gone}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(path: Path, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    base = _module_name(path).split(".")
    if path.name != "__init__.py":
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_names_used_across_modules():
    """Neither ``from jaxqueue.x import _name`` nor ``module._name`` on an imported module."""
    names = {_module_name(p) for p in _modules()}
    bad = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = set()  # local names bound to package modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = _resolve(path, node) or ""
                if not module.startswith("jaxqueue"):
                    continue
                for alias in node.names:
                    if _private(alias.name):
                        bad.append(f"{_rel(path)}:{node.lineno} imports {module}.{alias.name}")
                    if f"{module}.{alias.name}" in names:
                        aliases.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                aliases.update(a.asname for a in node.names if a.asname and a.name in names)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _private(node.attr)
            ):
                bad.append(f"{_rel(path)}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


def _top_level_imports(path: Path) -> set[str]:
    """The package modules a module imports at import time (not inside functions)."""
    names = {_module_name(p) for p in _modules()}
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        stack = [node]
        while stack:
            item = stack.pop()
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(item, ast.ImportFrom):
                module = _resolve(path, item) or ""
                for alias in item.names:
                    full = f"{module}.{alias.name}"
                    found.add(full if full in names else module)
            elif isinstance(item, ast.Import):
                found.update(a.name for a in item.names)
            stack.extend(ast.iter_child_nodes(item))
    return {m for m in found if m in names}


def test_no_import_circles_between_modules():
    """A module never imports, through any chain of imports, one that imports it
    (deferred imports included: a circle broken only by deferring is still one)."""
    graph = {}
    names = {_module_name(p) for p in _modules()}
    for path in _modules():
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(path, node) or ""
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in names else base)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        # a package's __init__ re-exports its modules: edges into it stand for its modules
        graph[module] = {t for t in targets if t in names and t != module}
    circles = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start and len(trail) > 1 and not _through_package_init(trail):
                    circles.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert not circles, "\n".join(sorted(set(circles)))


def _through_package_init(trail: list[str]) -> bool:
    """A circle through a package's ``__init__`` (which imports its own modules so
    users can reach them) is the package's interface, not a circle of modules."""
    names = {_module_name(p) for p in _modules() if p.name == "__init__.py"}
    return any(m in names for m in trail)
