"""Default level bounds under an arrival source: the queues its stress path
builds in the mean field (jaxqueue.runs.bounds.source_levels)."""

import math

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.core.arrivals import MMPP, Profile, Trace
from jaxqueue.core.service import make_pools
from jaxqueue.runs import bounds, planner
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.profiles import periodic

#: A day of 240 time units whose peak, 1.35 at load 0.9, passes the capacity.
DAY = Profile.from_function(lambda t: 1 + 0.5 * np.sin(2 * np.pi * t / 240), 240.0, 24)


def test_a_constant_path_stays_at_the_fixed_point():
    """Random's servers are M/M/1 queues: the largest tail of a path at the start's
    own load is the fixed point's lambda^k, but for what the start leaves out (it
    is the fixed point on the first bound, 40 levels: a mass of 0.7^40 = 6.4e-7
    past it, which 30 time units only partly restore)."""
    tail = periodic.largest_tail(Limit("random"), 0.7, [(0.7, 30.0)])
    k = np.arange(tail.size)
    assert tail.size - 1 > 40 and tail[-1] <= periodic.REMAINDER
    assert np.max(np.abs(tail - 0.7**k)) < 0.7**40


@pytest.mark.slow
def test_a_longer_burst_builds_longer_queues():
    """JSQ fills one level after another while the load is above 1: after a burst
    at 1.5 for t units, more than 1 + 0.5 t levels are busy (mass above 1/2)."""
    for t in (3.0, 6.0):  # 30 and 60 RK4 steps: one compiled schedule of 64
        tail = periodic.largest_tail(Limit("jsq"), 0.9, [(1.5, t)])
        assert tail[int(1 + 0.5 * t)] > 0.5 > tail[int(3 + 0.5 * t)]


def test_stress_paths():
    path = bounds.stress_path(DAY, 0.9, 1000)
    assert len(path) == 48 and sum(b for _, b in path) == pytest.approx(480.0)
    assert max(a for a, _ in path) == pytest.approx(0.9 * DAY.peak)
    burst = MMPP(((-0.1, 0.1), (0.1, -0.1)), (0.5, 1.5))
    [(load, stay)] = bounds.stress_path(burst, 0.9, 1000)
    assert load == pytest.approx(1.35) and stay == pytest.approx(-math.log(1e-6) / 0.1)
    trace = Trace(np.cumsum(np.r_[np.full(500, 1.0), np.full(500, 0.25)]))
    path = bounds.stress_path(trace, 0.5, 100)
    assert sum(a * b * 100 for a, b in path) == pytest.approx(1000)  # every arrival, once
    assert max(a for a, _ in path) > 1.0  # the dense half runs at about 4/2.5 x 0.5 = 0.8..1.3


def test_where_the_mean_field_does_not_size_them():
    """Fewer than 100 servers, per-server policies and jsew with pools keep the
    bound at a raised load (planner.bound_load)."""
    assert bounds.source_levels(jq.make("pod"), 50, 1, 0.9, DAY) is None
    assert bounds.source_levels(jq.make("jiq-original"), 1000, 100, 0.9, DAY) is None
    assert (
        bounds.source_levels(
            jq.make("jsew"), 1000, 1, 0.9, DAY, pools=make_pools("0.2:2,0.8:1", 1000)
        )
        is None
    )


@pytest.mark.slow
def test_a_peak_past_the_capacity_fits_the_default_bound():
    """Pod(2) at N = 1000 under DAY: the default bound holds 300 time units
    (the peak's queues included), where the former bound at a load halfway to
    the capacity (16 levels) overflows."""
    kw = dict(arrivals=DAY, replicas=2, time=300, warmup_time=60, seed=1)
    plan = planner.plan("pod", [0.9], 1000, 1, **kw)
    tail = periodic.largest_tail(Limit("pod"), 0.9, bounds.stress_path(DAY, 0.9, 1000))
    need = int(np.nonzero(1000 * tail < 1e-6)[0][0])
    assert plan.system.levels >= need > 16
    res = jq.simulate("pod", 0.9, 1000, 1, **kw)  # raises on an overflow
    assert np.asarray(res.tail.mean)[plan.system.levels - 4 :].max() == 0.0
    with pytest.raises(jq.LevelOverflowError, match="levels=16"):
        jq.simulate("pod", 0.9, 1000, 1, levels=16, **kw)


def test_a_long_trace_keeps_the_window_before_its_backlog_peaks():
    """Of a trace longer than TRACE_WINDOW: the window that ends where the fluid
    backlog peaks, here the end of a burst at twice the mean rate."""
    gaps = np.full(20_000, 1.0)
    gaps[12_000:13_000] = 0.4  # a burst: 2.5 times the rate over 400 gap units
    path = bounds.stress_path(Trace(np.cumsum(gaps)), 0.5, 10)
    assert len(path) == int(bounds.TRACE_WINDOW / bounds.TRACE_BIN)
    rates = np.array([a for a, _ in path])
    assert rates[-1] > 1.0 and rates[-int(60 / bounds.TRACE_BIN)] > 1.0  # the burst's end
    # before it, the mean rate: load 0.5 over gaps of 1 / 0.97 mean gaps
    assert np.mean(rates[: len(rates) // 2]) == pytest.approx(0.5 * 0.97, rel=0.05)
