"""The package's shape in counts, from its syntax trees (not a test, not run in CI).

    python benchmarks/house_counts.py [--json] [--list]

What a reader meets when configuration travels loose instead of as values
(``Model``, ``RunOptions``, ``Bounds``), and how the package is cut:

* lines and modules of ``jaxqueue/``, the modules per folder, and the modules
  of 500 lines or more (the house limit is 600);
* functions whose signature carries six or more of the configuration's option
  names (the fields of the three dataclasses);
* literal option lists: a tuple, list or set literal of six or more option
  names as strings, or a call passing six or more of them as keywords;
* functions taking 12 or more parameters.

``--list`` names each function or site counted; ``--json`` prints one JSON
record alone on stdout.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxqueue"
#: How many option names make a signature, a literal or a call "carry the options".
CARRIES = 6
#: Parameters that make a signature long.
LONG_SIGNATURE = 12
#: Lines that make a module large (the house limit is 600).
LARGE_MODULE = 500


def option_names() -> set[str]:
    """The fields of Model, RunOptions and Bounds."""
    sys.path.insert(0, str(ROOT))
    from jaxqueue.core.config import Bounds, Model, RunOptions

    return {f.name for cls in (Model, RunOptions, Bounds) for f in dataclasses.fields(cls)}


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return [n for n in names if n not in ("self", "cls")]


def _strings(node) -> list[str]:
    return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def count(options: set[str]) -> dict:
    modules, lines, by_folder, large = 0, 0, Counter(), []
    carriers, literals, long_signatures = [], [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        n = text.count("\n")
        modules, lines = modules + 1, lines + n
        by_folder[path.parent.relative_to(ROOT).as_posix()] += 1
        if n >= LARGE_MODULE:
            large.append(f"{rel} ({n})")
        for node in ast.walk(ast.parse(text)):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = _parameters(node)
                carried = options.intersection(params)
                if len(carried) >= CARRIES:
                    carriers.append(f"{where} {node.name} ({len(carried)})")
                if len(params) >= LONG_SIGNATURE:
                    long_signatures.append(f"{where} {node.name} ({len(params)})")
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                if len(options.intersection(_strings(node))) >= CARRIES:
                    literals.append(f"{where} literal")
            elif isinstance(node, ast.Call):
                given = {k.arg for k in node.keywords if k.arg is not None}
                if len(options.intersection(given)) >= CARRIES:
                    literals.append(f"{where} call")
    return {
        "lines": lines,
        "modules": modules,
        "modules_by_folder": dict(sorted(by_folder.items())),
        "large_modules": large,
        "option_names": len(options),
        "signatures_carrying_options": carriers,
        "literal_option_lists": literals,
        "long_signatures": long_signatures,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON record alone on stdout")
    ap.add_argument("--list", action="store_true", help="name every site counted")
    args = ap.parse_args(argv)
    out = count(option_names())
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"jaxqueue/: {out['lines']} lines in {out['modules']} modules")
    for folder, n in out["modules_by_folder"].items():
        print(f"  {folder:24s} {n:4d} modules")
    rows = [
        (f"modules of {LARGE_MODULE}+ lines", "large_modules"),
        (
            f"signatures carrying {CARRIES}+ of the {out['option_names']} option names",
            "signatures_carrying_options",
        ),
        (f"literal option lists ({CARRIES}+ names: literals, calls)", "literal_option_lists"),
        (f"functions with {LONG_SIGNATURE}+ parameters", "long_signatures"),
    ]
    for label, key in rows:
        print(f"{label:60s} {len(out[key]):4d}")
        if args.list:
            for site in out[key]:
                print(f"    {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
