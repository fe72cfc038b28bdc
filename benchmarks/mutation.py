"""Mutation score of the theory's closed forms and the estimates (not a test, not run in CI).

    python benchmarks/mutation.py [--budget SECONDS] [--modules erlang,closed_forms]
                                  [--slow] [--children 2] [--workdir DIR] [--json]

Runs mutmut (``pip install '.[mutation]'``) over each module of :data:`MODULES`
with the test files that cover it: every mutant (an operator, a constant or a
comparison changed, a call argument dropped, ...) of the module is run against
the tests that call the mutated function, and is *killed* when one of them
fails, *survives* when all pass, is a *timeout* past mutmut's time limit, and
*no tests* when no selected test calls its function. The summary gives those
counts per module, the seconds it took, and each survivor's diff
(docs/testing.md discusses them).

Nothing in the working tree is touched: the repository (without its virtual
environments, results and git data) is copied into ``--workdir`` (a temporary
folder, removed at the end unless given), mutmut's configuration is written
into that copy's ``pyproject.toml``, and mutmut runs there. The modules run in
the order given, each with the budget left divided by the modules left; a
module out of time is stopped, and its unchecked mutants are counted as such.
``-m "not slow"`` selects the tests unless ``--slow``. One compilation cache
serves every mutant (a mutant that changes a compiled program compiles anew:
the cache is keyed by the program).

``--json``: the summary as one JSON record alone on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Each module mutated, and the test files that cover it (the tests that call
#: a mutated function are found by mutmut's own first run).
MODULES = {
    "erlang": (
        "jaxqueue/theory/erlang.py",
        ("tests/test_erlang.py", "tests/test_fits.py", "tests/test_mutants.py"),
    ),
    "closed_forms": (
        "jaxqueue/theory/closed_forms.py",
        ("tests/test_theory.py", "tests/test_meanfield.py", "tests/test_mutants.py"),
    ),
    "lu": ("jaxqueue/theory/lu.py", ("tests/test_lu.py", "tests/test_mutants.py")),
    "estimates": (
        "jaxqueue/results/estimates.py",
        (
            "tests/test_stats.py",
            "tests/test_displays.py",
            "tests/test_paired_verdicts.py",
            "tests/test_mutants.py",
        ),
    ),
}

#: What the copy leaves out: environments, caches, results, git data.
IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".ci-venv*",
    "__pycache__",
    "*.egg-info",
    "build",
    "mutants",
    ".pytest_cache",
    ".ruff_cache",
    "*.sqlite",
    "*.npz",
)

#: What the process each mutant is forked from imports first (none starts JAX's
#: backends): a mutant's own process then imports only the package and the tests.
PRELOAD = (
    "numpy",
    "scipy.linalg",
    "scipy.sparse",
    "scipy.special",
    "scipy.stats",
    "jax",
    "jax.numpy",
    "optax",
    "pytest",
    "matplotlib.pyplot",
)
PRELOAD_FILE = "mutmut_preload.txt"

#: mutmut's exit codes by the status it gives them (mutmut.stats.status_by_exit_code).
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "caught by type check",
    2: "interrupted",
    None: "not checked",
}


def log(text: str) -> None:
    print(f"[mutation] {text}", file=sys.stderr, flush=True)


def _copy_repository(dest: Path) -> None:
    for entry in ROOT.iterdir():
        if entry.name in {".git", ".venv", "build", "mutants"} or entry.name.startswith(".ci-venv"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, ignore=IGNORED, symlinks=True)
        else:
            shutil.copy2(entry, dest / entry.name)
    (dest / "sweeps" / "results").mkdir(parents=True, exist_ok=True)


def _toml_list(items) -> str:
    return "[" + ", ".join(json.dumps(str(x)) for x in items) + "]"


def _configure(copy: Path, module: str, tests: tuple, slow: bool) -> list:
    """mutmut's section in the copy's pyproject.toml: the module, its tests, and
    pytest on one process (the suite's ``-n auto`` would fork JAX workers)."""
    args = ["-n", "0", "-p", "no:cacheprovider"] + ([] if slow else ["-m", "not slow"])
    existing = [t for t in tests if (copy / t).exists()]
    section = "\n".join(
        [
            "",
            "[tool.mutmut]",
            'source_paths = ["jaxqueue"]',
            f"only_mutate = {_toml_list([module])}",
            f"pytest_add_cli_args = {_toml_list(args)}",
            f"pytest_add_cli_args_test_selection = {_toml_list(existing)}",
            'also_copy = ["docs", "sweeps", "benchmarks", "README.md"]',
            # a process per mutant, forked from one that imported the libraries
            # but never started JAX's backends (whose threads a fork would break)
            'process_isolation = "forkserver"',
            'forkserver_warmup = "import"',
            f"preload_modules_file = {json.dumps(PRELOAD_FILE)}",
            "use_git_change_detection = false",
            "",
        ]
    )
    with open(copy / "pyproject.toml", "a") as f:
        f.write(section)
    (copy / PRELOAD_FILE).write_text("\n".join(PRELOAD) + "\n")
    return existing


def _run_mutmut(copy: Path, budget: float, children: int, env: dict) -> tuple[float, bool, str]:
    """``mutmut run`` in ``copy`` for at most ``budget`` seconds (then SIGINT:
    mutmut stops its workers and saves what it has). Returns the seconds, whether
    it was stopped, and the tail of its output."""
    start = time.monotonic()
    out = open(copy / "mutmut.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(children)],
        cwd=copy,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stopped = False
    try:
        proc.wait(timeout=max(budget, 1.0))
    except subprocess.TimeoutExpired:
        stopped = True
        log("out of time: stopping mutmut")
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out.close()
    tail = (copy / "mutmut.log").read_text(errors="replace")[-2000:]
    return time.monotonic() - start, stopped, tail


def _results(copy: Path, module: str) -> dict:
    meta = copy / "mutants" / (module + ".meta")
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: STATUS.get(code, "suspicious") for name, code in codes.items()}


#: Run in a copy: each named mutant's diff, as JSON (mutmut 3.8's own ``show``,
#: in one process rather than one per mutant).
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
path, names = sys.argv[1], sys.argv[2:]
print(json.dumps({n: get_diff_for_mutant(n, path=path) for n in names}))
"""


def _diffs(copy: Path, module: str, names: list, env: dict) -> dict:
    if not names:
        return {}
    done = subprocess.run(
        [sys.executable, "-c", _DIFFS, module, *names],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        log(f"the diffs failed: {done.stderr[-1000:]}")
        return dict.fromkeys(names, "(no diff: see mutmut show NAME in the copy)")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_module(key: str, budget: float, args, base: Path, cache: Path) -> dict:
    module, tests = MODULES[key]
    copy = base / key
    _copy_repository(copy)
    tests = _configure(copy, module, tests, args.slow)
    env = dict(
        os.environ,
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.2",
        OPENBLAS_NUM_THREADS="1",
        MPLBACKEND="Agg",
    )
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the copy's tests are rewritten once, not per mutant
    log(f"{key}: {module} against {', '.join(tests)}, budget {budget:.0f} s")
    seconds, stopped, tail = _run_mutmut(copy, budget, args.children, env)
    status = _results(copy, module)
    if not status:
        log(f"{key}: mutmut gave no results; its output ends:\n{tail}")
    counts: dict = {}
    for s in status.values():
        counts[s] = counts.get(s, 0) + 1
    survivors = sorted(n for n, s in status.items() if s == "survived")
    row = {
        "module": module,
        "tests": tests,
        "seconds": round(seconds, 1),
        "stopped_by_budget": stopped,
        "total": len(status),
        "killed": counts.get("killed", 0),
        "survived": counts.get("survived", 0),
        "timeout": counts.get("timeout", 0),
        "no_tests": counts.get("no tests", 0),
        "not_checked": counts.get("not checked", 0) + counts.get("interrupted", 0),
        "other": {
            k: v
            for k, v in counts.items()
            if k not in {"killed", "survived", "timeout", "no tests", "not checked", "interrupted"}
        },
        "survivors": _diffs(copy, module, survivors, env),
    }
    checked = row["killed"] + row["survived"] + row["timeout"]
    row["score"] = round(row["killed"] / checked, 4) if checked else None
    log(
        f"{key}: {row['killed']} killed, {row['survived']} survived, {row['timeout']} timeout, "
        f"{row['no_tests']} no tests, {row['not_checked']} not checked of {row['total']} "
        f"in {seconds:.0f} s"
    )
    return row


def _print_summary(rows: list, seconds: float) -> None:
    print(
        f"{'module':34s} {'killed':>7s} {'survived':>9s} {'timeout':>8s} "
        f"{'no tests':>9s} {'unchecked':>10s} {'total':>6s} {'score':>6s} {'seconds':>8s}"
    )
    for r in rows:
        score = "-" if r["score"] is None else f"{r['score']:.1%}"
        print(
            f"{r['module']:34s} {r['killed']:7d} {r['survived']:9d} {r['timeout']:8d} "
            f"{r['no_tests']:9d} {r['not_checked']:10d} {r['total']:6d} {score:>6s} "
            f"{r['seconds']:8.0f}"
        )
    print(f"\n{seconds:.0f} s in all; score = killed / (killed + survived + timeout)")
    for r in rows:
        for name, diff in r["survivors"].items():
            print(f"\n## survived: {name}\n{diff}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--modules",
        default=",".join(MODULES),
        help=f"which of {', '.join(MODULES)}, in this order (default: all)",
    )
    ap.add_argument("--budget", type=float, default=2400.0, help="seconds for all modules")
    ap.add_argument("--children", type=int, default=2, help="mutants run at once")
    ap.add_argument("--slow", action="store_true", help="run the slow tests too")
    ap.add_argument("--workdir", help="where the copies go (kept); default a temporary folder")
    ap.add_argument("--json", action="store_true", help="the summary as JSON alone on stdout")
    args = ap.parse_args(argv)
    keys = [k.strip() for k in args.modules.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODULES]
    if unknown:
        ap.error(f"unknown module(s) {unknown}: choose from {', '.join(MODULES)}")
    try:
        import mutmut  # noqa: F401
    except ImportError:
        ap.error("mutmut is not installed: pip install '.[mutation]'")
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="jaxqueue-mut-"))
    base.mkdir(parents=True, exist_ok=True)
    start, rows = time.monotonic(), []
    try:
        for i, key in enumerate(keys):
            left = args.budget - (time.monotonic() - start)
            if left < 30:
                log(f"{key}: no budget left, skipped")
                continue
            rows.append(run_module(key, left / (len(keys) - i), args, base, base / "jit-cache"))
    finally:
        if not args.workdir:
            shutil.rmtree(base, ignore_errors=True)
    seconds = time.monotonic() - start
    if args.json:
        print(json.dumps({"seconds": round(seconds, 1), "modules": rows}, indent=1))
    else:
        _print_summary(rows, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
