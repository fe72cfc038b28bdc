"""The diffusion limit's stationary means (jaxqueue.theory.baselines.diffusion.stationary_means)
and the figure baseline they draw (``baseline = "diffusion"``).

The stationary means against Ito's identities (docs/diffusion.md): ``E[Q_1] =
-beta`` and ``E[Q_1^2] + beta E[Q_2] / 2 = 1 + beta^2``; the baseline as a level
line on figures of counts over ``sqrt(N)`` against ``n_servers``, and nowhere
else; Mukherjee et al.'s figure drawn with it from a synthetic store (rows
written directly, no simulation).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from jaxqueue.cli import main as cli_main
from jaxqueue.results.estimates import estimate
from jaxqueue.results.stats import within
from jaxqueue.studies.grids.spec import SpecError, parse_spec
from jaxqueue.studies.grids.store import Store, parameter_values
from jaxqueue.studies.plotting.baselines import BASELINE_NAMES, baseline_curve
from jaxqueue.studies.plotting.figures import Series, summary_text
from jaxqueue.theory.baselines import diffusion

MUKHERJEE = Path(__file__).resolve().parents[2] / "sweeps" / "mukherjee_hw.toml"
#: The paths of the identity check: 2048 paths with the step 0.02 (about 2 s).
PATHS, DT, SEED = 2048, 0.02, 1
NAME = BASELINE_NAMES["diffusion"]


def test_the_stationary_means_satisfy_itos_identities():
    """Each path's time average over [10, 40] from (0, 0) at ``beta = 1``
    (family 2). ``E[Q_1] = -beta``: allowance 0.01 for the step and the burn-in
    (measured with 32768 paths: within 0.005 of ``-beta``, the paths' half-width
    0.003, at ``dt`` = 0.04 to 0.005 and burn-ins of 10 and 40). ``E[Q_2]``
    against ``2 (1 + beta^2 - E[Q_1^2]) / beta`` from the same paths, path by
    path: allowance 0.02 for the step and the burn-in (the difference measured
    with 32768 paths: 0.008 ± 0.011 at ``dt = 0.02``, 0.004 ± 0.011 at 0.01;
    docs/diffusion.md)."""
    beta = 1.0
    got = diffusion.stationary_means(beta, paths=PATHS, dt=DT, seed=SEED)
    assert got.times[0] == pytest.approx(10.0) and got.times[-1] == pytest.approx(40.0)
    assert got.q1.n == PATHS and got.settings["burn"] == 10.0 and got.settings["span"] == 30.0
    assert within(got.q1, -beta, family=2, allowance=0.01)
    x = diffusion.integrate(beta, got.times, paths=PATHS, dt=DT, seed=SEED)  # the same paths
    q1, q2 = x[:, :, 0].mean(axis=1), x[:, :, 1].mean(axis=1)
    assert estimate(q2).mean == got.q2.mean and estimate(q1).mean == got.q1.mean
    implied = 2.0 * (1.0 + beta**2 - (x[:, :, 0] ** 2).mean(axis=1)) / beta
    assert within(estimate(q2 - implied), 0.0, family=2, allowance=0.02)
    assert diffusion.stationary_means(beta, paths=PATHS, dt=DT, seed=SEED) is got  # cached


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(beta=0.0), r"beta=0\.0 is out of range: need a finite number > 0"),
        (dict(beta=math.nan), r"beta=nan is out of range"),
        (dict(beta="1"), r"beta='1' is out of range"),
        (dict(paths=1), r"paths=1 is out of range: need an integer >= 2"),
        (dict(paths=2.5), r"paths=2\.5 is out of range"),
        (dict(dt=0.0), r"dt=0\.0 is out of range: need a finite number > 0, <= 0\.5"),
        (dict(dt=0.75), r"dt=0\.75 is out of range"),
        (dict(burn=-1.0), r"burn=-1\.0 is out of range: need a finite number >= 0"),
        (dict(burn=math.inf), r"burn=inf is out of range"),
        (dict(span=0.001, dt=0.01), r"span=0\.001 is out of range: need a finite number >= 0\.01"),
        (dict(seed=-1), r"seed=-1 is out of range: need an integer in \[0, 2\^32\)"),
        (dict(burn=1e5), r"\(burn \+ span\) / dt = 10003000 steps is out of range: need at most"),
    ],
)
def test_refusals_name_the_parameter_and_come_before_anything_runs(kwargs, pattern, monkeypatch):
    def run(*args, **kw):
        raise AssertionError("integrated before the arguments were checked")

    monkeypatch.setattr(diffusion, "integrate", run)
    beta = kwargs.pop("beta", 1.0)
    with pytest.raises(ValueError, match=f"^{pattern}") as err:
        diffusion.stationary_means(beta, **kwargs)
    assert "\n" not in str(err.value)


SPEC = """\
name = "hw"
[grid]
policy = [{ name = "idle-first", d = [1] }, "jsq", { name = "pod", d = 2 }]
n_servers = [100, 400]
beta = [0.5, 1.0]
[run]
replicas = 2
time = 2
warmup_time = 1
theory = "none"

[[figure]]
name = "two"
metric = "tail"
k = 2
y_scale = "n_servers ** 0.5"
x = "n_servers"
panels = "beta"
series = ["policy", "d"]
baseline = "diffusion"

[[figure]]
name = "idle"
metric = "occupancy"
k = 0
y_scale = "n_servers ** 0.5"
x = "n_servers"
panels = "beta"
series = ["policy", "d"]
baseline = "diffusion"
"""


def _line(spec, metric, policy, betas=(1.0,)) -> Series:
    """A line of ``policy`` at ``betas`` (its points in the spec), no values."""
    points = [p for p in spec.points if p.policy == policy and p.beta in betas]
    x = np.array([float(p.servers) for p in points])
    nan = np.full(x.size, np.nan)
    ids = tuple(p.point_id() for p in points)
    return Series(None, policy, metric, x, nan, nan, nan, nan, policy, ids)


def _figure(spec, name, **changes):
    """Figure ``name`` of ``spec``, its keys changed (the baseline's conditions)."""
    return dataclasses.replace(spec.figure(name), **changes)


def test_the_baseline_is_the_stationary_mean_on_counts_over_sqrt_n(monkeypatch):
    """A level line over the line's N at ``E[Q_2]`` (tail, k = 2) and at ``beta``
    itself (occupancy, k = 0, ``-E[Q_1]``); nothing for other metrics, another
    y_scale, another x, mixed ``beta``, or a policy the limit is not of."""
    spec = parse_spec(SPEC)
    calls = []

    def means(beta):
        calls.append(beta)
        q2 = estimate(np.array([0.5, 0.7]) + beta)
        return diffusion.StationaryMeans(estimate([-beta, -beta]), q2, (), {})

    monkeypatch.setattr("jaxqueue.studies.plotting.baselines.stationary_means", means)
    two, idle = spec.figure("two"), spec.figure("idle")
    for policy in ("idle-first", "jsq"):
        x, y = baseline_curve(_line(spec, "tail", policy), two, spec)
        np.testing.assert_array_equal(x, [100.0, 400.0])
        np.testing.assert_array_equal(y, [1.6, 1.6])  # E[Q_2] at beta = 1
        x, y = baseline_curve(_line(spec, "occupancy", policy, (0.5,)), idle, spec)
        np.testing.assert_array_equal(y, [0.5, 0.5])  # beta, exactly
    assert calls == [1.0, 1.0]
    assert baseline_curve(_line(spec, "tail", "pod"), two, spec) is None
    assert baseline_curve(_line(spec, "tail", "jsq", (0.5, 1.0)), two, spec) is None
    for metric, fig in (
        ("tail", _figure(spec, "two", index=1.0)),
        ("tail", _figure(spec, "two", index=3.0)),
        ("occupancy", _figure(spec, "two", index=0.0, metrics=("occupancy",), y_scale=None)),
        ("tail", _figure(spec, "two", y_scale="n_servers")),
        ("tail", _figure(spec, "two", y_scale="n_servers ** 0.5 * 2")),
        ("occupancy", _figure(spec, "idle", index=1.0)),
        ("mean_queue_length", _figure(spec, "two", metrics=("mean_queue_length",))),
        ("tail", _figure(spec, "two", x="ratio")),
        ("tail", _figure(spec, "two", baseline=None)),
    ):
        assert baseline_curve(_line(spec, metric, "jsq"), fig, spec) is None, fig
    assert calls == [1.0, 1.0]
    with pytest.raises(SpecError, match='baseline = "diffusion" is drawn against x = "n_servers"'):
        parse_spec(SPEC.replace('x = "n_servers"\npanels', 'x = "load"\npanels', 1))


LU_SPEC = """\
name = "lu_baseline"
[grid]
policy = ["jiq"]
n_servers = [100]
ratio = [10]
load = [0.5, 0.9]
[run]
replicas = 2
time = 2
warmup_time = 1
[[figure]]
name = "t"
metric = "mean_response_time"
baseline = "lu"
"""


def test_the_lu_baseline_is_unchanged():
    """Against the load, on CURVE_POINTS loads and the line's own; none against N."""
    from jaxqueue.studies.plotting.figures import CURVE_POINTS
    from jaxqueue.theory.baselines.lu import lu_approximation

    spec = parse_spec(LU_SPEC)
    fig = spec.figures[0]
    x = np.array([0.5, 0.9])
    nan = np.full(2, np.nan)
    ids = tuple(p.point_id() for p in spec.points)
    line = Series(None, "jiq", "mean_response_time", x, nan, nan, nan, nan, "jiq", ids)
    loads, y = baseline_curve(line, fig, spec)
    assert loads.size == CURVE_POINTS and loads[0] == 0.5 and loads[-1] == 0.9
    np.testing.assert_allclose(y, lu_approximation(loads, 10.0).mean_response_time)
    assert baseline_curve(line, _figure(spec, "t", x="n_servers"), spec) is None


def _mukherjee_rows(spec):
    """Rows of the quick mode's points: ``tail`` k = 2 at 0.7 / sqrt(N) (0.7 on the
    figure) and ``occupancy`` k = 0 at beta / sqrt(N); none for idle-first with
    d = 1 at N = 1600 (its line is shorter than the others)."""
    rows = []
    for p in spec.points:
        if p.policy == "idle-first" and dict(p.options)["d"] == 1 and p.servers == 1600:
            continue
        base = {k: v for k, v in parameter_values(p.params()).items() if k != "order"}
        base.update(order=None, point_id=p.point_id(), replicas=8, steps=100, warmup=10, seed=0)
        root = math.sqrt(p.servers)
        for metric, k, mean in (("tail", 2, 0.7 / root), ("occupancy", 0, p.beta / root)):
            row = {"metric": metric, "k": k, "mean": mean, "ci95": 0.05 / root, "theory": None}
            rows.append(base | row)
    return rows


def test_mukherjees_figure_draws_the_limit_and_reports_it(tmp_path, capsys):
    """``plot --figure two`` of a store of the spec's quick mode (beta = 1) writes a
    PNG whose legend names the limit, and its report gives the limit's E[Q_2] (the
    default paths, about 0.81) beside every line."""
    pytest.importorskip("matplotlib")
    text = MUKHERJEE.read_text(encoding="utf-8")
    spec = parse_spec(text, mode="quick")
    path = tmp_path / "hw.sqlite"
    with Store(path, spec.spec_hash(), spec.name, {"jaxqueue": "test"}, text) as store:
        points = [(p.point_id(), p.params(), 0.0) for p in spec.points]
        store.commit_batch(0, points, _mukherjee_rows(spec))
    png = tmp_path / "two.png"
    args = ["plot", str(path), "--figure", "two", "--spec", str(MUKHERJEE), "-o", str(png)]
    assert cli_main([*args, "--json"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    lines = json.loads(capsys.readouterr().out)["two"]["lines"]
    limit = diffusion.stationary_means(1.0).q2  # the figure's: cached
    assert len(lines) == 3 and {line["label"] for line in lines} == {
        "idle-first d=1",
        "idle-first d=2",
        "jsq",
    }
    for line in lines:
        assert line["baseline"] == NAME
        assert line["baseline_values"] == [limit.mean] * line["points"]
        assert summary_text(line) == f"no theory; the {NAME} drawn beside it"
    assert sorted(line["points"] for line in lines) == [2, 3, 3]
    assert abs(limit.mean - 0.81) < 0.05

    from jaxqueue.studies.plotting.plots import plot_figure

    axes = plot_figure(_mukherjee_rows(spec), spec.figure("two"), spec=spec)
    ax = np.atleast_1d(axes)[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"{NAME}, dotted" in legend
    levels = [ln for ln in ax.lines if ln.get_linestyle() == ":"]
    assert len(levels) == 1  # once per panel, not per line, over the lines' range
    np.testing.assert_array_equal(levels[0].get_ydata(), [limit.mean] * 2)
    np.testing.assert_array_equal(levels[0].get_xdata(), [100.0, 1600.0])
