"""Sensitivities in parameters of the compiled system: a pool's speed and share,
the service law's SCV, a rate profile's amplitude (docs/crn.md).

The fast tests check the sides' models and that every side's replica ``i``
has the same key; the slow ones compare the paired central differences with
the exact chain's at the same parameter values (N = 3 and 4) and the
amplitude's with the periodic mean field's at N = 100.
"""

from __future__ import annotations

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.cli.parser import build_parser
from jaxqueue.core.arrivals import Profile
from jaxqueue.core.config import Model
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.service import Pool
from jaxqueue.exact import solve_exact
from jaxqueue.results.stats import within
from jaxqueue.sim.placement import placement
from jaxqueue.studies.crn.sensitivity import plan_sides
from jaxqueue.studies.crn.sides import (
    RELATIVE_STEP,
    Step,
    side_model,
    system_default_step,
    system_value,
)
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.profiles.periodic import periodic_orbit
from jaxqueue.theory.profiles.periodic_result import as_result

#: One server at speed 2 and two at speed 1.
POOLS = (Pool(1, 2.0), Pool(2, 1.0))
SQUARE = Profile((0.0, 5.0, 10.0), (1.5, 0.5, None), "square")
#: Each parameter's system at the small N the exact chain solves.
CASES = {
    "speed": dict(n=3, pools=POOLS),
    "share": dict(n=4, pools="0.5:2,0.5:1"),
    "scv": dict(n=3, service="fit:0.7"),
}
SMALL = dict(d=2, replicas=16, levels=24, steps=51_200, seed=1)


def _model(parameter: str) -> Model:
    case = dict(CASES[parameter])
    return Model("pod", case.pop("n"), d=2, **case)


def test_the_sides_models_and_values():
    speed = _model("speed")
    assert system_value(speed, "speed") == 2.0 and system_value(speed, "speed", 1) == 1.0
    assert side_model(speed, "speed", 2.1).pools[0].speed == 2.1
    share = _model("share")
    assert system_value(share, "share") == 0.5
    assert [p.count for p in side_model(share, "share", 0.75).pools] == [3, 1]
    assert system_default_step(share, "share", 0.5) == 0.5
    assert system_default_step(share, "share", 0.5, richardson=False) == 0.25
    scv = _model("scv")
    assert system_value(scv, "scv") == pytest.approx(0.7)
    law = side_model(scv, "scv", 0.6).service
    assert law.scv == pytest.approx(0.6) and law.mean == pytest.approx(1.0)
    amp = Model("pod", 3, d=2, arrivals=SQUARE)
    assert system_value(amp, "amplitude") == 1.0
    assert system_default_step(amp, "amplitude", 1.0) == RELATIVE_STEP
    moved = side_model(amp, "amplitude", 0.5).arrivals
    assert moved.shape.tolist() == pytest.approx([1.25, 0.75])


def test_every_side_has_the_same_keys():
    s = plan_sides("pod", 0.7, 3, parameter="speed", pools=POOLS, **SMALL)
    assert len(s.plans) == 4 and s.values == pytest.approx((1.9, 2.1, 1.95, 2.05))
    assert {p.system.levels for p in s.plans} == {24}
    assert {(p.seed, p.streams) for p in s.plans} == {(1, (0,))}
    lo, hi = (np.asarray(placement(p)[2]) for p in s.plans[:2])
    assert np.array_equal(lo, hi)


def test_sides_of_their_own_level_bounds_are_planned_again_on_the_run_asked_for():
    """No ``levels`` given: each side's mean field sizes its own bound (Erlang(2)
    service at load 0.9, SCV 0.5 -+ h: 132 and 136 levels), and the sides are planned
    again at the largest, with the run's own settings (16 replicas, seed 1, 51,200
    steps), not the defaults."""
    small = {k: v for k, v in SMALL.items() if k != "levels"}
    s = plan_sides("pod", 0.9, 3, parameter="scv", service="erlang:2", **small)
    assert {p.system.levels for p in s.plans} == {136}
    for p in s.plans:
        assert (p.replicas, p.seed, p.streams) == (16, 1, (0,))
        assert p.measure_blocks * BLOCK == 51_200


@pytest.mark.parametrize(
    "parameter, model, kwargs, text",
    [
        ("speed", {}, {}, "needs pools"),
        ("share", dict(pools=POOLS), {}, "leaves pool 0 without servers"),
        ("share", dict(pools=POOLS), dict(h=0.25), "must move whole servers"),
        ("speed", dict(pools=POOLS), dict(pool=2), "pool=2 is out of range"),
        ("amplitude", {}, {}, "needs a rate profile"),
        ("amplitude", dict(arrivals=SQUARE), dict(h=1.5), "gives a negative rate"),
        ("scv", {}, dict(h=-0.1), "h=-0.1"),
        ("scv", {}, dict(warmup="auto"), "warmup='auto'"),
    ],
)
def test_arguments_are_checked_before_anything_runs(parameter, model, kwargs, text):
    with pytest.raises(ValueError, match=text):
        plan_sides("pod", 0.7, 3, parameter=parameter, d=2, **model, **kwargs)


def test_a_side_past_its_capacity_is_named():
    """A load above 1 is stable below the pools' capacity (4/3 here), but a slower
    side (speed 1.7: capacity 1.233) or a server moved to the slow pool (capacity
    1.25) is not: the side is named, not the load; a finite buffer is stable."""
    with pytest.raises(ValueError, match=r"side at speed=1\.7 has a capacity of 1\.23333"):
        plan_sides("pod", 1.25, 3, parameter="speed", d=2, pools=POOLS, h=0.3)
    with pytest.raises(
        ValueError, match=r"side at share=0\.25 has a capacity of 1\.25 .*load=1\.3"
    ):
        plan_sides(
            "pod", 1.3, 4, parameter="share", d=2, pools="0.5:2,0.5:1", h=0.25, richardson=False
        )
    s = plan_sides("pod", 1.25, 3, parameter="speed", d=2, pools=POOLS, h=0.3, buffer=5, steps=256)
    assert s.values == (1.7, 2.3, 1.85, 2.15)


def test_one_front_plans_the_sides_of_every_parameter():
    """The load's sides are the loads of one plan; a system parameter's, one plan
    each; a Step given whole plans as its keywords do, and a keyword beside it
    is refused, as is a pool for a parameter without pools."""
    load = plan_sides("pod", 0.7, 3, d=2, pools=POOLS, steps=256)
    assert len(load.groups) == 1 and load.groups[0].points == (0, 1, 2, 3)
    speed = plan_sides("pod", 0.7, 3, parameter="speed", d=2, pools=POOLS, steps=256)
    assert [g.points for g in speed.groups] == [(0,), (1,), (2,), (3,)]
    step = Step("speed", h=0.2, richardson=False, pool=1)
    whole = plan_sides("pod", 0.7, 3, step=step, d=2, pools=POOLS, steps=256)
    loose = plan_sides(
        "pod",
        0.7,
        3,
        parameter="speed",
        h=0.2,
        richardson=False,
        pool=1,
        d=2,
        pools=POOLS,
        steps=256,
    )
    assert whole.values == loose.values == (0.8, 1.2)
    assert [p.system for p in whole.plans] == [p.system for p in loose.plans]
    with pytest.raises(TypeError, match="h given beside step="):
        plan_sides("pod", 0.7, 3, step=step, h=0.1, d=2, pools=POOLS)
    with pytest.raises(ValueError, match="pool=1 is for parameter='speed' or 'share' only"):
        Step("scv", pool=1)
    with pytest.raises(ValueError, match="richardson=1 is not valid"):
        Step("load", richardson=1)


def test_a_pool_rounding_is_named_at_the_callers_line():
    """Half of 3 servers is not a whole number: the rounding of a speed's sides is
    warned about once, at the line that asked for them (not inside the package)."""
    with pytest.warns(jq.PoolRoundingWarning) as caught:
        plan_sides("pod", 0.7, 3, parameter="speed", d=2, pools="0.5:2,0.5:1", steps=256)
    assert len(caught) == 1
    assert caught[0].filename == __file__


def test_the_command_line_takes_them():
    base = ["simulate", "--policy", "pod", "--servers", "3", "--load", "0.7"]
    for parameter in ("speed", "share", "scv", "amplitude"):
        args = build_parser().parse_args(base + ["--sensitivity", parameter])
        assert args.sensitivity == parameter


def _exact(model: Model, parameter: str, values) -> float:
    """The exact chain's central difference at the sides' values."""
    lo, hi = values
    t = [solve_exact(side_model(model, parameter, v), 0.7).mean_response_time for v in values]
    return (t[1] - t[0]) / (hi - lo)


@pytest.mark.slow
@pytest.mark.parametrize("parameter", list(CASES))
def test_against_the_exact_chain(parameter):
    """The paired difference of the mean response time against the exact
    chain's at the same values: family 3 (the parameters), no allowance.
    Measured: speed -0.305 +- 0.016 (exact -0.3130), share -1.069 +- 0.016
    (-1.0697), scv 0.43 +- 0.17 (0.4649)."""
    case = dict(CASES[parameter])
    n = case.pop("n")
    s = jq.sensitivity("pod", 0.7, n, parameter=parameter, richardson=False, **case, **SMALL)
    ref = _exact(_model(parameter), parameter, s.values)
    est = s["mean_response_time"]
    assert within(est, ref, family=len(CASES)), (parameter, est, ref)


@pytest.mark.slow
def test_the_amplitude_against_the_periodic_mean_field():
    """Pod(2), N = 100, a square profile (1.5, 0.5) at lambda = 0.7: the paired
    difference against the periodic mean field's over each side's measured
    window, with the finite-N allowance 10 / N times the value (family 2).
    Measured: 0.357 +- 0.096 beside 0.379 (mean response time), 0.120 +- 0.033
    beside 0.133 (waiting probability)."""
    s = jq.sensitivity(
        "pod",
        0.7,
        100,
        parameter="amplitude",
        arrivals=SQUARE,
        d=2,
        replicas=16,
        steps=102_400,
        seed=0,
        richardson=False,
    )
    model = Model("pod", 100, d=2, arrivals=SQUARE)
    names = ("mean_response_time", "waiting_probability")
    sides = []
    for side, value in zip(s.sides, s.values):
        arr = side_model(model, "amplitude", value).arrivals
        window = (side.settings["time_warmup"], side.settings["time_measured"])
        orbit = periodic_orbit(Limit("pod", d=2, arrivals=arr), 0.7, window=window)
        sides.append(as_result(orbit, "pod", 0.7, None, arr))
    for name in names:
        ref = (getattr(sides[1], name) - getattr(sides[0], name)) / (s.values[1] - s.values[0])
        ok = within(s[name], ref, family=len(names), allowance=10 / 100 * abs(ref))
        assert ok, (name, s[name], ref)
