"""The theory column of a grid store's per-level rows, against the theory called directly.

A grid store keeps, beside each simulated ``tail`` and ``occupancy`` entry at
level ``k``, the mean field's value at that same ``k``
(:func:`jaxqueue.studies.grids.grid_theory.store_rows`). Here a tiny spec is run into
a store and every such row is compared with ``jaxqueue.theory.mean_field``
called on the row's own parameters (policy, load, ratio, d): its ``tail[k]``
and ``occupancy[k]``, and 0 past the levels the mean field represents (where its
tail is negligible: below 1e-9 at its last level here).
"""

import numpy as np
import pytest

from jaxqueue.studies.grids.grid import run_grid
from jaxqueue.studies.grids.spec import parse_spec
from jaxqueue.studies.grids.store import Store
from jaxqueue.theory import mean_field

SPEC = """
name = "theory_rows"
[grid]
policy = ["pod", "jiq"]
n_servers = [6]
n_dispatchers = [2]
load = [0.7]
[run]
replicas = 2
steps = 1024
warmup = 256
seed = 3
theory = "mean-field"
"""


def test_tail_and_occupancy_rows_hold_the_theory_at_their_own_level(tmp_path):
    """Pod(2) and JIQ (r = 3) at load 0.7: each stored ``theory`` of a ``tail`` or
    ``occupancy`` row at level ``k`` is the mean field's entry ``k`` to 1e-12 (relative;
    they are equal); a row read one level off would put 0.7 at ``tail`` level 0."""
    path = tmp_path / "rows.sqlite"
    assert run_grid(parse_spec(SPEC), path) == 2
    with Store.open_existing(path) as store:
        rows = store.rows()
    checked = {}
    for policy, d in (("pod", 2), ("jiq", None)):
        mf = mean_field(policy, 0.7, 3.0, d=d, with_quantiles=False)
        for metric in ("tail", "occupancy"):
            want = np.asarray(getattr(mf, metric), np.float64)
            got = [r for r in rows if r["policy"] == policy and r["metric"] == metric]
            ks = sorted(int(r["k"]) for r in got)
            assert ks == list(range(len(ks))) and len(ks) >= want.size  # every level, once
            for r in got:
                assert r["ratio"] == 3.0 and r["load"] == 0.7
                k = int(r["k"])
                value = want[k] if k < want.size else 0.0
                assert r["theory"] is not None, (policy, metric, k)
                assert abs(r["theory"] - value) <= 1e-12 * abs(value), (policy, metric, k)
            checked[policy, metric] = len(got)
        assert mf.tail[-1] < 1e-9 and mf.tail[1] == pytest.approx(0.7, rel=1e-12)
    assert len(checked) == 4 and min(checked.values()) > 5


def test_a_finite_buffer_points_theory_is_its_own_mean_field():
    """Host side, nothing simulated: the grid's theory of a point with 3 places per
    server is the mean field of that buffer (blocking 0.0627 at Pod(2), load 0.9),
    not the infinite-buffer one (which blocks nothing)."""
    from jaxqueue.studies.grids.grid_theory import theory_values
    from jaxqueue.studies.grids.points import Point

    point = Point("pod", (("d", 2),), 50, 1, 3, 0.9)
    (value,) = theory_values([point], "mean-field", {})
    want = mean_field("pod", 0.9, d=2, buffer=3, with_quantiles=False)
    assert value.settings["buffer"] == 3
    assert value.blocking_probability == pytest.approx(want.blocking_probability, rel=1e-12)
    assert value.blocking_probability > 0.01
    np.testing.assert_allclose(value.tail, want.tail, rtol=1e-12)
