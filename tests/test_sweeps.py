"""Every spec in sweeps/ runs end to end in quick mode: store, PNGs, and agreement with theory.

Each spec is run through the command line (``sweep --quick``, then ``plot``)
into a temporary folder. Checks: the store holds exactly the spec's points,
every ``[[figure]]`` is written as a PNG, and every simulated mean response
time with a theory value agrees with it within the Student-t tolerance of
its replicas (family: all such comparisons of the spec, family-wise rate
0.001) plus an allowance for the theory's own error at finite N: zero where
the theory is the exact CTMC, and ``MEAN_FIELD_ALLOWANCE / N`` relative to the
value where it is the mean field (its error shrinks like 1/N; the largest gap
between T and the mean field in the full runs of sweeps/README.md, 1.6% at
N = 500, is 8 / N, and in quick mode no point needs any allowance).

The suite runs the specs of :data:`IN_SUITE` end to end: the mean field and
no theory, loads and heavy-traffic exponents, per-server policies, server
pools, and the figure kinds of the rates, tails and response times. Grids
with the refined mean field (tests/test_grid.py) and with an arrivals file
(tests/test_trace_spec.py) run in their own tests. The other specs reuse
these features and run with ``--all-specs`` (about five more minutes on two
cores). Every spec is planned in the suite either way.
"""

import json
from pathlib import Path

import pytest

from jaxqueue.cli import main as cli_main
from jaxqueue.results.estimates import Estimate
from jaxqueue.results.stats import tolerance
from jaxqueue.studies.spec import load_spec
from jaxqueue.studies.store import Store

SPECS = sorted((Path(__file__).resolve().parents[1] / "sweeps").glob("*.toml"))
#: Relative finite-N error of the mean field allowed at N servers: this / N.
MEAN_FIELD_ALLOWANCE = 10.0
#: Metrics whose theory values are checked.
CHECKED = ("mean_response_time", "waiting_probability")


#: Specs run end to end in the suite (see the module notes); the rest need ``--all-specs``.
IN_SUITE = ("wang_fig6", "mitzenmacher_jiq", "liu_ying_alpha1", "pools_fast_servers")


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
        "mukherjee_hw",
        "mitzenmacher_jiq",
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

    from jaxqueue.studies.grid import CPU_MERGE_RATIO, _batches, _length, plan_grid, shape_groups

    gpu = [SimpleNamespace(platform="gpu")]
    for name in (
        "wang_fig4",
        "wang_table2_fig5",
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
GPU_SIZED = ("wang_fig4", "wang_table2_fig5", "mukherjee_hw", "liu_ying_fig2", "liu_ying_alpha1")


def test_gpu_modes_fill_a_device_with_at_least_twice_the_sample(capsys):
    """The [gpu] mode of each GPU-sized spec covers the full mode's points
    (Mukherjee et al.'s to N = 102400), compiles one program a policy, runs
    one batch a program on a GPU, and at every point takes at least twice
    the full mode's replicas x measured time, so that its intervals are no
    wider wherever the windows outlast the correlation time (what
    ``benchmarks/gpu_modes.py`` measures on the CPU; sweeps/README.md). Its
    starts are the mean field's."""
    from types import SimpleNamespace

    from jaxqueue.studies.grid import plan_grid, shape_groups

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


def _in_suite(path):
    if path.stem in IN_SUITE:
        return path
    return pytest.param(path, marks=pytest.mark.all_specs)


@pytest.mark.slow
@pytest.mark.parametrize("path", [_in_suite(p) for p in SPECS], ids=[p.stem for p in SPECS])
def test_spec_runs_in_quick_mode(path, tmp_path, capsys):
    spec = load_spec(path, quick=True)
    store = tmp_path / f"{spec.name}.sqlite"
    assert cli_main(["sweep", str(path), "--store", str(store), "--quick"]) == 0
    with Store.open_existing(store) as s:
        rows = s.rows()
        assert s.done() == {p.point_id() for p in spec.points}
    assert cli_main(["plot", str(store), "-o", str(tmp_path / "figures")]) == 0
    for fig in spec.figures:
        png = tmp_path / "figures" / f"{fig.name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", fig.name
    assert "simulation against theory" in capsys.readouterr().out
    checks = [r for r in rows if r["metric"] in CHECKED and r["theory"] is not None]
    if spec.run.theory != "none":
        assert checks, f"{spec.name}: theory {spec.run.theory!r} gave no values"
    exact = spec.run.theory == "exact"
    for r in checks:
        est = Estimate(r["mean"], r["ci95"], r["replicas"])
        allowance = 0.0 if exact else MEAN_FIELD_ALLOWANCE / r["servers"] * abs(r["theory"])
        tol = tolerance(est, family=len(checks), allowance=allowance)
        assert abs(r["mean"] - r["theory"]) <= tol, (spec.name, r["policy"], r["load"], r)
