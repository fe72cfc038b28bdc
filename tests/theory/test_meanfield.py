"""The generic mean field (jaxqueue.theory.generic.meanfield), derived from the policies' own rules."""

import numpy as np
import pytest
from agreement import assert_near_mean_field

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.core.status import Status
from jaxqueue.policies import make
from jaxqueue.theory.generic import exponential, meanfield

slow = pytest.mark.slow


@pytest.mark.parametrize(
    "name, d, ratio, levels",
    [
        ("pod", 2, None, 40),
        ("pod", 3, None, 40),
        pytest.param("jiq", None, 10.0, 40, marks=slow),
        pytest.param("jiq-pod", 2, 10.0, 40, marks=slow),
        pytest.param("jiq", None, 2.0, 120, marks=slow),
        ("jsq", None, None, 40),
    ],
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
    family-wise 0.001 over 4 comparisons (jq.tolerance) plus the house finite-N
    allowance (tests/agreement.py): 10/N times ``min(p, 1 - p)``. Measured
    gaps: blocking 1.6e-4 (allowance 2.2e-4), s_1..s_3 2.0e-4, 2.3e-4, 2.3e-4
    (6.5e-5, 2.2e-4, 4.7e-4), none above 0.12 of its tolerance.
    """
    fp = meanfield.fixed_point("pod", 1.2, d=2, buffer=3)
    assert fp.status is Status.CONVERGED
    mf = meanfield.as_result(fp, make("pod", d=2), 1.2, None, buffer=3)
    n = 10_000
    res = jq.simulate(
        "pod",
        1.2,
        n,
        1,
        d=2,
        buffer=3,
        replicas=8,
        steps=40 * n * 22 // 10,
        warmup=10 * n * 22 // 10,
        init=mf.occupancy,
        seed=4,
        interval="replicas",
    )
    tail = jq.Estimate(res.tail.mean[1:4], res.tail.ci95[1:4], res.tail.n)
    checks = [(res.blocking_probability, mf.blocking_probability, "blocking_probability")]
    checks += [(tail, mf.tail[1:4], "tail")]
    assert_near_mean_field(checks, 4, n)  # a family of 4 comparisons, family-wise 0.001


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
    with pytest.raises(
        ValueError,
        match="buffer=10000 is too large for the mean field at "
        "load=1.2: at a load of 1 or more the queues fill it",
    ):
        theory.mean_field("pod", 1.2, buffer=10**4)
    with pytest.raises(
        ValueError,
        match="buffer=10000 is out of range for the mean field by class: .* 20000 coordinates",
    ):
        theory.mean_field("pod", 0.5, buffer=10**4, service="erlang:2")
    with pytest.warns(jq.StartWarning, match=r"starts pod\(d=2\) empty: .*buffer=10000"):
        p = jq.runs.planner.plan("pod", [1.2], 100, buffer=10**4, replicas=2, steps=512)
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
            marginal = exponential.marginal(jl, jnp.asarray(keys))
            assert [m.shape for m in marginal] == [(5, 1, 1), (1, 4, 1), (1, 1, 1)]
            np.testing.assert_allclose(exponential.law_of(jl, keys, 5), want, rtol=1e-13, atol=0)
            values = (a + 1.0) * (b == 1)  # ignores the third outcome too
            np.testing.assert_allclose(
                exponential.expect(jl, values), (full * values).sum(), rtol=1e-13
            )


def _no_solve(*args, **kwargs):
    raise AssertionError("a solve was started")


def test_jiq_sq_at_a_large_ratio_is_refused_before_compiling(monkeypatch):
    """JIQ-SQ(2) at r = 1e4: the outcome grid of an arrival (a server's queue length, the
    dispatcher's I-queue size, the I-queue a delete request hits) has (L + 1)(J + 1)^2
    entries, and XLA asked for 788 GB at once. Refused from an estimate, nothing compiled,
    with the parameters, the estimate, the bound and what to do instead."""
    monkeypatch.setattr(meanfield, "_solve_on", _no_solve)
    bound = f"{meanfield.MAX_WORKING_BYTES / 2**30:.1f}"
    with pytest.raises(
        ValueError,
        match=(
            r"^the mean field of jiq-sq\(d=2\) at ratio=10000 with levels=40 and "
            r"iqueue_levels=10030 would take about 148.3 GiB of working memory \(its outcome "
            r"grid has 4.13e\+09 entries; .* ratio\^2\), more than MAX_WORKING_BYTES = "
            rf"{bound} GiB; use a smaller ratio \(r = N / M\), simulate from init='empty'"
        ),
    ):
        theory.mean_field("jiq-sq", 0.9, 1e4, d=2)
    for call in (meanfield.fixed_point, meanfield.transient):
        with pytest.raises(ValueError, match="148.3 GiB"):
            call("jiq-sq", 0.9, 1e4, d=2)
    # the generic path of the closed-form policies too (r = 1000: J = 4 r + 10 = 4010)
    with pytest.raises(ValueError, match=r"jiq at ratio=1000 .*iqueue_levels=4010 .*23.7 GiB"):
        meanfield.fixed_point("jiq", 0.9, 1000.0)
    assert meanfield.check_work("jiq-sq", 100.0) < 32 * 2**20  # 26 MiB: J = 130
    # a queue-length bound past the dense Newton's memory: fewer levels, not a smaller ratio
    with pytest.raises(
        ValueError,
        match=r"pod\(d=2\) at ratio=None with levels=20000 .* "
        r"GiB; give fewer levels",
    ):
        meanfield.fixed_point("pod", 0.5, levels=20_000)


def test_jiq_sq_balanced_joins_need_few_iqueue_levels():
    """Idle servers joining the shortest of d >= 2 I-queues keep the sizes within a few
    of the r each holds at the empty start: r + 30 I-queue levels, not 4 r + 10 (the
    same fixed point to 1e-15 at r = 100, ten times faster)."""
    sq, jiq = make("jiq-sq", d=2), make("jiq")
    assert meanfield.default_iqueue_levels(sq, 100.0) == 130
    assert meanfield.default_iqueue_levels(make("jiq-sq", d=1), 100.0) == 410  # JIQ
    assert meanfield.default_iqueue_levels(jiq, 100.0) == 410
    assert meanfield.default_iqueue_levels(sq, 2.0) == 32
    assert meanfield.default_iqueue_levels(sq, float("inf")) == 30  # one dispatcher


def test_a_run_at_a_ratio_the_mean_field_refuses_starts_empty(monkeypatch):
    """N = 10000, M = 3: init='auto' asks the estimate (nothing is solved) and starts
    JIQ-SQ empty with a StartWarning; a closed form (JIQ) still starts at its mean field."""
    monkeypatch.setattr(meanfield, "_solve_on", _no_solve)
    with pytest.warns(
        jq.StartWarning,
        match=r"starts jiq-sq\(d=2\) empty: .*ratio=3333.33 .* "
        r"GiB .*init='empty'",
    ):
        p = jq.runs.planner.plan("jiq-sq", [0.9], 10_000, 3, replicas=2, steps=512)
    assert p.init == "empty"
    assert jq.runs.planner.plan("jiq", [0.9], 10_000, 3, replicas=2, steps=512).init == "mean-field"
    assert (
        jq.runs.planner.plan("jiq-sq", [0.9], 1000, 10, replicas=2, steps=512).init == "mean-field"
    )


def test_jiq_sq_with_one_dispatcher_is_refused_as_the_simulator_does():
    """ratio=None is one dispatcher; JIQ-SQ(d) probes d distinct I-queues, so d = 2 needs
    M >= 2: refused with the simulator's own words (it used to give T = 1, p0 = 0).
    JIQ-Pod(2) with one dispatcher is idle-first, and JIQ-SQ(1) is JIQ: both valid."""
    from jaxqueue.core.system import System

    with pytest.raises(ValueError) as sim:
        make("jiq-sq", d=2).validate(System(10, 1, None, 1, 0))
    for ratio in (None, float("inf")):
        with pytest.raises(
            ValueError,
            match=r"^jiq-sq\(d=2\) with ratio=(None|inf) is not "
            r"valid: ratio=None \(or inf\) is one dispatcher",
        ):
            theory.mean_field("jiq-sq", 0.9, ratio)
    with pytest.raises(ValueError) as mf:
        meanfield.fixed_point("jiq-sq", 0.9, None, d=3)
    assert "d=3 is out of range: it probes dispatchers" in str(mf.value)
    assert str(sim.value).replace("d=2", "d=3") in str(mf.value)
    with pytest.raises(ValueError, match=r"d=2 is out of range: it probes dispatchers"):
        theory.mean_field("jiq-sq", 0.9, None, service="erlang:2")
    meanfield.check_work("jiq-pod", None, d=2)
    meanfield.check_work("jiq-sq", None, d=1)
    meanfield.check_work("jiq-sq", float("inf"), d=1)  # (it used to overflow)
    meanfield.check_work("jiq-sq", 10.0, d=2)
