"""Tests of the exact stationary solver :mod:`jaxqueue.exact` (the simulator's oracle).

Closed forms (M/M/1, independent M/M/1 under Random, M/M/1/b blocking), the
identities between policies that the rules imply, message and flow accounting,
the result schema, and input validation. All cases are small: the file runs in
a few seconds.
"""

import json
import math

import numpy as np
import pytest

import jaxqueue.exact.linalg as linalg
from jaxqueue.core.system import SERVICE_RATE
from jaxqueue.core.versions import versions
from jaxqueue.exact import RULES, ExactResult, solve_exact
from jaxqueue.policies import available, make
from jaxqueue.results.response import erlang_mixture_quantile, erlang_mixture_sf
from jaxqueue.results.schema import METRICS, QUANTILES, SCALAR_METRICS, VECTOR_METRICS, Result

LAM = 0.6


def _same(a, b, rtol=1e-9, atol=1e-12, skip=()):
    """Every metric of two results agrees (but those in ``skip``); a missing one on both."""
    for name in (
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
    ):
        if name in skip:
            continue
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=name)


# ---------------------------------------------------------------- closed forms


@pytest.mark.parametrize("policy", ["random", "jsq", "i1f", "jiq", "jiq-original", "jiq-threshold"])
def test_single_server_is_mm1(policy):
    lam, bound = 0.5, 40
    res = solve_exact(policy, lam, 1, 1, queue_bound=bound)
    assert res.truncated_mass < 1e-11
    assert res.mean_response_time == pytest.approx(1 / (1 - lam), rel=1e-9)
    assert res.waiting_probability == pytest.approx(lam, rel=1e-9)
    i = np.arange(15)
    np.testing.assert_allclose(res.tail[:15], lam**i, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(res.arrival_seen[:15], (1 - lam) * lam**i, rtol=1e-9, atol=1e-11)
    # exactly, the truncated chain is M/M/1/bound
    i = np.arange(bound + 1)
    np.testing.assert_allclose(res.tail, (lam**i - lam ** (bound + 1)) / (1 - lam ** (bound + 1)))
    assert res.mean_queue_length == pytest.approx(lam / (1 - lam), rel=1e-9)


def test_random_gives_independent_mm1_marginals():
    lam = 0.5
    bound = 30
    res = solve_exact("random", lam, 3, 1, queue_bound=bound)
    i = np.arange(12)
    np.testing.assert_allclose(res.tail[:12], lam**i, rtol=1e-6)
    assert res.mean_response_time == pytest.approx(1 / (1 - lam), rel=1e-7)
    # exactly: truncation drops per server, so the servers are independent
    # M/M/1/bound (5456 states: the iterative solver, accurate to ~1e-12 absolute)
    i = np.arange(bound + 1)
    s = (lam**i - lam ** (bound + 1)) / (1 - lam ** (bound + 1))
    np.testing.assert_allclose(res.tail, s, rtol=1e-9, atol=1e-12)
    at_bound = lam**bound * (1 - lam) / (1 - lam ** (bound + 1))
    assert res.truncated_mass == pytest.approx(1 - (1 - at_bound) ** 3, rel=1e-3, abs=1e-12)
    assert res.truncation_loss == pytest.approx(at_bound, rel=1e-3, abs=1e-12)
    # the dispatchers do not matter to Random
    _same(res, solve_exact("random", lam, 3, 3, queue_bound=30), rtol=1e-8)


@pytest.mark.parametrize("b, rho", [(1, 0.7), (3, 0.7), (3, 1.3), (4, 1.0)])
def test_mm1b_blocking(b, rho):
    res = solve_exact("jsq", rho, 1, 1, buffer=b)
    expected = 1 / (b + 1) if rho == 1.0 else (1 - rho) * rho**b / (1 - rho ** (b + 1))
    assert res.blocking_probability == pytest.approx(expected, rel=1e-8)
    occ = rho ** np.arange(b + 1)
    np.testing.assert_allclose(res.occupancy, occ / occ.sum(), rtol=1e-8)
    assert res.truncated_mass == 0.0 and res.queue_bound is None
    # an arrival is sent to the busy server, blocked or not, unless it is empty (PASTA)
    assert res.busy_routing_probability == pytest.approx(1 - occ[0] / occ.sum(), rel=1e-8)


# ------------------------------------------------------- identities between policies


def test_jiq_threshold_with_z0_is_jiq():
    a = solve_exact("jiq-threshold", 0.7, 3, 2, z=0, queue_bound=10)
    b = solve_exact("jiq", 0.7, 3, 2, queue_bound=10)
    assert a.n_states == b.n_states
    _same(a, b)


@pytest.mark.parametrize("policy", ["jiq-pod", "jiq-sq"])
def test_d1_variants_are_jiq(policy):
    a = solve_exact(policy, 0.7, 3, 2, d=1, buffer=4)
    b = solve_exact("jiq", 0.7, 3, 2, buffer=4)
    _same(a, b)


def test_pod_probing_all_servers_is_jsq():
    a = solve_exact("pod", LAM, 3, 1, d=3, queue_bound=12)
    b = solve_exact("jsq", LAM, 3, 1, queue_bound=12)
    _same(a, b, skip=("probe_rate",))
    assert a.probe_rate == pytest.approx(3 * LAM) and b.probe_rate == 0.0


def test_idle_first_else_jsq_is_jsq():
    # JIQ-Pod(d) with M = 1 is "idle first, else JSQ(d)" (Mukherjee et al.,
    # arXiv:1510.02657); d = N is JSQ.
    a = solve_exact("jiq-pod", LAM, 3, 1, d=3, queue_bound=12)
    b = solve_exact("jsq", LAM, 3, 1, queue_bound=12)
    for name in ("tail", "arrival_seen"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-9, atol=1e-13)
    assert a.mean_response_time == pytest.approx(b.mean_response_time, rel=1e-9)


def test_i1f_is_jsq_with_two_servers_and_two_places():
    a = solve_exact("i1f", 1.2, 2, 1, buffer=2)
    b = solve_exact("jsq", 1.2, 2, 1, buffer=2)
    _same(a, b)


def test_threshold_at_the_buffer_with_one_dispatcher_is_random():
    # z >= buffer: every server is always listed, and the one dispatcher picks
    # a uniform listed server, i.e. a uniform server.
    a = solve_exact("jiq-threshold", 0.9, 3, 1, z=3, buffer=3)
    b = solve_exact("random", 0.9, 3, 1, buffer=3)
    for name in ("tail", "arrival_seen", "blocking_probability", "mean_response_time"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-9)
    assert a.delete_rate == 0.0 and a.p0 == 0.0


@pytest.mark.parametrize(
    "policy, opts, n, m, kw",
    [
        ("pod", {"d": 2}, 3, 2, {"queue_bound": 5}),
        ("jiq-pod", {"d": 2}, 3, 2, {"queue_bound": 4}),
        ("jiq-sq", {"d": 2}, 3, 3, {"buffer": 2, "load": 1.3}),
        ("jiq-original", {}, 3, 2, {"queue_bound": 4}),
        ("jiq-threshold", {"z": 1}, 3, 2, {"queue_bound": 4}),
    ],
)
def test_symmetry_lumping_is_exact(policy, opts, n, m, kw):
    kw = {"load": LAM, **kw, **opts}
    a = solve_exact(policy, n_servers=n, n_dispatchers=m, **kw)
    b = solve_exact(policy, n_servers=n, n_dispatchers=m, symmetry=False, **kw)
    assert a.n_states < b.n_states
    _same(a, b)  # stale_fraction too (JIQ-Original)


# ------------------------------------------------------------ accounting


CASES = [
    ("random", {}, 3, 1, None),
    ("jsq", {}, 3, 1, None),
    ("pod", {"d": 2}, 3, 1, None),
    ("i1f", {}, 3, 1, None),
    ("jiq", {}, 4, 2, None),
    ("jiq-pod", {"d": 2}, 4, 2, None),
    ("jiq-sq", {"d": 2}, 4, 2, None),
    ("jiq-original", {}, 3, 2, None),
    ("jiq-threshold", {"z": 1}, 4, 2, None),
    ("jiq", {}, 4, 2, 2),
    ("jiq-original", {}, 3, 2, 2),
    ("i1f", {}, 4, 1, 2),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}{c[1]}-N{c[2]}-M{c[3]}-b{c[4]}")
def case(request):
    policy, opts, n, m, b = request.param
    load = 0.7 if b is None else 1.1
    res = solve_exact(policy, load, n, m, buffer=b, queue_bound=12 if b is None else None, **opts)
    return res


def test_conservation_and_little(case):
    res = case
    lam = res.load
    lost = (res.blocking_probability or 0.0) + res.truncation_loss  # None: infinite buffers
    # work conservation: departures (one per busy server) = accepted arrivals
    assert res.tail[1] == pytest.approx(lam * (1 - lost), rel=1e-9)
    assert res.tail[0] == pytest.approx(1.0)
    assert res.occupancy.sum() == pytest.approx(1.0)
    assert np.all(np.diff(res.tail) <= 1e-15)
    # Little's law on the accepted throughput, and the PASTA form
    t_little = res.mean_queue_length / (lam * (1 - lost))
    assert res.mean_response_time == pytest.approx(t_little, rel=1e-9)
    k = np.arange(len(res.arrival_seen))
    assert res.mean_response_time == pytest.approx(np.sum((k + 1) * res.arrival_seen), rel=1e-9)
    assert res.waiting_probability == pytest.approx(1 - res.arrival_seen[0], rel=1e-12)
    assert res.arrival_seen.sum() == pytest.approx(1.0)
    # every vector has levels + 1 entries; an accepted arrival never finds a full server
    assert len(res.tail) == len(res.occupancy) == len(res.arrival_seen) == res.levels + 1
    assert res.arrival_seen[-1] == 0.0
    if res.buffer is None:
        assert res.blocking_probability is None and 0 < res.truncated_mass < 0.1
        assert res.levels == res.queue_bound
    else:
        assert res.blocking_probability > 0 and res.truncated_mass == 0.0
        assert res.levels == res.buffer and res.queue_bound is None


def test_messages(case):
    res = case
    lam, n, m, d = res.load, res.n_servers, res.n_dispatchers, res.options.get("d", 1)
    if res.policy in ("random", "jsq", "i1f", "pod"):
        assert res.p0 is None and res.iqueue_distribution is None and res.stale_fraction is None
        assert res.join_rate is None and res.delete_rate is None  # no I-queues
        assert res.probe_rate == pytest.approx(d * lam if res.policy == "pod" and d >= 2 else 0.0)
        return
    picks = lam * (1 - res.p0)  # per server: arrivals at dispatchers with a non-empty I-queue
    iq = res.iqueue_distribution
    assert iq.sum() == pytest.approx(1.0) and iq[0] == pytest.approx(res.p0)
    mean_listed = m * float(np.arange(n + 1) @ iq) / n  # listed servers per server
    if res.policy in ("jiq", "jiq-pod", "jiq-sq"):
        # servers join exactly when they become idle; I-queues hold the idle servers
        assert res.join_rate == pytest.approx(res.occupancy[1], rel=1e-9)
        assert mean_listed == pytest.approx(res.occupancy[0], rel=1e-9)
    if res.policy != "jiq-original":
        # each listing ends by a pick or by a delete request
        assert res.join_rate == pytest.approx(picks + res.delete_rate, rel=1e-9)
        assert res.stale_fraction is None
    if res.policy == "jiq-original":
        assert res.delete_rate == 0.0
        assert res.join_rate == pytest.approx(picks, rel=1e-9)  # listings end only by picks
        assert 0 < res.stale_fraction < 1 - res.p0
    if res.policy == "jiq-threshold":
        assert mean_listed == pytest.approx(res.occupancy[: res.options["z"] + 1].sum(), rel=1e-9)
    expected_probes = {
        "jiq-pod": d * lam * res.p0 if d >= 2 else 0.0,
        "jiq-sq": d * res.join_rate if d >= 2 else 0.0,
    }.get(res.policy, 0.0)
    assert res.probe_rate == pytest.approx(expected_probes, rel=1e-9, abs=1e-15)


def test_jiq_join_rate_is_rate_of_becoming_idle():
    res = solve_exact("jiq", 0.8, 4, 2, queue_bound=12)
    assert res.join_rate == pytest.approx(res.occupancy[1], rel=1e-9)
    assert res.delete_rate > 0


# ------------------------------------------------------------ truncation


def test_truncated_mass_small_and_shrinking():
    masses, times = [], []
    for bound in (6, 9, 12):
        res = solve_exact("jsq", 0.5, 3, 1, queue_bound=bound)
        masses.append(res.truncated_mass)
        times.append(res.mean_response_time)
        assert res.queue_bound == bound and len(res.tail) == bound + 1
    assert masses[0] > masses[1] > masses[2] and masses[2] < 1e-9
    assert abs(times[2] - times[1]) < 1e-6


def test_default_bound_reaches_tolerance():
    res = solve_exact("jiq-pod", LAM, 3, 2, d=2)  # warnings are errors in this suite
    assert res.truncated_mass <= 1e-9 and res.truncation_loss <= 1e-9


def test_default_bound_warns_when_budget_too_small_and_refuses_far_too_small():
    with pytest.warns(UserWarning, match="truncated_mass"):
        res = solve_exact("random", 0.3, 2, 1, default_max_states=60)
    assert res.n_states <= 60 and 1e-9 < res.truncated_mass <= 1e-4
    with pytest.raises(RuntimeError, match=r"truncated_mass=0.0\d+ .* no exact answer"):
        solve_exact("random", 0.9, 2, 1, default_max_states=100)


def test_max_states_is_enforced():
    with pytest.raises(ValueError, match="max_states"):
        solve_exact("random", LAM, 3, 1, queue_bound=20, max_states=100)
    # refused from the state count's estimate, before any enumeration (which took 91 s here)
    with pytest.raises(
        ValueError,
        match=r"queue_bound=1000000: about 5e\+11 reachable states, "
        r"more than max_states=200000",
    ):
        solve_exact("pod", 0.5, 2, queue_bound=10**6)
    with pytest.raises(ValueError, match=r"^buffer=40: about .* more than max_states=1000"):
        solve_exact("jiq", 0.5, 4, 2, buffer=40, max_states=1000)


# ------------------------------------------------------------ solvers


def test_iterative_solver_matches_direct(monkeypatch):
    direct = solve_exact("jiq-sq", 0.8, 3, 2, d=2, queue_bound=10)
    monkeypatch.setattr(linalg, "DIRECT_STATE_LIMIT", 10)
    iterative = solve_exact("jiq-sq", 0.8, 3, 2, d=2, queue_bound=10)
    _same(direct, iterative, rtol=1e-8)


def test_dense_fallback_without_scipy(monkeypatch):
    sparse = solve_exact("jiq-original", LAM, 2, 2, queue_bound=6)
    monkeypatch.setattr(linalg, "_sp", None)
    monkeypatch.setattr(linalg, "_spla", None)
    dense = solve_exact("jiq-original", LAM, 2, 2, queue_bound=6)
    _same(sparse, dense)
    monkeypatch.setattr(linalg, "DENSE_STATE_LIMIT", 10)
    with pytest.raises(ValueError, match="DENSE_STATE_LIMIT"):
        solve_exact("jiq-original", LAM, 2, 2, queue_bound=6)


def test_reducible_chain_is_detected():
    # 0 -> 1 -> 2 -> 1: state 0 cannot be reached again
    rows, cols = np.array([0, 1, 2]), np.array([1, 2, 1])
    with pytest.raises(RuntimeError, match="irreducible"):
        linalg.check_irreducible(3, rows, cols)
    linalg.check_irreducible(3, np.array([0, 1, 2]), np.array([1, 2, 0]))


# ------------------------------------------------------------ policies and options


def _identical(a, b):
    """Bit-for-bit the same metrics, quantiles and diagnostics."""
    for name in METRICS:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and np.array_equal(x, y), name
        else:
            assert x == y, name
    assert a.response_quantiles == b.response_quantiles
    assert a.diagnostics == b.diagnostics


def test_option_a_policy_does_not_take_is_an_error():
    with pytest.raises(ValueError, match="policy 'jiq' takes no option d"):
        solve_exact("jiq", 0.5, 3, 2, d=2)
    with pytest.raises(ValueError, match="policy 'pod' takes no option z"):
        solve_exact("pod", 0.5, 3, 1, z=1)
    with pytest.raises(ValueError, match="policy 'jsq' takes no option d, z"):
        solve_exact("jsq", 0.5, 3, 1, d=1, z=0)


def test_pod_defaults_to_its_own_d():
    default = solve_exact("pod", LAM, 3, 1, queue_bound=10)
    _identical(default, solve_exact("pod", LAM, 3, 1, d=2, queue_bound=10))
    assert default.options == {"d": 2} and default.policy_label == "pod(d=2)"
    assert default.probe_rate == pytest.approx(2 * LAM, rel=1e-12)
    # not Random (which is Pod(1))
    random = solve_exact("random", LAM, 3, 1, queue_bound=10)
    assert default.mean_response_time < random.mean_response_time - 0.1
    assert not np.allclose(default.tail, random.tail, rtol=1e-3)
    _identical(solve_exact("pod", LAM, 3, 1, d=1, queue_bound=10), random)


def test_idle_first_is_jiq_pod_with_one_dispatcher():
    for d in (None, 1, 3):
        a = solve_exact("idle-first", LAM, 3, d=d, queue_bound=10)
        b = solve_exact("jiq-pod", LAM, 3, 1, d=d, queue_bound=10)
        _identical(a, b)
        assert a.policy == "idle-first" and b.policy == "jiq-pod"
        assert a.rule == b.rule == "jiq-pod" and a.options == b.options
    with pytest.raises(ValueError, match="n_dispatchers=2 .*single-dispatcher"):
        solve_exact("idle-first", LAM, 3, 2, queue_bound=10)


def test_policy_instances_are_accepted():
    a = solve_exact(make("jiq-sq", d=2), 0.8, 3, 2, queue_bound=8)
    _identical(a, solve_exact("jiq-sq", 0.8, 3, 2, queue_bound=8))
    _identical(a, solve_exact(make("jiq-sq", d=2), 0.8, 3, 2, d=2, queue_bound=8))
    with pytest.raises(ValueError, match="disagree"):
        solve_exact(make("jiq-sq", d=2), 0.8, 3, 2, d=1, queue_bound=8)


def test_every_registered_policy_has_a_rule():
    assert set(RULES) == {
        "random",
        "jsq",
        "jsew",
        "pod",
        "i1f",
        "jiq",
        "jiq-pod",
        "jiq-sq",
        "jiq-original",
        "jiq-threshold",
    }
    for name in available():
        assert make(name).exact_rule()[0] in RULES, name


# ------------------------------------------------------------ the result schema


def test_result_types_and_settings():
    res = solve_exact("jiq-threshold", 0.7, 3, 2, z=0, queue_bound=10)
    assert isinstance(res, ExactResult) and isinstance(res, Result)
    assert ExactResult.source == res.source == "exact"
    for name in SCALAR_METRICS:
        assert type(getattr(res, name)) is float or getattr(res, name) is None, name
    assert res.stale_fraction is None  # only JIQ-Original makes stale picks
    for name in VECTOR_METRICS:
        v = getattr(res, name)
        assert isinstance(v, np.ndarray) and v.dtype == np.float64, name
    assert res.settings == {
        "policy": "jiq-threshold",
        "policy_label": "jiq-threshold(z=0)",
        "options": {"z": 0},
        "n_servers": 3,
        "n_dispatchers": 2,
        "ratio": 1.5,
        "load": 0.7,
        "buffer": None,
        "levels": 10,
        "queue_bound": 10,
        "symmetry": True,
        "rule": "jiq-threshold",
        "versions": versions(),
    }
    assert set(res.diagnostics) == {"truncated_mass", "truncation_loss", "n_states"}
    assert res.n_states == res.diagnostics["n_states"] and res.ratio == 1.5
    assert len(res.iqueue_distribution) == 3 + 1


@pytest.mark.parametrize("policy, m", [("jsq", 1), ("jiq-original", 2)])
def test_to_dict_is_json(policy, m):
    res = solve_exact(policy, 1.2, 3, m, buffer=2)
    out = json.loads(json.dumps(res.to_dict()))
    assert out["source"] == "exact"
    assert set(out) >= set(METRICS) | {"response_quantiles", "settings", "diagnostics"}
    assert out["tail"]["mean"] == res.tail.tolist() and out["tail"]["ci95"] is None
    assert out["mean_response_time"] == {"mean": res.mean_response_time, "ci95": None, "n": None}
    assert set(out["response_quantiles"]) == {str(q) for q in QUANTILES}
    assert out["settings"]["versions"] == versions()
    assert out["settings"]["rule"] == policy and out["diagnostics"]["n_states"] == res.n_states
    if policy == "jsq":
        # None, not NaN, outside the JIQ family
        assert res.p0 is None and res.iqueue_distribution is None and res.stale_fraction is None
        assert out["p0"] is None and out["iqueue_distribution"] is None
        assert out["stale_fraction"] is None
    else:
        assert out["p0"]["mean"] == res.p0 and 0 < res.stale_fraction < 1
    rows = res.records()
    assert {r["metric"] for r in rows} >= {"tail", "mean_response_time", "response_quantile"}
    assert all(r["source"] == "exact" for r in rows)


def test_response_quantiles_of_mm1():
    # M/M/1: the response time is Exp(1 - lambda)
    lam = 0.5
    res = solve_exact("jsq", lam, 1, queue_bound=60)
    assert list(res.response_quantiles) == list(QUANTILES)
    for q, t in res.response_quantiles.items():
        assert type(t) is float
        assert t == pytest.approx(-math.log(1 - q) / (1 - lam) / SERVICE_RATE, rel=1e-9)


def test_response_quantiles_are_the_erlang_mixture():
    res = solve_exact("jiq", 0.9, 3, 2, buffer=4)
    q = np.array(QUANTILES)
    expected = erlang_mixture_quantile(res.arrival_seen, q) / SERVICE_RATE
    np.testing.assert_array_equal([res.response_quantiles[x] for x in QUANTILES], expected)
    sf = erlang_mixture_sf(res.arrival_seen, expected * SERVICE_RATE)
    np.testing.assert_allclose(sf, 1 - q, rtol=1e-9)


# ------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "args, kw, match",
    [
        (("jsq-2", LAM, 3, 1), {}, r"unknown policy 'jsq-2'; valid names: .*jsq.*random"),
        (("jsq", LAM, 0, 1), {}, "n_servers=0"),
        (("jsq", LAM, 3, 0), {}, "n_dispatchers=0"),
        (("jsq", LAM, 3, 4), {}, r"n_dispatchers=4 .*<= 3"),
        (("jsq", 0.0, 3, 1), {}, "load=0.0"),
        (("jsq", -0.5, 3, 1), {}, "load"),
        (("jsq", float("nan"), 3, 1), {}, "load"),
        (("jsq", 1.0, 3, 1), {}, r"load=1.0 .*infinite buffers need 0 < load < 1"),
        (("jsq", None, 3, 1), {}, "load is required"),
        (("pod", LAM, 3, 1), {"d": 0}, "d=0"),
        (("pod", LAM, 3, 1), {"d": 4}, r"d=4 .*<= n_servers \(3\)"),
        (("jiq-pod", LAM, 3, 1), {"d": 4}, r"d=4 .*<= n_servers \(3\)"),
        (("idle-first", LAM, 3, 1), {"d": 4}, r"d=4 .*<= n_servers \(3\)"),
        (("jiq-sq", LAM, 3, 2), {"d": 3}, r"d=3 .*<= n_dispatchers \(2\)"),
        (
            ("jiq-sq", LAM, 3, 1),
            {},
            r"d=2 .*<= n_dispatchers \(1\)",
        ),  # its default d = 2 needs M >= 2
        (("jiq-threshold", LAM, 3, 1), {"z": -1}, "z=-1"),
        (("jiq", LAM, 3, 2), {"d": 2}, "takes no option d"),
        (("jsq", LAM, 3, 1), {"buffer": 0}, "buffer=0"),
        (("jsq", LAM, 3, 1), {"queue_bound": 0}, "queue_bound=0"),
        (("jsq", LAM, 3, 1), {"buffer": 2, "queue_bound": 5}, "queue_bound"),
        (("jsq", LAM, 3, 1), {"tol": 0.0}, "tol=0.0"),
        (("jsq", LAM, 3, 1), {"max_states": 0}, "max_states=0"),
        (("jsq", LAM, 3, 1), {"default_max_states": 0}, "default_max_states=0"),
    ],
)
def test_bad_inputs_raise(args, kw, match):
    with pytest.raises(ValueError, match=match):
        solve_exact(*args, **kw)


def test_bad_types_raise():
    with pytest.raises(TypeError, match="n_servers"):
        solve_exact("jsq", LAM, 2.5, 1)
    with pytest.raises(TypeError, match="load"):
        solve_exact("jsq", "fast", 2, 1)
    with pytest.raises(TypeError, match="d must be an int"):
        solve_exact("pod", LAM, 3, 1, d=2.0)
    with pytest.raises(TypeError, match="n_dispatchers"):
        solve_exact("jsq", LAM, 2, True)


def test_numpy_integers_are_accepted():
    a = solve_exact("pod", LAM, np.int64(3), np.int32(1), d=np.int64(2), buffer=np.int64(3))
    b = solve_exact("pod", LAM, 3, 1, d=2, buffer=3)
    _identical(a, b)
    assert type(a.n_servers) is int and type(a.buffer) is int and a.options == {"d": 2}


def test_heavy_load_is_fine_with_a_finite_buffer():
    res = solve_exact("jiq", 3.0, 2, 2, buffer=2)
    assert 0.5 < res.blocking_probability < 1
