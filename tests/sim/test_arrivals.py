"""Time-varying and trace-driven arrivals: validation, and the simulator against exact answers.

References are computed here, independently of the simulator:

* an MMPP feeding JSQ on N = 2 servers: the stationary law of the joint
  chain (source state, sorted queue lengths), truncated far past any level
  the simulation reaches;
* a periodic rate profile feeding one server: the periodic regime of the
  time-inhomogeneous M/M/1 chain, by uniformization over each segment
  (time averages over a period, and the law an arrival finds, weighted by
  each segment's rate);
* a trace of evenly spaced arrivals on one server: the D/M/1 queue, whose
  waiting probability ``sigma`` solves ``sigma = exp(-(1 - sigma) / lambda)``,
  whose response time is exponential of rate ``1 - sigma`` and whose
  time-average queue satisfies ``P(Q >= k) = lambda sigma^(k - 1)``;
* flat sources (equal rates) against the exact solver's stationary answer.

Every statistical comparison uses the Bonferroni Student-t tolerance of
:func:`jaxqueue.results.stats.tolerance` over the family of the comparisons
in this module.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from chains import mmpp_jsq_reference, profile_mm1_reference

import jaxqueue as jq
from jaxqueue.core.arrivals import MMPP, Profile, Trace, as_arrivals, parse_arrivals
from jaxqueue.exact import solve_exact
from jaxqueue.results.stats import tolerance, within
from jaxqueue.runs import planner
from jaxqueue.sim import runner

FAMILY = 27 + 5  # statistical comparisons in this module

# -- validation -----------------------------------------------------------------------


def test_profile_scaling_and_errors():
    p = Profile((0.0, 2.0, 6.0), (3.0, 1.0, None))
    assert p.period == 6.0 and np.allclose(p.shape, [1.8, 0.6]) and p.peak == pytest.approx(1.8)
    q = Profile.from_function(lambda t: 1.0 + math.sin(t), 2 * math.pi, 64)
    assert abs(float(np.sum(q.shape * q.durations)) / q.period - 1.0) < 1e-12
    for times, rates, msg in [
        ((0.0, 1.0), (1.0,), "2 times but 1 rates"),
        ((1.0, 2.0), (1.0, None), "first time must be 0"),
        ((0.0, 2.0, 2.0), (1.0, 1.0, None), "times must increase"),
        ((0.0, 1.0), (-1.0, None), ">= 0 and not all 0"),
        ((0.0, 1.0, 2.0), (0.0, 0.0, None), "not all 0"),
    ]:
        with pytest.raises(ValueError, match=msg):
            Profile(times, rates)


def test_mmpp_and_trace_errors():
    m = MMPP(((-1.0, 1.0), (3.0, -3.0)), (2.0, 0.0))
    assert np.allclose(m.stationary, [0.75, 0.25]) and np.allclose(m.shape, [4 / 3, 0.0])
    assert m.extra_rate() == 3.0 and np.allclose(m.jump_table(), [[2 / 3, 1 / 3], [1.0, 0.0]])
    with pytest.raises(ValueError, match="rows must sum to 0"):
        MMPP(((-1.0, 0.5), (1.0, -1.0)), (1.0, 1.0))
    with pytest.raises(ValueError, match="off-diagonal"):
        MMPP(((1.0, -1.0), (1.0, -1.0)), (1.0, 1.0))
    with pytest.raises(ValueError, match="irreducible"):
        MMPP(((-1.0, 1.0, 0.0), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)), (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="must be 2 x 2"):
        MMPP(((-1.0, 1.0),), (1.0, 1.0))
    with pytest.raises(ValueError, match="must not decrease"):
        Trace(np.array([0.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match="service times must be > 0"):
        Trace(np.array([0.0, 1.0]), np.array([1.0, 0.0]))
    t = Trace(np.array([0.0, 1.0, 3.0]), np.array([2.0, 2.0, 2.0]))
    assert np.allclose(t.gaps, [1.0, 2 / 3, 4 / 3]) and t.natural_load(2) == pytest.approx(2 / 3)
    assert t == Trace(np.array([0.0, 1.0, 3.0]), np.array([2.0, 2.0, 2.0]))
    assert hash(t) == hash(Trace(np.array([0.0, 1.0, 3.0]), np.array([2.0, 2.0, 2.0])))


def test_files(tmp_path):
    prof = tmp_path / "day.csv"
    prof.write_text("time,rate\n0,1\n8,3\n24,\n")
    p = parse_arrivals(str(prof))
    assert isinstance(p, Profile) and p.label == "day" and p.period == 24.0
    trace = tmp_path / "tasks.csv"
    trace.write_text("timestamp,service,other\n0.5,1,x\n1.5,2,y\n4,3,z\n")
    t = as_arrivals(str(trace))
    assert isinstance(t, Trace) and t.arrivals == 3 and t.service is not None
    mm = tmp_path / "src.json"
    mm.write_text(json.dumps({"generator": [[-1, 1], [1, -1]], "rates": [1, 2]}))
    assert isinstance(parse_arrivals(str(mm)), MMPP)
    bad = tmp_path / "bad.csv"
    bad.write_text("when,rate\n0,1\n")
    with pytest.raises(ValueError, match="column 'time'"):
        parse_arrivals(str(bad))
    bad.write_text("time\n0\nx\n")
    with pytest.raises(ValueError, match="row 3 column 'time' is not a number"):
        parse_arrivals(str(bad))
    bad.write_text("time\n0\n2\n1\n")
    with pytest.raises(ValueError, match="must not decrease"):
        parse_arrivals(str(bad))
    with pytest.raises(ValueError, match="no such file"):
        parse_arrivals(str(tmp_path / "none.csv"))
    with pytest.raises(TypeError, match="arrivals must be"):
        as_arrivals(3)


def test_plan_checks_before_compiling(monkeypatch):
    def no_run(*args, **kwargs):
        raise AssertionError("validation must come before any compilation")

    monkeypatch.setattr(runner, "run_blocks", no_run)
    trace = Trace(np.arange(10.0))
    with pytest.raises(ValueError, match="identical exponential servers"):
        planner.plan("pod", [0.5], 4, arrivals=trace, service="erlang:2")
    short = Profile((0.0, 0.5, 1.0), (1.0, 2.0, None))
    with pytest.raises(ValueError, match="merge short segments"):
        planner.plan("jsq", [0.5], 1, arrivals=short)
    with pytest.raises(ValueError, match="load"):
        planner.plan("pod", [1.2], 4, arrivals=Profile((0.0, 10.0), (1.0, None)))
    with pytest.warns(jq.BackendWarning, match="clock"):
        p = planner.plan(
            "pod",
            [0.5, 0.7],
            4,
            backend="registers",
            arrivals=MMPP(((-1.0, 1.0), (1.0, -1.0)), (0.5, 1.5)),
        )
    assert p.backend == "xla" and "clock" in p.backend_note
    assert p.fingerprint()["system"]["arrivals"]["kind"] == "mmpp"


# -- checks against the exact references of tests/chains.py ------------------------


def _check(est, value, what):
    tol = tolerance(est, FAMILY)
    assert abs(est.mean - value) <= tol, f"{what}: {est.mean:.5f} vs {value:.5f} (tol {tol:.5f})"


def _check_seen(res, seen, mean_queue):
    _check(res.mean_queue_length, mean_queue, "mean queue length")
    _check(res.waiting_probability, 1.0 - seen[0], "P(wait)")
    _check(res.mean_response_time, float(seen @ (np.arange(seen.size) + 1.0)), "mean response")


# -- the simulator against them -----------------------------------------------------------


@pytest.mark.slow  # (2.4 s)
def test_mmpp_jsq_against_joint_chain():
    """A slow two-state MMPP whose high state overloads the servers (peak 1.02)."""
    src = MMPP(((-0.5, 0.5), (0.5, -0.5)), (0.3, 1.7))
    res = jq.simulate("jsq", 0.6, 2, arrivals=src, replicas=32, steps=300_000, seed=11)
    mean_queue, seen = mmpp_jsq_reference(src, 0.6, 2)
    _check_seen(res, seen, mean_queue)
    assert res.settings["arrivals"]["kind"] == "mmpp"


@pytest.mark.slow
def test_profile_mm1_against_periodic_regime():
    """Five segments, two of them shorter than the longest gap a step can
    draw (a step passes up to 12 segment ends)."""
    src = Profile((0.0, 2.0, 5.0, 7.0, 12.0, 20.0), (0.4, 1.6, 0.8, 1.4, 0.6, None))
    res = jq.simulate("jsq", 0.6, 1, arrivals=src, replicas=32, steps=300_000, seed=12)
    mean_queue, seen = profile_mm1_reference(src, 0.6)
    _check_seen(res, seen, mean_queue)
    # each replica's measured time covers many periods
    assert res.settings["time_measured"] > 50 * src.period


@pytest.mark.slow
def test_pool_occupancy_under_a_profile_samples_only_real_service_candidates():
    """With pools, each pool's occupancy comes from the servers the service
    candidates draw; under a profile the candidates the source thins out (at
    rate peak - lambda(t), more often when the load is low) must not count,
    or the sample leans to the quiet hours (counting them put the idle
    fraction 0.036 too high here, nine times this tolerance). The pools'
    occupancies, weighted by their shares of the servers, must give the
    occupancy the time sums measure. The two come from one run and differ by
    the sampling alone, so the sampled estimate's tolerance (summed over the
    pools) bounds the difference."""
    src = Profile.from_function(lambda t: 1 + 0.8 * np.sin(2 * np.pi * t / 20), 20.0, 8)
    res = jq.simulate(
        "pod",
        0.8,
        20,
        pools="0.5:2,0.5:1",
        arrivals=src,
        replicas=32,
        steps=2**17,
        seed=3,
        interval="replicas",
    )
    shares = np.array([0.5, 0.5])
    drawn = shares @ res.pool_occupancy.mean
    tol = shares @ tolerance(res.pool_occupancy, FAMILY)
    for k in range(4):
        assert abs(drawn[k] - res.occupancy.mean[k]) <= tol[k], (k, drawn[k], res.occupancy.mean[k])


@pytest.mark.slow  # (2.5 s)
def test_trace_dm1():
    """Evenly spaced trace arrivals on one server: the D/M/1 queue."""
    load = 0.8
    sigma = 0.5
    for _ in range(200):
        sigma = math.exp(-(1.0 - sigma) / load)
    res = jq.simulate(
        "jsq", load, 1, arrivals=Trace(np.arange(1000.0)), replicas=32, steps=200_000, seed=13
    )
    _check(res.waiting_probability, sigma, "P(wait)")
    _check(res.mean_response_time, 1.0 / (1.0 - sigma), "mean response")
    for q, est in res.response_quantiles.items():  # exponential of rate 1 - sigma
        _check(est, -math.log(1.0 - q) / (1.0 - sigma), f"response quantile {q}")
    # time averages, from the states the service events find: P(Q >= k) = lambda sigma^(k-1)
    _check(res.mean_queue_length, load / (1.0 - sigma), "mean queue length")
    tail = res.tail
    for k in (1, 2, 3):
        est = type(tail)(float(tail.mean[k]), float(tail.ci95[k]), tail.n)
        _check(est, load * sigma ** (k - 1), f"time-average tail s_{k}")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["profile-erlang", "mmpp-jiq-threshold"])
def test_flat_sources_match_exact(case):
    """Equal rates make the sources Poisson: the exact stationary answers
    hold, through the phase-type class words and the per-server step."""
    if case == "profile-erlang":
        kw = dict(policy="pod", n=3, m=1, service="erlang:2", buffer=6)
        src = Profile((0.0, 1.0, 3.0, 4.0), (2.0, 2.0, 2.0, None))
    else:
        kw = dict(policy="jiq-threshold", n=3, m=2, service=None, buffer=6)
        src = MMPP(((-2.0, 2.0), (1.0, -1.0)), (1.0, 1.0))
    ex = solve_exact(
        kw["policy"], 0.8, kw["n"], kw["m"], buffer=kw["buffer"], service=kw["service"]
    )
    res = jq.simulate(
        kw["policy"],
        0.8,
        kw["n"],
        kw["m"],
        buffer=kw["buffer"],
        service=kw["service"],
        arrivals=src,
        replicas=32,
        steps=200_000,
        seed=14,
    )
    _check(res.mean_queue_length, ex.mean_queue_length, "mean queue length")
    _check(res.mean_response_time, ex.mean_response_time, "mean response")
    _check(res.blocking_probability, ex.blocking_probability, "blocking")


@pytest.mark.slow
def test_checkpoint_resume_with_clock(tmp_path):
    src = Profile((0.0, 3.0, 8.0), (0.5, 1.5, None))
    kw = dict(replicas=4, steps=20_000, warmup=2_560, seed=5, arrivals=src, init="empty")
    whole = jq.simulate("pod", 0.7, 4, **kw)
    p = planner.plan("pod", [0.7], 4, **kw)
    r = runner.Run.start(p)
    r.advance(30)
    path = str(tmp_path / "ck.npz")
    r.save(path)
    resumed = runner.Run.resume(p, path).advance().results()[0]
    assert resumed.mean_response_time == whole.mean_response_time
    assert np.array_equal(resumed.tail.mean, whole.tail.mean)


@pytest.mark.slow
def test_cli_arrivals_json(tmp_path):
    prof = tmp_path / "step.csv"
    prof.write_text("time,rate\n0,1\n5,2\n10,\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxqueue",
            "simulate",
            "--policy",
            "pod",
            "--load",
            "0.6",
            "--servers",
            "4",
            "--replicas",
            "4",
            "--steps",
            "5000",
            "--arrivals",
            str(prof),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout)
    assert data["settings"]["arrivals"]["kind"] == "profile"
    assert data["settings"]["arrivals"]["peak"] == pytest.approx(4 / 3)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["jiq", "jiq-threshold"])
def test_trace_time_averages_are_consistent(policy):
    """A bursty trace under I-queue policies (the I-queue sums by changes,
    per-server lists for JIQ-Threshold): every idle server of JIQ is listed
    once, so the time-average idle fraction equals the listed fraction state
    by state; and Little's law ties the time-average queue length to the
    response time arrivals see (tolerance: both intervals, as both come from
    the same replicas)."""
    rng = np.random.default_rng(3)
    gaps = rng.exponential(1.0, 4000) * np.where(rng.random(4000) < 0.2, 3.0, 0.5)
    n, m, load = 6, 2, 0.7
    res = jq.simulate(
        policy, load, n, m, arrivals=Trace(np.cumsum(gaps)), replicas=16, steps=100_000, seed=15
    )
    little = res.mean_response_time.mean * load  # infinite buffers: nothing blocked
    tol = (
        tolerance(res.mean_queue_length, FAMILY) + tolerance(res.mean_response_time, FAMILY) * load
    )
    assert abs(res.mean_queue_length.mean - little) <= tol
    if policy == "jiq":
        sizes = np.arange(res.iqueue_distribution.mean.size)
        listed = m / n * float(res.iqueue_distribution.mean @ sizes)
        assert abs((1.0 - res.tail.mean[1]) - listed) < 1e-9
    assert 0.0 < res.p0.mean < 1.0


@pytest.mark.slow
def test_one_dispatchers_iqueue_under_a_trace_is_the_busy_time():
    """JIQ with one server and one dispatcher under a bursty trace: the I-queue is
    empty exactly while the server is busy, so ``p0`` (the time-average fraction of
    an empty I-queue, sampled at the service candidates as the tail is) equals the
    busy fraction ``tail[1]`` state by state, to float rounding."""
    rng = np.random.default_rng(5)
    gaps = rng.exponential(1.0, 4000) * np.where(rng.random(4000) < 0.2, 3.0, 0.5)
    trace = Trace(np.cumsum(gaps))
    res = jq.simulate(
        "jiq", 0.7, 1, 1, arrivals=trace, replicas=4, steps=20_000, metrics={"busy": "s[1]"}
    )
    assert 0.3 < res.tail.mean[1] < 1.0
    assert abs(res.p0.mean - res.tail.mean[1]) < 1e-6
    # a user metric is sampled where the tail is: the busy fraction again
    assert abs(res.user_metrics["busy"].mean - res.tail.mean[1]) < 1e-6


@pytest.mark.slow
def test_message_rates_under_a_profile_are_per_unit_time():
    """Pod(2) under a square profile (load 0.9 for 5 time units, then 0.3 for 5), measured
    over about 200 periods: two probes per arrival, so twice the window's mean arrival
    rate per server, integrated here over the window the run reports (a step counted at
    the mean load's rate, not the peak's, gives 19% less)."""
    src = Profile((0.0, 5.0, 10.0), (1.5, 0.5, None))
    res = jq.simulate(
        "pod", 0.6, 10, d=2, arrivals=src, replicas=16, time=2000.0, warmup_time=10.0, seed=4
    )
    start = res.settings["time_warmup"]
    end = start + res.settings["time_measured"]

    def arrived(t):  # the integral of lambda(t) from 0 to t
        whole, part = divmod(t, 10.0)
        return whole * 6.0 + 0.9 * min(part, 5.0) + 0.3 * max(part - 5.0, 0.0)

    mean_rate = (arrived(end) - arrived(start)) / (end - start)
    assert abs(mean_rate - 0.6) < 0.01
    assert within(res.probe_rate, 2 * mean_rate, family=FAMILY), (res.probe_rate, mean_rate)


@pytest.mark.parametrize("last", [-2.0, float("nan"), float("inf")])
def test_a_profile_last_rate_that_is_no_rate_is_refused(last):
    """The last row's rate is ignored (it marks the end of the period), but a value
    there that is no rate is a mistake in the file: refused, not dropped in silence."""
    from jaxqueue.core.arrivals import Profile

    with pytest.raises(ValueError, match=r"the last row's rate .* is not a rate >= 0"):
        Profile((0.0, 1.0, 2.0), (1.0, 2.0, last))
    assert Profile((0.0, 1.0, 2.0), (1.0, 2.0, None)).rates[-1] is None
    assert Profile((0.0, 1.0, 2.0), (1.0, 2.0, 0.5)).rates[-1] is None
