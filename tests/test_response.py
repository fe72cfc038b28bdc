"""Tests of the Erlang-mixture response-time law (jaxqueue.results.response)."""

import numpy as np
import pytest
from scipy import special, stats

from jaxqueue.results.response import (
    erlang_mixture_cdf,
    erlang_mixture_mean,
    erlang_mixture_pdf,
    erlang_mixture_quantile,
    erlang_mixture_sf,
)

LEVELS = np.array([0.5, 0.9, 0.99, 0.999, 0.9999])


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
