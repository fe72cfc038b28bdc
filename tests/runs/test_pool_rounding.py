"""Pools given as fractions of N that are not whole servers: the theory put beside a
simulation of N servers is that of the rounded pools the simulator runs, with a
:class:`jaxqueue.PoolRoundingWarning`; standalone theory keeps the nominal fractions.

Deterministic: the simulations are replaced by stand-ins (nothing compiles), so
each test checks which pools reach the simulator and the theory.
"""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.core.service import Pool, make_pools, realized_pools

NOMINAL = "0.25:2,0.75:1"  # at N = 10: 2.5 and 7.5 servers, rounded to 3 and 7
REALIZED = "0.3:2,0.7:1"
WHOLE = "0.2:2,0.8:1"  # at N = 10: 2 and 8 servers


def _counts(pools):
    return [(p.count, p.speed) for p in pools]


def test_realized_pools_are_the_simulators_and_say_when_rounded():
    with pytest.warns(
        jq.PoolRoundingWarning,
        match=r"0\.25, 0\.75 of n_servers=10.*3, 7 "
        r"servers.*0\.3, 0\.7",
    ) as caught:
        pools = realized_pools(NOMINAL, 10)
    assert len(caught) == 1 and issubclass(jq.PoolRoundingWarning, UserWarning)
    assert pools == make_pools(NOMINAL, 10) and _counts(pools) == [(3, 2.0), (7, 1.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # whole servers, Pool objects, no pools: said nothing
        assert _counts(realized_pools(WHOLE, 10)) == [(2, 2.0), (8, 1.0)]
        assert _counts(realized_pools(NOMINAL, 100)) == [(25, 2.0), (75, 1.0)]
        assert _counts(realized_pools([Pool(3, 2.0), Pool(7)], 10)) == [(3, 2.0), (7, 1.0)]
        assert realized_pools(None, 10) is None
        assert _counts(realized_pools(NOMINAL, 10, warn=False)) == [(3, 2.0), (7, 1.0)]


def _fake_sweep(seen):
    def sweep(model, loads, run, **kw):  # the model and run options it was given, flat
        seen.append({**model.keywords(), **run.keywords()})
        return [SimpleNamespace(settings={"load": lam}) for lam in loads]

    return sweep


def test_compare_puts_the_mean_field_of_the_simulated_pools_beside_them(monkeypatch):
    """N = 10, pools 0.25:2,0.75:1 under Random: the simulator has 3 fast servers of
    10, so the fast pool's share of the tasks is 0.3; the theory column was 0.25."""
    from jaxqueue.studies import compare as cmp

    seen = []
    monkeypatch.setattr(cmp, "simulate", _fake_sweep(seen))
    with pytest.warns(jq.PoolRoundingWarning, match=r"0\.25, 0\.75.*0\.3, 0\.7") as caught:
        (row,) = cmp.compare(["random"], 10, ratio=10, loads=(0.5,), pools=NOMINAL)
    assert len(caught) == 1
    assert _counts(seen[0]["pools"]) == [(3, 2.0), (7, 1.0)]  # the pools the simulator ran
    ref = theory.mean_field("random", 0.5, pools=REALIZED)
    for name in ("pool_arrival_share", "pool_utilization", "pool_mean_response_time"):
        np.testing.assert_allclose(row.mean_field.metric(name), ref.metric(name), rtol=1e-12)
    assert row.mean_field.mean_response_time == pytest.approx(ref.mean_response_time, rel=1e-12)
    np.testing.assert_allclose(row.mean_field.pool_arrival_share, [0.3, 0.7], rtol=1e-9)
    # the result says which fractions it was solved at, and which were given
    assert [(q["fraction"], q["nominal_fraction"]) for q in row.mean_field.settings["pools"]] == [
        pytest.approx((0.3, 0.25)),
        pytest.approx((0.7, 0.75)),
    ]
    # standalone theory (N -> infinity) keeps the fractions given
    limit = theory.mean_field("random", 0.5, pools=NOMINAL)
    np.testing.assert_allclose(limit.pool_arrival_share, [0.25, 0.75], rtol=1e-9)
    assert [q["fraction"] for q in limit.settings["pools"]] == pytest.approx([0.25, 0.75])


def test_compare_with_whole_pools_says_nothing(monkeypatch):
    from jaxqueue.studies import compare as cmp

    seen = []
    monkeypatch.setattr(cmp, "simulate", _fake_sweep(seen))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (row,) = cmp.compare(["random"], 10, ratio=10, loads=(0.5,), pools=WHOLE)
    assert _counts(seen[0]["pools"]) == [(2, 2.0), (8, 1.0)]
    np.testing.assert_allclose(row.mean_field.pool_arrival_share, [0.2, 0.8], rtol=1e-9)
    assert [q["nominal_fraction"] for q in row.mean_field.settings["pools"]] == pytest.approx(
        [0.2, 0.8]
    )


SPEC = """
name = "rounded"
[grid]
policy = ["random"]
n_servers = [10, 100]
load = [0.5]
pools = ["0.25:2,0.75:1"]
[run]
replicas = 2
steps = 512
warmup = 256
theory = "mean-field"
"""


def test_a_sweep_compares_each_n_with_the_mean_field_of_its_own_servers(tmp_path, monkeypatch):
    """A grid's theory is cached across N, but not across the pools' rounding: N = 10
    gets the mean field at 0.3/0.7, N = 100 the one at 0.25/0.75."""
    from jaxqueue.studies.grids import grid
    from jaxqueue.studies.grids.spec import parse_spec

    spec = parse_spec(SPEC)
    by_n = {p.servers: p for p in spec.points}
    cache = {}
    ten, hundred = grid._theory([by_n[10], by_n[100]], "mean-field", cache)
    assert len(cache) == 2
    for th, pools in ((ten, REALIZED), (hundred, NOMINAL)):
        ref = theory.mean_field("random", 0.5, pools=pools)
        np.testing.assert_allclose(th.pool_arrival_share, ref.pool_arrival_share, rtol=1e-12)
        assert th.mean_response_time == pytest.approx(ref.mean_response_time, rel=1e-12)

    # run_grid says so once, for N = 10 only, before anything runs
    def stop(*args, **kwargs):
        raise RuntimeError("stopped before running")

    monkeypatch.setattr(grid.planner, "plan_model", stop)
    with pytest.warns(jq.PoolRoundingWarning, match="n_servers=10 ") as caught:
        with pytest.raises(RuntimeError, match="stopped before running"):
            grid.run_grid(spec, tmp_path / "rounded.sqlite")
    assert len([w for w in caught if issubclass(w.category, jq.PoolRoundingWarning)]) == 1
