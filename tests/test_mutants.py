"""Checks that kill the mutants benchmarks/mutation.py found surviving (docs/testing.md).

Each test names the change it catches; the references are exact values
computed here (closed forms of small cases), not by the code under test.
"""

from __future__ import annotations

import math
import warnings

import jax
import numpy as np
import pytest

from jaxqueue import theory
from jaxqueue.core.status import Status
from jaxqueue.results.schema import QUANTILES
from jaxqueue.theory.baselines import erlang
from jaxqueue.theory.closed import closed_forms

# -- theory/erlang.py ---------------------------------------------------------------------


def test_erlang_refusals_name_the_range():
    """The messages, and the edges of the ranges: N = 10**7 is taken, 10**7 + 1 and
    beta = 0 (where the limit formula would give 1) are not."""
    with pytest.raises(ValueError, match=r"n_servers must be an integer in 1\.\.10000000, got 0"):
        erlang.erlang_c(0, 0.5)
    with pytest.raises(ValueError, match=r"n_servers must be an integer in 1\.\.10000000"):
        erlang.erlang_b(10**7 + 1, 0.5)
    with pytest.raises(ValueError, match=r"stable for 0 < load < 1, got load=1\.0"):
        erlang.erlang_c(4, 1.0)
    with pytest.raises(ValueError, match=r"beta must be positive, got 0\.0"):
        erlang.halfin_whitt_waiting(0.0)
    assert 0.0 < erlang.erlang_b(10**7, 0.999) < 1.0


def test_erlang_response_time_where_the_wait_and_the_service_have_one_rate():
    """N = 2 at load 0.5: the wait's rate ``N (1 - lambda)`` is 1, the service's, and
    ``S + W`` is Erlang(2, 1) given a wait; C = 1/3 (B(2, 1) = 1/5)."""
    t = np.array([0.0, 0.5, 2.0, 7.0])
    want = (2.0 / 3.0) * np.exp(-t) + (1.0 / 3.0) * (1.0 + t) * np.exp(-t)
    assert erlang.erlang_c(2, 0.5) == pytest.approx(1.0 / 3.0, rel=1e-14, abs=0.0)
    np.testing.assert_allclose(erlang.response_time_sf(2, 0.5, t), want, rtol=1e-14)


def test_erlang_number_in_system_outside_its_support():
    """``P(L = k) = 0`` and ``P(L >= k) = 1`` for ``k <= 0`` exactly (at N = 10,
    load 0.5 the masses sum to 1 - 6e-16)."""
    k = np.array([-3, -1, 0])
    np.testing.assert_array_equal(erlang.number_in_system_pmf(10, 0.5, k)[:2], 0.0)
    np.testing.assert_array_equal(erlang.number_in_system_tail(10, 0.5, k), 1.0)


def test_erlang_small_quantile_to_float64_precision():
    """M/M/1 at load 0.5: ``T`` is exp(1/2), its 0.001-quantile ``-2 log(0.999)``, to
    1e-12 relative (the bisection's stop is relative: an absolute one of 4e-16 / t
    stopped at 2e-11 here)."""
    for q in (1e-3, 0.5):  # one at a time: a second level would refine the first
        got = erlang.response_time_quantile(1, 0.5, q)
        assert got == pytest.approx(-2.0 * math.log1p(-q), rel=1e-12, abs=0.0), q


def test_erlang_result_settings():
    """What the result records beside the metrics (ErlangResult's docstring)."""
    res = erlang.erlang_result(4, 0.75)
    settings = {k: v for k, v in res.settings.items() if k != "versions"}
    assert settings == {
        "policy": "mmn",
        "policy_label": "M/M/4",
        "options": {},
        "n_servers": 4,
        "load": 0.75,
        "buffer": None,
        "mean_wait": erlang.mean_wait(4, 0.75),
        "mean_waiting_number": erlang.mean_waiting_number(4, 0.75),
    }
    assert set(res.settings["versions"]) >= {"jaxqueue", "jax", "numpy"}
    # Erlang C at a = N lambda = 3 from its textbook sum: 0.5094...
    a = 3.0
    terms = [a**j / math.factorial(j) for j in range(4)]
    last = a**4 / math.factorial(4) / (1 - 0.75)
    assert res.waiting_probability == pytest.approx(last / (sum(terms) + last), rel=1e-13, abs=0.0)


# -- theory/closed_forms.py ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "d", "load", "ratio"),
    # the last: a law of 77,816 sizes, past the first blocks of 4,096 and 8,192
    [("jiq", 1, 0.9, 10.0), ("jiq-pod", 2, 0.7, 3.0), ("jiq", 1, 0.3, 1e4)],
)
def test_the_iqueue_law_of_a_closed_form_has_wangs_mean(policy, d, load, ratio):
    """The I-queue size law a closed form reports (computed on the host, not by
    ``theory.iqueue_distribution``): ``p_0`` is the mean field's ``p0``, the law sums
    to one less its reported remainder (below 1e-15), its mean is ``r (1 - lambda)``,
    the idle servers per dispatcher (Wang et al., Theorem 1), and its ratios
    ``p_{k+1} / p_k = a / (a + delta + k + 1)`` fall with ``k`` as that form says."""
    mf = (
        theory.mean_field(policy, load, ratio, d=d)
        if d > 1
        else theory.mean_field(policy, load, ratio)
    )
    dist = np.asarray(mf.iqueue_distribution, np.float64)
    rest = mf.diagnostics["iqueue_remainder"]
    assert dist[0] == pytest.approx(mf.p0, rel=1e-15, abs=0.0)
    assert 0.0 <= rest < 1e-15 and dist[-1] > 0.0
    assert abs(dist.sum() + rest - 1.0) < 1e-14
    assert dist @ np.arange(dist.size) == pytest.approx(ratio * (1.0 - load), rel=1e-12, abs=0.0)
    steps = dist[1:] / dist[:-1]
    assert np.all(np.diff(steps) < 0)
    # 1 / ratio - 1 = (delta + k + 1) / a: affine in k, of slope 1 / a
    inv = 1.0 / steps - 1.0
    np.testing.assert_allclose(np.diff(inv), inv[1] - inv[0], rtol=1e-4)  # (ratios near 1)


def test_a_failed_p0_solve_is_named(monkeypatch):
    """A closed form whose ``p0`` solver fails raises with the point and the status."""
    monkeypatch.setattr(closed_forms, "host_p0", lambda *args: (math.nan, Status.MAX_ITERATIONS))
    with pytest.raises(
        RuntimeError,
        match=r"p0 solver failed at load=0\.9, ratio=10\.0, d=1: status MAX_ITERATIONS",
    ):
        theory.mean_field("jiq", 0.9, 10.0)


def _mf(policy, load, ratio=None, d=1):
    """The closed form's result (float64, on the host)."""
    if d > 1:
        return theory.mean_field(policy, load, ratio, d=d)
    return theory.mean_field(policy, load, ratio)


def _tail_by_recursion(load, p0, d, count=60):
    """``s_1 = lambda``, ``s_{k+1} = lambda p0 s_k^d``: the fixed point of the
    mean-field drift (an arrival joins a server with ``k`` tasks when its ``d``
    probes all hold ``k`` or more, after an empty I-queue, probability ``p0``)."""
    s = [load]
    for _ in range(count):
        s.append(load * p0 * s[-1] ** d)
    return np.array(s)


def test_closed_form_response_times_against_the_tail_recursion():
    """``T = sum_k s_k / lambda`` (Little) with ``s_k`` from :func:`_tail_by_recursion`
    at the mean field's ``p0``: JIQ (``1 / (1 - lambda p0)``), JIQ-Pod(2), Pod(2)
    (``p0 = 1``), Random; JSQ's is 1 and NaN past the load's range. Through the
    array functions (``theory.mean_response_time``), float64."""
    with jax.enable_x64(True):
        for policy, d, ratio in (("jiq", 1, 10.0), ("jiq-pod", 2, 10.0), ("pod", 2, None)):
            p0 = _mf(policy, 0.9, ratio, d=d).p0 if ratio else 1.0
            want = _tail_by_recursion(0.9, p0, d).sum() / 0.9
            options = {"d": d} if d > 1 else {}
            got = float(theory.mean_response_time(policy, 0.9, ratio, **options))
            assert got == pytest.approx(want, rel=1e-12, abs=0.0), policy
        assert float(theory.mean_response_time("random", 0.8)) == pytest.approx(5.0, rel=1e-12)
        t = np.asarray(theory.mean_response_time("jsq", np.array([0.9, 1.2])))
        assert t[0] == 1.0 and np.isnan(t[1])
        with pytest.raises(ValueError, match="'jiq-pod' needs ratio = N / M"):
            theory.mean_response_time("jiq-pod", 0.9, d=2)


def test_closed_form_message_rates():
    """JIQ-Pod(d): idle servers join I-queues at ``s_1 - s_2 = lambda (1 - p0 lambda^d)``;
    an arrival after an empty I-queue (``p0``) probes ``d`` servers (``d lambda p0``)
    and, finding an idle one, sends a delete request (``lambda p0 (1 - lambda^d)``);
    JIQ probes none; Pod(d) probes ``d lambda`` and has no I-queues."""
    for policy, d in (("jiq", 1), ("jiq-pod", 2)):
        mf = _mf(policy, 0.9, 10.0, d=d)
        p0, lam_d = mf.p0, 0.9**d
        assert mf.join_rate == pytest.approx(0.9 * (1 - p0 * lam_d), rel=1e-12, abs=0.0)
        assert mf.delete_rate == pytest.approx(0.9 * p0 * (1 - lam_d), rel=1e-12, abs=0.0)
        assert mf.probe_rate == pytest.approx(d * 0.9 * p0 if d > 1 else 0.0, rel=1e-12, abs=0.0)
    for d in (2, 3):
        pod = _mf("pod", 0.9, d=d)
        assert pod.probe_rate == pytest.approx(0.9 * d, rel=1e-12, abs=0.0)
        assert pod.join_rate is None and pod.delete_rate is None
        assert pod.diagnostics["iqueue_remainder"] == 0.0
    assert _mf("random", 0.9).probe_rate == 0.0 and _mf("jsq", 0.9).probe_rate == 0.0


def test_closed_form_laws_of_the_response_time():
    """JSQ: every arrival finds an idle server, ``T ~ exp(1)``; Random and JIQ: the
    number found is geometric, ``T ~ exp(1 - lambda p0)`` (``p0 = 1`` for Random),
    with the mean tasks per server ``lambda / (1 - lambda p0)``."""
    q = np.array(sorted(QUANTILES))
    jsq = _mf("jsq", 0.9)
    np.testing.assert_allclose(jsq.occupancy[:2], [0.1, 0.9], rtol=1e-14)
    assert list(jsq.arrival_seen[:2]) == [1.0, 0.0]
    np.testing.assert_allclose([jsq.response_quantiles[x] for x in q], -np.log1p(-q), rtol=1e-14)
    for policy, ratio in (("random", None), ("jiq", 10.0)):
        mf = _mf(policy, 0.9, ratio)
        rate = 1.0 - 0.9 * (mf.p0 if ratio else 1.0)
        got = [mf.response_quantiles[x] for x in q]
        np.testing.assert_allclose(got, -np.log1p(-q) / rate, rtol=1e-12)
        assert mf.mean_queue_length == pytest.approx(0.9 / rate, rel=1e-12, abs=0.0)
        assert mf.settings["ratio"] == ratio


def test_closed_form_arguments():
    """``levels`` is named in its refusal, and 1 is taken; ``r`` below 1 is a valid ratio."""
    with pytest.raises(ValueError, match=r"^levels=0 is out of range: need 1 <= levels"):
        theory.mean_field("pod", 0.9, levels=0)
    assert 0.0 < theory.mean_field("jiq", 0.9, 0.5).p0 < 1.0
    assert theory.mean_field("random", 1e-7, levels=1).tail.size == 2  # s_0, s_1
    # the adaptive count's least, in both of its branches (d = 1, d >= 2)
    assert theory.mean_field("random", 1e-20).tail.size == 2
    assert theory.mean_field("pod", 1e-20, d=2).tail.size == 2
    quantiles = theory.mean_field("pod", 0.9, d=2, with_quantiles=False).response_quantiles
    assert np.all(np.isnan(list(quantiles.values())))  # skipped when not asked for


@pytest.mark.parametrize(
    ("policy", "ratio", "d", "load"),
    [
        ("random", None, 1, 0.9),
        ("jiq", 10.0, 1, 0.9),
        ("pod", None, 2, 0.9),
        ("jiq-pod", 10.0, 2, 0.9),
        ("pod", None, 2, 0.1),  # s_4 = 1e-15: between the per-entry count's thresholds
    ],
)
def test_closed_form_tails_and_their_adaptive_count(policy, ratio, d, load):
    """The tail ``s_0 .. s_{n-1}`` of :func:`_tail_by_recursion`, with ``n`` the fewest
    entries whose rest ``sum_{i >= n} s_i`` is below 1e-15 (measured: 350, 43, 9, 7 and 5
    entries), and that rest reported as the tail's remainder; the occupancy, the law
    of what an arrival finds and the waiting probability that follow from it."""
    mf = _mf(policy, load, ratio, d=d)
    p0 = mf.p0 if ratio else 1.0
    s = np.concatenate([[1.0], _tail_by_recursion(load, p0, d, count=2000)])
    rest = np.cumsum(s[::-1])[::-1]  # rest[n] = sum_{i >= n} s_i
    n = int(np.argmax(rest < 1e-15))
    assert mf.tail.size == n
    np.testing.assert_allclose(mf.tail, s[:n], rtol=1e-12)
    assert mf.diagnostics["tail_remainder"] == pytest.approx(rest[n], rel=1e-9, abs=0.0)
    np.testing.assert_allclose(mf.occupancy, s[:n] - s[1 : n + 1], rtol=1e-12, atol=1e-300)
    # an arrival finds k or more tasks with probability p0 s_k^d (k >= 1): a_0 = 1
    a = np.concatenate([[1.0], p0 * s[1 : n + 1] ** d])
    np.testing.assert_allclose(mf.arrival_seen, a[:n] - a[1 : n + 1], rtol=1e-12, atol=1e-300)
    assert mf.waiting_probability == pytest.approx(a[1], rel=1e-12, abs=0.0)


def _pod_tail(log_lam: float, p0: float, d: int, count: int) -> np.ndarray:
    """``s_k = lambda**((d**k - 1)/(d - 1)) p0**((d**(k-1) - 1)/(d - 1))`` in float64 logs
    (the recursion ``s_{k+1} = lambda p0 s_k^d`` solved), ``k = 0..count-1``."""
    out = [1.0]
    for k in range(1, count):
        e_lam = (d**k - 1) // (d - 1) if d > 1 else k
        e_p0 = (d ** (k - 1) - 1) // (d - 1) if d > 1 else k - 1
        out.append(math.exp(e_lam * log_lam + e_p0 * math.log(p0)) if e_lam < 1e6 else 0.0)
    return np.array(out)


def test_the_tail_array_function_of_each_family():
    """``theory.tail`` (the differentiable array function, not the host result) against
    the recursion written here: JIQ-Pod(2) and JIQ at r = 10 with the p0 of the mean
    field (s_1 = lambda exactly: an arrival's p0 enters from s_2), Pod(2) past the
    exponent cap (levels 120: ``2**100`` exceeds 1e30; those entries are exactly 0), the
    default 32 levels and the least, one; NaN outside the ratio's range ``0 < r < inf``
    and the load's, a ratio below 1 inside it."""
    lam, r = 0.9, 10.0
    for policy, d in (("jiq-pod", 2), ("jiq", 1)):
        p0 = _mf(policy, lam, r, d=d).p0
        got = np.asarray(theory.tail(policy, lam, r, d=d) if d > 1 else theory.tail(policy, lam, r))
        want = _pod_tail(math.log(lam), p0, d, got.size)
        assert got.shape == (33,) and got[1] == pytest.approx(lam, rel=1e-6)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-30)
    pod = np.asarray(theory.tail("pod", lam, levels=120))
    np.testing.assert_allclose(pod, _pod_tail(math.log(lam), 1.0, 2, 121), rtol=2e-5, atol=1e-30)
    assert pod.shape == (121,) and np.all(pod[100:] == 0.0)
    assert np.asarray(theory.tail("pod", lam, levels=1)).tolist() == pytest.approx([1.0, lam])
    for ratio in (0.0, -1.0, math.inf, math.nan):
        assert np.isnan(np.asarray(theory.tail("jiq-pod", lam, ratio))).all(), ratio
    assert np.isnan(np.asarray(theory.tail("jiq-pod", 1.5, r))).all()
    assert np.isfinite(np.asarray(theory.tail("jiq-pod", lam, 0.5))).all()
    assert np.isnan(np.asarray(theory.mean_response_time("jiq-pod", lam, 0.0)))


def test_the_array_functions_refuse_with_reasons(monkeypatch):
    with pytest.raises(ValueError, match=r"levels=0 is out of range: need 1 <= levels"):
        theory.tail("pod", 0.5, levels=0)
    with pytest.raises(ValueError, match=r"policy 'jiq-pod' needs ratio = N / M"):
        theory.tail("jiq-pod", 0.5)
    with pytest.raises(ValueError, match=r"the generic fixed point: use theory\.mean_field$"):
        theory.tail("i1f", 0.5)
    from jaxqueue.policies import make
    from jaxqueue.policies.base import ClosedForm

    i1f = type(make("i1f"))  # a policy that says it has no mean field, and why
    monkeypatch.setattr(i1f, "no_mean_field", "no reason here")
    with pytest.raises(
        ValueError, match=r"closed-form mean field; it has no mean field: no reason"
    ):
        theory.tail("i1f", 0.5)
    pod = type(make("pod"))
    monkeypatch.setattr(pod, "closed_form", lambda self: ClosedForm("nope", 2))
    with pytest.raises(
        ValueError, match=r"declares the closed form 'nope'; known families: pod, jsq, jiq-pod$"
    ):
        theory.tail("pod", 0.5)


def test_pods_response_time_near_saturation_in_float64():
    """Pod(2) at ``1 - lambda = 1e-10`` (float64, where the doubly exponential sum needs
    its 40-odd terms): ``T = sum_k lambda**(2**k - 2)`` summed here until the terms
    vanish; and at 1 - 1e-6 in float32."""
    from jaxqueue.core.host import host_float64

    lam = 1 - 1e-10  # (its float64 value: 1 - lambda is 1.00000008e-10)
    want = sum(math.exp((2**k - 2) * math.log(lam)) for k in range(1, 200))
    with host_float64():
        got = float(theory.mean_response_time("pod", lam, d=2))
    assert got == pytest.approx(want, rel=1e-12)
    lam = float(np.float32(1 - 1e-6))
    want = sum(math.exp((2**k - 2) * math.log(lam)) for k in range(1, 200))
    assert float(theory.mean_response_time("pod", lam, d=2)) == pytest.approx(want, rel=2e-5)


def test_a_uniform_below_two_to_the_minus_32_comes_from_the_low_word():
    """``open_uniform``: with the high word 0, ``u = lo / 2**64`` exactly (float32 holds
    these powers of two); with ``hi = 1, lo = 0``, ``2**-32``."""
    import jax.numpy as jnp

    from jaxqueue.policies.probes import open_uniform

    hi = jnp.array([0, 0, 1], jnp.uint32)
    lo = jnp.array([2**31, 1, 0], jnp.uint32)
    np.testing.assert_array_equal(np.asarray(open_uniform(hi, lo)), [2.0**-33, 2.0**-64, 2.0**-32])


# -- theory/lu.py -------------------------------------------------------------------------


def test_lu_iqueue_law_of_jiq_sq_3_is_the_supermarket_law():
    """JIQ-SQ(3) (where ``(d**j - 1) / (d - 1)`` and ``(d**j - 1) (d - 1)`` differ; at
    ``d = 2`` they agree): the law's "at least j" is ``rho**(1 + 3 + ... + 3**(j-1))``,
    with ``rho`` solving ``sum_i rho**((3**i - 1)/2) = r (1 - lambda)`` by Brent's method
    here."""
    from scipy.optimize import brentq

    lam, r = 0.9, 10.0
    e = [(3**i - 1) // 2 for i in range(1, 40)]
    rho = brentq(lambda x: sum(x**k for k in e) - r * (1 - lam), 1e-9, 1 - 1e-12, xtol=1e-16)
    res = theory.lu_result("jiq-sq", lam, r, d=3)
    n = res.iqueue_distribution.size
    at_least = np.array([rho ** ((3**j - 1) // 2) for j in range(n + 1)])
    np.testing.assert_allclose(res.iqueue_distribution, at_least[:-1] - at_least[1:], rtol=1e-9)
    assert res.p0 == pytest.approx(1 - rho, rel=1e-9)
    # sizes up to the first whose "at least" is below 1e-15; past it, the remainder
    assert at_least[n - 2] >= 1e-15 > at_least[n - 1]
    assert res.diagnostics["iqueue_remainder"] == pytest.approx(at_least[n], rel=1e-6, abs=0.0)


def test_lu_at_the_ends_of_the_ratio():
    """A ratio so small that ``r (1 - lambda)`` is 0 (5e-324): every I-queue empty, every
    task sent at random, ``T = 1 / (1 - lambda)``; so large that ``1 - rho`` is below
    float64's resolution (JIQ-SQ(2) at r = 1e300; JIQ at r = 1e17, where
    ``m / (1 + m)`` rounds to 1): no I-queue empty, one level, nobody waits. Quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for d in (1, 2):
            small = theory.lu_result(
                "jiq-sq" if d > 1 else "jiq", 0.9, 5e-324, d=d if d > 1 else None
            )
            assert small.p0 == 1.0 and small.mean_response_time == pytest.approx(10.0, rel=1e-12)
            np.testing.assert_array_equal(small.iqueue_distribution, [1.0])
            assert small.diagnostics["iqueue_remainder"] == 0.0
        for policy, d, r in (("jiq-sq", 2, 1e300), ("jiq", None, 1e17)):
            big = theory.lu_result(policy, 0.5, r, d=d)
            assert big.p0 == 0.0 and big.settings["levels"] == 1
            assert big.mean_response_time == pytest.approx(1.0, abs=1e-16)
            assert 0.0 <= big.waiting_probability <= 1e-16
            assert math.copysign(1.0, big.waiting_probability) == 1.0  # not -0.0
            np.testing.assert_array_equal(big.iqueue_distribution, [0.0])
            assert big.diagnostics["iqueue_remainder"] == 1.0


def test_lu_past_a_hundred_thousand_iqueue_sizes_the_rest_is_reported():
    """r = 10**5 at load 0.9: the geometric I-queue law (``rho = m / (1 + m)``,
    ``m = 10**4``) is cut at 100000 sizes, with ``rho**100001`` of it (4.5e-5) reported
    as its remainder (this raised a shape error)."""
    res = theory.lu_result("jiq", 0.9, 1e5)
    m = 1e5 * (1 - 0.9)
    rho = m / (1 + m)
    law = res.iqueue_distribution
    assert law.size == 100_001
    assert law[0] == pytest.approx(1 - rho, rel=1e-12)
    assert law[-1] == pytest.approx((1 - rho) * rho**100_000, rel=1e-9)
    assert res.diagnostics["iqueue_remainder"] == pytest.approx(rho**100_001, rel=1e-9)
    # short of the cap: sizes up to the first whose "at least" is below 1e-15 (rho = 1/2)
    small = theory.lu_result("jiq", 0.9, 10.0)
    n = small.iqueue_distribution.size
    assert 0.5 ** (n - 2) >= 1e-15 > 0.5 ** (n - 1)
    assert small.diagnostics["iqueue_remainder"] == pytest.approx(0.5**n, rel=1e-12)


def test_lu_one_level_when_a_random_task_is_rare():
    """r = 10**16 at load 0.5: ``a = lambda (1 - rho)`` is about 1e-16, so
    ``s_2 = lambda a`` is below 1e-15 and one level suffices. The automatic count is the
    fewest levels ``L`` with ``lambda a**L < 1e-15`` at other points too."""
    res = theory.lu_result("jiq", 0.5, 1e16)
    assert res.settings["levels"] == 1 and res.tail.size == 2
    for lam, r in [(0.5, 10.0), (0.9, 10.0), (0.3, 2.0), (0.99, 1.0), (0.7, 0.5)]:
        res = theory.lu_result("jiq", lam, r)
        a = lam / (1 + r * (1 - lam))  # lambda (1 - rho), rho = m / (1 + m)
        want = next(n for n in range(1, 10_000) if lam * a**n < 1e-15)
        assert res.settings["levels"] == want, (lam, r)
        assert res.tail.size == want + 1
        assert res.diagnostics["tail_remainder"] == pytest.approx(lam * a**want, rel=1e-9)


def test_lu_arguments_and_settings():
    """What ``lu_result`` refuses (with the message), what it takes (``levels`` given,
    a ratio below 1, Mitzenmacher's FIFO order) and every setting it records."""
    from jaxqueue import __version__

    with pytest.raises(ValueError, match=r"ratio=0\.0: Lu et al\.'s approximation needs"):
        theory.lu_result("jiq", 0.9, 0.0)
    with pytest.raises(ValueError, match="ratio=inf"):
        theory.lu_result("jiq", 0.9, math.inf)
    with pytest.raises(ValueError, match=r"levels=0 must be at least 1"):
        theory.lu_result("jiq", 0.9, 10.0, levels=0)
    one = theory.lu_result("jiq", 0.9, 10.0, levels=1)
    np.testing.assert_allclose(one.tail, [1.0, 0.9], rtol=1e-15)
    five = theory.lu_result("jiq", 0.9, 10.0, levels=5)
    a = 0.9 * 0.5
    np.testing.assert_allclose(five.tail, [1.0] + [0.9 * a**k for k in range(5)], rtol=1e-14)
    assert five.settings["levels"] == 5
    assert five.diagnostics["tail_remainder"] == pytest.approx(0.9 * a**5, rel=1e-14)
    half = theory.lu_result("jiq", 0.9, 0.5)  # r = 1/2: m = 0.05, p0 = 1 / 1.05
    assert half.p0 == pytest.approx(1 / 1.05, rel=1e-14)
    fifo = theory.lu_result("jiq-original", 0.9, 10.0, z=0, order="fifo")
    assert fifo.settings["options"]["order"] == "fifo"
    assert theory.lu_result("jiq-original", 0.9, 10.0, z=0).settings["options"]["order"] == "random"
    s = five.settings
    assert s["policy"] == "jiq" and s["policy_label"] == "jiq"
    assert s["load"] == 0.9 and s["ratio"] == 10.0 and s["d"] == 1 and s["buffer"] is None
    assert s["model"] == "lu" and s["versions"]["jaxqueue"] == __version__
    assert five.diagnostics["status"] is Status.CONVERGED
    assert five.blocking_probability is None  # an infinite buffer blocks nothing: no number
    no_q = theory.lu_result("jiq", 0.9, 10.0, with_quantiles=False)
    assert all(math.isnan(v) for v in no_q.response_quantiles.values())
    assert list(no_q.response_quantiles) == list(QUANTILES)


def test_lu_series_arguments():
    """``busy_iqueue_fraction``'s default is the geometric law (``d = 1``: ``m / (1 + m)``);
    ``d`` must be an integer >= 1; the approximation is NaN for ``r <= 0``; JIQ-Pod with
    one probe joins one random I-queue; JIQ-SQ(10**5) (where ``d**j`` overflows) is quiet."""
    from jaxqueue.policies import make
    from jaxqueue.theory.baselines.lu import busy_iqueue_fraction, join_probes

    np.testing.assert_allclose(busy_iqueue_fraction([0.5, 3.0]), [1 / 3, 0.75], rtol=1e-15)
    for bad in (2.5, 0):
        with pytest.raises(ValueError, match=rf"d={bad!r} must be an integer >= 1"):
            busy_iqueue_fraction(1.0, bad)
    assert np.isnan(theory.lu_approximation(0.5, 0.0).mean_response_time)
    assert np.isnan(theory.lu_approximation(0.5, -1.0).rho)
    assert join_probes(make("jiq-pod", d=1)) == 1
    assert join_probes(make("jiq-sq", d=3)) == 3
    with np.errstate(over="raise"):
        res = theory.lu_result("jiq-sq", 0.9, 10.0, d=100_000)
    # rho solves rho + rho**(d + 1) + ... = 1: rho = 1 to float64 rounding, less d**-huge
    assert res.iqueue_distribution.sum() + res.diagnostics["iqueue_remainder"] == pytest.approx(1.0)


# -- results/ -----------------------------------------------------------------------------


def test_estimate_arithmetic_names_the_paired_run():
    """``Estimate - Estimate`` is refused with the call that gives the difference its
    interval, written out."""
    from jaxqueue.results.estimates import Estimate

    with pytest.raises(TypeError) as err:
        Estimate(1.0, 0.1, 8) - Estimate(2.0, 0.1, 8)
    assert "jq.paired('pod', [0.9, 0.95], 100, d=2)['mean_response_time']), or combine" in str(
        err.value
    )


def test_a_vector_estimates_repr_has_six_digits():
    from jaxqueue.results.estimates import Estimate

    text = repr(Estimate(np.array([1.23456789, 2.0]), np.array([0.1, 0.2]), 8))
    assert "1.234568" in text and "1.2345679" not in text


def test_batch_means_of_a_vector_metric_per_entry():
    """A vector metric's batch-means interval, entry by entry, written out: each entry's
    deviations about its own grand mean over the ``R B`` batches, ``t(RB - 1) s /
    sqrt(RB)``, widened by ``sqrt((1 + rho) / (1 - rho))`` where the lag-1 correlation
    ``rho`` passes ``2 / sqrt(RB)``. Entries of very different size (a tail's 1 and
    0.01) tell a grand mean over every entry from each entry's own."""
    from scipy.stats import t as student

    from jaxqueue.results.simulation import batch_means

    rng = np.random.default_rng(7)
    r, b = 3, 8
    x = np.stack(
        [1.0 + 0.05 * rng.standard_normal((r, b)), 0.01 + 0.002 * rng.standard_normal((r, b))],
        axis=-1,
    )
    whole = x.mean(axis=1)
    est, lag1, widened = batch_means(whole, x)
    for k in range(2):
        v = x[..., k]
        dev = v - v.mean()
        ss = (dev**2).sum()
        rho = (dev[:, :-1] * dev[:, 1:]).sum() / ss
        half = student.ppf(0.975, r * b - 1) * math.sqrt(ss / (r * b - 1) / (r * b))
        if rho > 2 / math.sqrt(r * b):
            c = min(rho, 0.9)
            half *= math.sqrt((1 + c) / (1 - c))
        assert est.ci95[k] == pytest.approx(half, rel=1e-9)
        assert est.mean[k] == pytest.approx(whole[:, k].mean(), rel=1e-12)
        assert lag1[k] == pytest.approx(rho, rel=1e-9)


def test_half_drift_of_straight_halves_has_no_noise():
    """Each half a straight line: the residuals are 0, so the interval is 0 (no
    correlation to estimate) and the drift is the difference of the halves' means."""
    from jaxqueue.results.warmup import half_drift

    y = np.r_[np.linspace(1.0, 2.0, 5), np.linspace(4.0, 6.0, 5)]
    drift, ci = half_drift(y)
    assert drift == pytest.approx(5.0 - 1.5, rel=1e-12) and ci == pytest.approx(0.0, abs=1e-12)


def test_a_failed_extended_warmup_from_the_mean_field_is_not_told_to_start_there():
    from jaxqueue.results.warmup import failure_message

    diag = dict(passed=False, auto=True, extensions=3, mser_truncation=5, batches=20)
    diag.update(half_drift=0.25, half_drift_ci99=0.1)
    text = failure_message(diag, 0.9, 100, init="mean-field")
    assert text.endswith(
        "lengthen the warm-up (warmup= or warmup_time=) or the window (steps= or time=)"
    )
    assert "start from the mean field" in failure_message(diag, 0.9, 100, init="empty")


def test_a_quantile_iteration_out_of_steps_says_so(monkeypatch):
    from jaxqueue.results import response

    monkeypatch.setattr(response, "_MAX_ITER", 1)
    with pytest.raises(RuntimeError, match="^quantile iteration did not converge$"):
        response.erlang_mixture_quantile(np.array([0.2, 0.3, 0.5]), np.array([0.5]))
