"""Sensitivities and paired points in grid specs (jaxqueue.studies.grids.crn_rows,
docs/sweeps.md, Sensitivities and paired points).

The fast tests parse specs and check the streams and the lines of paired points; the
slow ones run a spec with ``sensitivity = "load"`` end to end (store, exports, a
figure) at Pod(2), N = 3, 16 replicas (the shape of tests/studies/test_sensitivity.py's small
system) and compare its rows with :func:`jaxqueue.sensitivity` and a finite difference
of the mean field, and a paired spec's difference rows with :func:`jaxqueue.paired`'s.
"""

from __future__ import annotations

import csv
import json
import sqlite3

import jax
import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.core.config import Bounds
from jaxqueue.policies.registry import make
from jaxqueue.studies.crn.paired import compare_samples, coupling_threshold
from jaxqueue.studies.crn.sensitivity import sensitivity
from jaxqueue.studies.grids import crn_rows, export
from jaxqueue.studies.grids.batching import group_bounds
from jaxqueue.studies.grids.crn_rows import THEORY_STEP, PairedRows, check_processes, references
from jaxqueue.studies.grids.grid import _batch_plan, run_grid
from jaxqueue.studies.grids.points import paired_word
from jaxqueue.studies.grids.spec import SpecError, parse_spec
from jaxqueue.studies.grids.spec_values import CURVED, derivative_name, difference_name
from jaxqueue.studies.grids.store import Store
from jaxqueue.theory import mean_field

SPEC = """\
name = "slopes"
[grid]
policy = { name = "pod", d = 2 }
n_servers = 3
load = [0.5, 0.7]
[run]
replicas = 16
steps = 4096
warmup = 1024
seed = 5
theory = "mean-field"
sensitivity = "load"

[[figure]]
name = "slope"
metric = "d_mean_response_time_d_load"
x = "load"
"""

#: The run columns of a stored row, as the spec's ``[run]`` gives them above.
SPEC_RUN = ("replicas", "steps", "warmup", "seed")

#: The same grid without the new keys, and with ``paired``.
PLAIN = SPEC.replace('sensitivity = "load"\n', "").split("[[figure]]")[0]
PAIRED = PLAIN.replace('theory = "mean-field"', 'theory = "mean-field"\npaired = true')
#: A figure of the paired differences.
DIFF_FIGURE = """
[[figure]]
name = "gap"
metric = "diff_mean_response_time"
x = "load"
"""


def test_the_keys_are_parsed_and_unset_they_leave_the_hash():
    spec = parse_spec(SPEC)
    assert spec.run.sensitivity == ("load",) and spec.run.paired is False
    assert spec.figure("slope").metrics == ("d_mean_response_time_d_load",)
    plain, paired = parse_spec(PLAIN), parse_spec(PAIRED)
    assert plain.run.sensitivity == () and paired.run.paired is True
    assert len({spec.spec_hash(), plain.spec_hash(), paired.spec_hash()}) == 3
    assert parse_spec(PLAIN.replace("seed = 5", "seed = 5\npaired = false")).spec_hash() == (
        plain.spec_hash()
    )
    text = PLAIN.replace("load = [", "alpha = [") + 'sensitivity = ["load", "alpha"]\n'
    both = parse_spec(text)
    assert both.run.sensitivity == ("load", "alpha")


@pytest.mark.parametrize(
    "old, new, pattern",
    [
        ('sensitivity = "load"', 'sensitivity = "lambda"', "sensitivity='lambda' is not valid"),
        ('sensitivity = "load"', 'sensitivity = ["load", "load"]', "a list of distinct"),
        ('sensitivity = "load"', 'sensitivity = "alpha"', "needs every point given by alpha"),
        ('sensitivity = "load"', "paired = 1", "paired=1 is not valid"),
        # parameters of the compiled system: refused at parse time, not after the run
        # (they once simulated the batch and then died with an AttributeError)
        *(
            ('sensitivity = "load"', f'sensitivity = ["load", "{p}"]', f"sensitivity='{p}' is not")
            for p in ("speed", "share", "scv", "amplitude")
        ),
    ],
)
def test_bad_keys_name_their_line(old, new, pattern):
    with pytest.raises(SpecError, match=pattern) as err:
        parse_spec(SPEC.replace(old, new))
    assert err.value.line == 12


def test_paired_points_share_one_stream():
    plain, paired = parse_spec(PLAIN), parse_spec(PAIRED)
    assert [plain.run.stream_for(p) for p in plain.points] == [p.seed_word(5) for p in plain.points]
    words = {paired.run.stream_for(p) for p in paired.points}
    assert words == {paired_word(5)}
    bounds = Bounds(*group_bounds(list(paired.points)))
    plan = _batch_plan(paired, list(paired.points), 2, bounds, None)
    assert plan.streams == (paired_word(5),) * 2


@pytest.mark.slow
def test_a_spec_with_sensitivity_runs_end_to_end(tmp_path):
    spec = parse_spec(SPEC)
    path = tmp_path / "slopes.sqlite"
    assert run_grid(spec, path) == 2
    with Store.open_existing(path) as store:
        rows = store.rows()
        meta = store.meta()
    by = {(r["point_id"], r["metric"]): r for r in rows}
    assert not any(r["metric"].startswith("diff_") for r in rows)  # unpaired: no differences
    name = derivative_name("mean_response_time", "load")
    for point in spec.points:
        pid = point.point_id()
        # the stored derivative is jq.sensitivity's at the point with the spec's seed
        run = dict(replicas=16, steps=4096, warmup=1024, seed=5, interval="replicas")
        alone = sensitivity("pod", point.load, 3, d=2, **run)
        for metric, est in alone.derivatives.items():
            row = by[(pid, derivative_name(metric, "load"))]
            assert row["mean"] == float(est.mean) and row["ci95"] == float(est.ci95)
            flag = by[(pid, derivative_name(metric, "load") + CURVED)]["mean"]
            assert flag == float(metric in alone.curved)
        for row in (r for r in rows if r["point_id"] == pid and r["metric"].startswith("d_")):
            assert [row[k] for k in SPEC_RUN] == [16, 4096, 1024, 5], row["metric"]
        # the theory column: the mean field's central difference at THEORY_STEP
        pol = make("pod", d=2)
        lo, hi = (
            mean_field(pol, point.load + s).mean_response_time for s in (-THEORY_STEP, THEORY_STEP)
        )
        theory = by[(pid, name)]["theory"]
        assert theory == pytest.approx((hi - lo) / (2 * THEORY_STEP), rel=1e-9)
        wide = [mean_field(pol, point.load + s).mean_response_time for s in (-1e-3, 1e-3)]
        assert theory == pytest.approx((wide[1] - wide[0]) / 2e-3, rel=1e-4)
    # the streams are recorded
    db = sqlite3.connect(path)
    streams = dict(db.execute("SELECT point_id, params FROM points").fetchall())
    db.close()
    assert {pid: json.loads(v)["stream"] for pid, v in streams.items()} == {
        p.point_id(): p.seed_word(5) for p in spec.points
    }
    # the exports carry the rows: CSV, the frame (and Parquet), the Dataset (netCDF's)
    out = tmp_path / "slopes.csv"
    assert cli_main(["export", str(path), "--csv", str(out)]) == 0
    with open(out) as f:
        assert sum(r["metric"] == name for r in csv.DictReader(f)) == 2
    pytest.importorskip("pandas")
    frame = export.to_frame(rows)
    assert np.isfinite(frame[frame.metric == name]["theory"].astype(float)).all()
    pytest.importorskip("xarray")
    ds = export.to_dataset(rows, meta)
    assert ds[name].dims == ("load",) and np.isfinite(ds[name + "_theory"]).all()
    pytest.importorskip("matplotlib")
    assert cli_main(["plot", str(path), "-o", str(tmp_path / "figs")]) == 0
    assert (tmp_path / "figs" / "slope.png").read_bytes()[:4] == b"\x89PNG"


def test_a_line_is_its_points_but_the_load_and_its_reference_the_lowest_load():
    text = PAIRED.replace("load = [0.5, 0.7]", "load = [0.7, 0.5, 0.6]\nn_dispatchers = [1, 3]")
    spec = parse_spec(text)
    ref = references(spec.points)
    assert len(spec.points) == 6 and len(set(ref.values())) == 2
    for p, r in ref.items():
        assert (r.load, r.dispatchers) == (0.5, p.dispatchers)
    assert PairedRows(parse_spec(PLAIN), {}, set()).rows([], [], None) == []  # unpaired
    assert parse_spec(PAIRED + DIFF_FIGURE).figure("gap").metrics == ("diff_mean_response_time",)
    with pytest.raises(SpecError, match="diff_mean_response_time"):
        parse_spec(PLAIN + DIFF_FIGURE)


def test_a_point_waits_for_its_reference_in_a_later_batch(monkeypatch):
    """Batches in any order: a point's values are held until its reference has run,
    and the rows are the pair's :func:`compare_samples`."""
    spec = parse_spec(PAIRED)
    low, high = sorted(spec.points, key=lambda p: p.load)
    rng = np.random.default_rng(0)
    x = rng.normal(size=8)
    values = {low: ({"m": x}, None), high: ({"m": x + rng.normal(size=8)}, None)}
    monkeypatch.setattr(crn_rows, "scalar_names", lambda result, plan: ("m",))
    monkeypatch.setattr(crn_rows, "side_samples", lambda run, j, names: values[run.points[j]])

    class Ran:
        plan = None
        settings = {"steps": 4096, "warmup": 1024}

        def __init__(self, points):
            self.points = points

    ids = {p: p.point_id() for p in spec.points}
    made = PairedRows(spec, ids, set())
    # the stored theory of each point's m (a scalar: k None), which the difference takes
    stored = {
        p: [{"point_id": ids[p], "metric": "m", "k": None, "theory": t}]
        for p, t in ((low, 1.25), (high, 2.0))
    }
    assert made.rows([high], [Ran], Ran([high]), stored[high]) == []
    rows = {r["metric"]: r for r in made.rows([low], [Ran], Ran([low]), stored[low])}
    diff, _, corr, coupled, _ = compare_samples([values[low], values[high]])
    assert rows["diff_m"]["theory"] == 0.75 and rows["diff_m_correlation"]["theory"] is None
    assert rows["diff_m"]["mean"] == float(diff[0]["m"].mean)
    assert rows["diff_m"]["ci95"] == float(diff[0]["m"].ci95)
    assert rows["diff_m_correlation"]["mean"] == corr[0]["m"]
    assert rows["diff_m_coupled"]["mean"] == float(corr[0]["m"] > coupling_threshold(8))
    assert {r["point_id"] for r in rows.values()} == {ids[high]} and not made.samples.get(high)
    # a point whose reference is in the store already (a resumed sweep) is named
    assert PairedRows(spec, ids, {ids[low]}).missed == [high]


def test_paired_differences_run_in_one_process(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match="paired is not available with several processes"):
        check_processes(parse_spec(PAIRED))
    check_processes(parse_spec(PLAIN))


@pytest.mark.slow
def test_a_paired_spec_stores_jq_paired_differences_and_resumes(tmp_path):
    """The stored differences are jq.paired's for the same two points, seed and stream;
    a sweep resumed after its reference was stored says it has no rows for the point."""
    spec = parse_spec(PAIRED + DIFF_FIGURE)
    path = tmp_path / "paired.sqlite"
    assert run_grid(spec, path) == 2
    with Store.open_existing(path) as store:
        rows = store.rows()
    by = {(r["point_id"], r["metric"]): r for r in rows}
    low, high = sorted(spec.points, key=lambda p: p.load)
    run = dict(replicas=16, steps=4096, warmup=1024, seed=5, interval="replicas")
    bounds = Bounds(*group_bounds(list(spec.points)))
    c = jq.paired("pod", [low.load, high.load], 3, d=2, bounds=bounds, stream=paired_word(5), **run)
    assert c.coupled[0]["mean_response_time"]
    for metric, est in c.differences[0].items():
        row = by[(high.point_id(), difference_name(metric))]
        assert row["mean"] == float(est.mean) and row["ci95"] == float(est.ci95)
        r = by[(high.point_id(), difference_name(metric) + "_correlation")]["mean"]
        assert r == c.correlation[0][metric]
        flag = by[(high.point_id(), difference_name(metric) + "_coupled")]["mean"]
        assert flag == float(c.coupled[0][metric])
    # the theory column: the difference of the two points' theory
    theory = {(r["point_id"], r["metric"]): r["theory"] for r in rows if r["k"] == -1}
    gap = by[(high.point_id(), "diff_mean_response_time")]["theory"]
    ends = [theory[(p.point_id(), "mean_response_time")] for p in (high, low)]
    assert gap == ends[0] - ends[1] and gap > 0
    quantile = {
        (r["point_id"], r["k"]): r["theory"] for r in rows if r["metric"] == "response_quantile"
    }
    gap = by[(high.point_id(), "diff_p90")]["theory"]
    assert gap == quantile[(high.point_id(), 0.9)] - quantile[(low.point_id(), 0.9)]
    assert not any(k[0] == low.point_id() and k[1].startswith("diff_") for k in by)
    for row in (r for r in rows if r["metric"].startswith("diff_")):
        assert [row[k] for k in SPEC_RUN] == [16, 4096, 1024, 5], row["metric"]
        assert row["warmup_passed"] is None and row["k"] == -1
    pytest.importorskip("matplotlib")
    assert cli_main(["plot", str(path), "-o", str(tmp_path / "figs")]) == 0
    assert (tmp_path / "figs" / "gap.png").read_bytes()[:4] == b"\x89PNG"
    # the state a kill between the two points' batches leaves: the reference stored alone
    db = sqlite3.connect(path)
    with db:
        for table in ("results", "points"):
            db.execute(f"DELETE FROM {table} WHERE point_id = ?", (high.point_id(),))
    db.close()
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        assert run_grid(spec, path, log=f) == 1
    assert "1 points have no diff_ rows" in log.read_text()
    with Store.open_existing(path) as store:
        again = store.rows()
    assert [r for r in again if not r["metric"].startswith("diff_")] == [
        r for r in rows if not r["metric"].startswith("diff_")
    ]
    assert not any(r["metric"].startswith("diff_") for r in again)


def test_theory_slopes_in_alpha_and_where_the_theory_has_no_value():
    """The theory row of a derivative in ``alpha`` (host side, nothing simulated): Pod(2)
    at N = 100, alpha = 0.5 (load 0.9): ``dT/dalpha = T'(lambda) N**-alpha log N``, with
    ``T'`` by ``jax.grad`` of the closed form; a metric the mean field has no value for
    (Pod's join rate) has no slope, not an error."""
    import math

    from jaxqueue import theory
    from jaxqueue.studies.grids.crn_rows import theory_slopes

    spec = parse_spec(
        PLAIN.replace("n_servers = 3", "n_servers = 100").replace(
            "load = [0.5, 0.7]", "alpha = [0.5]"
        )
    )
    (point,) = spec.points
    out = theory_slopes(spec, point, "alpha", ("mean_response_time", "join_rate"), {})
    lam = 1 - 100**-0.5
    slope = float(jax.grad(lambda x: theory.mean_response_time("pod", x, d=2))(lam))
    assert out["mean_response_time"] == pytest.approx(slope * 100**-0.5 * math.log(100), rel=1e-5)
    assert out["join_rate"] is None
