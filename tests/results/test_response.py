"""Tests of the response-time laws (jaxqueue.results.response) and the pools' metrics
(jaxqueue.results.pools): closed forms, and laws computed here from small chains."""

import numpy as np
import pytest
from chains import (
    ERLANG2,
    EXP,
    Rule,
    expm,
    farm,
    farm_metrics,
    hyperexp,
    response_ph,
    seen_rates,
    shortest_queue,
    solve_farm,
)
from scipy import special, stats
from scipy.optimize import brentq

from jaxqueue.core.service import PhaseType
from jaxqueue.exact import solve_exact
from jaxqueue.results.pools import pool_metrics
from jaxqueue.results.response import (
    erlang_mixture_cdf,
    erlang_mixture_mean,
    erlang_mixture_pdf,
    erlang_mixture_quantile,
    erlang_mixture_sf,
    ph_mixture_quantiles,
    ph_response_mean,
    ph_response_quantiles,
)
from jaxqueue.results.schema import QUANTILES

LEVELS = np.array([0.5, 0.9, 0.99, 0.999, 0.9999])
#: The levels every result reports.
LEVELS_REPORTED = np.array(QUANTILES)


def geometric(rho: float) -> np.ndarray:
    """M/M/1 arrival-seen law (1 - rho) rho**k, truncated where rho**k < 1e-18."""
    k_max = int(np.ceil(np.log(1e-18) / np.log(rho)))
    return (1 - rho) * rho ** np.arange(k_max + 1)


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9, 0.95])
def test_mm1_quantiles_are_exponential(rho):
    # M/M/1 FIFO: the response time is Exp(1 - rho), quantile -log(1 - q)/(1 - rho).
    w = geometric(rho)
    exact = -np.log1p(-LEVELS) / (1 - rho)
    np.testing.assert_allclose(erlang_mixture_quantile(w, LEVELS), exact, rtol=1e-10, atol=0)
    np.testing.assert_allclose(erlang_mixture_mean(w), 1 / (1 - rho), rtol=1e-13)
    t = np.array([0.0, 0.3, 2.0, 10.0])
    np.testing.assert_allclose(erlang_mixture_sf(w, t), np.exp(-(1 - rho) * t), rtol=1e-12)
    np.testing.assert_allclose(
        erlang_mixture_pdf(w, t), (1 - rho) * np.exp(-(1 - rho) * t), rtol=1e-12
    )


def test_unnormalised_weights_give_the_same_law():
    w = geometric(0.8)
    np.testing.assert_allclose(
        erlang_mixture_quantile(1234.5 * w, LEVELS), erlang_mixture_quantile(w, LEVELS), rtol=1e-12
    )


@pytest.mark.parametrize("k", [0, 7, 300, 800])
def test_pure_erlang_against_scipy(k):
    w = np.zeros(k + 1)
    w[k] = 3.0  # unnormalised
    q = np.array([1e-4, 0.5, 0.9, 0.99, 0.9999])
    t = erlang_mixture_quantile(w, q)
    # the law at the computed quantiles, in relative terms on the side that is small
    np.testing.assert_allclose(special.gammainc(k + 1, t[:2]), q[:2], rtol=1e-10)
    np.testing.assert_allclose(special.gammaincc(k + 1, t[2:]), 1 - q[2:], rtol=1e-10)
    np.testing.assert_allclose(t, stats.gamma.ppf(q, k + 1), rtol=1e-9)
    grid = np.linspace(0, 2 * (k + 1) + 20, 7)
    np.testing.assert_allclose(
        erlang_mixture_cdf(w, grid), stats.gamma.cdf(grid, k + 1), rtol=1e-11, atol=1e-15
    )
    np.testing.assert_allclose(
        erlang_mixture_pdf(w, grid), stats.gamma.pdf(grid, k + 1), rtol=1e-11, atol=1e-300
    )
    assert erlang_mixture_mean(w) == pytest.approx(k + 1, rel=1e-14)


def test_batch_shapes_and_rows_independent():
    rng = np.random.default_rng(0)
    w = rng.integers(0, 100, size=(4, 3, 50)).astype(float)
    w[2, 1] = 0.0  # a replica that saw nothing
    out = erlang_mixture_quantile(w, LEVELS)
    assert out.shape == (4, 3, LEVELS.size)
    assert erlang_mixture_quantile(w, 0.9).shape == (4, 3)
    assert erlang_mixture_cdf(w, 3.0).shape == (4, 3)
    assert erlang_mixture_cdf(w, np.array([1.0, 2.0])).shape == (4, 3, 2)
    assert erlang_mixture_mean(w).shape == (4, 3)
    assert np.all(np.isnan(out[2, 1])) and np.isnan(erlang_mixture_mean(w)[2, 1])
    mask = np.ones((4, 3), bool)
    mask[2, 1] = False
    assert np.all(np.isfinite(out[mask]))
    # each row equals its own one-row computation (also with the other rows' longer support)
    for i, j in [(0, 0), (3, 2)]:
        np.testing.assert_allclose(out[i, j], erlang_mixture_quantile(w[i, j], LEVELS), rtol=1e-12)
    # the quantile solves the cdf
    np.testing.assert_allclose(erlang_mixture_cdf(w[0, 0], out[0, 0]), LEVELS, rtol=1e-11)


def test_many_rows_both_sides_and_roots_at_the_bracket_ends():
    """Thousands of replicas' histograms at once, levels on both sides of 1/2
    (the survival side sums K + 1 Poisson terms, the other side the full
    sum): every quantile solves its own row's law to the solver's tolerance.
    The rows are drawn around a law whose p90 lies about 2% below twice its
    mean, the upper end of the solver's first doubling, where plain bisection
    after a Newton overshoot crawled (about 40 rounds)."""
    rng = np.random.default_rng(7)
    base = np.r_[np.full(10, 0.09), np.full(7, 0.01)]
    w = rng.multinomial(200_000, base / base.sum(), size=3000).astype(float)
    levels = np.array([0.001, 0.3, 0.5, 0.9, 0.99, 0.999])
    out = erlang_mixture_quantile(w, levels)
    mean = erlang_mixture_mean(w)
    assert np.all(np.abs(out[:, 3] / (2 * mean) - 1) < 0.03)  # the hard case is there
    rows = range(0, 3000, 97)
    lower = np.stack([erlang_mixture_cdf(w[i], out[i, :3]) for i in rows])
    np.testing.assert_allclose(lower, np.broadcast_to(levels[:3], lower.shape), rtol=1e-10)
    upper = np.stack([erlang_mixture_sf(w[i], out[i, 3:]) for i in rows])
    np.testing.assert_allclose(upper, np.broadcast_to(1 - levels[3:], upper.shape), rtol=1e-9)


def test_cdf_monotone_and_limits():
    rng = np.random.default_rng(1)
    w = rng.random((5, 40)) ** 3
    t = np.linspace(0.0, 120.0, 600)
    cdf = erlang_mixture_cdf(w, t)
    assert np.all(np.diff(cdf, axis=-1) >= 0)
    np.testing.assert_array_equal(cdf[:, 0], 0.0)
    np.testing.assert_allclose(cdf[:, -1], 1.0, atol=1e-14)
    np.testing.assert_allclose(erlang_mixture_sf(w, t) + cdf, 1.0, atol=1e-15)
    # the density is the derivative of the cdf
    h = 1e-5
    tm = np.array([0.5, 5.0, 30.0])
    fd = (erlang_mixture_cdf(w, tm + h) - erlang_mixture_cdf(w, tm - h)) / (2 * h)
    np.testing.assert_allclose(erlang_mixture_pdf(w, tm), fd, rtol=1e-6, atol=1e-12)
    assert np.all(erlang_mixture_cdf(w, np.inf) == 1.0)


def test_quantile_edges_and_errors():
    w = geometric(0.5)
    assert erlang_mixture_quantile(w, 0.0) == 0.0
    assert erlang_mixture_quantile(w, 1.0) == np.inf
    with pytest.raises(ValueError):
        erlang_mixture_quantile(w, 1.5)
    with pytest.raises(ValueError):
        erlang_mixture_quantile(-w, 0.5)
    with pytest.raises(ValueError):
        erlang_mixture_cdf(w, -1.0)
    with pytest.raises(ValueError):
        erlang_mixture_quantile(w, np.ones((2, 2)))


# ---- phase-type service and pools: where the arrivals found their servers ----


def test_class_quantiles_of_exponential_pools_are_the_erlang_mixture():
    """Two pools of speed-1 exp(1) servers: the law from (level, class) counts
    is the Erlang mixture of the levels alone, sample by sample."""
    from jaxqueue.core.service import exponential
    from jaxqueue.results.simulation import class_response_quantiles

    rng = np.random.default_rng(1)
    counts = rng.integers(0, 1000, size=(3, 6, 2)).astype(np.int64)
    counts[:, 0, 1] = 0  # idle servers count in the pool's first class; here each pool has one
    counts[2] = 0  # a sample without arrivals
    levels = np.array([0.5, 0.9, 0.99, 0.999])
    got = class_response_quantiles(counts, [(exponential(), 0), (exponential(), 1)])
    want = erlang_mixture_quantile(counts[:2].sum(axis=2), levels)
    np.testing.assert_allclose(got[:2], want, rtol=1e-11)
    assert np.all(np.isnan(got[2]))


def test_class_quantiles_batched_as_one_by_one_and_against_the_law():
    """A hyperexponential and an Erlang pool at speed 2: the batch of samples
    gives each sample's own quantiles; arrivals that all find an idle server
    of one pool have that pool's service law (its cdf at the quantile is q)."""
    from jaxqueue.core.service import Pool, erlang, hyperexponential, pool_laws
    from jaxqueue.results.simulation import class_response_quantiles

    laws = pool_laws((Pool(1, 1.0, hyperexponential(4.0)), Pool(1, 2.0, erlang(2))))
    classes = [(laws[0], 0), (laws[1], 2)]
    rng = np.random.default_rng(2)
    counts = rng.integers(0, 50, size=(4, 5, 4)).astype(np.int64)
    counts[:, 0, [1, 3]] = 0
    batch = class_response_quantiles(counts, classes)
    one = np.concatenate([class_response_quantiles(c[None], classes) for c in counts])
    np.testing.assert_allclose(batch, one, rtol=1e-12)
    assert np.all(np.diff(batch, axis=1) > 0)
    idle = np.zeros((1, 5, 4), np.int64)
    idle[0, 0, 2] = 7  # only the fast Erlang pool's idle servers
    q = class_response_quantiles(idle, classes)[0]
    np.testing.assert_allclose(laws[1].cdf(q), [0.5, 0.9, 0.99, 0.999], rtol=1e-11)


# ---- anchors beyond M/M/1: laws computed here, from small chains (tests/chains.py) ----


def _quantiles_of(cdf, levels=LEVELS_REPORTED):
    """The roots of ``cdf(t) = q`` (brentq, to about 1e-14 relative)."""
    out = []
    for q in levels:
        hi = 1.0
        while cdf(hi) < q:
            hi *= 2.0
        out.append(brentq(lambda t, q=q: cdf(t) - q, 0.0, hi, xtol=1e-15, rtol=1e-14))
    return np.array(out)


@pytest.mark.parametrize("rho", [0.5, 0.9, 1.0, 1.5])
def test_mm1_with_a_finite_buffer(rho):
    """M/M/1/K with K = 4 places: ``pi_n`` proportional to ``rho**n``; an
    accepted arrival finds ``k < K`` with probability ``pi_k / (1 - pi_K)``
    and stays Erlang(``k + 1``, 1). The mean by Little's law, ``P(wait)``,
    the quantiles by brentq on the mixture's distribution function."""
    k = 4
    pi = rho ** np.arange(k + 1.0)
    pi /= pi.sum()
    w = pi[:k] / (1.0 - pi[k])
    little = float(np.arange(k + 1) @ pi) / (rho * (1.0 - pi[k]))

    def cdf(t):
        return float(w @ stats.gamma.cdf(t, np.arange(1, k + 1)))

    want = _quantiles_of(cdf)
    np.testing.assert_allclose(erlang_mixture_quantile(w, LEVELS_REPORTED), want, rtol=1e-9)
    assert erlang_mixture_mean(w) == pytest.approx(little, rel=1e-12)
    t = np.array([0.1, 1.0, 4.0, 12.0])
    np.testing.assert_allclose(erlang_mixture_cdf(w, t), [cdf(x) for x in t], rtol=1e-12)
    # the phase-type form with exp(1) service: the one in service is in its one phase
    law = PhaseType(*EXP)
    np.testing.assert_allclose(
        ph_response_quantiles(law, w, w[1:, None], LEVELS_REPORTED), want, rtol=1e-9
    )
    assert ph_response_mean(law, w, w[1:, None]) == pytest.approx(little, rel=1e-12)
    # and the exact solver's M/M/1/K (Random on one server)
    ex = solve_exact("random", rho, 1, buffer=k)
    assert ex.mean_response_time == pytest.approx(little, rel=1e-9)
    assert ex.waiting_probability == pytest.approx(1.0 - w[0], rel=1e-9)
    assert ex.blocking_probability == pytest.approx(pi[k], rel=1e-9)
    np.testing.assert_allclose([ex.response_quantiles[q] for q in LEVELS_REPORTED], want, rtol=1e-9)


def test_tagged_law_of_a_jsq_pair():
    """JSQ on two servers with 4 places each: the law of what an accepted
    arrival finds, from the chain, gives the Erlang mixture; its quantiles and
    distribution function against the tagged task's phase-type law (matrix
    exponential, brentq), its mean against Little's law."""
    f = farm(2, 1, 0.8, 4)
    states, pi, rewards = solve_farm(f, Rule(shortest_queue))
    ref = farm_metrics(f, states, pi, rewards)
    w = ref["arrival_seen"]
    want = [ref["response_quantiles"][q] for q in LEVELS_REPORTED]
    np.testing.assert_allclose(erlang_mixture_quantile(w, LEVELS_REPORTED), want, rtol=1e-9)
    assert erlang_mixture_mean(w) == pytest.approx(ref["mean_response_time"], rel=1e-12)
    beta, gen = response_ph(f, seen_rates(f, rewards))
    for t in (0.2, 1.5, 6.0):
        assert erlang_mixture_sf(w, t) == pytest.approx(beta @ expm(gen * t).sum(axis=1), rel=1e-10)
    assert 1.0 - w[0] == pytest.approx(ref["waiting_probability"], rel=1e-12)


@pytest.mark.parametrize("law", [ERLANG2, hyperexp(4.0)], ids=["erlang2", "hyperexp4"])
def test_phase_type_tagged_law_of_mph1k(law):
    """M/PH/1/K (K = 4, load 0.8): the joint law of the tasks found and the
    phase in service, from the chain, gives :func:`ph_response_quantiles` and
    :func:`ph_response_mean`; against the tagged task's law (matrix
    exponential, brentq) and Little's law."""
    f = farm(1, 1, 0.8, 4, law=law)
    states, pi, rewards = solve_farm(f, Rule(shortest_queue))  # one server: any rule
    ref = farm_metrics(f, states, pi, rewards)
    seen = seen_rates(f, rewards)[0]  # (k, phase)
    x = PhaseType(*law)
    want = [ref["response_quantiles"][q] for q in LEVELS_REPORTED]
    got = ph_response_quantiles(x, seen[:, 0], seen[1:], LEVELS_REPORTED)
    np.testing.assert_allclose(got, want, rtol=1e-9)
    mean = ph_response_mean(x, seen[:, 0], seen[1:])
    assert mean == pytest.approx(ref["mean_response_time"], rel=1e-10)


def test_pool_metrics_of_a_two_speed_farm():
    """JSQ (blind to speeds) on one speed-2 Erlang-2 server and two speed-1
    exp servers, 3 places each, load 0.9: every by-pool metric of
    :func:`pool_metrics`, from the chain's law of (pool, tasks found, phase)
    and the pools' occupancy, against the same metrics computed from the
    chain (shares and waiting from the arrivals' rates, the mean by Little's
    law pool by pool, the quantiles from each pool's tagged law)."""
    pools = [(1, 2.0, ERLANG2), (2, 1.0, None)]
    f = farm(3, 1, 0.9, 3, pools)
    states, pi, rewards = solve_farm(f, Rule(shortest_queue))
    ref = farm_metrics(f, states, pi, rewards)
    seen = seen_rates(f, rewards)
    seen /= seen.sum()
    components = []
    for i, (_, speed, law) in enumerate(pools):
        alpha, s = law or EXP
        x = PhaseType(alpha, tuple(tuple(speed * v for v in row) for row in s))
        components.append((seen[i].sum(), x, seen[i, :, 0], seen[i, 1:, : x.n_phases]))
    got = pool_metrics(components, ref["pool_occupancy"])
    for key in (
        "pool_arrival_share",
        "pool_utilization",
        "pool_mean_queue_length",
        "pool_mean_response_time",
        "pool_waiting_probability",
        "pool_occupancy",
    ):
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-9, err_msg=key)
    table = np.array([ref["pool_response_quantiles"][q] for q in LEVELS_REPORTED]).T
    np.testing.assert_allclose(got["pool_response_quantiles"], table, rtol=1e-9)
    overall = [ref["response_quantiles"][q] for q in LEVELS_REPORTED]
    np.testing.assert_allclose(
        ph_mixture_quantiles(components, LEVELS_REPORTED), overall, rtol=1e-9
    )
