"""Sensitivities by common random numbers (jaxqueue.studies.crn.sensitivity, docs/crn.md).

The fast tests check the arguments and that the sides share their keys; the
slow ones compare simulated derivatives with the mean field's (by autodiff)
and the exact chain's, and count how often the paired interval covers the
exact difference. Two compiled shapes: Pod(2) at N = 1000 and at N = 3, four
sides of 16 replicas each.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from agreement import coverage_acceptance, coverage_bounds, coverage_runs

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.exact import solve_exact
from jaxqueue.results.stats import within
from jaxqueue.runs import planner
from jaxqueue.sim.placement import placement
from jaxqueue.studies.crn.sensitivity import plan_sides, sensitivity
from jaxqueue.studies.crn.sides import RELATIVE_STEP, default_step, load_at
from jaxqueue.theory.closed import closed_forms

#: The small system the exact chain solves (one compiled shape for its tests).
SMALL = dict(d=2, replicas=16, levels=24)
SMALL_LOAD = 0.7


def test_the_sides_share_their_keys_where_a_batch_of_loads_does_not():
    sides = plan_sides("pod", 0.9, 1000, d=2, replicas=4, steps=256, levels=16)
    keys = np.asarray(placement(sides.plans[0])[2]).reshape(4, 4, 2)
    assert all(np.array_equal(keys[0], keys[j]) for j in range(1, 4))
    # a batch of loads without a shared stream: replica i of each load has its own key
    p = planner.plan("pod", list(sides.plans[0].loads), 1000, d=2, replicas=4, steps=256, levels=16)
    other = np.asarray(placement(p)[2]).reshape(4, 4, 2)
    assert not np.array_equal(other[0], other[1])


def test_the_sides_and_the_default_step():
    sides = plan_sides("pod", 0.9, 1000, d=2, replicas=4, steps=256, levels=16)
    assert sides.h == pytest.approx(RELATIVE_STEP * 0.1)
    lo, hi, lo2, hi2 = sides.plans[0].loads
    assert lo < lo2 < 0.9 < hi2 < hi
    assert sides.values == sides.plans[0].loads  # the float32 loads run, as the parameter
    assert sides.plans[0].streams == (0, 0, 0, 0)
    only = plan_sides("pod", 0.9, 1000, d=2, h=0.01, richardson=False, replicas=4, steps=256)
    assert len(only.plans[0].loads) == 2 and only.h == 0.01
    # a finite buffer: a fraction of the load itself
    assert default_step("load", 1.2, 100, buffer=5) == pytest.approx(RELATIVE_STEP * 1.2)


def test_alpha_and_beta_move_the_load_by_the_same_fraction():
    n = 400
    for parameter, value in (("alpha", 0.6), ("beta", 1.5)):
        lam = load_at(parameter, value, n)
        h = default_step(parameter, value, n)
        moved = load_at(parameter, value - h, n) - lam
        assert abs(moved) == pytest.approx(RELATIVE_STEP * (1.0 - lam), rel=0.05)
        sides = plan_sides("pod", None, n, d=2, replicas=2, steps=256, **{parameter: value})
        assert sides.parameter == parameter
        assert sides.values[0] == pytest.approx(value - h, rel=1e-5)


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        (dict(load=0.9, alpha=0.5), TypeError, "one of load, alpha and beta"),
        (dict(), TypeError, "got none"),
        (dict(load=0.9, parameter="beta"), ValueError, "needs beta"),
        (dict(load=0.9, parameter="colour"), ValueError, "is not valid"),
        (dict(load=0.9, h=0.0), ValueError, "h=0.0"),
        (dict(load=0.9, warmup="auto"), ValueError, "warmup='auto'"),
        (dict(load=0.9, replica=4), TypeError, "did you mean 'replicas'"),
    ],
)
def test_arguments_are_checked_before_anything_runs(kwargs, error, text):
    with pytest.raises(error, match=text):
        plan_sides("pod", n_servers=1000, d=2, **kwargs)


def test_the_public_name():
    assert jq.sensitivity is sensitivity


@pytest.mark.slow
def test_pod_at_n_1000_against_the_mean_field_derivative():
    """Pod(2), N = 1000, lambda = 0.9: dT/dlambda by autodiff through the closed
    form, and dP(wait)/dlambda = d lambda^(d-1) (P(wait) = lambda^d), each with
    the finite-N allowance 10 / N times the value (docs/statistics.md: a
    derivative is "anything else"); the probe rate is d lambda at every N, so
    its derivative d has no allowance. Measured: 10.10 +- 0.51 beside 10.415."""
    s = sensitivity("pod", 0.9, 1000, d=2, replicas=16, steps=102_400, seed=0)
    slope = float(jax.grad(lambda x: closed_forms.mean_response_time("pod", x, d=2))(0.9))
    assert slope == pytest.approx(10.4151, abs=1e-3)
    refs = {"mean_response_time": slope, "waiting_probability": 2 * 0.9, "probe_rate": 2.0}
    for name, ref in refs.items():
        allowance = 0.0 if name == "probe_rate" else 10 / 1000 * ref
        assert within(s[name], ref, family=len(refs), allowance=allowance), (name, s[name], ref)
    assert s.settings["interval"] == "replicas" and s[name].n == 16


def _exact_difference(lo: float, hi: float) -> float:
    """The exact chain's ``(T(hi) - T(lo)) / (hi - lo)`` at N = 3."""
    t = [solve_exact("pod", x, 3, d=2).mean_response_time for x in (lo, hi)]
    return (t[1] - t[0]) / (hi - lo)


@pytest.mark.slow
def test_pod_at_n_3_against_the_exact_chain():
    """The simulated central differences at h and h / 2 against the exact
    chain's at the same (float32) loads, and the extrapolated value against the
    exact derivative (a difference over 2e-5): family 3, no allowance."""
    s = sensitivity("pod", SMALL_LOAD, 3, steps=102_400, seed=1, **SMALL)
    lo, hi, lo2, hi2 = s.values
    refs = {
        "derivatives": _exact_difference(lo, hi),
        "half_step": _exact_difference(lo2, hi2),
        "extrapolated": _exact_difference(SMALL_LOAD - 1e-5, SMALL_LOAD + 1e-5),
    }
    for part, ref in refs.items():
        est = getattr(s, part)["mean_response_time"]
        assert within(est, ref, family=len(refs)), (part, est, ref)
    assert "mean_response_time" not in s.curved


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::jaxqueue.studies.crn.sensitivity.CurvatureWarning")
def test_the_paired_interval_covers_the_exact_difference():
    """Short runs (seeds from 100) at N = 3: the 95% interval of D(h) covers
    the exact chain's difference at the same loads in about 95% of them. The
    count is Binomial(runs, 0.95) if the interval is right; the test is
    two-sided at 0.001 (0.0005 each side): too few covering runs (an interval
    too narrow) and too many (one too wide: twice the width covers 99.93% with
    15 degrees of freedom) both fail. The runs are the fewest that also pass
    an interval of 85% coverage with probability at most 0.001: 347, accepting
    315 to 341 (measured 326; 40 runs, one-sided, passed an 85% interval 86%
    of the time and could not fail a wide one)."""
    runs = coverage_runs(0.95, 0.85, 1e-3)
    lower, upper = coverage_bounds(runs, 0.95, 1e-3)
    assert (runs, lower, upper) == (347, 315, 341)
    assert coverage_acceptance(runs, 0.95, 1e-3, 0.9993) < 1e-6
    covered, reference = 0, None
    for seed in range(100, 100 + runs):
        s = sensitivity("pod", SMALL_LOAD, 3, steps=12_800, seed=seed, **SMALL)
        if reference is None:
            reference = _exact_difference(*s.values[:2])
        est = s["mean_response_time"]
        covered += abs(est.mean - reference) <= est.ci95
    assert lower <= covered <= upper, (covered, lower, upper)


@pytest.mark.slow
def test_the_command_line_prints_the_derivatives(capsys):
    args = ["simulate", "--policy", "pod", "--d", "2", "--servers", "3", "--load", "0.7"]
    args += ["--replicas", "16", "--levels", "24", "--steps", "12800", "--seed", "100"]
    assert cli_main(args + ["--sensitivity", "load", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameter"] == "load" and data["h"] == pytest.approx(RELATIVE_STEP * 0.3)
    s = sensitivity("pod", SMALL_LOAD, 3, steps=12_800, seed=100, **SMALL)
    assert data["derivatives"]["mean_response_time"] == s["mean_response_time"].to_dict()


#: At N = 3: one server at speed 2 and two at speed 1, a capacity of 4/3 tasks
#: per server per unit time: load 1 is stable.
POOLS = "0.34:2,0.66:1"
#: A tiny run: the sides' derivatives exist, nothing is compared.
TINY = dict(replicas=4, steps=2560, seed=3)


def test_the_default_step_measures_the_room_to_the_capacity():
    """The room is to the stability boundary of the system run: the pools'
    capacity, none with a finite buffer (any load > 0 is stable)."""
    assert default_step("load", 1.0, 3, capacity=4 / 3) == pytest.approx(RELATIVE_STEP / 3)
    assert default_step("load", 0.9, 3) == default_step("load", 0.9, 3, capacity=1.0)
    pools = jq.Model("jsq", 3, pools=POOLS)
    for load, room in ((1.0, 1 / 3), (1.2, 4 / 3 - 1.2), (0.5, 0.5)):
        sides = plan_sides(pools, load, replicas=4, steps=256)
        assert sides.h == pytest.approx(RELATIVE_STEP * room) and sides.h > 0
        assert max(sides.plans[0].loads) < 4 / 3
    # a finite buffer: 5% of the load, past the capacity too
    buffered = plan_sides(pools.replace(buffer=4), 1.5, replicas=4, steps=256)
    assert buffered.h == pytest.approx(RELATIVE_STEP * 1.5)
    # at or past the boundary with infinite buffers: the load's own error, not h=0
    with pytest.raises(ValueError, match=r"infinite buffers need load < 1\.33333"):
        plan_sides(pools, 1.4, replicas=4, steps=256)
    with pytest.raises(ValueError, match="infinite buffers need 0 < load < 1"):
        plan_sides("jsq", 1.0, 3, replicas=4, steps=256)


# a tiny run: a Richardson gap its noise resolves is no concern here
@pytest.mark.slow  # fast: the default-step test above, and a run in test_fast_references.py
@pytest.mark.filterwarnings("ignore::jaxqueue.studies.crn.sensitivity.CurvatureWarning")
def test_a_load_of_1_below_the_pools_capacity_has_a_derivative(capsys):
    """``simulate --policy jsq --servers 3 --load 1.0 --pools 0.34:2,0.66:1
    --sensitivity load`` (it failed with "h=0.0 is out of range"), as
    jq.sensitivity; and a finite buffer at load 1.2."""
    args = ["simulate", "--policy", "jsq", "--servers", "3", "--load", "1.0", "--pools", POOLS]
    args += ["--replicas", "4", "--steps", "2560", "--seed", "3", "--sensitivity", "load"]
    assert cli_main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    s = sensitivity(jq.Model("jsq", 3, pools=POOLS), 1.0, **TINY)
    assert data["h"] == s.h == pytest.approx(RELATIVE_STEP / 3)
    assert data["derivatives"]["mean_response_time"] == s["mean_response_time"].to_dict()
    assert np.isfinite(s["mean_response_time"].mean) and s["mean_response_time"].mean > 0
    b = sensitivity(jq.Model("jsq", 3, buffer=4), 1.2, **TINY)
    assert b.h == pytest.approx(RELATIVE_STEP * 1.2)
    assert np.isfinite(b["mean_response_time"].mean) and np.isfinite(b["mean_response_time"].ci95)
