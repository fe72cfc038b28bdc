"""Every spec in sweeps/ runs end to end in quick mode: store, PNGs, and agreement with theory.

Each spec is run through the command line (``sweep --quick``, ``export
--csv``, then ``plot``) into a temporary folder. Checks: the store holds
exactly the spec's points and the CSV every row, every ``[[figure]]`` is
written as a PNG, and every simulated mean response
time with a theory value agrees with it within the Student-t tolerance of
its replicas (family: all such comparisons of the spec, family-wise rate
0.001) plus an allowance for the theory's own error at finite N: zero where
the theory is the exact CTMC, and the finite-N allowance of
docs/statistics.md where it is the mean field (``10 / N`` of ``T - E[S]``,
with ``E[S]`` the fastest server's mean service time, a floor on T; of
``min(p, 1 - p)`` for P(wait)). Measured in quick mode: every point within
0.4 of its tolerance with no allowance at all (the largest: wang_fig4's
JIQ-Pod at 0.7, 0.39; wang_fig6 at load 0.3, where the former 10 / N of T
was 4.5 times the tolerance, 0.38 with an allowance now 0.09 of it).

The suite runs every spec: those of :data:`WHOLE` in their whole quick
mode (the mean field and no theory, loads and heavy-traffic exponents,
per-server policies, server pools, the figure kinds of the rates, tails and
response times), each of the others on a slice of its quick mode
(:func:`_slice`: its first policy at one load, every other value kept),
which goes through the same parse, plan, run, store, export and figures on
fewer points; ``--all-specs`` runs their whole quick mode instead (about
five more minutes on two cores). Grids with the refined mean field
(tests/studies/test_grid.py) and with an arrivals file (tests/studies/test_trace_spec.py)
also run in their own tests. Every spec is planned whole in the suite.
"""

import io
import json
import os
import re
from pathlib import Path

import pytest
import tomllib
from agreement import finite_n_allowance

from jaxqueue.cli import main as cli_main
from jaxqueue.results.estimates import Estimate
from jaxqueue.results.stats import tolerance
from jaxqueue.studies.grids.grid import run_grid
from jaxqueue.studies.grids.spec import load_spec, parse_spec
from jaxqueue.studies.grids.store import COLUMNS, Store

SPECS = sorted((Path(__file__).resolve().parents[2] / "sweeps").glob("*.toml"))
#: Metrics whose theory values are checked.
CHECKED = ("mean_response_time", "waiting_probability")


#: Specs run whole in quick mode in the suite (see the module notes); the rest run a
#: slice, whole with ``--all-specs``. A whole quick run of each of the rest took
#: 20 to 85 s on one core (wang_table2_fig5 57, wang_fig7_8 60, liu_ying_fig2 36,
#: mukherjee_hw 20, daily_profile 85, wang_trace 60); wang_fig4's takes 7.
WHOLE = ("wang_fig6", "mitzenmacher_jiq", "liu_ying_alpha1", "pools_fast_servers", "wang_fig4")


def test_every_reproduction_has_a_spec_that_plans(capsys):
    """Every spec, run in the suite or not, loads and plans in quick and full mode."""
    names = {p.stem for p in SPECS}
    assert {
        "wang_fig4",
        "wang_table2_fig5",
        "wang_fig6",
        "wang_fig7_8",
        "liu_ying_fig2",
        "liu_ying_alpha1",
        "liu_ying_fig1",
        "mukherjee_hw",
        "mitzenmacher_jiq",
        "wang_table2_qk",
        "wang_threshold",
    } <= names
    for path in SPECS:
        full, quick = load_spec(path), load_spec(path, quick=True)
        assert quick.figures, f"{path.name} draws no figure"
        assert len(quick.points) <= len(full.points)
        for spec, flags in ((full, ()), (quick, ("--quick",))):
            assert spec.points and spec.run.replicas >= 2, path.name
            assert cli_main(["sweep", str(path), "--plan", "--json", *flags]) == 0
            assert json.loads(capsys.readouterr().out)["points"] == len(spec.points)


def test_on_a_gpu_each_shape_is_one_batch_and_on_a_cpu_lengths_stay_close():
    """The paper specs compile one program a policy (N and M are per-replica
    numbers). On a GPU a shape group's points of other run lengths share
    batches (each its own window): one batch a shape. On a CPU a batch
    holds points whose lengths are within CPU_MERGE_RATIO of each other (the
    shorter ones' replicas step to the longest's end for nothing)."""
    from types import SimpleNamespace

    from jaxqueue.studies.grids.grid import (
        CPU_MERGE_RATIO,
        _batches,
        _length,
        plan_grid,
        shape_groups,
    )

    gpu = [SimpleNamespace(platform="gpu")]
    for name in (
        "wang_fig4",
        "wang_table2_fig5",
        "wang_table2_qk",
        "mukherjee_hw",
        "liu_ying_fig2",
        "liu_ying_alpha1",
    ):
        spec = load_spec(SPECS[[p.stem for p in SPECS].index(name)])
        on_gpu = plan_grid(spec, devices=gpu)
        assert on_gpu["batches"] == on_gpu["shapes"] == len(shape_groups(spec)), name
        # N and M are per-replica numbers: one compiled program a policy
        assert on_gpu["shapes"] == len({(p.policy, p.options) for p in spec.points}), name
        if name == "wang_fig4":  # 8 loads a policy, lengths within 1.25: two batches each
            assert plan_grid(spec)["batches"] == 6
        for points in shape_groups(spec).values():
            for batch in _batches(points, spec, 32)[1]:
                lengths = [_length(p, spec) for p in batch]
                assert max(lengths) <= CPU_MERGE_RATIO * min(lengths), name


#: The specs sized for a GPU: each has a [gpu] mode (many replicas over short windows).
GPU_SIZED = (
    "wang_fig4",
    "wang_table2_fig5",
    "wang_table2_qk",
    "mukherjee_hw",
    "liu_ying_fig2",
    "liu_ying_alpha1",
)


def test_gpu_modes_fill_a_device_with_at_least_twice_the_sample(capsys):
    """The [gpu] mode of each GPU-sized spec covers the full mode's points
    (Mukherjee et al.'s to N = 102400), compiles one program a policy, runs
    one batch a program on a GPU, and at every point takes at least twice
    the full mode's replicas x measured time, so that its intervals are no
    wider wherever the windows outlast the correlation time (what
    ``benchmarks/gpu_modes.py`` measures on the CPU; sweeps/README.md). Its
    starts are the mean field's."""
    from types import SimpleNamespace

    from jaxqueue.studies.grids.grid import plan_grid, shape_groups

    gpu = [SimpleNamespace(platform="gpu")]
    for name in GPU_SIZED:
        path = SPECS[[p.stem for p in SPECS].index(name)]
        full, fast = load_spec(path), load_spec(path, mode="gpu")
        assert fast.run.init == "mean-field", name
        ids = {p.point_id(): p for p in fast.points}
        assert {p.point_id() for p in full.points} <= set(ids), name
        for p in full.points:
            q = ids[p.point_id()]
            full_sample = full.run.replicas * full.run.steps_for(p)
            assert fast.run.replicas * fast.run.steps_for(q) >= 2 * full_sample, (name, p)
        planned = plan_grid(fast, devices=gpu)
        assert planned["batches"] == planned["shapes"] == len(shape_groups(fast)), name
        assert planned["shapes"] == len({(p.policy, p.options) for p in fast.points}), name
        assert cli_main(["sweep", str(path), "--plan", "--json", "--gpu"]) == 0
        assert json.loads(capsys.readouterr().out)["points"] == len(fast.points)
    assert (
        max(
            p.servers
            for p in load_spec(
                SPECS[[p.stem for p in SPECS].index("mukherjee_hw")], mode="gpu"
            ).points
        )
        == 102400
    )


def _service_floor(row) -> float:
    """The mean service time of a spec row's fastest server (1 without pools)."""
    pools = row["pools"]
    return 1.0 if not pools else 1.0 / max(float(p.split(":")[1]) for p in pools.split(","))


def _toml(value) -> str:
    """A value of a spec's table in TOML (strings, numbers, lists, inline tables)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return repr(value)


def _listed(value) -> list:
    return [] if value is None else value if isinstance(value, list) else [value]


def _slice(path: Path, folder: Path) -> Path:
    """``path`` written into ``folder`` with its ``[quick]`` table narrowed to its
    first policy (an option with several values: the first) and one load (where
    the spec has loads: one that a figure's ``where`` names, else the first; an
    ``alpha`` or ``beta`` axis likewise, else its median value);
    every other key, table and figure as written.
    The spec's ``data/`` folder is linked beside it (arrival files are
    relative to the spec)."""
    text = path.read_text()
    doc = tomllib.loads(text)
    quick = dict(doc["quick"])
    first = quick.get("policy", doc["grid"]["policy"])[0]
    if isinstance(first, dict):
        first = {k: v[0] if isinstance(v, list) else v for k, v in first.items()}
    quick["policy"] = [first]
    loads = quick.get("load", doc["grid"].get("load"))
    if loads is not None:
        named = [v for f in doc["figure"] for v in _listed(f.get("where", {}).get("load"))]
        quick["load"] = [next((v for v in loads if v in named), loads[0])]
    for axis in ("alpha", "beta"):  # a heavy-traffic load axis: one value, named or the median
        values = quick.get(axis, doc["grid"].get(axis))
        if isinstance(values, list) and len(values) > 1:
            named = [v for f in doc["figure"] for v in _listed(f.get("where", {}).get(axis))]
            quick[axis] = [next((v for v in values if v in named), values[len(values) // 2])]
    table = "[quick]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in quick.items()) + "\n"
    sliced, count = re.subn(r"(?ms)^\[quick\]\n.*?(?=^\[|\Z)", lambda m: table, text)
    assert count == 1, path.name
    (folder / "data").symlink_to(path.parent / "data")
    out = folder / path.name
    out.write_text(sliced)
    return out


def _ids(path: Path) -> str:
    return path.stem if path.stem in WHOLE else f"{path.stem}-slice-one-policy-one-load"


@pytest.mark.slow
@pytest.mark.parametrize("path", SPECS, ids=[_ids(p) for p in SPECS])
def test_spec_runs_in_quick_mode(path, tmp_path, capsys, request):
    if path.stem not in WHOLE and not request.config.getoption("--all-specs"):
        path = _slice(path, tmp_path)
    spec = load_spec(path, quick=True)
    store = tmp_path / f"{spec.name}.sqlite"
    assert cli_main(["sweep", str(path), "--store", str(store), "--quick"]) == 0
    with Store.open_existing(store) as s:
        rows = s.rows()
        assert s.done() == {p.point_id() for p in spec.points}
    csv = tmp_path / "rows.csv"
    assert cli_main(["export", str(store), "--csv", str(csv)]) == 0
    assert len(csv.read_text().splitlines()) == len(rows) + 1  # a header and every row
    assert cli_main(["plot", str(store), "-o", str(tmp_path / "figures")]) == 0
    for fig in spec.figures:
        png = tmp_path / "figures" / f"{fig.name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", fig.name
    # the report names what the theory is: a prediction, or the M/M/N benchmark
    said = "the M/M/N (Erlang C) benchmark" if spec.run.theory == "erlang" else "theory"
    assert f"simulation against {said}" in capsys.readouterr().out
    checks = [r for r in rows if r["metric"] in CHECKED and r["theory"] is not None]
    if spec.run.theory != "none":
        assert checks, f"{spec.name}: theory {spec.run.theory!r} gave no values"
    if spec.run.theory == "erlang":  # a bound, not a prediction: see _check_erlang_bound
        _check_erlang_bound(spec.name, checks)
        return
    exact = spec.run.theory == "exact"
    for r in checks:
        est = Estimate(r["mean"], r["ci95"], r["replicas"])
        allowance = (
            0.0
            if exact
            else finite_n_allowance(
                r["metric"], r["theory"], r["n_servers"], service=_service_floor(r)
            )
        )
        tol = tolerance(est, family=len(checks), allowance=allowance)
        assert abs(r["mean"] - r["theory"]) <= tol, (spec.name, r["policy"], r["load"], r)


def _check_erlang_bound(name: str, checks: list) -> None:
    """theory = "erlang" stores the M/M/N queue of each point's N and load, whose
    mean wait is a lower bound for distributed queues (Liu and Ying,
    arXiv:1912.11904): each simulated mean response time is at least its value
    less the Student-t tolerance (family: those compared). Points where no
    replica saw a wait (an interval of 0) have nothing to compare."""
    rows = [r for r in checks if r["metric"] == "mean_response_time" and r["ci95"] > 0]
    assert rows, f"{name}: no mean response time to compare with the M/M/N queue"
    for r in rows:
        tol = tolerance(Estimate(r["mean"], r["ci95"], r["replicas"]), family=len(rows))
        assert r["mean"] >= r["theory"] - tol, (name, r["policy"], r["load"], r)


#: One point whose warm-up diagnostic fails (tests/runs/test_warmup_auto.py): one
#: server at load 1.2 with room for 4000 tasks, started empty, no warm-up.
FAILING_WARMUP = """\
name = "failing_warmup"
[grid]
policy = ["random"]
n_servers = [1]
buffer = [4000]
load = [1.2]
[run]
replicas = 2
steps = 5120
warmup = 0
seed = 1
init = "empty"
theory = "none"
[[figure]]
name = "t"
metric = "mean_response_time"
x = "load"
"""


@pytest.mark.slow
def test_a_sweep_keeps_each_points_warmup_verdict(tmp_path):
    """A point whose warm-up diagnostic failed says so in the store and its
    exports (the ``warmup_passed`` column: 1, 0, or empty where nothing could
    be judged), as a single run's result and the command line do."""
    store = tmp_path / "failing.sqlite"
    log = io.StringIO()
    assert run_grid(parse_spec(FAILING_WARMUP), store, log=log) == 1
    assert "warning: the warm-up diagnostic failed at 1 of the 1 points" in log.getvalue()
    with Store.open_existing(store) as s:
        rows = s.rows()
    assert rows and "warmup_passed" in COLUMNS
    assert all(r["warmup_passed"] == 0 for r in rows)
    csv = tmp_path / "rows.csv"
    assert cli_main(["export", str(store), "--csv", str(csv)]) == 0
    assert "warmup_passed" in csv.read_text().splitlines()[0].split(",")


def test_the_committed_paper_scale_stores_match_their_specs(capsys):
    """sweeps/reproduce.py list: every result it runs has a spec, and each committed
    finished store holds every point of its spec as the repository has it (a spec
    edited without a rerun would leave its store, and the figures drawn from it,
    stale: the hash differs and it reads 'to run')."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "sweeps" / "reproduce.py"
    spec = importlib.util.spec_from_file_location("reproduce", path)
    reproduce = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reproduce)
    cwd = os.getcwd()
    try:
        assert reproduce.main(["list"]) == 0
    finally:
        os.chdir(cwd)
    lines = {line.split()[0]: line.split()[2] for line in capsys.readouterr().out.splitlines()}
    assert set(lines) == set(reproduce.RUNS)
    finished = ("wang_fig4", "wang_fig6", "wang_table2_fig5", "mukherjee_hw", "liu_ying_fig2")
    finished += ("liu_ying_fig1", "liu_ying_alpha1", "liu_ying_class", "liu_ying_theorem")
    for name in finished:
        assert lines[name] == "finished", name
