"""The mean field under a rate profile with a service law or server pools
(jaxqueue.theory.profiles.periodic by class: the ODE of jaxqueue.theory.generic.phases).

Checked against exact references (Random makes each server an M_t/PH/1
queue, and with pools each pool's server an M_t/M/1 queue at its speed,
whose periodic regimes tests/chains.py computes by uniformization), against
the identical-server orbit (pools that are all alike), against the
constant-load fixed point (a flat profile), and against the simulator at
large N over the same measured window.
"""

import numpy as np
import pytest
from agreement import assert_near_mean_field
from chains import profile_mph1_reference

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.core.arrivals import Profile
from jaxqueue.core.config import Bounds
from jaxqueue.core.service import parse_service
from jaxqueue.results.response import ph_response_quantiles
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.profiles import periodic

#: Five segments, peak 0.96 at load 0.6 (as tests/theory/test_periodic.py).
FIVE = Profile((0.0, 2.0, 5.0, 7.0, 12.0, 20.0), (0.4, 1.6, 0.8, 1.4, 0.6, None))
#: A flat profile of the same period: the constant-load fixed point.
FLAT = Profile((0.0, 8.0, 20.0), (1.0, 1.0, None))
#: Half the period at 0.6 and half at 1.4 of the mean (peak 1.12 at load 0.8).
DAY = Profile((0.0, 5.0, 10.0), (0.6, 1.4, None), label="two-level")


@pytest.mark.slow
def test_random_with_a_service_law_is_the_periodic_mph1_queue():
    """Random with Erlang-2 service: each server an M_t/E_2/1 queue. The mean
    queue length, the law of the queue an arrival finds, the mean response
    time (Little over the period, against the arrivals' own) and the
    response-time quantiles of the arrivals' joint law of (queue, phase)."""
    law = parse_service("erlang:2")
    occ, seen = profile_mph1_reference(FIVE, 0.6, law.alpha, law.matrix, k=60)
    mf = theory.mean_field("random", 0.6, arrivals=FIVE, service="erlang:2")
    n = np.arange(occ.shape[0])
    assert mf.mean_queue_length == pytest.approx(occ.sum(axis=1) @ n, abs=1e-8)
    level = seen.sum(axis=1)
    k = min(level.size, mf.arrival_seen.size)
    np.testing.assert_allclose(mf.arrival_seen[:k], level[:k], atol=1e-8)
    assert mf.waiting_probability == pytest.approx(1.0 - level[0], abs=1e-8)
    # an arrival that finds n >= 1 tasks, the one in service in phase p: the rest
    # of that service ((-S)^-1 1)_p and n more services
    rest = np.linalg.solve(-np.asarray(law.matrix), np.ones(law.n_phases))
    per_arrival = level[0] * law.mean + float(
        np.sum(seen[1:] * (rest[None, :] + n[1:, None] * law.mean))
    )
    assert mf.mean_response_time == pytest.approx(per_arrival, abs=1e-8)
    # over whole periods Little's law holds for the orbit: E[Q] / lambda
    assert mf.mean_response_time == pytest.approx(mf.mean_queue_length / 0.6, abs=1e-8)
    qs = sorted(mf.response_quantiles)
    for q, value in zip(qs, ph_response_quantiles(law, level, seen[1:], qs)):
        assert mf.response_quantiles[q] == pytest.approx(value, abs=1e-7), q
    assert mf.diagnostics["tail_remainder"] < periodic.REMAINDER
    assert mf.settings["service"] == law.to_dict()
    assert mf.settings["arrivals"]["kind"] == "profile"


@pytest.mark.slow
def test_random_with_pools_is_each_pools_periodic_queue():
    """Random with a quarter of the servers twice as fast: each pool's servers
    are M_t/M/1 queues at their speed, each sent lambda(t). Every pool metric
    and the totals against the two references."""
    pools = ((0.25, 2.0), (0.75, 1.0))
    mf = theory.mean_field("random", 0.6, arrivals=FIVE, pools="0.25:2,0.75:1")
    refs = [profile_mph1_reference(FIVE, 0.6, [1.0], [[-v]], k=60) for _, v in pools]
    mean_queue, busy, waits, times, occupancy = [], [], [], [], []
    for (_, v), (occ, seen) in zip(pools, refs):
        n = np.arange(occ.shape[0])
        law = occ[:, 0]
        mean_queue.append(law @ n)
        busy.append(1.0 - law[0])
        waits.append(1.0 - seen[0, 0])
        times.append(float(seen[:, 0] @ (n + 1.0)) / v)
        occupancy.append(law)
    np.testing.assert_allclose(mf.pool_arrival_share, [0.25, 0.75], atol=1e-9)
    np.testing.assert_allclose(mf.pool_mean_queue_length, mean_queue, atol=1e-8)
    np.testing.assert_allclose(mf.pool_utilization, busy, atol=1e-8)
    np.testing.assert_allclose(mf.pool_waiting_probability, waits, atol=1e-8)
    np.testing.assert_allclose(mf.pool_mean_response_time, times, atol=1e-8)
    for i, law in enumerate(occupancy):
        k = min(law.size, len(mf.pool_occupancy[i]))
        np.testing.assert_allclose(mf.pool_occupancy[i][:k], law[:k], atol=1e-8)
    assert mf.mean_queue_length == pytest.approx(
        0.25 * mean_queue[0] + 0.75 * mean_queue[1], abs=1e-8
    )
    assert mf.mean_response_time == pytest.approx(0.25 * times[0] + 0.75 * times[1], abs=1e-8)
    # each pool's busy fraction over the period, at the start of each RK4 step (at most
    # 0.02 long, ending on the segment boundaries): over a whole period the left rule's
    # first-order errors cancel, leaving O(step^2) (5e-7 here)
    curve = mf.diagnostics["orbit"]
    lengths = np.diff(np.append(curve["time"], FIVE.period))
    assert curve["pool_utilization"].shape == (lengths.size, 2)
    np.testing.assert_allclose(lengths @ curve["pool_utilization"] / FIVE.period, busy, atol=1e-5)
    assert np.ptp(curve["pool_utilization"][:, 1]) > 0.2  # (the slow pool's load swings)


@pytest.mark.slow
@pytest.mark.parametrize("name, ratio", [("pod", None), ("jiq", 5.0)])
def test_pools_all_alike_are_the_identical_servers_orbit(name, ratio):
    """Two pools of speed 1 are identical servers: the ODE by class gives the
    exponential orbit's averages (the I-queues, p0 and the quantiles too) and
    its curve over the period."""

    def orbit(**setting):  # on the same bounds
        found = periodic.periodic_orbit(
            Limit(name, ratio, arrivals=FIVE, **setting), 0.6, bounds=Bounds(16, ratio and 32)
        )
        return periodic.as_result(found, name, 0.6, ratio, FIVE)

    plain, alike = orbit(), orbit(pools="0.5:1,0.5:1")
    assert max(alike.diagnostics["tail_remainder"], alike.diagnostics["iqueue_remainder"]) < 1e-6
    for what in (
        "mean_response_time",
        "mean_queue_length",
        "waiting_probability",
        "p0",
        "probe_rate",
        "delete_rate",
        "join_rate",
    ):
        a, b = getattr(plain, what), getattr(alike, what)
        assert (a is None) == (b is None), what
        if a is not None:
            assert b == pytest.approx(a, abs=1e-9), what
    np.testing.assert_allclose(alike.tail, plain.tail, atol=1e-9)
    for q in plain.response_quantiles:
        assert alike.response_quantiles[q] == pytest.approx(plain.response_quantiles[q], abs=1e-8)
    np.testing.assert_allclose(alike.pool_utilization, [plain.tail[1]] * 2, atol=1e-9)
    for key, curve in plain.diagnostics["orbit"].items():
        np.testing.assert_allclose(alike.diagnostics["orbit"][key], curve, atol=1e-9, err_msg=key)
    if ratio is not None:
        np.testing.assert_allclose(alike.iqueue_distribution, plain.iqueue_distribution, atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, ratio, setting",
    [
        ("pod", None, {"service": "erlang:2"}),
        ("pod", None, {"pools": "0.2:2,0.8:1"}),
    ],
)
def test_a_flat_profile_is_the_constant_load_fixed_point(name, ratio, setting):
    """A profile at 1 throughout: the phase-type and pools fixed point, its
    quantiles and its pool metrics. (JIQ's I-queues by class are checked
    against the exponential orbit above.)"""
    orbit = theory.mean_field(name, 0.6, ratio, arrivals=FLAT, **setting)
    fixed = theory.mean_field(name, 0.6, ratio, **setting)
    for what in ("mean_response_time", "mean_queue_length", "waiting_probability", "p0"):
        a, b = getattr(fixed, what), getattr(orbit, what)
        if a is not None:
            assert b == pytest.approx(a, abs=1e-8), what
    for q in fixed.response_quantiles:
        assert orbit.response_quantiles[q] == pytest.approx(fixed.response_quantiles[q], abs=1e-7)
    if "pools" in setting:
        for what in (
            "pool_arrival_share",
            "pool_utilization",
            "pool_mean_response_time",
            "pool_waiting_probability",
        ):
            np.testing.assert_allclose(
                getattr(orbit, what), getattr(fixed, what), atol=1e-8, err_msg=what
            )
        assert orbit.settings["pools"] == fixed.settings["pools"]


def test_refusals_name_the_reason():
    """jsew with pools of other means (it routes by expected wait), a policy
    without the generic mean field, and a mean load past the capacity; the
    grid's test of the same. JSQ-like routing whose peak passes the capacity
    is covered (tests/theory/test_sliding.py)."""
    with pytest.raises(NotImplementedError, match="expected wait"):
        theory.mean_field("jsew", 0.8, arrivals=DAY, pools="0.2:2,0.8:1")
    assert "expected wait" in periodic.refusal(
        Limit("jsew", pools="0.2:2,0.8:1", arrivals=DAY), 0.8
    )
    assert periodic.refusal(Limit("jsew", service="erlang:2", arrivals=DAY), 0.8) is None
    for setting in ({"service": "erlang:2"}, {"pools": "0.2:2,0.8:1"}, {}):
        assert periodic.refusal(Limit("jsq", arrivals=DAY, **setting), 0.8) is None
    assert "tagged" in periodic.refusal(Limit("jiq-original", 10.0, arrivals=DAY), 0.8)
    with pytest.raises(ValueError, match="load=1.25"):
        theory.mean_field("pod", 1.25, arrivals=DAY, pools="0.2:2,0.8:1")


# -- the simulator at large N over its own measured window --------------------------------

N, LOAD = 5_000, 0.8
#: JIQ with Erlang-2 service and a fifth of the servers 1.5 times as fast: phases,
#: pools and I-queues at once. The capacity is 1.1, and the peak 1.12 passes it.
SETTING = {"service": "erlang:2", "pools": "0.2:1.5,0.8:1"}
#: T, P(wait), E[Q], p99, p0; utilization, share and T of both pools
FAMILY = 5 + 6


@pytest.mark.slow
def test_simulation_at_large_n_matches_over_its_window():
    """N = 5000, r = 5 at load 0.8 under DAY, 5.5 periods measured after 4 of
    warm-up from the constant-load mean field (the period map contracts by
    about 0.3 a period), the mean field averaged over the simulation's own
    window; the finite-N allowance is 10 / N of the value, as for the other
    large-N comparisons."""
    gamma = 3.0  # uniformization: the largest phase rate (Erlang-2 on the fast pool)
    per_time = N * (LOAD * DAY.peak + gamma)
    # levels given (the default's stress path, 28 levels, costs a by-class solve; an
    # overflow would fail the run)
    sim = jq.simulate(
        "jiq",
        LOAD,
        N,
        N // 5,
        arrivals=DAY,
        replicas=16,
        levels=32,
        steps=int(55 * per_time),
        warmup=int(40 * per_time),
        seed=43,
        interval="replicas",
        **SETTING,
    )
    s = sim.settings
    assert s["time_measured"] == pytest.approx(55.0, rel=0.02)
    mf = theory.mean_field(
        "jiq", LOAD, 5.0, arrivals=DAY, window=(s["time_warmup"], s["time_measured"]), **SETTING
    )
    checks = [
        (sim.mean_response_time, mf.mean_response_time, "T"),
        (sim.waiting_probability, mf.waiting_probability, "P(wait)"),
        (sim.mean_queue_length, mf.mean_queue_length, "E[Q]"),
        (sim.metric("p99"), mf.response_quantiles[0.99], "p99"),
        (sim.p0, mf.p0, "p0"),
    ]
    for what in ("pool_utilization", "pool_arrival_share", "pool_mean_response_time"):
        checks.append((getattr(sim, what), getattr(mf, what), what))
    # E[S] floor: the fast pool's mean service
    assert_near_mean_field(checks, FAMILY, N, load=LOAD, service=1 / 1.5)


GRID = """\
[grid]
policy = ["pod", "jsew"]
n_servers = [300]
load = [0.8]
pools = ["0.2:2,0.8:1"]
arrivals = ["day.csv"]
[run]
replicas = 8
time = 45
warmup_time = 20
seed = 3
theory = "mean-field"
"""


@pytest.mark.slow
def test_a_grid_gives_a_profile_point_with_a_service_law_its_mean_field(tmp_path):
    """A grid point with a profile and server pools gets the mean field by
    class over its own simulation's window; jsew's, which routes by the
    pools' speeds, gets none."""
    from types import SimpleNamespace

    from jaxqueue.studies.grids import grid
    from jaxqueue.studies.grids.spec import parse_spec

    (tmp_path / "day.csv").write_text("time,rate\n0,0.6\n5,1.4\n10,\n")
    spec = parse_spec(GRID, base=tmp_path)
    points = sorted(spec.points, key=lambda p: p.policy)
    assert [p.policy for p in points] == ["jsew", "pod"]
    fake = SimpleNamespace(settings={"time_warmup": 20.5, "time_measured": 45.25})
    jsew, pod = grid._theory(
        points, "mean-field", {}, [fake, fake], lambda text: spec.arrivals_file(text).source
    )
    assert jsew is None
    ref = theory.mean_field("pod", 0.8, arrivals=DAY, window=(20.5, 45.25), pools="0.2:2,0.8:1")
    assert pod.mean_response_time == pytest.approx(ref.mean_response_time, abs=1e-12)
    assert pod.settings["pools"] == ref.settings["pools"]
