"""Phase-type service in the simulator.

Statistical checks are two-sided Student-t tests for the replicas used
(:func:`jaxqueue.tolerance`), family-wise 0.001 (Bonferroni) over the
comparisons of this file, counted in :data:`FAMILY`. References: the M/PH/1
queue (Pollaczek-Khinchine mean, waiting probability ``rho``) for ``N = 1``,
and the exact CTMC with phases (:func:`jaxqueue.exact.solve_exact`) for small
systems; the exact solutions' truncated mass is below 1e-9, far below the
intervals.
"""

import jax
import numpy as np
import pytest
from agreement import WARMUP_VERDICT_FAILS, assert_near_mean_field

import jaxqueue as jq
from jaxqueue.core.service import (
    PhaseType,
    erlang,
    exponential,
    hyperexponential,
    mph1_mean_response_time,
)
from jaxqueue.exact import solve_exact
from jaxqueue.results.schema import POOL_METRICS
from jaxqueue.results.stats import tolerance
from jaxqueue.runs import planner
from jaxqueue.sim import runner

ONE = jax.devices()[:1]

# (policy, options, N, M, buffer, load, service) against the exact chain with phases
EXACT_CASES = [
    ("pod", {"d": 2}, 3, 1, 4, 0.7, "erlang:2"),
    ("jiq", {}, 3, 2, 4, 0.6, "erlang:3"),
    # half drift 0.0168 against its 99% half-width 0.011
    pytest.param(("jiq-pod", {"d": 2}, 4, 2, 3, 0.9, "hyperexp:4"), marks=WARMUP_VERDICT_FAILS),
    ("jiq-sq", {"d": 2}, 2, 2, None, 0.6, "erlang:2"),
]
# (policy, options, N, M, buffer, load, pools) against the exact chain with pools
POOL_CASES = [
    ("pod", {"d": 2}, 3, 1, 4, 1.0, "0.34:2,0.66:1"),
    ("jiq", {}, 4, 2, 3, 1.2, "0.5:2,0.5:1"),
]
EXACT_METRICS = (
    "mean_response_time",
    "waiting_probability",
    "mean_queue_length",
    "blocking_probability",
    "p0",
    "delete_rate",
    "tail s_1..s_3",
    "response quantiles p50..p99.9",
)
# comparisons: M/PH/1 (2 laws x 2 metrics, and M/E3/1's 4 quantiles), the exact
# cases (at most 6 + 3 + 4 each, and with pools the 5 pool metrics, the
# occupancy at k = 1, 2 and the 4 quantiles of 2 pools), the mean-field cases
# (s_1..s_3 and p0)
FAMILY = (
    4
    + 4
    + (len(EXACT_CASES) + len(POOL_CASES)) * (len(EXACT_METRICS) + 2 + 3)
    + len(POOL_CASES) * (len(POOL_METRICS) + 2 + 4) * 2
    + 2 * 4
)


def _close(est, value, what):
    value = np.asarray(value, np.float64)
    err = np.abs(np.asarray(est.mean) - value)
    tol = tolerance(est, FAMILY)
    assert np.all(err <= tol), f"{what}: simulated {est.mean} ± {tol}, exact {value}"
    assert np.all((np.asarray(est.ci95) > 0) | (err == 0)), what


def test_mph1_and_the_phase_counts():
    """N = 1, Erlang-3: the Pollaczek-Khinchine mean, P(wait) = rho and the
    response-time quantiles of the exact M/E3/1 chain; and the state's phase
    counts split each level's servers exactly."""
    law = erlang(3)
    p = planner.plan(
        "random", [0.6], 1, replicas=32, steps=2**17, warmup=4096, seed=5, service=law, devices=ONE
    )
    assert p.system.service == law and p.backend == "xla"
    r = runner.Run.start(p)
    r.advance()
    (res,) = r.results()
    _close(res.mean_response_time, mph1_mean_response_time(0.6, law), "M/E3/1 mean response")
    _close(res.waiting_probability, 0.6, "M/E3/1 waiting probability")
    exact = solve_exact("random", 0.6, 1, service=law)
    assert exact.truncated_mass < 1e-9
    _quantiles_close(res, exact, "M/E3/1")
    assert res.settings["service"]["label"] == "erlang:3"
    tail = np.asarray(r.core.tail)
    phases = np.asarray(r.core.classes)
    counts = tail - np.concatenate([tail[:, 1:], np.zeros_like(tail[:, :1])], axis=1)
    assert phases.shape == (32, p.system.levels + 1, 3)
    assert np.all(phases >= 0) and np.all(phases[:, 0, 1:] == 0)  # idle: the pool's first class
    np.testing.assert_array_equal(phases.sum(axis=2), counts)


@pytest.mark.slow
def test_mph1_hyperexponential():
    law = hyperexponential(4.0)
    res = jq.simulate(
        "random", 0.6, 1, service=law, replicas=32, steps=2**18, warmup=8192, seed=6, devices=ONE
    )
    _close(res.mean_response_time, mph1_mean_response_time(0.6, law), "M/H2/1 mean response")
    _close(res.waiting_probability, 0.6, "M/H2/1 waiting probability")


def _ids(case):
    name, opts, n, m, b, lam, law = case
    return f"{name}-N{n}-M{m}-b{b}-l{lam}-{law}"


@pytest.mark.slow
@pytest.mark.parametrize("case", EXACT_CASES, ids=_ids)
def test_against_the_exact_chain_with_phases(case):
    name, opts, n, m, b, lam, law = case
    _against_exact(name, opts, n, m, b, lam, {"service": law})


@pytest.mark.slow
@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0]}-N{c[2]}-M{c[3]}-l{c[5]}-{c[6]}")
def test_against_the_exact_chain_with_pools(case):
    name, opts, n, m, b, lam, pools = case
    _against_exact(name, opts, n, m, b, lam, {"pools": pools})


def _against_exact(name, opts, n, m, b, lam, law):
    sim = jq.simulate(
        name,
        lam,
        n,
        m,
        buffer=b,
        replicas=32,
        steps=2**18,
        warmup=8192,
        seed=7,
        iqueue_levels=n if m > 1 else None,
        devices=ONE,
        **law,
        **opts,
    )
    ex = solve_exact(name, lam, n, m, buffer=b, **law, **opts)
    assert ex.truncated_mass < 1e-9
    for metric in EXACT_METRICS[:-2]:
        exact = getattr(ex, metric)
        if exact is None:
            assert getattr(sim, metric) is None, metric
        elif metric == "blocking_probability" and b is None:
            assert sim.blocking_probability.mean == 0.0 and exact == 0.0
        elif metric == "delete_rate" and exact == 0.0:
            assert sim.delete_rate.mean == 0.0
        else:
            _close(getattr(sim, metric), exact, metric)
    s = sim.tail
    _close(jq.Estimate(np.asarray(s.mean)[1:4], np.asarray(s.ci95)[1:4], s.n), ex.tail[1:4], "tail")
    _quantiles_close(sim, ex, "response time")
    if "pools" in law:
        _pools_close(sim, ex)
    else:
        assert all(
            getattr(sim, name) is None
            for name in POOL_METRICS + ("pool_occupancy", "pool_response_quantiles")
        )


def _pools_close(sim, exact):
    """Each pool's metrics against the exact chain's: the arrivals' share,
    waiting probability, mean response time and response-time quantiles from
    where they found their servers; the utilization, mean queue length and
    the fractions of servers with 1 and 2 tasks from what the service
    candidates drew."""
    for name in POOL_METRICS:
        _close(getattr(sim, name), getattr(exact, name), name)
    assert list(sim.pool_response_quantiles) == list(exact.pool_response_quantiles)
    for q, est in sim.pool_response_quantiles.items():
        _close(est, exact.pool_response_quantiles[q], f"pool p{100 * q:g}")
    occ = sim.pool_occupancy
    _close(
        jq.Estimate(occ.mean[:, 1:3], occ.ci95[:, 1:3], occ.n),
        exact.pool_occupancy[:, 1:3],
        "pool_occupancy k = 1, 2",
    )
    np.testing.assert_allclose(sim.pool_arrival_share.mean.sum(), 1.0, rtol=1e-12)
    rows = sim.records()
    by_pool = [r for r in rows if r["metric"] == "pool_mean_response_time"]
    assert [r["k"] for r in by_pool] == [0, 1]  # a row per pool
    assert [r["mean"] for r in by_pool] == sim.pool_mean_response_time.mean.tolist()
    # the metrics with two indices name the pool in the metric
    p99 = next(r for r in rows if r["metric"] == "pool1_response_quantile" and r["k"] == 0.99)
    assert (p99["mean"], p99["ci95"]) == (
        sim.pool_response_quantiles[0.99].mean[1],
        sim.pool_response_quantiles[0.99].ci95[1],
    )
    occ = [r["mean"] for r in rows if r["metric"] == "pool0_occupancy"]
    assert occ == sim.pool_occupancy.mean[0].tolist()


def _quantiles_close(sim, exact, what):
    """Each simulated response-time quantile (one per replica, from where the
    arrivals found their servers) against the exact chain's."""
    assert list(sim.response_quantiles) == list(exact.response_quantiles)
    for q, est in sim.response_quantiles.items():
        _close(est, exact.response_quantiles[q], f"{what} p{100 * q:g}")


@pytest.mark.slow
def test_a_unit_exponential_law_is_the_exponential_engine():
    kw = dict(replicas=4, steps=2048, warmup=512, seed=3, devices=ONE)
    a = jq.simulate("pod", 0.8, 20, **kw)
    b = jq.simulate("pod", 0.8, 20, service="exp", **kw)
    c = jq.simulate("pod", 0.8, 20, service=exponential(), **kw)
    assert a.to_dict()["tail"] == b.to_dict()["tail"] == c.to_dict()["tail"]
    assert b.settings["service"] == "exp"


def test_bad_service_inputs_fail_before_compiling():
    with pytest.raises(ValueError, match="service="):
        planner.plan("pod", [0.5], 10, service="erlang:0")
    with pytest.raises(ValueError, match="service="):
        planner.plan("pod", [0.5], 10, service="weibull:2")
    with pytest.raises(ValueError, match="exchangeable"):
        planner.plan("jiq-original", [0.5], 10, 2, service="erlang:2")
    with pytest.raises(ValueError, match="capacity"):
        planner.plan("pod", [0.6], 10, service=erlang(2, mean=2.0))
    with pytest.raises(
        ValueError, match="init='mean-field'"
    ):  # jsew routes by speed: no mean field
        planner.plan("jsew", [0.6], 10, pools="0.5:2,0.5:1", init="mean-field")
    with pytest.raises(TypeError, match="service"):
        planner.plan("pod", [0.6], 10, service=3)
    with pytest.raises(ValueError, match="sub-generator"):
        PhaseType((1.0,), ((1.0,),))
    with pytest.warns(jq.BackendWarning, match="phase-type"):
        p = planner.plan("pod", [0.6], 10, service="erlang:2", backend="registers")
    assert p.backend == "xla"
    # a law of mean 2 at load 0.4 is stable (rho = 0.8) and takes twice the time per task
    p = planner.plan("pod", [0.4], 10, service=erlang(2, mean=2.0))
    assert p.system.capacity == pytest.approx(0.5) and p.system.service.mean == pytest.approx(2.0)


def test_pools_inputs():
    p = planner.plan("pod", [0.9], 10, pools="0.2:2,0.8:1")
    assert [(q.count, q.speed) for q in p.system.pools] == [(2, 2.0), (8, 1.0)]
    assert p.system.capacity == pytest.approx(1.2) and p.system.service_rate == 2.0
    with pytest.raises(ValueError, match="capacity"):
        planner.plan("pod", [0.7], 10, pools=[(0.5, 1.0), (0.5, 0.2)])
    with pytest.raises(ValueError, match="FRACTION:SPEED"):
        planner.plan("pod", [0.5], 10, pools="0.2,0.8")
    with pytest.raises(ValueError, match="sum to 1"):
        planner.plan("pod", [0.5], 10, pools=[(0.2, 2.0), (0.7, 1.0)])
    with pytest.raises(ValueError, match="without servers"):
        planner.plan("pod", [0.5], 10, pools=[(0.01, 2.0), (0.99, 1.0)])
    with pytest.raises(ValueError, match="speed"):
        planner.plan("pod", [0.5], 10, pools=[(0.5, 0.0), (0.5, 1.0)])
    with pytest.raises(ValueError, match="exchangeable"):
        planner.plan("jiq-threshold", [0.5], 10, 2, pools="0.5:2,0.5:1")


# (policy, options, M, service, levels) against the phase-type mean field at
# N = 10^4, after 5 time units of warm-up from the mean field's state. The
# start splits each level over the phases by the mean field's joint law (and,
# for JIQ, sets the I-queue sizes): measured with 32 replicas over the first 5
# time units with no warm-up, s_1..s_3 were within 0.44 half-widths of the mean
# field for both cases (Pod(2) with hyperexp:4 was 18 to 20 half-widths off
# when the phases were split by the in-service mix).
MF_CASES = [  # half drifts 0.029 (99% half-width 0.023) and 0.0077 (0.0071)
    pytest.param(("pod", {"d": 2}, 1, "hyperexp:4", None), marks=WARMUP_VERDICT_FAILS),
    pytest.param(("jiq", {}, 1000, "erlang:2", 32), marks=WARMUP_VERDICT_FAILS),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", MF_CASES, ids=lambda c: f"{c[0]}-{c[3]}")
def test_against_the_phase_type_mean_field(case):
    """N = 10^4, lambda = 0.9 (r = 10 for JIQ), 40 time units after 5 of warm-up
    from the phase-type mean field's state (init "auto"). Finite-N
    allowance: the mean field is the N -> infinity limit, its error at N is
    O(1/N), allowed as the house 10 / N times ``min(p, 1 - p)`` on every
    fraction (tests/agreement.py). Measured gaps (allowances): Pod(2) s_1..s_3
    2.0e-4, 2.8e-4, 5e-6 (1.0e-4, 2.2e-4, 3.5e-4); JIQ 5.0e-4, 2.2e-3,
    1.8e-3 (1.0e-4, 3.4e-4, 1.2e-4) and p0 2.0e-3 (4.8e-4): none above
    0.34 of its tolerance."""
    from jaxqueue import theory

    name, opts, m, law, levels = case
    n, lam = 10_000, 0.9
    per = jq.steps_per_time_unit(n, lam, _rate(law))
    sim = jq.simulate(
        name,
        lam,
        n,
        m,
        service=law,
        replicas=8,
        steps=int(40 * per),
        warmup=int(5 * per),
        seed=9,
        levels=levels,
        **opts,
    )
    mf = theory.mean_field(name, lam, n / m if m > 1 else None, service=law, **opts)
    s = sim.tail
    est = jq.Estimate(np.asarray(s.mean)[1:4], np.asarray(s.ci95)[1:4], s.n)
    checks = [(est, mf.tail[1:4], "tail")] + ([(sim.p0, mf.p0, "p0")] if m > 1 else [])
    assert_near_mean_field(checks, FAMILY, n)


def _rate(law):
    from jaxqueue.core.service import parse_service

    return parse_service(law).rate


@pytest.mark.slow
def test_checkpoint_resume_with_classes(tmp_path):
    """A run with pools and a phase-type law saved part-way and resumed gives the
    uninterrupted run's result bit for bit (the class counts are in the checkpoint)."""
    kw = dict(
        service="hyperexp:4",
        pools="0.5:2,0.5:1",
        replicas=4,
        steps=8 * 256,
        warmup=512,
        seed=12,
        devices=ONE,
    )
    whole = jq.simulate("jiq", 0.8, 20, 4, **kw).to_dict()
    p = planner.plan("jiq", [0.8], 20, 4, **kw)
    r = runner.Run.start(p)
    r.advance(6)  # part-way: 6 of the 10 blocks (2 warm-up, 8 measured)
    path = str(tmp_path / "run.npz")
    r.save(path)
    resumed = runner.Run.resume(p, path)
    resumed.advance()
    (res,) = resumed.results()
    out = res.to_dict()
    for key in (
        "tail",
        "mean_response_time",
        "p0",
        "arrival_seen",
        "response_quantiles",
        "pool_utilization",
        "pool_mean_response_time",
        "pool_occupancy",
        "pool_response_quantiles",
    ):
        assert out[key] == whole[key], key
    assert set(out["response_quantiles"]) == {"0.5", "0.9", "0.99", "0.999"}
    assert len(out["pool_occupancy"]["mean"]) == 2
    # a checkpoint without the (level, class) counts of service candidates (an
    # earlier version's) is refused with advice, not resumed into a result without them
    with np.load(path) as data:
        old = {k: data[k] for k in data.files if not k.endswith("/sampled_class")}
    np.savez(path, **old)
    with pytest.raises(runner.CheckpointMismatch, match="earlier jaxqueue"):
        runner.Run.resume(p, path)
