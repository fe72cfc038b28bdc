"""The M/M/N queue (Erlang C) against closed forms, Erlang's B recursion, a direct
birth-death solve and the Halfin-Whitt limit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import poisson

from jaxqueue.cli import main as cli_main
from jaxqueue.results.schema import QUANTILES
from jaxqueue.studies.grids.grid_theory import theory_value, theory_values
from jaxqueue.studies.grids.spec import parse_spec
from jaxqueue.theory.baselines import erlang


def _birth_death(n: int, lam: float, top: int) -> np.ndarray:
    """The stationary law of the number in system, truncated at ``top``, by
    normalising the products of the birth-death rates (independent of the module)."""
    p = np.empty(top + 1)
    p[0] = 1.0
    for k in range(1, top + 1):
        p[k] = p[k - 1] * lam * n / min(k, n)
    return p / p.sum()


def _erlang_b_recursion(n: int, a: float) -> float:
    b = 1.0
    for k in range(1, n + 1):
        b = a * b / (k + a * b)
    return b


@pytest.mark.parametrize("lam", [0.1, 0.5, 0.9, 0.999])
def test_one_server_is_mm1(lam):
    assert erlang.erlang_c(1, lam) == pytest.approx(lam, rel=1e-14)
    assert erlang.mean_wait(1, lam) == pytest.approx(lam / (1 - lam), rel=1e-12)
    assert erlang.mean_response_time(1, lam) == pytest.approx(1 / (1 - lam), rel=1e-12)
    k = np.arange(30)
    np.testing.assert_allclose(erlang.number_in_system_pmf(1, lam, k), (1 - lam) * lam**k, 1e-12)
    np.testing.assert_allclose(erlang.number_in_system_tail(1, lam, k), lam**k, rtol=1e-12)


@pytest.mark.parametrize("lam", [0.3, 0.5, 0.95])
def test_two_servers_by_hand(lam):
    # pi_0 = (1 - lam) / (1 + lam); P(wait) = P(L >= 2) = 2 lam^2 / (1 + lam)
    c = 2 * lam**2 / (1 + lam)
    assert erlang.erlang_c(2, lam) == pytest.approx(c, rel=1e-14)
    assert erlang.mean_wait(2, lam) == pytest.approx(c / (2 * (1 - lam)), rel=1e-13)
    assert erlang.mean_waiting_number(2, lam) == pytest.approx(2 * lam**3 / (1 - lam**2), rel=1e-13)
    p0 = erlang.number_in_system_pmf(2, lam, [0])[0]
    assert p0 == pytest.approx((1 - lam) / (1 + lam), rel=1e-14)


@pytest.mark.parametrize("n, lam", [(5, 0.7), (30, 0.9), (200, 0.98)])
def test_against_a_birth_death_solve(n, lam):
    top = n + int(60 / (1 - lam))
    p = _birth_death(n, lam, top)
    k = np.arange(top + 1)
    np.testing.assert_allclose(erlang.number_in_system_pmf(n, lam, k), p, rtol=1e-10, atol=1e-300)
    tail = np.cumsum(p[::-1])[::-1]
    np.testing.assert_allclose(
        erlang.number_in_system_tail(n, lam, k), tail, rtol=1e-10, atol=1e-16
    )
    assert erlang.erlang_c(n, lam) == pytest.approx(tail[n], rel=1e-11)
    waiting = float(np.sum(np.maximum(k - n, 0) * p))
    assert erlang.mean_waiting_number(n, lam) == pytest.approx(waiting, rel=1e-10)
    res = erlang.erlang_result(n, lam)
    assert res.mean_queue_length == pytest.approx(float(np.sum(k * p)) / n, rel=1e-10)
    assert res.mean_response_time == pytest.approx(1 + waiting / (lam * n), rel=1e-10)


@pytest.mark.parametrize("n, lam", [(1, 0.5), (10, 0.3), (1000, 0.999), (20000, 0.99)])
def test_erlang_b_matches_its_recursion(n, lam):
    assert erlang.erlang_b(n, lam) == pytest.approx(_erlang_b_recursion(n, lam * n), rel=1e-11)


@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0])
def test_halfin_whitt_limit(beta):
    """At lambda = 1 - beta / sqrt(N) Erlang C tends to 1 / (1 + beta Phi / phi);
    its distance here shrinks like 1 / sqrt(N) (0.06 / sqrt(N) measured at beta = 1)."""
    limit = erlang.halfin_whitt_waiting(beta)
    gaps = []
    for n in (10**2, 10**4, 10**6):
        gaps.append(abs(erlang.erlang_c(n, 1 - beta / math.sqrt(n)) - limit))
        assert gaps[-1] < 0.5 / math.sqrt(n)
    assert gaps[0] > gaps[1] > gaps[2]


def test_heavy_traffic_is_stable():
    """lambda = 1 - N^-alpha at N = 10^6: no overflow; P(wait) rises with alpha
    through the Halfin-Whitt value at alpha = 1/2, towards 0 below and 1 above."""
    n = 10**6
    values = [erlang.erlang_c(n, 1 - n**-a) for a in (0.3, 0.45, 0.5, 0.55, 0.7, 1.0)]
    assert all(0 <= v <= 1 for v in values)
    assert values == sorted(values)
    assert values[0] < 1e-30
    assert values[2] == pytest.approx(erlang.halfin_whitt_waiting(1.0), abs=1e-3)
    assert values[-1] > 0.998
    # the mean wait is C / (N^(1 - alpha)) at alpha = 1: about 1
    assert erlang.mean_wait(n, 1 - 1 / n) == pytest.approx(values[-1], rel=1e-9)


def test_a_light_load_on_many_servers_is_poisson():
    """N = 10^6 at lambda = 0.01: no task waits (C underflows to 0, its log stays
    finite) and the number in system is Poisson(lambda N): to 1e-8 (9e-9
    measured) at 10^6 - 10^4 steps of the log ladder from N, where its
    cumulative sum's rounding shows."""
    n, lam = 10**6, 0.01
    a = lam * n
    assert erlang.erlang_c(n, lam) == 0.0
    k = np.array([9000, 9900, 10000, 10100, 11000])
    poisson = np.exp(k * math.log(a) - a - np.array([math.lgamma(x + 1) for x in k]))
    np.testing.assert_allclose(erlang.number_in_system_pmf(n, lam, k), poisson, rtol=2e-8)
    assert erlang.erlang_result(n, lam).mean_queue_length == pytest.approx(lam, rel=1e-15)


def test_response_time_law():
    n, lam = 50, 0.95
    t = np.linspace(0.0, 60.0, 600_001)
    sf = erlang.response_time_sf(n, lam, t)
    assert sf[0] == 1.0
    mean = float(np.sum(0.5 * (sf[1:] + sf[:-1])) * (t[1] - t[0]))
    assert mean == pytest.approx(erlang.mean_response_time(n, lam), rel=1e-8)
    q = erlang.response_time_quantile(n, lam, QUANTILES)
    np.testing.assert_allclose(erlang.response_time_sf(n, lam, q), 1 - np.array(QUANTILES), 1e-12)


def _tagged_customer(n: int, lam: float, top: int):
    """The waiting and response times of an arrival to the M/M/N queue, from chains
    built here: the number in system (:func:`_birth_death`, truncated at ``top``; what an
    arrival finds, by PASTA), then a tagged customer's own
    chain, uniformized at rate ``N``: finding ``k >= N`` it waits for ``k - N + 1``
    completions of the ``N`` busy servers (rate ``N`` each step: an Erlang(k - N + 1, N)
    wait), then its own exp(1) service. Returns ``P(W > t)`` and ``P(T > t)`` as
    functions of an array ``t``, and ``E[W]``."""
    pi = _birth_death(n, lam, top)
    assert pi[-1] < 1e-17  # the truncation is far out
    # the tagged customer's state: 0 in service, j >= 1 completions still to wait for
    start = np.zeros(top - n + 2)
    start[0] = pi[:n].sum()
    start[1:] = pi[n:]
    steps = 4000  # Poisson(N t) below 4000 for every t used (N t <= 2500)
    waiting, alive = np.empty(steps), np.empty(steps)
    v = start.copy()
    for i in range(steps):  # one uniformized step: a completion of N at rate N, or not
        waiting[i], alive[i] = v[1:].sum(), v.sum()
        served = v[0] * (1.0 - 1.0 / n)  # its own service ends at rate 1 of N
        v = np.r_[served + v[1], v[2:], 0.0]

    def mix(counts, t):
        t = np.atleast_1d(np.asarray(t, np.float64))
        weights = poisson.pmf(np.arange(steps)[None, :], n * t[:, None])
        return weights @ counts

    mean_wait = float(np.arange(start.size) @ start) / n
    return (lambda t: mix(waiting, t)), (lambda t: mix(alive, t)), mean_wait


def _quantile(sf, level: float) -> float:
    """The ``level`` quantile of a law with survival function ``sf``, by bisection."""
    lo, hi = 0.0, 1.0
    while sf(hi)[0] > 1.0 - level:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if sf(mid)[0] > 1.0 - level else (lo, mid)
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi)


@pytest.mark.parametrize(("n", "lam"), [(5, 0.7), (50, 0.95)])
def test_waiting_and_response_time_laws_against_a_tagged_customer(n, lam):
    """``P(W > t) = C exp(-(N - lambda N) t)`` and the response time's law and quantiles
    (``response_time_sf``, ``response_time_quantile``, ``erlang_result``) against the
    tagged customer's chain (:func:`_tagged_customer`), to 1e-10 (measured: 1e-13 at
    most). N = 50, load 0.95: p99 = 4.9553."""
    top = n + int(40 / (1 - lam))  # lambda**(top - N) below 1e-17
    wait_sf, response_sf, mean_wait = _tagged_customer(n, lam, top)
    c = erlang.erlang_c(n, lam)
    t = np.array([0.0, 0.01, 0.05, 0.1, 0.3, 0.7, 1.5])
    np.testing.assert_allclose(wait_sf(t), c * np.exp(-(n - lam * n) * t), rtol=1e-10)
    assert erlang.mean_wait(n, lam) == pytest.approx(mean_wait, rel=1e-10)
    t = np.array([0.0, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0])
    np.testing.assert_allclose(erlang.response_time_sf(n, lam, t), response_sf(t), rtol=1e-10)
    want = np.array([_quantile(response_sf, q) for q in QUANTILES])
    np.testing.assert_allclose(erlang.response_time_quantile(n, lam, QUANTILES), want, rtol=1e-10)
    got = erlang.erlang_result(n, lam).response_quantiles
    np.testing.assert_allclose([got[q] for q in QUANTILES], want, rtol=1e-10)


def test_result_in_the_schema():
    res = erlang.erlang_result(100, 0.9)
    assert res.source == "erlang"
    assert res.tail is None and res.occupancy is None
    assert res.waiting_probability == erlang.erlang_c(100, 0.9)
    assert res.blocking_probability is None  # an infinite queue blocks nothing
    assert set(res.response_quantiles) == set(QUANTILES)
    assert res.metric("p99") == res.response_quantiles[0.99]
    assert "M/M/100" in repr(res)
    assert res.to_dict()["waiting_probability"]["mean"] == res.waiting_probability


@pytest.mark.parametrize("bad", [(0, 0.5), (2.5, 0.5), (10, 1.0), (10, 0.0), (10, -0.1)])
def test_refuses_bad_arguments(bad):
    with pytest.raises(ValueError):
        erlang.erlang_c(*bad)


def test_as_a_spec_theory_and_on_the_command_line(capsys):
    """theory = "erlang" stores the M/M/N queue of each point's N and load (here
    lambda = 1 - N^-alpha); ``theory --model erlang`` prints the same result."""
    spec = parse_spec(
        'name = "t"\n[grid]\npolicy = ["jsq"]\nn_servers = [10, 100]\nbuffer = [5]\n'
        'alpha = [0.5, 1.0]\n[run]\nreplicas = 2\ntime = 10\ntheory = "erlang"\n'
        '[[figure]]\nname = "w"\nmetric = "waiting_probability"\nx = "n_servers"\n'
    )
    values = theory_values(spec.points, "erlang", {})
    assert len(values) == 4
    for point, res in zip(spec.points, values, strict=True):
        assert point.load == pytest.approx(1 - point.servers**-point.alpha)
        assert theory_value(res, "waiting_probability", None) == erlang.erlang_c(
            point.servers, point.load
        )
        assert theory_value(res, "tail", 2) is None
    assert (
        cli_main(
            [
                "theory",
                "--policy",
                "jsq",
                "--model",
                "erlang",
                "--servers",
                "100",
                "--load",
                "0.9",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "erlang"
    assert out["waiting_probability"]["mean"] == erlang.erlang_c(100, 0.9)
    assert cli_main(["theory", "--policy", "jsq", "--model", "erlang", "--load", "0.9"]) == 2
    assert "give --servers" in capsys.readouterr().err
