"""The generic mean field (jaxqueue.theory.meanfield), derived from the policies' own rules."""

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.core.status import Status
from jaxqueue.policies import make
from jaxqueue.theory import meanfield

slow = pytest.mark.slow


@pytest.mark.parametrize(
    "name, d, ratio, levels",
    [("pod", 2, None, 40), ("pod", 3, None, 40),
     pytest.param("jiq", None, 10.0, 40, marks=slow),
     pytest.param("jiq-pod", 2, 10.0, 40, marks=slow),
     pytest.param("jiq", None, 2.0, 120, marks=slow), ("jsq", None, None, 40)],  # fmt: skip
)
@pytest.mark.slow
def test_reproduces_the_closed_forms(name, d, ratio, levels):
    fp = meanfield.fixed_point(name, 0.9, ratio, d=d, levels=levels)
    assert fp.status is Status.CONVERGED and fp.residual < 1e-12
    assert fp.tail.size == levels + 1  # levels: the largest queue length represented
    assert fp.truncated[0] < 1e-13 and fp.truncated[1] < 1e-13
    mf = theory.mean_field(name, 0.9, ratio, d=d)
    k = min(len(mf.tail), fp.tail.size)
    np.testing.assert_allclose(fp.tail[:k], mf.tail[:k], rtol=0, atol=1e-10)
    if ratio is not None:
        assert abs((1 - fp.iq_tail[1]) - mf.p0) < 1e-10
        q = fp.iq_tail
        dist = q - np.concatenate([q[1:], [0.0]])
        np.testing.assert_allclose(dist[:10], mf.iqueue_distribution[:10], rtol=0, atol=1e-10)
        # messages from the same rules: deletes per arrival times lambda
        assert abs(0.9 * fp.rates.deletes - mf.delete_rate) < 1e-10
    # Newton started at the closed form (no ODE run) lands on the same point in a few steps
    start = np.concatenate([fp.tail[1:], fp.iq_tail[1:]])
    again = meanfield.fixed_point(name, 0.9, ratio, d=d, levels=levels, start=start)
    assert again.status is Status.CONVERGED and again.iterations <= 3
    np.testing.assert_allclose(again.tail, fp.tail, rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="start must have shape"):
        meanfield.fixed_point(name, 0.9, ratio, d=d, levels=levels, start=start[:-1])


@slow
@pytest.mark.slow
def test_single_dispatcher_idle_first_and_i1f_fill_idle_servers_first():
    for name, d in (("idle-first", 2), ("i1f", None)):
        mf = theory.mean_field(name, 0.9, None, d=d)
        np.testing.assert_allclose(mf.tail[:3], [1.0, 0.9, 0.0], atol=1e-12)
        assert mf.mean_response_time == pytest.approx(1.0, abs=1e-12)


@slow
def test_jiq_sq_balances_iqueues_better_than_jiq():
    sq = theory.mean_field("jiq-sq", 0.9, 10.0, d=2)
    jiq = theory.mean_field("jiq", 0.9, 10.0)
    assert sq.p0 < jiq.p0 and sq.mean_response_time < jiq.mean_response_time
    # mean I-queue length is still r (1 - lambda): the I-queues list the idle servers
    dist = sq.iqueue_distribution
    assert np.arange(dist.size) @ dist == pytest.approx(10.0 * 0.1, rel=1e-9)
    # joins balance departures from one task; each join probes d = 2 I-queues
    assert sq.join_rate == pytest.approx(sq.tail[1] - sq.tail[2], rel=1e-12)
    assert sq.probe_rate == pytest.approx(2 * sq.join_rate, rel=1e-12)


@pytest.mark.slow
def test_transient_from_empty_reaches_the_fixed_point():
    times, tails, _ = meanfield.transient("pod", 0.9, d=2, t_end=400.0)
    fp = meanfield.fixed_point("pod", 0.9, d=2)
    assert np.all(np.diff(tails[:, 1]) >= -1e-12)  # s_1 rises monotonically from empty
    np.testing.assert_allclose(tails[-1, :6], fp.tail[:6], atol=1e-8)
    assert times[-1] == pytest.approx(400.0)


@slow
def test_finite_buffer_overload_against_simulation():
    """Pod(2), b = 3, lambda = 1.2 at N = 10^4: blocking and tail within the CI.

    8 replicas, fixed seed; tolerance: the Student-t quantile for 8 replicas at a
    family-wise 0.001 over 4 comparisons (jq.tolerance) plus a finite-N
    allowance of 10/N relative.
    """
    fp = meanfield.fixed_point("pod", 1.2, d=2, buffer=3)
    assert fp.status is Status.CONVERGED
    mf = meanfield.as_result(fp, make("pod", d=2), 1.2, None, buffer=3)
    n = 10_000
    res = jq.simulate("pod", 1.2, n, 1, d=2, buffer=3, replicas=8, steps=40 * n * 22 // 10,
                      warmup=10 * n * 22 // 10, init=mf.occupancy, seed=4,
                      interval="replicas")  # fmt: skip
    allow = 10.0 / n  # the mean field's O(1/N) gap, relative
    pairs = [(res.blocking_probability, mf.blocking_probability)] + [
        (jq.Estimate(res.tail.mean[i], res.tail.ci95[i], res.tail.n), mf.tail[i]) for i in (1, 2, 3)
    ]
    for est, want in pairs:  # a family of 4 comparisons, family-wise 0.001
        assert abs(est.mean - want) <= jq.tolerance(est, 4, allowance=allow * want), (est, want)


@pytest.mark.slow
def test_mean_field_with_a_buffer_is_the_generic_fixed_point():
    """A finite buffer takes every policy with a mean field to the generic path."""
    mf = theory.mean_field("pod", 1.2, buffer=3)  # Pod's default d = 2
    fp = meanfield.fixed_point("pod", 1.2, d=2, buffer=3)
    want = meanfield.as_result(fp, make("pod", d=2), 1.2, None, buffer=3)
    assert isinstance(mf, theory.MeanFieldResult) and mf.status is Status.CONVERGED
    assert mf.buffer == 3 and mf.levels == 3 and mf.d == 2
    for name in ("tail", "occupancy", "arrival_seen"):
        np.testing.assert_array_equal(getattr(mf, name), getattr(want, name))
        assert getattr(mf, name).shape == (4,)
    assert mf.arrival_seen[3] == 0.0  # an arrival that finds b tasks is blocked
    assert mf.blocking_probability == want.blocking_probability > 0
    assert mf.response_quantiles == want.response_quantiles and mf.p0 is None
    with pytest.raises(ValueError, match="levels=5 must equal buffer=3"):
        theory.mean_field("pod", 1.2, buffer=3, levels=5)
    with pytest.raises(ValueError, match="load"):
        theory.mean_field("pod", 1.2)  # infinite buffers need load < 1


def test_a_buffer_far_above_the_queues_costs_only_the_levels_they_reach():
    """Pod(2) at load 0.5 with 10^4 places per server (the simulator takes up to 10^6):
    the fixed point is solved on the levels the queues reach and is zero above them
    (it took 159 s and, at 10^5 places, more memory than a machine has); T is the
    infinite buffers' to 1e-12 and nothing is blocked."""
    mf = theory.mean_field("pod", 0.5, buffer=10**4)
    assert mf.levels == 10**4 and mf.buffer == 10**4 and mf.status is Status.CONVERGED
    assert mf.blocking_probability == 0.0 and np.all(mf.tail[meanfield.DEFAULT_LEVELS + 1 :] == 0)
    whole = theory.mean_field("pod", 0.5)
    assert mf.mean_response_time == pytest.approx(whole.mean_response_time, rel=1e-12)
    np.testing.assert_allclose(mf.tail[: whole.tail.size], whole.tail, rtol=1e-9, atol=1e-14)


def test_overload_starts_full_and_a_buffer_too_large_to_fill_is_refused():
    """Past capacity the queues fill the buffer (from empty, 500 time units at b = 100 and
    load 1.2, where Newton used to give up): the ODE starts from the full system, and the
    blocking leaves each server its capacity, 1 - 1/1.2. Above 4096 places the dense solve
    is refused, naming the buffer; a simulation's automatic start then starts empty and
    says why (nothing compiles)."""
    mf = theory.mean_field("pod", 1.2, buffer=100)
    assert mf.status is Status.CONVERGED and mf.levels == 100
    assert mf.blocking_probability == pytest.approx(1 - 1 / 1.2, rel=1e-9)
    assert mf.tail[1] == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="buffer=10000 is too large for the mean field at "
                                         "load=1.2: at a load of 1 or more the queues fill it"):
        theory.mean_field("pod", 1.2, buffer=10**4)
    with pytest.raises(ValueError, match="buffer=10000 is out of range for the mean field by "
                                         "class: .* 20000 coordinates"):
        theory.mean_field("pod", 0.5, buffer=10**4, service="erlang:2")
    with pytest.warns(jq.StartWarning, match=r"starts pod\(d=2\) empty: .*buffer=10000"):
        p = jq.sim.runner.plan("pod", [1.2], 100, buffer=10**4, replicas=2, steps=512)
    assert p.init == "empty"


def test_policies_without_mean_field_fail_in_the_generic_path_too():
    with pytest.raises(NotImplementedError, match="no generic mean field.*composition"):
        meanfield.fixed_point("jiq-threshold", 0.9, 10.0)
    with pytest.raises(NotImplementedError, match="no generic mean field.*tagged-server"):
        meanfield.fixed_point("jiq-original", 0.9, 10.0)
    with pytest.raises(NotImplementedError, match="jiq-original.*infinite buffers"):
        theory.mean_field("jiq-original", 0.9, 10.0, buffer=4)


def test_outcomes_a_function_ignores_are_summed_out_first():
    """A law or expectation over the outcome grid is the same whether or not the
    outcomes the function ignores are summed out before the contraction (and a
    law of total mass 0, an empty I-queue system's listed server, stays 0)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(3)
    shapes = [(5, 1, 1), (1, 4, 1), (1, 1, 6)]
    with jax.enable_x64(True):
        for zero_mass in (False, True):
            laws = [rng.random(s) for s in shapes]
            if zero_mass:
                laws[2] = np.zeros(shapes[2])
            a = np.arange(5).reshape(5, 1, 1)
            b = np.arange(4).reshape(1, 4, 1)
            keys = np.where(b == 0, a, 0)  # ignores the third outcome
            full = np.broadcast_to(laws[0] * laws[1] * laws[2], (5, 4, 6))
            want = np.bincount(np.broadcast_to(keys, (5, 4, 6)).ravel(), full.ravel(), 5)
            jl = tuple(jnp.asarray(x) for x in laws)
            marginal = meanfield._marginal(jl, jnp.asarray(keys))
            assert [m.shape for m in marginal] == [(5, 1, 1), (1, 4, 1), (1, 1, 1)]
            np.testing.assert_allclose(meanfield._law_of(jl, keys, 5), want, rtol=1e-13, atol=0)
            values = (a + 1.0) * (b == 1)  # ignores the third outcome too
            np.testing.assert_allclose(meanfield._expect(jl, values),
                                       (full * values).sum(), rtol=1e-13)  # fmt: skip
