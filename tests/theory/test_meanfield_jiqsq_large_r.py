"""JIQ-SQ(d) mean field at large ratios r = N / M (jaxqueue.theory.generic.meanfield).

Its fixed point has ``p0`` about ``d^-(r (1 - lambda))``, and the I-queue tails
drop from 1 to 0 about ``r (1 - lambda)`` levels up. Newton used to start from
an ODE run whose RK4 steps are unstable past r of about 30 (the I-queue
equations are r times faster) and then crawled one I-queue level per step:
16 steps at r = 100, 49 of the 50 allowed at r = 500 (3.5 min), none
converging past about 600 (``MAX_ITERATIONS`` with a residual of ``lambda r``
after 6 to 9 min). It now starts from the fixed point reduced to ``p0``.
"""

import math

import numpy as np
import pytest

from jaxqueue import theory
from jaxqueue.core.status import Status
from jaxqueue.policies import make
from jaxqueue.theory.generic import meanfield

LAM = 0.9


def _assert_fixed_point(fp, lam, r, buffer=None):
    s, q = fp.tail, fp.iq_tail
    assert fp.status is Status.CONVERGED and fp.residual < 1e-12
    for t in (s, q):
        assert t[0] == 1.0 and np.all(t >= 0.0) and np.all(np.diff(t) <= 0.0)  # monotone tails
    # the I-queues list exactly the idle servers
    assert abs(q[1:].sum() / r - (1.0 - s[1])) < 1e-12
    if buffer is None:
        assert abs(s[1] - lam) < 1e-12  # every arrival is served
    assert fp.truncated[1] < 1e-12  # the I-queue levels hold the whole profile


def _p0_of_tail(s, lam):
    """``p0`` from the servers' tail: ``s_2 - s_3 = lambda p0 (s_1 - s_2)`` (a random
    server takes the arrival with probability p0). ``1 - Q_1`` rounds to 0 in float64
    once ``p0`` is below about 1e-16; ``s_2``, near 0, keeps it."""
    return (s[2] - s[3]) / (lam * (s[1] - s[2]))


@pytest.mark.slow  # a compile of its own (about 3 s)
def test_converges_at_the_largest_ratio_the_memory_bound_admits():
    """r = 780 (0.9 GiB estimated): it ran 50 Newton steps (minutes) and did not
    converge; now the reduced start is already within tol (one evaluation)."""
    r = 780.0
    fp = meanfield.fixed_point("jiq-sq", LAM, r, d=2)
    _assert_fixed_point(fp, LAM, r)
    assert fp.iterations <= 3
    q = fp.iq_tail
    # the I-queues hold r (1 - lambda) = 78 servers each, balanced: Q_j drops at j = 78..79
    assert abs(int(np.sum(q > 0.5)) - r * (1 - LAM)) <= 2
    # below the drop 1 - Q_j doubles a level (d = 2), above it Q_j falls doubly exponentially
    growth = (1 - q[56:71]) / (1 - q[55:70])
    assert np.all((growth > 1.95) & (growth < 2.05)) and q[90] == 0.0
    p0 = _p0_of_tail(fp.tail, LAM)
    # 1 - Q_j grows about d-fold a level below the drop: p0 = 2^-(r (1 - lambda) + 1.33)
    assert 1.2 < -math.log2(p0) - r * (1 - LAM) < 1.5
    mf = meanfield.as_result(fp, "jiq-sq", LAM, r, with_quantiles=False)
    assert 0.0 <= mf.p0 < 1e-15 and abs(mf.mean_response_time - 1.0) < 1e-12


@pytest.mark.slow  # a compile of its own (about 3 s)
def test_same_fixed_point_where_it_converged_before():
    """r = 10 and 100: the values of the ODE-started Newton (6 and 16 steps) to 1e-12,
    now in at most 3, with p0 read from the servers' tail as well."""
    before = {  # (1 - Q_1, s_2, Q_2)
        10.0: (0.33745205609306783, 0.273336165435385, 0.28465840386585406),
        100.0: (0.0003888202512773997, 0.0003149444035346774, 0.9988339655225563),
    }
    for r, (p0, s2, q2) in before.items():
        fp = meanfield.fixed_point("jiq-sq", LAM, r, d=2)
        _assert_fixed_point(fp, LAM, r)
        assert fp.iterations <= 3
        assert abs((1 - fp.iq_tail[1]) - p0) < 1e-12
        assert abs(fp.tail[2] - s2) < 1e-12 and abs(fp.iq_tail[2] - q2) < 1e-12
        assert abs(_p0_of_tail(fp.tail, LAM) - p0) < 1e-12 * max(1.0, 1 / p0)


@pytest.mark.slow  # a compile of its own (about 3 s)
def test_p0_falls_d_fold_per_level_of_the_mean_iqueue():
    """Continuity in r: ten more servers per dispatcher at lambda = 0.9 is one more
    idle server per I-queue, and p0 falls by about d (r = 200 -> 300: 2^10)."""
    p0 = {}
    for r in (200.0, 300.0):
        fp = meanfield.fixed_point("jiq-sq", LAM, r, d=2)
        _assert_fixed_point(fp, LAM, r)
        p0[r] = 1 - fp.iq_tail[1]
        assert abs(_p0_of_tail(fp.tail, LAM) / p0[r] - 1) < 1e-3
    assert abs(math.log2(p0[200.0] / p0[300.0]) - 10.0) < 0.05


@pytest.mark.slow  # a compile of its own (about 3 s)
def test_jiq_sq_with_d_1_is_jiq_closed_form():
    """d = 1 joins a random I-queue: JIQ, whose closed form it matches. At r = 100
    (J = 410 levels) the ODE-started Newton took 12 steps and 100 s; now at most 4."""
    r = 100.0
    fp = meanfield.fixed_point("jiq-sq", LAM, r, d=1)
    _assert_fixed_point(fp, LAM, r)
    assert fp.iterations <= 4
    mf = theory.mean_field("jiq", LAM, r)
    assert abs((1 - fp.iq_tail[1]) - mf.p0) < 1e-10
    k = min(len(mf.tail), fp.tail.size)
    np.testing.assert_allclose(fp.tail[:k], mf.tail[:k], rtol=0, atol=1e-10)


@pytest.mark.slow  # a compile of its own (about 3 s)
def test_finite_buffers_and_ratios_below_one():
    """A buffer of 10 at r = 100 (14 steps before, 3 now; the same p0 as without
    one, no queue reaching 10), and r = 0.5 (more dispatchers than servers),
    where the empty start listed no idle server and Newton gave NON_FINITE."""
    fp = meanfield.fixed_point("jiq-sq", LAM, 100.0, d=2, buffer=10)
    _assert_fixed_point(fp, LAM, 100.0, buffer=10)
    assert fp.iterations <= 3 and abs((1 - fp.iq_tail[1]) - 0.0003888202512773997) < 1e-12
    fp = meanfield.fixed_point("jiq-sq", LAM, 0.5, d=2)
    _assert_fixed_point(fp, LAM, 0.5)
    assert 0.9 < 1 - fp.iq_tail[1] < 1.0


def test_reduced_start_past_float64_p0():
    """The start alone (NumPy, nothing compiled) at r = 3000, lambda = 0.5: p0 about
    2^-1500 underflows, the log-space sums still put the drop at r (1 - lambda)."""
    pol, r, lam = make("jiq-sq", d=2), 3000.0, 0.5
    J = meanfield.default_iqueue_levels(pol, r)
    system = meanfield.limit_system(pol, r, 40, J)
    x = meanfield.jiq_sq_start(pol, system, lam, r)
    s, q = np.r_[1.0, x[:40]], np.r_[1.0, x[40:]]
    assert np.all(np.diff(s) <= 0) and np.all(np.diff(q) <= 0) and np.all(x >= 0)
    assert abs(q[1:].sum() / r - (1 - s[1])) < 1e-12 and abs(s[1] - lam) < 1e-12
    assert abs(int(np.sum(q > 0.5)) - r * (1 - lam)) <= 2
    # not JIQ-SQ, or one dispatcher: no reduced start (the ODE run as before)
    assert (
        meanfield.jiq_sq_start(make("jiq"), meanfield.limit_system(make("jiq"), r, 40, J), lam, r)
        is None
    )
    one = meanfield.limit_system(make("jiq-sq", d=1), None, 40, 30)
    assert meanfield.jiq_sq_start(make("jiq-sq", d=1), one, lam, None) is None


@pytest.mark.slow
def test_past_the_memory_bound_when_raised(monkeypatch):
    """r = 1000 (1.6 GiB estimated; 1.9 GB peak, about 10 s on 2 cores): refused
    at the default bound, solved when it is raised (9 min and no convergence before)."""
    with pytest.raises(ValueError, match=r"ratio=1000 .* MAX_WORKING_BYTES"):
        meanfield.check_work("jiq-sq", 1000.0, d=2)
    monkeypatch.setattr(meanfield, "MAX_WORKING_BYTES", 2 * 2**30)
    fp = meanfield.fixed_point("jiq-sq", LAM, 1000.0, d=2)
    _assert_fixed_point(fp, LAM, 1000.0)
    assert fp.iterations <= 3
    assert 1.2 < -math.log2(_p0_of_tail(fp.tail, LAM)) - 100.0 < 1.5
