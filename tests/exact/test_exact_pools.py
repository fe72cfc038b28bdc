"""Tests of the exact solver with pools of servers (``solve_exact(..., pools=...)``).

Exact arithmetic against closed forms (Random routing splits the system into
independent M/M/1 and M/PH/1 queues, one per server), a hand-built chain
written here independently of :mod:`jaxqueue.exact.chain` (JSQ over a fast
and a slow server), pools that are all alike (the identical-server results),
the symmetry lumping within pools, flow balance, and input validation. No
statistics: tolerances are those of the linear solves and of the truncation.
"""

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from jaxqueue.core.service import Pool, erlang, mph1_mean_response_time
from jaxqueue.exact import solve_exact
from jaxqueue.exact.chain import estimate_states
from jaxqueue.results.schema import QUANTILES

METRICS = (
    "tail",
    "occupancy",
    "arrival_seen",
    "iqueue_distribution",
    "mean_queue_length",
    "mean_response_time",
    "waiting_probability",
    "blocking_probability",
    "p0",
    "join_rate",
    "delete_rate",
    "probe_rate",
    "stale_fraction",
    "truncated_mass",
    "truncation_loss",
)


def _same(a, b, rtol=1e-9, atol=1e-12):
    for name in METRICS:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=name)
    x = [a.response_quantiles[q] for q in QUANTILES]
    y = [b.response_quantiles[q] for q in QUANTILES]
    np.testing.assert_allclose(x, y, rtol=max(rtol, 1e-10), err_msg="response_quantiles")


def _pool_throughput(res, means=None):
    """Completions per unit time, from each pool's busy fraction: a busy server of
    speed ``v`` and law of mean ``m`` completes ``v / m`` tasks per unit time."""
    occ = res.pool_occupancy
    means = means or [1.0] * len(occ)
    return sum(
        p["servers"] * p["speed"] / mean * (1.0 - row[0])
        for p, row, mean in zip(res.settings["pools"], occ, means)
    )


# ---------------------------------------------------------------- Random: independent queues

LAM = 0.6


def test_random_two_exponential_pools_are_two_mm1_queues():
    # each server is an M/M/1 queue with arrival rate LAM and service rate v
    res = solve_exact("random", LAM, 2, pools=[(0.5, 2), (0.5, 1)], queue_bound=50)
    assert res.truncated_mass < 1e-11
    assert res.settings["pools"] == [
        {"servers": 1, "speed": 2.0, "service": None},
        {"servers": 1, "speed": 1.0, "service": None},
    ]
    assert "service" not in res.settings
    assert res.mean_response_time == pytest.approx((1 / (2 - LAM) + 1 / (1 - LAM)) / 2, rel=1e-8)
    assert res.tail[1] == pytest.approx((LAM / 2 + LAM) / 2, rel=1e-9)
    occ = res.pool_occupancy
    assert occ.shape == (2, 51)
    assert occ[0, :4] == pytest.approx([(1 - 0.3) * 0.3**k for k in range(4)], rel=1e-9)
    assert occ[1, :4] == pytest.approx([(1 - LAM) * LAM**k for k in range(4)], rel=1e-9)
    np.testing.assert_allclose(occ.mean(axis=0), res.occupancy, rtol=0, atol=1e-15)
    assert res.waiting_probability == pytest.approx(res.tail[1], rel=1e-9)  # PASTA, per server
    # the response time is the even mixture of exp(2 - LAM) and exp(1 - LAM)
    assert list(res.response_quantiles) == list(QUANTILES)
    for q, t in res.response_quantiles.items():
        exact = brentq(
            lambda x, q=q: (
                0.5 * math.exp(-(2 - LAM) * x) + 0.5 * math.exp(-(1 - LAM) * x) - (1 - q)
            ),
            0.0,
            100.0,
            xtol=1e-14,
        )
        assert type(t) is float
        assert t == pytest.approx(exact, rel=1e-8), q


def test_random_erlang_pool_is_an_mph1_queue():
    # pool 0: Erlang-2 of mean 1 at speed 2, i.e. Erlang-2 of mean 1/2; pool 1: exp(1)
    pools = [Pool(1, 2.0, erlang(2)), Pool(1, 1.0)]
    res = solve_exact("random", LAM, 2, pools=pools, queue_bound=50)
    assert res.truncated_mass < 1e-11
    fast = mph1_mean_response_time(LAM, erlang(2, mean=0.5))
    assert res.mean_response_time == pytest.approx((fast + 1 / (1 - LAM)) / 2, rel=1e-8)
    assert res.tail[1] == pytest.approx((LAM / 2 + LAM) / 2, rel=1e-9)
    busy = 1.0 - res.pool_occupancy[:, 0]
    assert busy == pytest.approx([LAM / 2, LAM], rel=1e-9)  # M/G/1: P(busy) = rho
    # by pool: half the arrivals each, each pool an M/PH/1 queue
    np.testing.assert_allclose(res.pool_arrival_share, [0.5, 0.5], rtol=1e-9)
    np.testing.assert_allclose(res.pool_utilization, busy, rtol=0, atol=0)
    np.testing.assert_allclose(res.pool_waiting_probability, [LAM / 2, LAM], rtol=1e-9)
    np.testing.assert_allclose(res.pool_mean_response_time, [fast, 1 / (1 - LAM)], rtol=1e-8)
    np.testing.assert_allclose(
        res.pool_mean_queue_length, LAM * res.pool_mean_response_time, rtol=1e-8
    )  # Little
    for q, t in res.pool_response_quantiles.items():  # the exp(1) pool: M/M/1, Exp(1 - LAM)
        assert t[1] == pytest.approx(-math.log(1 - q) / (1 - LAM), rel=1e-8), q
        assert t[0] < t[1]  # the fast pool's tasks leave sooner
    assert res.settings["pools"][0]["service"] == erlang(2).to_dict()
    assert res.settings["pools"][1]["service"] is None
    t = [res.response_quantiles[q] for q in QUANTILES]
    assert all(x < y for x, y in zip(t, t[1:]))
    assert t[0] < res.mean_response_time < t[-1]


# ---------------------------------------------------------------- a hand-built chain


def _jsq_two_servers(lam, speeds, b):
    """JSQ over two labelled exponential servers of the given speeds, buffer ``b``,
    arrivals at rate ``2 lam``, written directly: ``(pi, states)``."""
    states = [(x, y) for x in range(b + 1) for y in range(b + 1)]
    idx = {s: i for i, s in enumerate(states)}
    q = np.zeros((len(states), len(states)))
    for (x, y), i in idx.items():
        if x < y:
            targets = [(1.0, (x + 1, y))]
        elif y < x:
            targets = [(1.0, (x, y + 1))]
        elif x < b:
            targets = [(0.5, (x + 1, y)), (0.5, (x, y + 1))]
        else:
            targets = []  # both full: lost
        for p, t in targets:
            q[i, idx[t]] += 2 * lam * p
        if x > 0:
            q[i, idx[(x - 1, y)]] += speeds[0]
        if y > 0:
            q[i, idx[(x, y - 1)]] += speeds[1]
    q -= np.diag(q.sum(axis=1))
    q[:, 0] = 1.0  # pi Q = 0 but its first equation, which becomes sum(pi) = 1
    rhs = np.zeros(len(states))
    rhs[0] = 1.0
    return np.linalg.solve(q.T, rhs), states


@pytest.mark.parametrize("symmetry", [True, False])
def test_jsq_fast_and_slow_server_matches_a_hand_built_chain(symmetry):
    lam, b = 1.1, 3
    pi, states = _jsq_two_servers(lam, (2.0, 1.0), b)
    x = np.array([s[0] for s in states])
    y = np.array([s[1] for s in states])
    blocked = float(pi[(x == b) & (y == b)].sum())
    mean_q = float(pi @ (x + y)) / 2
    res = solve_exact("jsq", lam, 2, pools="0.5:2,0.5:1", buffer=b, symmetry=symmetry)
    assert res.blocking_probability == pytest.approx(blocked, rel=1e-10)
    assert res.mean_queue_length == pytest.approx(mean_q, rel=1e-10)
    assert res.mean_response_time == pytest.approx(mean_q / (lam * (1 - blocked)), rel=1e-10)
    occ = res.pool_occupancy
    np.testing.assert_allclose(occ[0], np.bincount(x, weights=pi, minlength=b + 1), atol=1e-12)
    np.testing.assert_allclose(occ[1], np.bincount(y, weights=pi, minlength=b + 1), atol=1e-12)
    assert res.n_states == (b + 1) ** 2  # two servers of different pools: nothing to lump


# ---------------------------------------------------------------- pools all alike


@pytest.mark.parametrize(
    "policy, n, m, kw",
    [
        ("pod", 4, 1, {"d": 2}),
        ("jiq", 4, 2, {}),
        ("jiq-sq", 4, 2, {"service": "erlang:2"}),
    ],
)
def test_pools_all_alike_are_identical_servers(policy, n, m, kw):
    base = solve_exact(policy, 0.9, n, m, buffer=3, **kw)
    res = solve_exact(policy, 0.9, n, m, buffer=3, pools=[(0.5, 1), (0.5, 1)], **kw)
    assert res.n_states > base.n_states  # the pools are told apart
    _same(res, base, rtol=1e-9, atol=1e-12)
    assert "pools" not in base.settings and base.pool_occupancy is None
    occ = res.pool_occupancy
    np.testing.assert_allclose(occ[0], occ[1], atol=1e-12)  # exchangeable pools


def test_pool_laws_given_in_the_pools_or_as_the_service_agree():
    a = solve_exact("jsq", 0.8, 3, buffer=3, service="erlang:2")
    pools = [Pool(1, 1.0, erlang(2)), Pool(2, 1.0, erlang(2))]
    b = solve_exact("jsq", 0.8, 3, buffer=3, pools=pools)
    c = solve_exact("jsq", 0.8, 3, buffer=3, service="erlang:2", pools="0.34:1,0.66:1")
    _same(b, a)
    _same(c, a)
    assert c.settings["pools"] == [
        {"servers": 1, "speed": 1.0, "service": None},
        {"servers": 2, "speed": 1.0, "service": None},
    ]
    assert c.settings["service"] == erlang(2).to_dict()


# ---------------------------------------------------------------- lumping and flow balance


@pytest.mark.parametrize(
    "policy, n, m, kw",
    [
        ("jsq", 3, 1, {"pools": [(1 / 3, 2), (2 / 3, 1)], "buffer": 3, "load": 1.2}),
        ("jiq-pod", 4, 2, {"pools": "0.5:2,0.5:1", "buffer": 2, "load": 1.1}),
        ("i1f", 3, 1, {"pools": [Pool(2, 0.5, erlang(2)), Pool(1, 2.0)], "queue_bound": 3}),
    ],
)
def test_symmetry_lumping_is_exact_with_pools(policy, n, m, kw):
    kw = {"load": 0.7, **kw}
    a = solve_exact(policy, n_servers=n, n_dispatchers=m, **kw)
    b = solve_exact(policy, n_servers=n, n_dispatchers=m, symmetry=False, **kw)
    assert a.n_states < b.n_states
    _same(a, b, rtol=1e-8, atol=1e-11)
    np.testing.assert_allclose(a.pool_occupancy, b.pool_occupancy, atol=1e-11)


@pytest.mark.parametrize("service, pool_law", [(None, None), ("erlang:2", None), (None, erlang(3))])
def test_jsq_fast_and_slow_pools_above_load_one_balance_their_flows(service, pool_law):
    lam, n, b = 1.3, 4, 3
    pools = [Pool(2, 2.0, pool_law), Pool(2, 1.0)]
    res = solve_exact("jsq", lam, n, buffer=b, pools=pools, service=service)
    assert 0 < res.blocking_probability < 1
    accepted = lam * (1 - res.blocking_probability) * n
    # completions: every busy server of speed v completes v / mean tasks per unit time
    assert accepted == pytest.approx(_pool_throughput(res), rel=1e-10)
    # Little's law and the occupancy by pool
    assert res.mean_response_time * accepted == pytest.approx(n * res.mean_queue_length, rel=1e-12)
    occ = res.pool_occupancy
    np.testing.assert_allclose(occ.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose((2 * occ[0] + 2 * occ[1]) / n, res.occupancy, atol=1e-14)
    assert 0 < occ[0, 0] < 1 and 0 < occ[1, 0] < 1  # no pool always idle or always busy


def test_state_counts_and_estimate():
    # Pod(2), N = 3: one fast server, two slow ones, buffer 4: 5 x C(6, 2) states
    res = solve_exact("pod", 1.0, 3, pools=[(1 / 3, 2), (2 / 3, 1)], buffer=4)
    assert res.n_states == 5 * 15
    assert estimate_states("pod", 3, 1, 0, 4, True, pools=[(1, 1), (2, 1)]) == 75
    assert estimate_states("pod", 3, 1, 0, 4, False, pools=[(1, 1), (2, 1)]) == 125
    res = solve_exact("jiq", 1.2, 4, 2, pools="0.5:2,0.5:1", buffer=3)
    assert res.n_states <= estimate_states("jiq", 4, 2, 0, 3, True, pools=[(2, 1), (2, 1)])
    # the adaptive bound with pools
    res = solve_exact("pod", 0.7, 3, pools=[(1 / 3, 2), (2 / 3, 1)])
    assert res.truncated_mass <= 1e-9
    assert _pool_throughput(res) == pytest.approx(0.7 * 3 * (1 - res.truncation_loss), rel=1e-9)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "policy, load, n, m, kw, match",
    [
        (
            "jiq-original",
            0.5,
            4,
            2,
            {"pools": "0.5:2,0.5:1"},
            r"pools='0.5:2,0.5:1'.*jiq-original.*identical servers.*take pools.*jiq-pod",
        ),
        ("jiq-threshold", 0.5, 4, 2, {"pools": [(0.5, 2), (0.5, 1)]}, r"pools=.*jiq-threshold"),
        ("jsq", 0.5, 4, 1, {"pools": [(0.5, 2), (0.4, 1)]}, r"pools.*fractions.*sum to 1"),
        ("jsq", 0.5, 4, 1, {"pools": [(0.5, 0), (0.5, 1)]}, r"pools=.*speed=0.0 is out of range"),
        ("jsq", 0.5, 4, 1, {"pools": "0.5:0,0.5:1"}, r"pools='0.5:0,0.5:1'.*speed"),
        ("jsq", 0.5, 4, 1, {"pools": "fast"}, r"pools='fast' is not valid"),
        ("jsq", 0.5, 4, 1, {"pools": [Pool(1, 2.0), Pool(2, 1.0)]}, r"pools hold 3 servers"),
        ("jsq", 0.5, 4, 1, {"pools": [(0.1, 2), (0.9, 1)]}, r"pools.*without servers"),
        ("jsq", 1.5, 4, 1, {"pools": "0.5:2,0.5:1"}, r"load=1.5 .*pools.*capacity = 1.5"),
        ("pod", 1.0, 4, 1, {"pools": "0.5:1,0.5:1"}, r"load=1.0 .*capacity = 1\b"),
        (
            "jiq",
            0.8,
            4,
            2,
            {"pools": [Pool(2, 1.0, erlang(2, mean=2.0)), Pool(2, 1.0)]},
            r"load=0.8 .*capacity = 0.75",
        ),
        ("jsq", 0.0, 4, 1, {"pools": "0.5:2,0.5:1"}, r"load=0.0"),
    ],
)
def test_bad_pools_raise_before_any_work(no_chain_work, policy, load, n, m, kw, match):
    with pytest.raises(ValueError, match=match):
        solve_exact(policy, load, n, m, **kw)


def test_bad_pools_type_raises():
    with pytest.raises(TypeError, match="pools"):
        solve_exact("jsq", 0.5, 2, 1, pools=3)


def test_a_finite_buffer_lifts_the_capacity():
    res = solve_exact("random", 2.0, 2, pools="0.5:2,0.5:1", buffer=2)
    assert 0 < res.blocking_probability < 1
    assert _pool_throughput(res) == pytest.approx(
        2.0 * 2 * (1 - res.blocking_probability), rel=1e-10
    )


def test_one_place_per_server_is_insensitive_to_the_law():
    # Random routing, buffer 1: each server is an M/G/1/1 loss queue, blocking
    # rho / (1 + rho) whatever the law, with rho = load * mean / speed
    pools = [Pool(1, 2.0, erlang(2)), Pool(1, 1.0, erlang(3, mean=0.8))]
    res = solve_exact("random", 1.5, 2, pools=pools, buffer=1)
    rho = np.array([1.5 / 2.0, 1.5 * 0.8])
    assert res.blocking_probability == pytest.approx(np.mean(rho / (1 + rho)), rel=1e-12)
    assert res.mean_response_time == pytest.approx(
        np.average([0.5, 0.8], weights=1 / (1 + rho)), rel=1e-12
    )  # an accepted task is served at once: its mean service time at the server it joins
