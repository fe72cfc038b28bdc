"""The package's layers: each subpackage imports only those below it (a source check, fast).

The simulator (``sim``) imports no theory: a run's level bounds and its
mean-field start come from ``runs``, the layer that plans it. ``theory``,
``sim`` and ``exact`` are siblings that do not import each other, but for
the exceptions listed in :data:`UPWARD` (deferred imports, each named).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jaxqueue"

#: A subpackage (or top-level module) may import those of a lower rank only.
RANK = {
    "core": 0,
    "results": 1,
    "policies": 2,
    "theory": 3,
    "sim": 3,
    "exact": 3,
    "runs": 4,
    "api": 5,
    "__init__": 6,
    "studies": 7,
    "cli": 8,
    "__main__": 9,
}

#: Imports against the ranks, each a deferred import inside one function (none today).
UPWARD: set[tuple[str, str]] = set()


def _layer(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def _imports(path: Path):
    """``(line, module)`` of every import of the package in a file, deferred ones included
    (``from jaxqueue import api`` is an import of ``jaxqueue.api``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "jaxqueue":
            yield from ((node.lineno, f"jaxqueue.{a.name}") for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)


def _target(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_layer_is_ranked():
    found = {_layer(p) for p in PACKAGE.rglob("*.py")}
    assert found == set(RANK), f"rank the new layers: {sorted(found ^ set(RANK))}"


def test_each_layer_imports_only_lower_ones():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer, rel = _layer(path), path.relative_to(PACKAGE).as_posix()
        for line, module in _imports(path):
            if not module.startswith("jaxqueue"):
                continue
            target = _target(module)
            if target == layer or RANK[target] < RANK[layer] or (rel, module) in UPWARD:
                continue
            bad.append(f"{rel}:{line} imports {module} ({layer} -> {target})")
    assert not bad, "\n".join(bad)


def test_the_simulator_imports_no_theory():
    """Named on its own: the rule the ranks above make (sim and theory are siblings)."""
    for path in (PACKAGE / "sim").rglob("*.py"):
        found = [m for _, m in _imports(path) if m.startswith("jaxqueue.")]
        assert not [m for m in found if _target(m) in ("theory", "runs")], path.name


def test_the_upward_exceptions_still_exist():
    """An exception that is gone must leave the list (else it hides a new one)."""
    for rel, module in UPWARD:
        assert any(m == module for _, m in _imports(PACKAGE / rel)), (rel, module)


def test_the_tests_mirror_the_package():
    """Each folder of tests names a subpackage and holds that subpackage's tests
    (tests/theory/ those of jaxqueue/theory/, ...); what spans the layers (the
    house rules, the docs, the public API, the references across engines) stays
    at the top of tests/."""
    tests = Path(__file__).resolve().parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders and folders <= subpackages, sorted(folders - subpackages)
    for folder in folders:
        assert all(p.name.startswith("test_") for p in (tests / folder).glob("*.py")), folder
