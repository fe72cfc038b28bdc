"""Tests of the exact solver with phase-type service (``solve_exact(..., service=...)``).

Exact arithmetic against closed forms (M/PH/1 by Pollaczek-Khinchine, the
waiting probability of M/G/1), hand-built chains written here independently
of :mod:`jaxqueue.exact.chain` (M/E2/1/b blocking, the M/E2/1 response time
through the count of service phases left), the exponential law in disguise
(lumpability of the phase machinery), the symmetry lumping, I-queue
accounting, and input validation. No statistics: tolerances are those of the
linear solves and of the truncation.
"""

import numpy as np
import pytest
from scipy.special import gammainc

from jaxqueue.core.service import PhaseType, erlang, mph1_mean_response_time, parse_service
from jaxqueue.exact import solve_exact
from jaxqueue.results.schema import QUANTILES

#: Exponential with rate 1, written as a two-phase law (phases are not lumped by the chain).
DISGUISED = PhaseType((0.5, 0.5), ((-1.0, 0.0), (0.0, -1.0)), "exp-in-disguise")
UNIT = PhaseType((1.0,), ((-1.0,),), "unit")

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


def _same(a, b, rtol=1e-9, atol=1e-12, quantiles=True):
    for name in METRICS:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=name)
    if quantiles:
        x = [a.response_quantiles[q] for q in QUANTILES]
        y = [b.response_quantiles[q] for q in QUANTILES]
        np.testing.assert_allclose(x, y, rtol=max(rtol, 1e-10), err_msg="response_quantiles")


# ---------------------------------------------------------------- M/PH/1


@pytest.mark.parametrize("load", [0.5, 0.8])
@pytest.mark.parametrize("service", ["erlang:3", "hyperexp:4", "fit:0.5", "fit:0.3"])
def test_one_server_is_mph1(service, load):
    law = parse_service(service)
    res = solve_exact("random", load, 1, service=service)  # adaptive bound
    assert res.truncated_mass <= 1e-9
    assert res.mean_response_time == pytest.approx(mph1_mean_response_time(load, law), rel=1e-6)
    assert res.waiting_probability == pytest.approx(load, rel=1e-6)  # M/G/1: P(busy) = rho
    assert res.tail[1] == pytest.approx(load, rel=1e-6)
    assert res.blocking_probability is None  # infinite buffer
    assert res.settings["service"] == law.to_dict()


def test_one_server_is_mph1_for_every_rule_and_a_mean_other_than_1():
    law = erlang(2, mean=0.5)  # load 1.2 * mean 0.5 = 0.6: stable
    t = mph1_mean_response_time(1.2, law)
    for policy in ("jsq", "pod", "i1f", "jiq", "jiq-pod"):
        d = 1 if policy in ("pod", "jiq-pod") else None
        res = solve_exact(policy, 1.2, 1, d=d, service=law, queue_bound=40)
        assert res.mean_response_time == pytest.approx(t, rel=1e-8), policy
        assert res.waiting_probability == pytest.approx(0.6, rel=1e-8), policy


# ---------------------------------------------------------------- exponential


@pytest.mark.parametrize("policy, n, m", [("jsq", 3, 1), ("jiq", 3, 2)])
def test_unit_exponential_is_the_exponential_chain(policy, n, m):
    base = solve_exact(policy, 0.7, n, m, queue_bound=8)
    assert "service" not in base.settings
    for service in ("exp", UNIT):
        res = solve_exact(policy, 0.7, n, m, queue_bound=8, service=service)
        assert res.n_states == base.n_states
        _same(res, base, rtol=0, atol=0)  # identical: the same chain
        assert res.response_quantiles == base.response_quantiles
        settings = dict(res.settings)
        assert settings.pop("service")["scv"] == pytest.approx(1.0)
        assert settings == base.settings


@pytest.mark.parametrize(
    "policy, n, m, kw",
    [("pod", 3, 1, {"d": 2}), ("jiq", 3, 2, {}), ("jiq-sq", 3, 2, {"buffer": 3, "load": 1.2})],
)
def test_exponential_in_disguise_lumps_to_the_exponential_chain(policy, n, m, kw):
    kw = {"load": 0.7, "queue_bound": 8, **kw}
    if "buffer" in kw:
        kw.pop("queue_bound")
    base = solve_exact(policy, n_servers=n, n_dispatchers=m, **kw)
    res = solve_exact(policy, n_servers=n, n_dispatchers=m, service=DISGUISED, **kw)
    assert res.n_states > base.n_states  # the phases are there, but do not matter
    _same(res, base, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- lumping and accounting


@pytest.mark.parametrize(
    "policy, n, m, kw",
    [
        ("pod", 3, 1, {"d": 2, "service": "hyperexp:3", "queue_bound": 4}),
        ("jiq-pod", 3, 2, {"d": 2, "service": "erlang:2", "queue_bound": 3}),
        ("jiq-sq", 3, 2, {"d": 2, "service": "fit:0.6", "buffer": 2, "load": 1.3}),
    ],
)
def test_symmetry_lumping_is_exact_with_phases(policy, n, m, kw):
    kw = {"load": 0.7, **kw}
    a = solve_exact(policy, n_servers=n, n_dispatchers=m, **kw)
    b = solve_exact(policy, n_servers=n, n_dispatchers=m, symmetry=False, **kw)
    assert a.n_states < b.n_states
    _same(a, b, rtol=1e-8, atol=1e-11)


@pytest.mark.parametrize(
    "policy, kw",
    [
        ("jiq", {"queue_bound": 8, "load": 0.7}),
        ("jiq-sq", {"d": 2, "queue_bound": 8, "load": 0.7}),
        ("jiq-pod", {"d": 2, "buffer": 3, "load": 1.2}),
    ],
)
def test_jiq_iqueues_list_exactly_the_idle_servers(policy, kw):
    n, m = 3, 2
    law = parse_service("erlang:2")
    res = solve_exact(policy, n_servers=n, n_dispatchers=m, service=law, **kw)
    iq = res.iqueue_distribution
    assert iq.sum() == pytest.approx(1.0, abs=1e-12)
    assert res.p0 == iq[0]
    assert np.arange(n + 1) @ iq * m == pytest.approx(n * res.occupancy[0], rel=1e-9)
    lam = res.load
    accepted = lam * (1 - (res.blocking_probability or 0.0) - res.truncation_loss)
    # work conservation: busy fraction = accepted work per server
    assert res.tail[1] == pytest.approx(accepted * law.mean, rel=1e-9)
    # every server that becomes idle joins one I-queue; servers become busy as often
    assert res.join_rate == pytest.approx(accepted * res.arrival_seen[0], rel=1e-9)
    assert res.waiting_probability == pytest.approx(1 - res.arrival_seen[0], abs=1e-15)
    assert 0 < res.waiting_probability < 1


# ---------------------------------------------------------------- hand-built chains


def _me2_b(lam, b):
    """Stationary law of M/E2/1/b, written directly: states 0 and (n, phase)."""
    idx = {0: 0}
    for k in range(1, b + 1):
        for ph in (0, 1):
            idx[(k, ph)] = len(idx)
    q = np.zeros((len(idx), len(idx)))
    q[0, idx[(1, 0)]] = lam
    for k in range(1, b + 1):
        for ph in (0, 1):
            s = idx[(k, ph)]
            if k < b:
                q[s, idx[(k + 1, ph)]] += lam
            if ph == 0:
                q[s, idx[(k, 1)]] += 2.0  # phase rate 2: mean 1
            else:
                q[s, idx[(k - 1, 0)] if k > 1 else 0] += 2.0
    q -= np.diag(q.sum(axis=1))
    q[:, 0] = 1.0  # pi Q = 0 but its first equation, which becomes sum(pi) = 1
    rhs = np.zeros(len(idx))
    rhs[0] = 1.0
    pi = np.linalg.solve(q.T, rhs)
    full = sum(pi[idx[(b, ph)]] for ph in (0, 1))
    mean_q = sum(k * (pi[idx[(k, 0)]] + pi[idx[(k, 1)]]) for k in range(1, b + 1))
    return full, mean_q


@pytest.mark.parametrize("lam, b", [(0.9, 3), (1.5, 2), (0.5, 1)])
def test_me21b_blocking(lam, b):
    full, mean_q = _me2_b(lam, b)
    res = solve_exact("random", lam, 1, buffer=b, service="erlang:2")
    assert res.blocking_probability == pytest.approx(full, rel=1e-10)  # PASTA
    assert res.mean_queue_length == pytest.approx(mean_q, rel=1e-10)
    assert res.mean_response_time == pytest.approx(mean_q / (lam * (1 - full)), rel=1e-10)
    assert res.truncated_mass == 0.0 and res.queue_bound is None


def test_me21_response_quantiles():
    # M/E2/1 at load 1/2 as a chain on the service phases left (each at rate 2):
    # an arrival adds 2; by PASTA it finds r phases left with the stationary
    # probability pi_r and stays an Erlang(r + 2, 2) time.
    lam, top = 0.5, 400
    q = np.zeros((top + 1, top + 1))
    for r in range(top + 1):
        if r + 2 <= top:
            q[r, r + 2] = lam
        if r > 0:
            q[r, r - 1] = 2.0
    q -= np.diag(q.sum(axis=1))
    q[:, 0] = 1.0  # pi Q = 0 but its first equation, which becomes sum(pi) = 1
    rhs = np.zeros(top + 1)
    rhs[0] = 1.0
    pi = np.linalg.solve(q.T, rhs)
    assert pi[-10:].sum() < 1e-30

    def cdf(t):
        return float(pi @ gammainc(np.arange(top + 1) + 2, 2.0 * t))

    mean = float(pi @ ((np.arange(top + 1) + 2) / 2.0))
    assert mean == pytest.approx(mph1_mean_response_time(lam, erlang(2)), rel=1e-12)
    res = solve_exact("random", lam, 1, service="erlang:2")
    assert res.mean_response_time == pytest.approx(mean, rel=1e-7)
    assert list(res.response_quantiles) == list(QUANTILES)
    for level, t in res.response_quantiles.items():
        assert type(t) is float
        assert cdf(t) == pytest.approx(level, abs=1e-8), level


def test_hyperexponential_quantiles_are_consistent():
    # M/H2/1: the quantiles are increasing and the reported mean lies between
    # the median and the 0.999 quantile (a long right tail)
    res = solve_exact("random", 0.5, 1, service="hyperexp:4")
    t = [res.response_quantiles[q] for q in QUANTILES]
    assert all(x < y for x, y in zip(t, t[1:]))
    assert t[0] < res.mean_response_time < t[-1]


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "policy, load, n, m, kw, match",
    [
        ("jsq", 0.5, 2, 1, {"service": "erlang:0"}, r"service='erlang:0'"),
        ("jsq", 0.5, 2, 1, {"service": "bogus"}, r"service='bogus' is not valid"),
        (
            "jiq-original",
            0.5,
            2,
            1,
            {"service": "erlang:2"},
            r"service='erlang:2'.*jiq-original.*policies that take a phase-type.*jiq-pod",
        ),
        (
            "jiq-threshold",
            0.5,
            2,
            2,
            {"service": "hyperexp:2"},
            r"service='hyperexp:2'.*jiq-threshold",
        ),
        ("jsq", 1.0, 2, 1, {"service": "erlang:2"}, r"load=1.0"),
        (
            "pod",
            0.6,
            2,
            1,
            {"service": erlang(2, mean=2.0)},
            r"load=0.6 .*mean 2.*load \* mean < 1",
        ),
        ("jsq", 0.0, 2, 1, {"service": "erlang:2"}, r"load=0.0"),
        ("jsq", 0.5, 2, 1, {"service": "erlang:2", "buffer": 2, "queue_bound": 4}, "queue_bound"),
    ],
)
def test_bad_service_inputs_raise_before_any_work(no_chain_work, policy, load, n, m, kw, match):
    with pytest.raises(ValueError, match=match):
        solve_exact(policy, load, n, m, **kw)


def test_bad_service_type_raises():
    with pytest.raises(TypeError, match="service"):
        solve_exact("jsq", 0.5, 2, 1, service=3)


def test_exponential_law_is_fine_for_every_rule_and_finite_buffers_lift_stability():
    # a unit exponential law goes to the exponential chain, which every rule has
    a = solve_exact("jiq-original", 0.5, 2, 2, service="exp", queue_bound=6)
    b = solve_exact("jiq-original", 0.5, 2, 2, queue_bound=6)
    _same(a, b, rtol=0, atol=0)
    # load * mean >= 1 is fine with a finite buffer
    res = solve_exact("jsq", 1.5, 2, 1, buffer=2, service="erlang:2")
    assert 0 < res.blocking_probability < 1
