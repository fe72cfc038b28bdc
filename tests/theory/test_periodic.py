"""The mean field under a periodic rate profile (jaxqueue.theory.profiles.periodic).

Checked against an exact reference (Random is an M_t/M/1 queue per server,
whose periodic regime tests/chains.py computes by uniformization), against
the constant-load mean field (a flat profile), against the conservation laws
a periodic regime obeys, and against the simulator at large N over the same
measured window.
"""

import json
import logging

import numpy as np
import pytest
from agreement import assert_near_mean_field, finite_n_allowance
from chains import profile_mm1_reference

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.core.arrivals import MMPP, Profile
from jaxqueue.core.config import Bounds
from jaxqueue.core.status import Status
from jaxqueue.results.stats import tolerance
from jaxqueue.theory import LevelGrowth, Newton, Settle
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.profiles import periodic

#: Five segments, peak 0.96 at load 0.6 (the profile of tests/sim/test_arrivals.py).
FIVE = Profile((0.0, 2.0, 5.0, 7.0, 12.0, 20.0), (0.4, 1.6, 0.8, 1.4, 0.6, None))
#: Half the period at 0.6 and half at 1.4 of the mean: at load 0.8 the peak (1.12)
#: passes the capacity, so queues build up for 5 time units and drain after.
DAY = Profile((0.0, 5.0, 10.0), (0.6, 1.4, None), label="two-level")


@pytest.mark.slow
def test_random_is_the_periodic_mm1_queue():
    """Random sends each server a Poisson stream of rate lambda(t): the mean
    field is the forward equation of one M_t/M/1 queue, solved here by RK4
    and by the reference by uniformization of the truncated chain."""
    mean_queue, seen = profile_mm1_reference(FIVE, 0.6)
    mf = theory.mean_field("random", 0.6, arrivals=FIVE)
    k = min(seen.size, mf.arrival_seen.size)
    assert mf.mean_queue_length == pytest.approx(mean_queue, abs=1e-8)
    np.testing.assert_allclose(mf.arrival_seen[:k], seen[:k], atol=1e-8)
    assert mf.waiting_probability == pytest.approx(1.0 - seen[0], abs=1e-8)
    assert mf.mean_response_time == pytest.approx(
        float(seen @ (np.arange(seen.size) + 1.0)), abs=1e-8
    )
    assert mf.diagnostics["tail_remainder"] < periodic.REMAINDER  # the levels grew to hold the peak
    assert mf.settings["arrivals"]["kind"] == "profile" and mf.settings["window"] == [0.0, 20.0]


@pytest.mark.slow
def test_windows_of_whole_periods_and_halves_average_to_the_period():
    """Any whole number of periods gives the period's averages; two halves of
    a period average to the period's averages."""
    mf = theory.mean_field("random", 0.6, arrivals=FIVE)
    other = theory.mean_field("random", 0.6, arrivals=FIVE, window=(7.3, 60.0))
    assert other.mean_queue_length == pytest.approx(mf.mean_queue_length, abs=1e-9)
    halves = [
        theory.mean_field("random", 0.6, arrivals=FIVE, window=w)
        for w in ((3.0, 10.0), (13.0, 10.0))
    ]
    assert np.mean([h.mean_queue_length for h in halves]) == pytest.approx(
        mf.mean_queue_length, abs=1e-9
    )
    assert abs(halves[0].mean_queue_length - halves[1].mean_queue_length) > 0.1  # (not flat)


@pytest.mark.parametrize(
    "name, ratio", [("pod", None), pytest.param("jiq", 5.0, marks=pytest.mark.slow)]
)
def test_a_flat_profile_is_the_constant_load_mean_field(name, ratio):
    """Two segments of equal rate: the orbit is the fixed point (closed forms)."""
    flat = Profile((0.0, 1.3, 4.0), (2.0, 2.0, None))
    mf = theory.mean_field(name, 0.9, ratio, arrivals=flat)
    ref = theory.mean_field(name, 0.9, ratio)
    for metric in (
        "mean_response_time",
        "waiting_probability",
        "mean_queue_length",
        "join_rate",
        "probe_rate",
        "delete_rate",
    ):
        assert getattr(mf, metric) == pytest.approx(getattr(ref, metric), abs=1e-9), metric
    k = min(mf.tail.size, ref.tail.size)
    np.testing.assert_allclose(mf.tail[:k], ref.tail[:k], atol=1e-9)
    if ratio is not None:
        assert mf.p0 == pytest.approx(ref.p0, abs=1e-9)
    np.testing.assert_allclose(
        mf.diagnostics["orbit"]["mean_response_time"], ref.mean_response_time, atol=1e-9
    )


@pytest.mark.slow
def test_conservation_over_the_period():
    """Over a period of the regime tasks are conserved: accepted arrivals per
    unit time equal completions (the busy fraction, with unit service rate),
    Little's law ties the mean queue to the mean response time, and the
    I-queues list exactly the idle servers on average. The peak passes the
    capacity, so these hold through the clipped, saturated part of the orbit."""
    jiq = theory.mean_field("jiq", 0.8, 5.0, arrivals=DAY)
    assert jiq.tail[1] == pytest.approx(0.8, abs=1e-9)  # infinite buffers: all accepted
    assert jiq.mean_queue_length == pytest.approx(0.8 * jiq.mean_response_time, abs=1e-8)
    iq = jiq.iqueue_distribution
    assert float(iq @ np.arange(iq.size)) / 5.0 == pytest.approx(1.0 - jiq.tail[1], abs=1e-9)
    assert jiq.p0 == pytest.approx(iq[0], abs=1e-12)
    curve = jiq.diagnostics["orbit"]
    assert curve["p0"].max() > jiq.p0 + 0.1  # the peak drains the I-queues
    assert curve["mean_response_time"].max() > 2.0 * curve["mean_response_time"].min()
    # a finite buffer blocks at the peak: accepted arrivals are lambda (1 - P(block))
    pod = theory.mean_field("pod", 0.8, arrivals=DAY, buffer=2)
    assert pod.blocking_probability > 0.01
    assert pod.tail[1] == pytest.approx(0.8 * (1.0 - pod.blocking_probability), abs=1e-9)
    accepted = 0.8 * (1.0 - pod.blocking_probability)
    assert pod.mean_queue_length == pytest.approx(accepted * pod.mean_response_time, abs=1e-8)


@pytest.mark.slow
def test_the_period_map_keeps_the_iqueue_conservation_law():
    """The ODE keeps ``sum_j Q_j / r = 1 - s_1``, so the period map does not
    contract along it, and what leaks there (mass joining I-queues past a
    small given bound) used to add up period after period: at 8 I-queue
    levels the map iteration ended 401 periods later on an orbit whose
    I-queues listed 13% fewer servers than were idle (and at r = 10 on the
    daily profile it never met tol). Each period now ends on the law."""
    orbit = periodic.periodic_orbit(
        Limit("jiq", 5.0, arrivals=DAY), 0.8, bounds=Bounds(None, 8), solver=Newton(max_iter=0)
    )
    L = orbit.system.levels
    assert orbit.status == Status.CONVERGED and orbit.periods < 40
    assert orbit.start[L:].sum() / 5.0 == pytest.approx(1.0 - orbit.start[0], abs=1e-12)
    assert orbit.averages.truncated[1] > 1e-3  # the bound is leaky (reported, as given)


def test_errors_name_the_parameter():
    with pytest.raises(NotImplementedError, match="mmpp arrivals"):
        theory.mean_field("pod", 0.8, arrivals=MMPP(((-1.0, 1.0), (1.0, -1.0)), (0.5, 1.5)))
    with pytest.raises(NotImplementedError, match="jiq-threshold"):
        theory.mean_field("jiq-threshold", 0.8, 10.0, arrivals=DAY)
    with pytest.raises(ValueError, match="window= .*arrivals="):
        theory.mean_field("pod", 0.8, window=(0.0, 10.0))
    with pytest.raises(ValueError, match="window length"):
        theory.mean_field("pod", 0.8, arrivals=DAY, window=(0.0, 0.0))
    with pytest.raises(ValueError, match="window start"):
        theory.mean_field("pod", 0.8, arrivals=DAY, window=(-1.0, 5.0))
    with pytest.raises(ValueError, match="load=1.0"):
        theory.mean_field("pod", 1.0, arrivals=DAY)
    with pytest.raises(ValueError, match="Settle.dt=2.0 is out of range for a periodic regime"):
        periodic.periodic_orbit(Limit("pod", arrivals=DAY), 0.8, solver=Settle(dt=2.0))
    with pytest.raises(ValueError, match="a periodic regime takes Newton's tol and max_iter"):
        theory.mean_field("pod", 0.8, arrivals=DAY, solver=LevelGrowth(tol=1e-8))


@pytest.mark.slow  # the periodic regime over a window is checked fast through compare below
def test_command_line(tmp_path, capsys):
    from jaxqueue.cli import main

    csv = tmp_path / "day.csv"
    csv.write_text("time,rate\n0,0.6\n5,1.4\n10,\n")
    assert (
        main(
            [
                "theory",
                "--policy",
                "pod",
                "--load",
                "0.8",
                "--arrivals",
                str(csv),
                "--window",
                "3,20",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    ref = theory.mean_field("pod", 0.8, arrivals=DAY, window=(3.0, 20.0))
    assert out["mean_response_time"]["mean"] == pytest.approx(ref.mean_response_time, abs=1e-12)
    assert out["settings"]["arrivals"]["peak"] == pytest.approx(1.4)
    assert out["settings"]["window"] == [3.0, 20.0]
    assert len(out["diagnostics"]["orbit"]["time"]) == 500  # steps of 0.02 over the period
    assert main(["theory", "--policy", "pod", "--load", "0.8", "--arrivals", str(csv)]) == 0
    text = capsys.readouterr().out
    assert "arrivals: profile day, peak 1.4 x the mean load" in text
    assert "averages over t in [0, 10] of the periodic regime" in text
    # refused before any work
    assert main(["theory", "--policy", "pod", "--load", "0.8", "--window", "0,5"]) == 2
    assert "--arrivals" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["theory", "--policy", "pod", "--load", "0.8", "--window", "0"])
    assert "START,LENGTH" in capsys.readouterr().err


# -- the simulator at large N over its own measured window --------------------------------

N, LOAD = 10_000, 0.8
#: Pod(2) here; JIQ's periodic regime meets the simulator by class
#: (tests/theory/test_periodic_classes.py: JIQ with Erlang-2 service and pools at
#: N = 10^4 under DAY), and by class with pools all alike it is this orbit.
CASES = [("pod", None)]
TAIL = 3
FAMILY = len(CASES) * (3 + TAIL)  # T, P(wait), E[Q], s_1..s_3 per policy (and p0 for JIQ)


@pytest.mark.slow
@pytest.mark.parametrize("name, ratio", CASES)
def test_simulation_at_large_n_matches_over_its_window(name, ratio):
    """N = 10^4, load 0.8 under DAY (10.5 periods measured after 6 of warm-up:
    the mean field's period map contracts by 0.22 (Pod) and 0.34 (JIQ, r = 5)
    a period here, so after 6 the state moves by under 1e-4 a period and the
    bias it leaves in the window's average is about 1e-5). The mean field is
    averaged over the simulation's own window, so a partial period at its end
    is no bias; the finite-N allowance is that of docs/statistics.md, as for
    the other large-N comparisons (``10 / N`` of ``T - 1``, of ``min(p, 1 -
    p)`` for P(wait) and s_k, of ``E[Q] - lambda``)."""
    per_time = N * (LOAD * DAY.peak + 1.0)  # uniformization rate: steps per time unit
    sim = jq.simulate(
        name,
        LOAD,
        N,
        N if ratio is None else int(N / ratio),
        arrivals=DAY,
        replicas=16,
        steps=int(105 * per_time),
        warmup=int(60 * per_time),
        seed=41,
        interval="replicas",
    )
    s = sim.settings
    mf = theory.mean_field(
        name, LOAD, ratio, arrivals=DAY, window=(s["time_warmup"], s["time_measured"])
    )
    checks = [
        (sim.mean_response_time, mf.mean_response_time, "T"),
        (sim.waiting_probability, mf.waiting_probability, "P(wait)"),
        (sim.mean_queue_length, mf.mean_queue_length, "E[Q]"),
        (
            jq.Estimate(sim.tail.mean[1 : TAIL + 1], sim.tail.ci95[1 : TAIL + 1], sim.tail.n),
            mf.tail[1 : TAIL + 1],
            "s_1..s_3",
        ),
    ]
    if ratio is not None:
        checks.append((sim.p0, mf.p0, "p0"))
    assert_near_mean_field(checks, FAMILY, N, load=LOAD)


# -- grids: a profile point's theory is the mean field over its own window ------------------

GRID = """\
[grid]
policy = ["pod"]
n_servers = [300]
load = [0.6, 0.8]
arrivals = ["day.csv"]
[run]
replicas = 8
time = 45
warmup_time = 20
seed = 3
theory = "mean-field"
"""


@pytest.mark.slow  # a whole grid run; compare's windows are checked fast below
def test_a_grid_compares_a_profile_with_the_mean_field_over_its_window(tmp_path):
    from types import SimpleNamespace

    from jaxqueue.studies.grids import grid
    from jaxqueue.studies.grids.grid import run_grid
    from jaxqueue.studies.grids.spec import parse_spec
    from jaxqueue.studies.grids.store import Store

    (tmp_path / "day.csv").write_text("time,rate\n0,0.6\n5,1.4\n10,\n")
    spec = parse_spec(GRID, base=tmp_path)
    point = spec.points[1]
    # the plumbing: the window comes from the point's own simulation
    fake = SimpleNamespace(settings={"time_warmup": 20.5, "time_measured": 45.25})
    (th,) = grid._theory(
        [point], "mean-field", {}, [fake], lambda text: spec.arrivals_file(text).source
    )
    ref = theory.mean_field("pod", 0.8, arrivals=DAY, window=(20.5, 45.25))
    assert th.mean_response_time == pytest.approx(ref.mean_response_time, abs=1e-12)
    period = theory.mean_field("pod", 0.8, arrivals=DAY)
    assert abs(ref.mean_response_time - period.mean_response_time) > 1e-3  # the window matters
    # end to end: every point gets a theory value, within the simulation's tolerance
    store = tmp_path / "grid.sqlite"
    assert run_grid(spec, store) == 2
    with Store.open_existing(store) as s:
        rows = [r for r in s.rows() if r["metric"] == "mean_response_time"]
    assert len(rows) == 2 and all(r["theory"] is not None for r in rows)
    for r in rows:
        est = jq.Estimate(r["mean"], r["ci95"], r["replicas"])  # intervals across replicas
        tol = tolerance(est, 2, allowance=finite_n_allowance("T", r["theory"], 300))
        assert abs(r["mean"] - r["theory"]) <= tol, r


# -- compare: each row's theory is the mean field over that row's own window ----------------


def test_compare_gives_each_row_the_periodic_regime_over_its_window(monkeypatch, caplog):
    """The plumbing, without running a simulation: a profile reaches the runs,
    each row's theory is the periodic mean field over its own window, a policy
    without a mean field there says why (jsew with pools of other speeds), and
    an MMPP has no theory."""
    from types import SimpleNamespace

    from jaxqueue.studies import compare as cmp

    windows = {0.6: (22.5, 40.25), 0.8: (20.0, 36.5)}
    seen = []

    def fake_sweep(model, loads, run, **kw):  # the model and run options it was given, flat
        seen.append({**model.keywords(), **run.keywords()})
        return [
            SimpleNamespace(
                settings={
                    "load": lam,
                    "time_warmup": windows[lam][0],
                    "time_measured": windows[lam][1],
                }
            )
            for lam in loads
        ]

    monkeypatch.setattr(cmp, "simulate", fake_sweep)
    caplog.set_level(logging.INFO, logger="jaxqueue")  # what compare says, on the logger
    rows = cmp.compare(["pod"], 300, loads=(0.6, 0.8), arrivals=DAY)
    assert seen[0]["arrivals"] is DAY and seen[0]["init"] == "mean-field"
    for r in rows:
        ref = theory.mean_field("pod", r.load, arrivals=DAY, window=windows[r.load])
        assert r.mean_field.mean_response_time == pytest.approx(ref.mean_response_time, abs=1e-12)
        assert r.mean_field.settings["window"] == list(windows[r.load])
    assert "periodic mean field of pod(d=2) at load 0.8 over t in [20, 56.5]" in caplog.text
    rows = cmp.compare(["jsew"], 300, loads=(0.6, 0.8), arrivals=DAY, pools="0.2:2,0.8:1")
    assert [r.mean_field for r in rows] == [None, None] and seen[-1]["init"] == "empty"
    assert "no mean field for jsew here: " in caplog.text
    # an MMPP: simulated (from the mean field at the mean load), no theory beside it
    mmpp = MMPP(((-1.0, 1.0), (1.0, -1.0)), (0.5, 1.5))
    rows = cmp.compare(["pod"], 300, loads=(0.6,), arrivals=mmpp)
    assert seen[-1]["arrivals"] is mmpp and seen[-1]["init"] == "mean-field"
    assert rows[0].mean_field is None
    assert "no mean field for pod(d=2) under mmpp arrivals" in caplog.text


@pytest.mark.slow
def test_compare_command_line_with_a_profile(tmp_path, capsys):
    """End to end: the simulated T of each row within its tolerance of the
    periodic mean field over its window (two loads, family 2, the finite-N
    allowance of docs/statistics.md: ``10 / N`` of ``T - 1``), and the table
    names the arrivals. The tolerance is the run's own estimate's (its n from
    batch means)."""
    from jaxqueue.cli import main

    csv = tmp_path / "day.csv"
    csv.write_text("time,rate\n0,0.6\n5,1.4\n10,\n")
    args = [
        "compare",
        "--policies",
        "pod",
        "--servers",
        "300",
        "--loads",
        "0.6,0.8",
        "--time",
        "45",
        "--warmup-time",
        "20",
        "--replicas",
        "8",
        "--seed",
        "3",
        "--arrivals",
        str(csv),
    ]
    assert main(args + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["load"] for r in rows] == [0.6, 0.8]
    for r in rows:
        s = r["simulation"]["settings"]
        assert s["arrivals"]["label"] == "day" and r["mean_field"]["settings"]["window"] == [
            s["time_warmup"],
            s["time_measured"],
        ]
        sim, mf = (
            r["simulation"]["mean_response_time"],
            r["mean_field"]["mean_response_time"]["mean"],
        )
        # the run's own estimate: its n is that of its batch means (8 replicas x 20)
        assert sim["n"] == 160, sim
        assert abs(sim["mean"] - mf) <= tolerance(
            sim, 2, allowance=finite_n_allowance("T", mf, 300)
        ), r
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("N = 300, r = 10, profile arrivals day: mean response time")
