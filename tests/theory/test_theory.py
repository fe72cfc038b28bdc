"""Tests of the mean-field theory (jaxqueue.theory).

Accuracy checks run in float64 under ``jax.enable_x64(True)``; array shapes are
kept few so that little is compiled.
"""

import json
from decimal import Decimal, localcontext

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, special

from jaxqueue import theory
from jaxqueue.core import status
from jaxqueue.core.status import Status
from jaxqueue.core.versions import versions as jq_versions
from jaxqueue.policies import make, option_names
from jaxqueue.results.response import erlang_mixture_cdf
from jaxqueue.results.schema import QUANTILES
from jaxqueue.studies.headline import headline_ratio
from jaxqueue.theory.closed import closed_forms
from jaxqueue.theory.generic import meanfield

CORNER_LOADS = (1e-4, 1 - 1e-6)
CORNER_RATIOS = (1e-2, 1e4)


def scipy_p0(lam: float, r: float, d: int) -> float:
    """Independent reference: the paper's equation with scipy's gammainc, bracketed root."""

    def f(p0):
        q1 = lam * (1 - p0 * lam**d)
        h = lam * p0 * (1 - lam**d) / (1 - lam)
        a, c = r * q1 / h, lam * r / h
        log_p = np.log(special.gammainc(c, a))
        return np.log(p0) + special.gammaln(c + 1) + a - c * np.log(a) + log_p

    return optimize.brentq(f, 1e-9, 1 - 1e-15, xtol=1e-16, rtol=4 * np.finfo(float).eps)


def decimal_p0_error(p0: float, lam: float, r: float, d: int) -> float:
    """Newton correction ``-F/F'`` at ``p0`` from 34-digit arithmetic on the series form.

    ``F = log(p0 * sum_k prod_{j<=k} a/(c+j))``: the normalisation of the I-queue law
    summed term by term (independent of the solver's quadrature).
    """
    with localcontext() as ctx:
        ctx.prec = 34

        def f(p):
            p, lm, rr = Decimal(p), Decimal(lam), Decimal(r)
            g = (1 - lm) / (1 - lm**d)
            c = rr * g / p
            a = c - rr * g * lm**d
            total, term, k = Decimal(1), Decimal(1), 0
            while term > total * Decimal(10) ** -33:
                k += 1
                term = term * a / (c + k)
                total += term
            return (p * total).ln()

        h = Decimal(p0) * Decimal(10) ** -8
        slope = (f(Decimal(p0) + h) - f(Decimal(p0) - h)) / (2 * h)
        return float(-f(p0) / slope)


@pytest.mark.parametrize("d", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_p0_matches_scipy_reference(d):
    lam = np.array([0.1, 0.5, 0.9, 0.98])
    r = np.array([20.0, 1.0, 10.0, 10.0])
    with jax.enable_x64(True):
        sol = theory.solve_p0(lam, r, d)
    assert sol.p0.dtype == jnp.float64
    np.testing.assert_array_equal(sol.status, 0)
    ref = np.array([scipy_p0(a, b, d) for a, b in zip(lam, r)])
    np.testing.assert_allclose(sol.p0, ref, rtol=0, atol=1e-11)
    assert np.all(np.abs(np.asarray(sol.residual)) < 1e-13)


@pytest.mark.parametrize("d", [1, 10])
@pytest.mark.slow
def test_extreme_corners_finite_converged_and_accurate(d):
    lam, r = (x.ravel() for x in np.meshgrid(CORNER_LOADS, CORNER_RATIOS, indexing="ij"))
    with jax.enable_x64(True):
        sol = theory.solve_p0(lam, r, d)
    np.testing.assert_array_equal(sol.status, 0)
    p0 = np.asarray(sol.p0)
    assert np.all(np.isfinite(p0)) and np.all((p0 > 0) & (p0 <= 1))
    for i in (0, 2, 3):  # index 1 (lambda = 1e-4, r = 1e4: c ~ 2e8, 1.4e5 decimal terms)
        # is checked through the normalisation of the I-queue law below.
        err = decimal_p0_error(p0[i], lam[i], r[i], d)
        assert abs(err) < 1e-12, (lam[i], r[i], err)


@pytest.mark.parametrize("d", [1, 10])
@pytest.mark.slow
def test_iqueue_law_normalised_with_mean_r_one_minus_lambda(d):
    # Wang et al.: sum_k k p_k is the number of idle servers per dispatcher, r (1 - lambda).
    lam = np.array([1e-4, 0.3, 0.999, 1 - 1e-6])
    r = np.array([1e4, 0.01, 300.0, 1e4])
    with jax.enable_x64(True):
        p0 = theory.solve_p0(lam, r, d).p0
        dist = np.asarray(theory.iqueue_distribution(p0, lam, r, d, jmax=200_000))
    k = np.arange(dist.shape[-1])
    assert dist[:, -1].max() < 1e-30  # nothing left past jmax
    np.testing.assert_allclose(dist.sum(-1), 1.0, rtol=0, atol=1e-10)
    np.testing.assert_allclose(dist @ k, r * (1 - lam), rtol=1e-9)
    np.testing.assert_allclose(dist[:, 0], p0, rtol=1e-15)
    # the host-side law used by mean_field agrees
    host, rest = closed_forms._iqueue_host(float(p0[2]), lam[2], r[2], d)
    np.testing.assert_allclose(host, dist[2, : host.size], rtol=1e-12, atol=1e-300)
    assert rest < 1e-15


def test_invalid_inputs_give_status_not_silent_nan():
    with jax.enable_x64(True):
        sol = theory.solve_p0(np.array([1.2, 0.5, 0.5, 0.5]), np.array([1.0, -1.0, np.inf, 2.0]))
    invalid, ok = Status.INVALID_INPUT, Status.CONVERGED
    np.testing.assert_array_equal(sol.status, [invalid, invalid, invalid, ok])
    assert [Status(int(c)) for c in sol.status] == [invalid, invalid, invalid, ok]
    assert np.all(np.isnan(np.asarray(sol.p0)[:3])) and np.isfinite(sol.p0[3])
    assert "invalid" in status.message(sol.status[0])
    with pytest.raises(ValueError):
        theory.solve_p0(0.5, 1.0, 0)


@pytest.mark.slow
def test_float32_mode_accuracy():
    # Without x64 everything is float32; documented accuracy about 5e-7 absolute.
    lam = np.array([0.1, 0.5, 0.9, 0.98], np.float32)
    r = np.array([20.0, 1.0, 10.0, 10.0], np.float32)
    with jax.enable_x64(False):
        sol32 = theory.solve_p0(lam, r, 2)
        assert sol32.p0.dtype == jnp.float32
        sol32 = jax.tree_util.tree_map(np.asarray, sol32)
    with jax.enable_x64(True):
        sol64 = theory.solve_p0(lam.astype(np.float64), r.astype(np.float64), 2)
    np.testing.assert_array_equal(sol32.status, 0)
    np.testing.assert_allclose(np.asarray(sol32.p0, np.float64), sol64.p0, rtol=0, atol=2e-6)


@pytest.mark.slow
@pytest.mark.parametrize("d", [1, 2])
def test_gradients_match_central_differences(d):
    h = 1e-6  # central differences in float64: error ~ h**2 + eps / h, ~1e-10 relative
    with jax.enable_x64(True):
        for lam, r in [(0.3, 0.5), (0.9, 10.0), (0.98, 40.0)]:

            def p0(lam_, r_):
                return theory.solve_p0(lam_, r_, d).p0

            x = (jnp.float64(lam), jnp.float64(r))
            _, dp0_dlam = jax.jvp(p0, x, (jnp.float64(1.0), jnp.float64(0.0)))
            _, dp0_dr = jax.jvp(p0, x, (jnp.float64(0.0), jnp.float64(1.0)))
            fd_lam = (p0(lam * (1 + h), r) - p0(lam * (1 - h), r)) / (2 * h * lam)
            fd_r = (p0(lam, r * (1 + h)) - p0(lam, r * (1 - h))) / (2 * h * r)
            assert float(dp0_dlam) == pytest.approx(float(fd_lam), rel=1e-6)
            assert float(dp0_dr) == pytest.approx(float(fd_r), rel=1e-6)
            assert float(dp0_dlam) > 0 > float(dp0_dr)  # busier: more empty I-queues

            # JIQ-Pod(1) is JIQ, which takes no option d
            policy, opts = ("jiq", {}) if d == 1 else ("jiq-pod", {"d": d})

            def t(lam_, r_, policy=policy, opts=opts):
                return theory.mean_response_time(policy, lam_, r_, **opts)

            _, dt_dlam = jax.jvp(t, x, (jnp.float64(1.0), jnp.float64(0.0)))
            fd_t = (t(lam * (1 + h), r) - t(lam * (1 - h), r)) / (2 * h * lam)
            assert float(dt_dlam) == pytest.approx(float(fd_t), rel=1e-6)


@pytest.mark.slow
def test_reverse_mode_gradient_of_vectorised_response_time():
    lam = np.array([0.3, 0.5, 0.9, 0.98])
    r = np.array([0.5, 2.0, 10.0, 40.0])
    h = 1e-6
    with jax.enable_x64(True):
        grad = jax.grad(lambda x: jnp.sum(theory.mean_response_time("jiq-pod", x, r, d=2)))(lam)
        t_plus = np.asarray(theory.mean_response_time("jiq-pod", lam * (1 + h), r, d=2))
        t_minus = np.asarray(theory.mean_response_time("jiq-pod", lam * (1 - h), r, d=2))
        grad = np.asarray(grad)
    np.testing.assert_allclose(grad, (t_plus - t_minus) / (2 * h * lam), rtol=1e-6)


@pytest.mark.slow
def test_p0_grid_matches_pointwise_solve():
    loads = np.array([0.05, 0.5, 0.95])
    ratios = np.array([0.1, 1.0, 30.0, 1000.0])
    with jax.enable_x64(True):
        grid = theory.p0_grid(loads, ratios, 1)
        lam, r = np.meshgrid(loads, ratios, indexing="ij")
        point = theory.solve_p0(lam.ravel(), r.ravel(), 1)
    assert grid.p0.shape == (3, 4)
    np.testing.assert_array_equal(grid.status, 0)
    np.testing.assert_allclose(grid.p0, np.asarray(point.p0).reshape(3, 4), rtol=1e-14)


def test_random_pod_and_jsq_tails():
    lam = 0.7
    s = theory.mean_field("random", lam).tail
    np.testing.assert_allclose(s, lam ** np.arange(s.size), rtol=1e-14)
    t_random = theory.mean_field("random", lam).mean_response_time
    assert t_random == pytest.approx(1 / (1 - lam), rel=1e-14)
    np.testing.assert_allclose(theory.tail("random", lam, levels=6), lam ** np.arange(7), rtol=1e-6)
    s_pod = theory.mean_field("pod", lam, d=3).tail
    i = np.arange(s_pod.size)
    np.testing.assert_allclose(s_pod, lam ** ((3.0**i - 1) / 2), rtol=1e-13)
    np.testing.assert_allclose(theory.mean_field("pod", lam, d=1).tail, s, rtol=0)
    jsq = theory.mean_field("jsq", lam)
    np.testing.assert_allclose(jsq.tail, [1.0, lam])
    assert jsq.mean_response_time == 1.0 and jsq.waiting_probability == 0.0


@pytest.mark.slow
def test_jiq_pod_with_d1_is_jiq_and_jiq_tail_formula():
    a = theory.mean_field("jiq", 0.9, 5.0)
    b = theory.mean_field("jiq-pod", 0.9, 5.0, d=1)
    assert b.d == 1 and b.probe_rate == 0.0
    assert a.p0 == b.p0 and a.mean_response_time == b.mean_response_time
    np.testing.assert_array_equal(a.tail, b.tail)
    i = np.arange(a.tail.size)
    np.testing.assert_allclose(a.tail[1:], a.p0 ** (i[1:] - 1) * 0.9 ** i[1:], rtol=1e-12)
    assert a.mean_response_time == pytest.approx(1 / (1 - 0.9 * a.p0), rel=1e-14)


@pytest.mark.parametrize(
    "policy,ratio,d",
    [
        ("random", None, None),
        ("pod", None, 2),
        ("jsq", None, None),
        ("jiq", 10.0, None),
        ("jiq-pod", 10.0, 2),
        ("jiq-pod", 0.5, 10),
    ],
)
@pytest.mark.slow
def test_mean_field_consistency(policy, ratio, d):
    lam = 0.95
    mf = theory.mean_field(policy, lam, ratio, d=d)
    s, k = mf.tail, np.arange(mf.tail.size)
    assert mf.levels == s.size - 1 and mf.occupancy.size == mf.arrival_seen.size == s.size
    # tail non-increasing from 1; occupancy its differences; nothing material left out
    assert s[0] == 1.0 and np.all(np.diff(s) <= 0) and mf.tail_remainder < 1e-15
    np.testing.assert_allclose(mf.occupancy[:-1], -np.diff(s), rtol=1e-12, atol=1e-17)
    # the last entry is s_L - s_{L+1}, with s_{L+1} <= tail_remainder
    assert 0 <= s[-1] - mf.occupancy[-1] <= mf.tail_remainder + 1e-15 * s[-1]
    # Little's law for the Erlang mixture: sum_k (k + 1) P(find k) = sum s_i / lambda
    np.testing.assert_allclose(mf.arrival_seen.sum(), 1.0, atol=1e-14)
    np.testing.assert_allclose((k + 1) @ mf.arrival_seen, mf.mean_response_time, rtol=1e-12)
    np.testing.assert_allclose(mf.mean_queue_length, lam * mf.mean_response_time, rtol=1e-14)
    np.testing.assert_allclose(mf.waiting_probability, 1 - mf.arrival_seen[0], atol=1e-14)
    q = np.array(list(mf.response_quantiles))
    t = np.array(list(mf.response_quantiles.values()))
    assert tuple(q) == QUANTILES
    assert all(type(v) is float for v in mf.response_quantiles.values())
    assert np.all(np.diff(t) > 0) and t[0] > 0
    np.testing.assert_allclose(erlang_mixture_cdf(mf.arrival_seen, t), q, rtol=1e-10)
    assert mf.blocking_probability is None and mf.stale_fraction is None  # infinite buffer
    assert mf.status is Status.CONVERGED
    # the jnp helpers agree
    with jax.enable_x64(True):
        t_jnp = float(theory.mean_response_time(policy, lam, ratio, d=d))
        s_jnp = np.asarray(theory.tail(policy, lam, ratio, d=d, levels=mf.levels))
    assert t_jnp == pytest.approx(mf.mean_response_time, rel=1e-12)
    np.testing.assert_allclose(s_jnp, s, rtol=1e-12, atol=1e-300)
    if policy in ("jiq", "jiq-pod"):
        dd = mf.d
        assert 0 < mf.p0 < 1 and mf.iqueue_distribution[0] == pytest.approx(mf.p0, rel=1e-15)
        assert np.arange(mf.iqueue_distribution.size) @ mf.iqueue_distribution == pytest.approx(
            ratio * (1 - lam), rel=1e-11
        )
        # joins = leaves: own-dispatcher assignments lambda (1 - p0) plus delete requests
        assert mf.join_rate == pytest.approx(s[1] - s[2], rel=1e-12)
        assert mf.join_rate == pytest.approx(lam * (1 - mf.p0) + mf.delete_rate, rel=1e-12)
        assert mf.delete_rate == pytest.approx(lam * mf.p0 * (1 - lam**dd), rel=1e-12)
        assert mf.probe_rate == (lam * mf.p0 * dd if dd >= 2 else 0.0)
        assert mf.waiting_probability == pytest.approx(mf.p0 * lam**dd, rel=1e-12)
    else:
        assert mf.p0 is None and mf.iqueue_distribution is None
        assert mf.join_rate is None and mf.delete_rate is None  # no I-queues: do not apply
        assert mf.probe_rate == (lam * d if policy == "pod" else 0.0)


@pytest.mark.slow
def test_ordering_jiq_pod_beats_pod_and_jiq():
    # Wang et al.: JIQ-Pod(d) has the shortest mean response time of the three.
    for lam, r in [(0.5, 1.0), (0.9, 10.0), (0.99, 2.0)]:
        t_jp = theory.mean_field("jiq-pod", lam, r, d=2).mean_response_time
        assert t_jp < theory.mean_field("jiq", lam, r).mean_response_time
        assert t_jp < theory.mean_field("pod", lam, d=2).mean_response_time


def _d_where_taken(policy, d):
    """``{"d": d}`` for a policy that takes ``d`` (pod, jiq-pod), nothing for jiq."""
    return {"d": d} if "d" in option_names(policy) else {}


@pytest.mark.slow
def test_headline_figures():
    fit = headline_ratio()
    assert 9.0 < fit.ratio < 11.0
    # each single-policy ratio reproduces its target
    with jax.enable_x64(True):
        for policy, target in fit.targets.items():
            opts = _d_where_taken(policy, 2)
            t = float(theory.mean_response_time(policy, 0.98, fit.ratios[policy], **opts))
            assert t == pytest.approx(target, rel=1e-9)
    at10 = {
        p: theory.mean_field(p, 0.98, 10.0, **_d_where_taken(p, 2)).mean_response_time
        for p in ("jiq", "jiq-pod", "pod")
    }
    assert at10["jiq"] == pytest.approx(5.3, abs=0.1)
    assert at10["jiq-pod"] == pytest.approx(2.6, abs=0.1)
    assert at10["pod"] == pytest.approx(4.5, abs=0.02)
    assert fit.mean_response_time["pod"] == pytest.approx(at10["pod"], rel=1e-14)


@pytest.mark.parametrize(
    "policy,ratio,d",
    [
        pytest.param("jiq-pod", 10.0, 2, marks=pytest.mark.slow),
        pytest.param("random", None, None, marks=pytest.mark.slow),
    ],
)
def test_max_load_for_target(policy, ratio, d):
    target = 3.0
    res = theory.max_load_for_target(policy, target, ratio, d=d)
    assert res.status is Status.CONVERGED
    with jax.enable_x64(True):
        t_star = float(theory.mean_response_time(policy, res.load, ratio, d=d))
        t_above = float(theory.mean_response_time(policy, res.load + 1e-7, ratio, d=d))
    assert t_star <= target + 1e-9 and t_above > target
    assert res.mean_response_time == pytest.approx(t_star, rel=1e-14)
    if policy == "random":
        assert res.load == pytest.approx(1 - 1 / target, abs=1e-10)


def test_max_load_edge_cases():
    infeasible = theory.max_load_for_target("jiq-pod", 0.9, 10.0)
    assert infeasible.status is Status.INFEASIBLE and infeasible.load == 0.0
    unbounded = theory.max_load_for_target("jsq", 2.0)
    assert unbounded.status is Status.UNBOUNDED and unbounded.load == 1.0
    with pytest.raises(ValueError, match="needs ratio"):
        theory.max_load_for_target("jiq", 3.0)
    with pytest.raises(ValueError, match="no closed-form"):
        theory.max_load_for_target("i1f", 3.0)
    # a target that is no mean response time, and a ratio out of range, are errors
    for bad in (float("nan"), -1.0, 0.0):
        with pytest.raises(ValueError, match=f"target={bad} is out of range"):
            theory.max_load_for_target("jiq", bad, 10.0)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"ratio={bad} is out of range: need 0 < ratio"):
            theory.max_load_for_target("jiq", 3.0, bad)
    endless = theory.max_load_for_target("jiq", float("inf"), 10.0)
    assert endless.status is Status.UNBOUNDED and endless.load == 1.0


def test_closed_forms_are_nan_outside_their_domain():
    """As ``solve_p0``: points outside ``0 < lambda < 1`` (and ``0 < r < inf``) are NaN,
    one by one, in every entry (no negative times, no tails above 1)."""
    loads = jnp.array([-0.5, 0.0, 0.5, 1.0, 1.5])
    bad = np.array([True, True, False, True, True])
    for policy in ("random", "pod"):
        t = np.asarray(theory.mean_response_time(policy, loads))
        assert np.all(np.isnan(t[bad])) and np.all(np.isfinite(t[~bad])), policy
        s = np.asarray(theory.tail(policy, loads, levels=4))
        assert np.all(np.isnan(s[bad])) and np.all((s[~bad] >= 0) & (s[~bad] <= 1)), policy
    t = np.asarray(theory.mean_response_time("jiq", 0.5, jnp.array([-3.0, 0.0, jnp.inf, 10.0])))
    assert np.all(np.isnan(t[:3])) and np.isfinite(t[3])


def test_to_dict_is_json_and_mirrors_the_result():
    mf = theory.mean_field("jiq-pod", 0.9, 10.0, d=2)
    assert isinstance(mf, theory.MeanFieldResult) and mf.source == "mean-field"
    out = json.loads(json.dumps(mf.to_dict()))
    assert out["source"] == "mean-field"
    assert out["mean_response_time"] == {"mean": mf.mean_response_time, "ci95": None, "n": None}
    assert out["p0"]["mean"] == mf.p0 and out["tail"]["mean"] == mf.tail.tolist()
    assert out["response_quantiles"]["0.999"]["mean"] == mf.response_quantiles[0.999]
    assert out["stale_fraction"] is None and out["blocking_probability"] is None
    assert out["settings"]["policy_label"] == "jiq-pod(d=2)" and out["settings"]["d"] == 2
    assert out["settings"]["levels"] == mf.tail.size - 1
    assert out["diagnostics"]["status"] == 0
    assert out["diagnostics"]["tail_remainder"] == mf.tail_remainder
    pod = theory.mean_field("pod", 0.9, d=2).to_dict()
    assert pod["p0"] is None and pod["iqueue_distribution"] is None
    assert out["settings"]["versions"] == jq_versions()


def test_mean_field_errors():
    for name in ("jiq-threshold", "jiq-original"):  # host-side solvers for infinite buffers
        with pytest.raises(NotImplementedError, match=f"{name}.*infinite buffers"):
            theory.mean_field(name, 0.5, 1.0, buffer=3)
    with pytest.raises(ValueError, match="unknown policy"):
        theory.mean_field("nope", 0.5, 1.0)
    for bad in (-1.0, 0.0, float("nan"), float("inf")):  # (None is one dispatcher)
        with pytest.raises(ValueError, match="ratio"):
            theory.mean_field("jiq", 0.5, bad)


@pytest.mark.slow
def test_pod_default_d_is_the_policy_default_as_in_simulate():
    # simulate builds its policy with make(name): Pod's default is d = 2
    default = make("pod")
    assert default.d == 2
    mf = theory.mean_field("pod", 0.9)
    assert mf.d == 2 and mf.options == default.options() and mf.policy_label == default.label()
    explicit = theory.mean_field("pod", 0.9, d=2)
    assert mf.mean_response_time == explicit.mean_response_time
    np.testing.assert_array_equal(mf.tail, explicit.tail)
    # not Random's (d = 1)
    assert mf.mean_response_time < theory.mean_field("random", 0.9).mean_response_time
    with jax.enable_x64(True):
        t_default = float(theory.mean_response_time("pod", 0.9))
        s_default = np.asarray(theory.tail("pod", 0.9, levels=5))
        s_two = np.asarray(theory.tail("pod", 0.9, d=2, levels=5))
    assert t_default == pytest.approx(mf.mean_response_time, rel=1e-12)
    np.testing.assert_array_equal(s_default, s_two)
    # the JIQ family likewise: jiq-pod's default d = 2
    assert theory.mean_field("jiq-pod", 0.9, 10.0).d == make("jiq-pod").d == 2


def test_options_a_policy_does_not_take_are_errors():
    with pytest.raises(ValueError, match=r"'jiq' takes no option d"):
        theory.mean_field("jiq", 0.9, 10, d=2)
    with pytest.raises(ValueError, match=r"'random' takes no option d"):
        theory.mean_field("random", 0.9, d=1)
    with pytest.raises(ValueError, match=r"'pod' takes no option z"):
        theory.mean_field("pod", 0.9, z=1)
    with pytest.raises(ValueError, match=r"takes no option d"):
        theory.tail("jsq", 0.9, d=2)
    with pytest.raises(ValueError, match=r"takes no option d"):
        theory.mean_response_time("jiq", 0.9, 10.0, d=2)


def test_per_server_policies_have_no_closed_form_and_say_which_mean_field():
    for name, kind in (("jiq-threshold", "composition"), ("jiq-original", "tagged-server")):
        with pytest.raises(
            ValueError, match=f"no closed-form mean field; its mean field is the '{kind}' solver"
        ):
            theory.tail(name, 0.5, 10.0)


def test_array_functions_need_a_closed_form():
    for name in ("i1f", "jiq-sq", "idle-first"):
        with pytest.raises(ValueError, match="no closed-form mean field.*generic fixed point"):
            theory.tail(name, 0.9, 10.0)
        with pytest.raises(ValueError, match="no closed-form mean field"):
            theory.mean_response_time(name, 0.9, 10.0)
    with pytest.raises(ValueError, match="needs ratio"):
        theory.tail("jiq", 0.9)


@pytest.mark.slow
def test_status_codes_are_status_members():
    assert theory.Status is Status
    with jax.enable_x64(True):
        sol = theory.solve_p0(np.array([0.5, 1.5]), np.array([2.0, 2.0]))
    assert [Status(int(c)) for c in sol.status] == [Status.CONVERGED, Status.INVALID_INPUT]
    assert not hasattr(theory, "STATUS_MESSAGES") and not hasattr(theory, "to_dict")
    mf = theory.mean_field("jiq", 0.9, 10.0)
    assert isinstance(mf.status, Status) and mf.status is Status.CONVERGED
    assert mf.diagnostics["status"] is Status.CONVERGED
    # the generic path's statuses: tests/theory/test_meanfield.py and the levels test below
    res = theory.max_load_for_target("random", 3.0)
    assert isinstance(res.status, Status)


@pytest.mark.parametrize(
    "policy,ratio,load,n",
    [
        ("pod", None, 0.6, 4),
        ("jsq", None, 0.9, 6),
        pytest.param("jiq", 10.0, 0.9, 20, marks=pytest.mark.slow),
    ],
)
def test_levels_is_the_largest_queue_length(policy, ratio, load, n):
    # as the simulator's System.levels: arrays over k = 0..levels, levels + 1 entries
    with jax.enable_x64(True):
        s = np.asarray(theory.tail(policy, load, ratio, levels=n))
    assert s.shape == (n + 1,)
    mf = theory.mean_field(policy, load, ratio, levels=n)
    for arr in (mf.tail, mf.occupancy, mf.arrival_seen):
        assert arr.shape == (n + 1,)
    assert mf.levels == mf.settings["levels"] == n
    np.testing.assert_allclose(mf.tail, s, rtol=1e-12, atol=1e-300)
    # the remainder is the mass past level n: the auto-sized tail's entries n+1, n+2, ...
    full = theory.mean_field(policy, load, ratio)
    if full.tail.size > n + 1:
        rest = full.tail[n + 1 :].sum() + full.tail_remainder
        assert mf.tail_remainder == pytest.approx(rest, rel=1e-12)
        np.testing.assert_array_equal(mf.tail, full.tail[: n + 1])
    with pytest.raises(ValueError, match="levels"):
        theory.mean_field(policy, load, ratio, levels=0)


def test_a_given_levels_that_cuts_the_tail_is_refused():
    """A given ``levels`` leaving more than 1e-6 of the tail out (infinite buffers) is an
    error: the truncated model's metrics are not the mean field's."""
    with pytest.raises(ValueError, match=r"levels=3 is too small .*pod\(d=2\).* 0\.245 of"):
        theory.mean_field("pod", 0.9, levels=3)
    # a finite buffer is the model, not a cut
    assert theory.mean_field("pod", 0.9, buffer=3).levels == 3


@pytest.mark.slow
def test_a_given_levels_that_cuts_the_generic_fixed_point_is_refused():
    """The generic fixed point too (JIQ-SQ(2), r = 10, lambda = 0.9: T = 1.31 at levels 3,
    1.436 in truth)."""
    with pytest.raises(ValueError, match=r"levels=3 is too small .*jiq-sq\(d=2\).* 0\.0474 of"):
        theory.mean_field("jiq-sq", 0.9, 10.0, levels=3)


@pytest.mark.slow
def test_the_generic_fixed_point_grows_its_levels_until_the_tail_is_negligible():
    """JIQ-SQ(1) is JIQ (an idle server joins one random I-queue); at r = 1 and
    lambda = 0.8 its first 40 levels leave 2.4e-8 at the bound: the adaptive count
    grows until at most 1e-12 is there, and gives JIQ's closed form to 1e-12."""
    mf = theory.mean_field("jiq-sq", 0.8, 1.0, d=1)
    assert mf.levels > meanfield.DEFAULT_LEVELS and mf.tail_remainder <= meanfield.LEVEL_TOL
    jiq = theory.mean_field("jiq", 0.8, 1.0)
    assert mf.mean_response_time == pytest.approx(jiq.mean_response_time, rel=1e-12)
    n = min(mf.tail.size, jiq.tail.size)
    np.testing.assert_allclose(mf.tail[:n], jiq.tail[:n], rtol=1e-9, atol=1e-14)


@pytest.mark.slow
def test_levels_convention_of_the_generic_path():
    n = 12
    mf = theory.mean_field("i1f", 0.9, levels=n)
    assert mf.tail.shape == mf.occupancy.shape == mf.arrival_seen.shape == (n + 1,)
    assert mf.levels == n and mf.arrival_seen[n] == 0.0 and mf.p0 is None
    assert mf.status is Status.CONVERGED
    assert mf.blocking_probability is None and mf.stale_fraction is None  # infinite buffer
    assert mf.iqueue_distribution is None
    assert tuple(mf.response_quantiles) == QUANTILES


@pytest.mark.slow
def test_quantiles_filled_for_many_points_equal_those_of_one_point():
    from jaxqueue.theory.result import fill_quantiles

    cases = [
        ("pod", 0.9, None, {}),
        ("jiq-pod", 0.7, 10.0, {}),
        ("jiq-pod", 0.95, 10.0, {}),
        ("pod", 0.99, None, {"buffer": 6}),
        ("jiq-original", 0.8, 10.0, {"order": "fifo"}),
        ("i1f", 0.9, None, {}),
        ("jiq", 0.9, 10.0, {}),
        ("pod", 0.5, None, {}),
    ]
    whole = [theory.mean_field(p, lam, r, **kw) for p, lam, r, kw in cases]
    bare = [theory.mean_field(p, lam, r, with_quantiles=False, **kw) for p, lam, r, kw in cases]
    # closed forms with d >= 2, the generic and the tagged-server fixed points leave them NaN
    assert sum(np.isnan(list(b.response_quantiles.values())).all() for b in bare) >= 5
    for order in (list(range(len(cases))), list(range(len(cases)))[::-1]):
        filled = fill_quantiles([bare[i] for i in order] + [None])
        assert filled[-1] is None
        for i, res in zip(order, filled):
            assert res.response_quantiles == whole[i].response_quantiles  # bit for bit
            assert res.mean_response_time == whole[i].mean_response_time


def test_mean_field_takes_a_list_of_loads_and_names_the_differentiable_entry_points():
    """A list of loads gives one result per load, each the single call's; a traced
    load is refused with the entry points jax.grad can go through, and the closed
    form's gradient there agrees with a central difference of mean_field itself."""
    from jaxqueue.results.sweep import SweepResult

    loads = [0.5, 0.9]
    many = theory.mean_field("jiq", loads, 10.0, with_quantiles=False)
    assert isinstance(many, SweepResult) and len(many) == 2
    for load, res in zip(loads, many):
        one = theory.mean_field("jiq", load, 10.0, with_quantiles=False)
        assert res.settings["load"] == load
        np.testing.assert_array_equal(res.tail, one.tail)
        assert res.mean_response_time == one.mean_response_time
    assert {row["load"] for row in many.records()} == set(loads)  # one table of both
    with pytest.raises(TypeError, match="theory.mean_response_time"):
        jax.grad(lambda x: theory.mean_field("jiq", x, 10.0).mean_response_time)(0.9)
    h = 1e-5
    t = [theory.mean_field("jiq", 0.9 + s * h, 10.0).mean_response_time for s in (1, -1)]
    with jax.enable_x64(True):
        grad = float(jax.grad(lambda x: theory.mean_response_time("jiq", x, 10.0))(0.9))
    assert grad == pytest.approx((t[0] - t[1]) / (2 * h), rel=1e-5)
