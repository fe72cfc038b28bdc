"""The mean field with server pools (``theory.mean_field(..., pools=...)``).

Checked against what is known exactly (pools all alike are identical
servers; under Random every server is its own M/PH/1 queue), against the
simulator at N = 10^4 (Wang, Feng and Cheng's set-up of
tests/test_vs_mean_field.py, with 20% of the servers twice as fast), and
for what the simulator takes from it: its default level bound and its
mean-field start.
"""

import json
import math

import numpy as np
import pytest
from agreement import assert_near_mean_field

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.core.service import Pool, erlang, exponential, mph1_mean_response_time
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.theory.generic import phases
from jaxqueue.theory.generic.limit import Limit

FAST = "0.2:2,0.8:1"  # 20% of the servers twice as fast: capacity 1.2


# ---------------------------------------------------------------- exact cases


@pytest.mark.slow
@pytest.mark.parametrize("name, ratio", [("pod", None), ("jiq", 10.0)])
def test_pools_all_alike_are_identical_servers(name, ratio):
    plain = theory.mean_field(name, 0.9, ratio)  # the closed form
    for pools in ("1:1", "0.3:1,0.7:1"):  # one pool (the phase-type path), and two alike
        mf = theory.mean_field(name, 0.9, ratio, pools=pools)
        assert mf.mean_response_time == pytest.approx(plain.mean_response_time, abs=1e-9)
        n = min(len(mf.tail), len(plain.tail))
        np.testing.assert_allclose(mf.tail[:n], plain.tail[:n], atol=1e-9)
        assert (mf.p0 is None) == (plain.p0 is None)
        if plain.p0 is not None:
            assert mf.p0 == pytest.approx(plain.p0, abs=1e-9)
        for q, value in plain.response_quantiles.items():
            assert mf.response_quantiles[q] == pytest.approx(value, rel=1e-9), q
        occ = np.asarray(mf.pool_occupancy)
        np.testing.assert_allclose(occ, occ[[0]].repeat(len(occ), 0), atol=1e-9)


@pytest.mark.slow
def test_random_pools_are_independent_mm1_queues():
    lam = 0.9
    mf = theory.mean_field("random", lam, pools=FAST)
    rho = np.array([lam / 2, lam / 1])  # each server is M/M/1 at its speed
    k = np.arange(len(mf.tail))
    occ = np.asarray(mf.pool_occupancy)
    np.testing.assert_allclose(occ, (1 - rho[:, None]) * rho[:, None] ** k, atol=1e-10)
    # arrivals split by pool size; a task at a pool of speed v stays Exp(v - lambda)
    w, rate = np.array([0.2, 0.8]), np.array([2.0, 1.0]) - lam
    assert mf.mean_response_time == pytest.approx(float(w @ (1 / rate)), rel=1e-9)
    assert mf.waiting_probability == pytest.approx(float(w @ rho), rel=1e-9)
    for q, t in mf.response_quantiles.items():
        assert float(w @ np.exp(-rate * t)) == pytest.approx(1 - q, rel=1e-9), q
    # and by pool: each gets its share of the servers' arrivals, as an M/M/1 queue
    np.testing.assert_allclose(mf.pool_arrival_share, w, rtol=1e-9)
    np.testing.assert_allclose(mf.pool_utilization, rho, rtol=1e-9)
    np.testing.assert_allclose(mf.pool_waiting_probability, rho, rtol=1e-9)
    np.testing.assert_allclose(mf.pool_mean_response_time, 1 / rate, rtol=1e-9)
    np.testing.assert_allclose(mf.pool_mean_queue_length, rho / (1 - rho), rtol=1e-8)
    for q, t in mf.pool_response_quantiles.items():  # Exp(v - lambda) by pool
        np.testing.assert_allclose(t, -math.log(1 - q) / rate, rtol=1e-9, err_msg=str(q))
    # a sweep store's rows, and the theory value a store row gets
    from jaxqueue.results.schema import pool_row_value
    from jaxqueue.studies.grids.grid import _theory_value

    row = next(
        r for r in mf.records() if r["metric"] == "pool1_response_quantile" and r["k"] == 0.99
    )
    assert row["mean"] == pytest.approx(-math.log(0.01) / rate[1], rel=1e-9)
    assert _theory_value(mf, "pool1_response_quantile", 0.99) == row["mean"]
    assert _theory_value(mf, "pool0_occupancy", 2) == pytest.approx((1 - rho[0]) * rho[0] ** 2)
    assert pool_row_value(mf, "pool2_occupancy", 0) is None  # no third pool
    assert mf.settings["pools"] == [
        {"fraction": 0.2, "speed": 2.0, "service": exponential().to_dict()},
        {"fraction": 0.8, "speed": 1.0, "service": exponential().to_dict()},
    ]


@pytest.mark.slow
def test_random_pools_with_their_own_laws_follow_pollaczek_khinchine():
    lam = 0.7
    pools = [Pool(1, 2.0, erlang(2)), Pool(4, 1.0, erlang(3))]  # shares 0.2 and 0.8
    mf = theory.mean_field("random", lam, pools=pools)
    want = 0.2 * mph1_mean_response_time(lam, erlang(2, mean=0.5)) + 0.8 * mph1_mean_response_time(
        lam, erlang(3)
    )
    assert mf.mean_response_time == pytest.approx(want, rel=1e-8)
    assert mf.settings["pools"][0]["service"] == erlang(2).to_dict()


@pytest.mark.slow
def test_little_and_flow_balance_with_pools():
    """JIQ above load 1 (below the capacity): accepted work balances service by pool."""
    lam = 1.1
    mf = theory.mean_field("jiq", lam, 10.0, pools=FAST)
    assert mf.mean_response_time == pytest.approx(mf.mean_queue_length / lam, rel=1e-9)
    occ = np.asarray(mf.pool_occupancy)
    busy = 1.0 - occ[:, 0]
    assert float(np.array([0.2 * 2, 0.8 * 1]) @ busy) == pytest.approx(lam, rel=1e-9)
    assert mf.p0 is not None and 0 < mf.p0 < 1
    # by pool: what each pool's arrivals bring is what its servers complete,
    # Little's law holds per pool, and the pools make up the whole
    share, f, v = mf.pool_arrival_share, np.array([0.2, 0.8]), np.array([2.0, 1.0])
    np.testing.assert_allclose(lam * share, f * v * mf.pool_utilization, rtol=1e-8)
    np.testing.assert_allclose(
        mf.pool_mean_queue_length, lam * share / f * mf.pool_mean_response_time, rtol=1e-8
    )
    np.testing.assert_allclose(mf.pool_utilization, busy)
    assert float(share @ mf.pool_mean_response_time) == pytest.approx(
        mf.mean_response_time, rel=1e-8
    )
    assert float(share @ mf.pool_waiting_probability) == pytest.approx(
        mf.waiting_probability, rel=1e-9
    )
    assert mf.pool_utilization[0] < mf.pool_utilization[1]  # JIQ: the fast servers idle more


@pytest.mark.slow
def test_command_line_theory_with_pools(capsys):
    from jaxqueue.cli import main

    assert main(["theory", "--policy", "random", "--load", "0.9", "--pools", FAST, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mean_response_time"]["mean"] == pytest.approx(0.2 / 1.1 + 0.8 / 0.1, rel=1e-9)
    assert [q["speed"] for q in out["settings"]["pools"]] == [2.0, 1.0]
    assert len(out["pool_occupancy"]["mean"]) == 2
    assert out["pool_mean_response_time"]["mean"] == pytest.approx([1 / 1.1, 1 / 0.1], rel=1e-9)
    assert main(["theory", "--policy", "random", "--load", "0.9", "--pools", FAST]) == 0
    text = capsys.readouterr().out
    assert "pools 0.2 of the servers at speed 2, 0.8 of the servers at speed 1" in text
    # a column per pool: Random sends each pool its share of the servers
    row = next(line for line in text.splitlines() if "pool_arrival_share" in line)
    assert row.split()[1:] == ["0.2", "0.8"]
    # the refined mean field is for identical servers: refused before any work
    assert (
        main(["theory", "--policy", "pod", "--load", "0.9", "--pools", FAST, "--servers", "100"])
        == 2
    )
    assert "--pools" in capsys.readouterr().err


def test_pools_errors_name_the_parameter():
    with pytest.raises(ValueError, match="capacity"):
        phases.fixed_point(Limit("pod", pools=FAST), 1.25)  # capacity 1.2
    with pytest.raises(ValueError, match="routing at random"):
        phases.fixed_point(Limit("random", pools=FAST), 1.1)  # the slow pool at 1.1
    with pytest.raises(NotImplementedError, match="expected wait"):
        theory.mean_field("jsew", 0.9, pools=FAST)
    with pytest.raises(ValueError, match="per-server"):
        theory.mean_field("jiq-original", 0.9, 10.0, pools=FAST)
    with pytest.raises(ValueError, match="sum to 1"):
        theory.mean_field("pod", 0.9, pools=[(0.5, 2.0), (0.6, 1.0)])
    with pytest.raises(ValueError, match="speed"):
        theory.mean_field("pod", 0.9, pools=[(0.5, 0.0), (0.5, 1.0)])


# ---------------------------------------------------------------- the simulator

N, RATIO, LOAD = 10_000, 10.0, 0.9
CASES = [("pod", {"d": 2}), ("jiq", {}), ("jsq", {})]
TAIL = 3
# per case: T, the waiting probability, s_1..s_3, each pool's share of the
# arrivals, utilization and mean response time, and p0 where it applies
POOLED = ("pool_arrival_share", "pool_utilization", "pool_mean_response_time")
FAMILY = len(CASES) * (2 + TAIL + 2 * len(POOLED)) + 1


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c[0])
def pair(request):
    name, opts = request.param
    mf = theory.mean_field(name, LOAD, RATIO, pools=FAST, **opts)
    per_time = jq.steps_per_time_unit(N, LOAD, 2.0)  # uniformized at the fast pool's rate
    sim = jq.simulate(
        name,
        LOAD,
        N,
        int(N / RATIO),
        replicas=32,
        steps=int(20 * per_time),
        warmup=int(10 * per_time),
        seed=19,
        interval="replicas",
        pools=FAST,
        **opts,
    )
    return sim, mf


@pytest.mark.slow
def test_simulation_at_large_n_matches_the_pools_mean_field(pair):
    """Tolerance: Student-t for 32 replicas, family-wise 0.001 over this test's
    comparisons, plus ``10 / N`` of the predicted value for the mean field's
    O(1/N) error (as tests/test_vs_mean_field.py)."""
    sim, mf = pair
    assert sim.settings["init"] == "mean-field"  # the default start, now that pools have one
    checks = [
        (sim.mean_response_time, mf.mean_response_time, "T"),
        (sim.waiting_probability, mf.waiting_probability, "P(wait)"),
        (
            jq.Estimate(sim.tail.mean[1 : TAIL + 1], sim.tail.ci95[1 : TAIL + 1], sim.tail.n),
            np.asarray(mf.tail[1 : TAIL + 1]),
            "s_1..s_3",
        ),
    ]
    if mf.p0 is not None:
        checks.append((sim.p0, mf.p0, "p0"))
    checks += [(getattr(sim, name), getattr(mf, name), name) for name in POOLED]
    assert_near_mean_field(checks, FAMILY, N, service=0.5)  # the fast pool's mean service


@pytest.mark.slow
def test_level_bounds_and_start_come_from_the_pools_mean_field():
    p = planner.plan("pod", [LOAD], 1000, 1, d=2, replicas=2, steps=10, pools=FAST)
    mf = theory.mean_field("pod", LOAD, pools=FAST)
    # N s_L < 1e-6 plus a quarter: a dozen levels, where Random's M/M/1 tail needed 248
    first = int(np.nonzero(1000 * np.asarray(mf.tail) < 1e-6)[0][0])
    assert p.system.levels == 4 * math.ceil((first + max(4, first // 4)) / 4) <= 16
    core = runner._initial_core(p)
    classes = np.asarray(core.classes)[
        0
    ]  # (levels + 1, classes): pool 0 is class 0, pool 1 class 1
    want = np.asarray(mf.pool_occupancy)[:, : classes.shape[0]].T * np.array([200, 800])
    assert classes.sum(axis=0).tolist() == [200, 800]  # every pool keeps its servers
    assert np.all(np.abs(classes - want) <= 1.0), (classes, want)  # rounding only
