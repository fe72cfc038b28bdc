"""Mutation score of the simulator, the policies, the theory and the studies (not a test, not run in CI).

    python benchmarks/mutation.py [--budget SECONDS] [--modules erlang,closed_forms]
                                  [--sample K] [--seed S] [--slow] [--children 2]
                                  [--workdir DIR] [--json]

Runs mutmut (``pip install '.[mutation]'``) over each group of :data:`MODULES`
with the test files that cover it: every mutant (an operator, a constant or a
comparison changed, a call argument dropped, ...) of the group's files is run
against the tests that call the mutated function, and is *killed* when one of
them fails, *survives* when all pass, is a *timeout* past mutmut's time limit,
and *no tests* when no selected test calls its function. The summary gives
those counts per group, the seconds it took, and each survivor's diff
(docs/testing.md discusses them).

``--sample K`` runs K mutants of each group drawn at random (seeded by
``--seed``) from all of them, for the groups whose every mutant would take hours
(the simulator's mutants each recompile the programs their tests run): the
score is then an estimate, given with its exact (Clopper-Pearson) 95% interval
over the sampled mutants checked.

Nothing in the working tree is touched: the repository (without its virtual
environments, results and git data) is copied into ``--workdir`` (a temporary
folder, removed at the end unless given), mutmut's configuration is written
into that copy's ``pyproject.toml``, and mutmut runs there. The modules run in
the order given, each with the budget left divided by the modules left; a
module out of time is stopped, and its unchecked mutants are counted as such.
``-m "not slow"`` selects the tests unless ``--slow``. One compilation cache
serves every mutant (a mutant that changes a compiled program compiles anew:
the cache is keyed by the program).

``--confirm MUTANT TEST...`` (with ``--workdir`` and one ``--modules`` group, after a
run that kept its copy) is the second stage for a mutant the fast tier let
through: it applies the mutant to the copy's source, runs the named test files
with their slow tests, and restores the source; docs/testing.md lists the
verdicts.

``--json``: the summary as one JSON record alone on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The fast tier's test files, for the groups that most tests reach.
ALL_TESTS = ("tests",)

#: Each group of files mutated, and the test files that cover it (the tests that
#: call a mutated function are found by mutmut's own first run).
MODULES = {
    "erlang": (
        "jaxqueue/theory/baselines/erlang.py",
        ("tests/theory/test_erlang.py", "tests/studies/test_fits.py", "tests/test_mutants.py"),
    ),
    "closed_forms": (
        "jaxqueue/theory/closed/closed_forms.py",
        ("tests/theory/test_theory.py", "tests/theory/test_meanfield.py", "tests/test_mutants.py"),
    ),
    "lu": ("jaxqueue/theory/baselines/lu.py", ("tests/theory/test_lu.py", "tests/test_mutants.py")),
    "estimates": (
        "jaxqueue/results/estimates.py",
        (
            "tests/results/test_stats.py",
            "tests/results/test_displays.py",
            "tests/studies/test_paired_verdicts.py",
            "tests/test_mutants.py",
        ),
    ),
    "policies": (
        (
            "jaxqueue/policies/base.py",
            "jaxqueue/policies/classic.py",
            "jaxqueue/policies/jiq.py",
            "jaxqueue/policies/probes.py",
            "jaxqueue/policies/per_server.py",
            "jaxqueue/policies/exact_rules.py",
            "jaxqueue/policies/registry.py",
        ),
        ALL_TESTS,
    ),
    "sim": (
        ("jaxqueue/sim/step.py", "jaxqueue/sim/collect.py", "jaxqueue/sim/blocks.py"),
        ALL_TESTS,
    ),
    "results": (
        (
            "jaxqueue/results/estimates.py",
            "jaxqueue/results/stats.py",
            "jaxqueue/results/student.py",
            "jaxqueue/results/warmup.py",
            "jaxqueue/results/simulation.py",
            "jaxqueue/results/response.py",
            "jaxqueue/results/schema.py",
            "jaxqueue/results/pools.py",
        ),
        ALL_TESTS,
    ),
    "studies": (
        (
            "jaxqueue/studies/crn/sensitivity.py",
            "jaxqueue/studies/crn/sides.py",
            "jaxqueue/studies/crn/paired.py",
            "jaxqueue/studies/grids/grid_theory.py",
            "jaxqueue/studies/grids/crn_rows.py",
        ),
        ALL_TESTS,
    ),
}


def _files(key: str) -> tuple:
    files = MODULES[key][0]
    return (files,) if isinstance(files, str) else tuple(files)


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

#: Tests that read what the copy leaves out (the committed stores), and the house
#: rules' tests, which read the sources (a mutated module is many times its size).
NOT_IN_COPY = (
    "tests/studies/test_sweeps.py::test_the_committed_paper_scale_stores_match_their_specs",
)
NOT_RUN = ("tests/test_house.py",)

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


def _configure(copy: Path, files: tuple, tests: tuple, slow: bool) -> list:
    """mutmut's section in the copy's pyproject.toml: the files, their tests, and
    pytest on one process (the suite's ``-n auto`` would fork JAX workers)."""
    args = ["-n", "0", "-p", "no:cacheprovider"] + ([] if slow else ["-m", "not slow"])
    for test in NOT_IN_COPY:
        args += ["--deselect", test]
    for test in NOT_RUN:
        args += ["--ignore", test]
    existing = [t for t in tests if (copy / t).exists()]
    section = "\n".join(
        [
            "",
            "[tool.mutmut]",
            'source_paths = ["jaxqueue"]',
            f"only_mutate = {_toml_list(files)}",
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


def _run_mutmut(
    copy: Path, budget: float, children: int, env: dict, names=()
) -> tuple[float, bool, str]:
    """``mutmut run`` (of the named mutants, or all) in ``copy`` for at most
    ``budget`` seconds (then SIGINT: mutmut stops its workers and saves what it
    has). Returns the seconds, whether it was stopped, and the tail of its output."""
    start = time.monotonic()
    out = open(copy / "mutmut.log", "a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *names],
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


def _results(copy: Path, files: tuple) -> dict:
    """Each mutant's status, over the group's files."""
    status = {}
    for module in files:
        meta = copy / "mutants" / (module + ".meta")
        if meta.exists():
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            status.update({name: STATUS.get(code, "suspicious") for name, code in codes.items()})
    return status


#: The characters of mutmut's progress spinner (left out of a quoted log).
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

#: A name no mutant has: ``mutmut run`` with it generates the mutants and maps
#: the tests to the functions they call, then stops before running any mutant.
_NO_MUTANT = "jaxqueue_no_such_mutant"


def _check_clean(tail: str) -> None:
    """Fail loudly where mutmut could not run the tests unmutated (then no mutant is checked)."""
    if "failed to collect stats" in tail:
        lines = [
            x for x in tail.replace("\r", "\n").splitlines() if x.strip() and x[0] not in SPINNER
        ]
        raise RuntimeError(
            "the clean tests failed under mutmut (run them in the copy's mutants/ folder with "
            "MUTANT_UNDER_TEST=stats to see which); its output ends:\n" + "\n".join(lines[-10:])
        )


def _sample(copy: Path, files: tuple, k: int, seed: int, budget: float, env: dict):
    """Generate the group's mutants without running them, and draw ``k`` of them
    uniformly (sorted names, a seeded generator: the same draw for the same code)."""
    seconds, _, tail = _run_mutmut(copy, budget, 1, env, [_NO_MUTANT])
    _check_clean(tail)
    names = sorted(_results(copy, files))
    if not names:
        raise RuntimeError(f"mutmut generated no mutants; its output ends:\n{tail}")
    return random.Random(seed).sample(names, min(k, len(names))), len(names), seconds


def clopper_pearson(killed: int, n: int, level: float = 0.95) -> tuple:
    """The exact binomial interval of a proportion ``killed / n``."""
    from scipy.stats import beta

    a = 1.0 - level
    lo = 0.0 if killed == 0 else float(beta.ppf(a / 2, killed, n - killed + 1))
    hi = 1.0 if killed == n else float(beta.ppf(1 - a / 2, killed + 1, n - killed))
    return lo, hi


#: Run in a copy: each named mutant's diff, as JSON (mutmut 3.8's own ``show``,
#: in one process rather than one per mutant).
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
path, names = sys.argv[1], sys.argv[2:]
print(json.dumps({n: get_diff_for_mutant(n, path=path) for n in names}))
"""


def _diffs(copy: Path, files: tuple, names: list, env: dict) -> dict:
    out = {}
    for module in files:
        # a mutant's name is its module's dotted path, then its function's
        dotted = module[: -len(".py")].replace("/", ".") + ".x"
        mine = [n for n in names if n.startswith(dotted)]
        if not mine:
            continue
        done = subprocess.run(
            [sys.executable, "-c", _DIFFS, module, *mine],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            log(f"the diffs failed: {done.stderr[-1000:]}")
            out.update(dict.fromkeys(mine, "(no diff: see mutmut show NAME in the copy)"))
        else:
            out.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def run_module(key: str, budget: float, args, base: Path, cache: Path) -> dict:
    files, tests = _files(key), MODULES[key][1]
    copy = base / key
    _copy_repository(copy)
    tests = _configure(copy, files, tests, args.slow)
    env = dict(
        os.environ,
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.2",
        OPENBLAS_NUM_THREADS="1",
        MPLBACKEND="Agg",
    )
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the copy's tests are rewritten once, not per mutant
    log(f"{key}: {', '.join(files)} against {', '.join(tests)}, budget {budget:.0f} s")
    names, population, seconds = [], None, 0.0
    if args.sample:
        names, population, seconds = _sample(copy, files, args.sample, args.seed, budget, env)
        log(f"{key}: {len(names)} of {population} mutants drawn (seed {args.seed})")
    spent, stopped, tail = _run_mutmut(copy, budget - seconds, args.children, env, names)
    _check_clean(tail)
    seconds += spent
    status = _results(copy, files)
    if names:
        status = {n: status.get(n, "not checked") for n in names}
    if not status:
        log(f"{key}: mutmut gave no results; its output ends:\n{tail}")
    counts: dict = {}
    for s in status.values():
        counts[s] = counts.get(s, 0) + 1
    survivors = sorted(n for n, s in status.items() if s == "survived")
    row = {
        "module": key,
        "files": list(files),
        "tests": tests,
        "population": population if names else len(status),
        "sampled": bool(names),
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
        "survivors": _diffs(copy, files, survivors, env),
    }
    checked = row["killed"] + row["survived"] + row["timeout"]
    # a timeout is counted as not caught: a loaded machine can time out a right run
    row["score"] = round(row["killed"] / checked, 4) if checked else None
    row["score_95"] = (
        [round(x, 4) for x in clopper_pearson(row["killed"], checked)] if checked else None
    )
    log(
        f"{key}: {row['killed']} killed, {row['survived']} survived, {row['timeout']} timeout, "
        f"{row['no_tests']} no tests, {row['not_checked']} not checked of {row['total']} "
        f"in {seconds:.0f} s"
    )
    return row


def _print_summary(rows: list, seconds: float) -> None:
    print(
        f"{'group':14s} {'killed':>7s} {'survived':>9s} {'timeout':>8s} {'no tests':>9s} "
        f"{'unchecked':>10s} {'run':>5s} {'of':>6s} {'score':>6s} {'95% interval':>14s} "
        f"{'seconds':>8s}"
    )
    for r in rows:
        score = "-" if r["score"] is None else f"{r['score']:.1%}"
        ci = "-" if r["score_95"] is None else f"{r['score_95'][0]:.0%}-{r['score_95'][1]:.0%}"
        print(
            f"{r['module']:14s} {r['killed']:7d} {r['survived']:9d} {r['timeout']:8d} "
            f"{r['no_tests']:9d} {r['not_checked']:10d} {r['total']:5d} {r['population']:6d} "
            f"{score:>6s} {ci:>14s} {r['seconds']:8.0f}"
        )
    print(
        f"\n{seconds:.0f} s in all; score = killed / (killed + survived + timeout),"
        " with its exact 95% interval (over a sample: 'run' of 'of' mutants)"
    )
    for r in rows:
        for name, diff in r["survivors"].items():
            print(f"\n## survived: {name}\n{diff}")


def confirm(copy: Path, name: str, tests: list, timeout: float = 1800.0) -> str:
    """Apply mutant ``name`` to the source of a kept copy, run ``tests`` there (the
    slow ones too, stopping at the first failure), and put the source back.
    Returns ``"killed"``, ``"survived"`` or ``"timeout"`` (the second stage of a
    fast-tier survivor: which slow test, if any, catches it)."""
    dotted = name.split(".x", 1)[0]  # the module: its functions are x_NAME, xǁCLASSǁNAME
    source = copy / (dotted.replace(".", "/") + ".py")
    saved = source.read_bytes()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")
    env.pop("PYTHONPATH", None)
    try:
        subprocess.run(
            [sys.executable, "-m", "mutmut", "apply", name],
            cwd=copy,
            env=env,
            check=True,
            capture_output=True,
        )
        if source.read_bytes() == saved:
            raise RuntimeError(f"mutmut apply {name} changed nothing in {source}")
        cmd = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:randomly"]
        cmd += ["-p", "no:cacheprovider", "-x", "-q", *tests]
        try:
            done = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout"
        return "survived" if done.returncode == 0 else "killed"
    finally:
        source.write_bytes(saved)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--modules",
        default=",".join(MODULES),
        help=f"which of {', '.join(MODULES)}, in this order (default: all)",
    )
    ap.add_argument("--budget", type=float, default=2400.0, help="seconds for all modules")
    ap.add_argument("--children", type=int, default=2, help="mutants run at once")
    ap.add_argument(
        "--sample", type=int, default=0, help="run this many mutants per group, drawn at random"
    )
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed")
    ap.add_argument("--slow", action="store_true", help="run the slow tests too")
    ap.add_argument("--workdir", help="where the copies go (kept); default a temporary folder")
    ap.add_argument("--json", action="store_true", help="the summary as JSON alone on stdout")
    ap.add_argument(
        "--confirm",
        nargs="+",
        metavar=("MUTANT", "TEST"),
        help="in the kept copy --workdir/GROUP: apply MUTANT, run the TESTs (slow ones too), "
        "restore, print killed or survived",
    )
    args = ap.parse_args(argv)
    if args.confirm:
        if not args.workdir or len(args.confirm) < 2 or len(args.modules.split(",")) != 1:
            ap.error("--confirm MUTANT TEST... needs --workdir and one --modules group")
        copy = Path(args.workdir) / args.modules
        verdict = confirm(copy, args.confirm[0], args.confirm[1:])
        print(f"{args.confirm[0]}: {verdict}")
        return 0
    keys = [k.strip() for k in args.modules.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODULES]
    if unknown:
        ap.error(f"unknown module(s) {unknown}: choose from {', '.join(MODULES)}")
    if args.sample < 0:
        ap.error(f"--sample must be >= 0 (0: every mutant), got {args.sample}")
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
