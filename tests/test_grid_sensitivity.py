"""Sensitivities and paired points in grid specs (jaxqueue.studies.grid_sensitivity,
docs/sweeps.md, Sensitivities and paired points).

The fast tests parse specs and check the streams; the slow one runs a spec with
``sensitivity = "load"`` end to end (store, exports, a figure) at Pod(2), N = 3,
16 replicas (the shape of tests/test_sensitivity.py's small system) and compares
its rows with :func:`jaxqueue.sensitivity` and a finite difference of the mean field.
"""

from __future__ import annotations

import csv
import json
import sqlite3

import numpy as np
import pytest

from jaxqueue.cli import main as cli_main
from jaxqueue.core.config import Bounds
from jaxqueue.policies.registry import make
from jaxqueue.studies import export
from jaxqueue.studies.batching import group_bounds
from jaxqueue.studies.derivatives import CURVED, derivative_name, paired_word
from jaxqueue.studies.grid import _batch_plan, run_grid
from jaxqueue.studies.grid_sensitivity import THEORY_STEP
from jaxqueue.studies.sensitivity import sensitivity
from jaxqueue.studies.spec import SpecError, parse_spec
from jaxqueue.studies.store import Store
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

#: The same grid without the new keys, and with ``paired``.
PLAIN = SPEC.replace('sensitivity = "load"\n', "").split("[[figure]]")[0]
PAIRED = PLAIN.replace('theory = "mean-field"', 'theory = "mean-field"\npaired = true')


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
