"""The Halfin-Whitt diffusion limit (jaxqueue.theory.baselines.diffusion) and the process-level comparison.

The diffusion's pieces against closed forms: without reflection the SDE is
linear and Gaussian; the reflected process's stationary moments satisfy
``E[Q_1] = -beta``, ``E[Q_1^2] = 1 + beta^2 - beta E[Q_2] / 2`` and ``E[Q_1
Q_2] = -beta E[Q_2] / 2`` (Ito's formula; docs/diffusion.md). The simulated
side: JSQ's transient against the exact chain of (idle servers, servers with
two tasks), whose finite-N gap from the limit halves as N quadruples, a
slice of sweeps/mukherjee_process.py's quick mode, and the finite horizon's
level bound of idle-first with d = 1 (runs.bounds.horizon_levels).
"""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.results.estimates import Estimate, estimate
from jaxqueue.results.stats import tolerance, within
from jaxqueue.runs import bounds
from jaxqueue.theory.baselines import diffusion

SCRIPT = Path(__file__).resolve().parents[2] / "sweeps" / "mukherjee_process.py"
#: One shape for every integration here (paths, times), so they share one compilation.
PATHS, TIMES = 2048, np.round(0.1 * np.arange(41), 10)


@functools.cache
def _script():
    spec = importlib.util.spec_from_file_location("mukherjee_process", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_without_reflection_the_paths_are_gaussian_with_the_closed_form_moments():
    """Mean and variance of ``Q_1(t)`` at 41 times (family 82). Allowance 0.01:
    Euler's error, ``O(dt)`` (the variance's stationary bias is ``dt / 2``)."""
    start = (-0.5, 1.0)
    x = diffusion.integrate(1.0, TIMES, start=start, paths=PATHS, dt=0.01, reflect=False)
    mean, var = diffusion.linear_moments(1.0, TIMES, start)
    q1 = x[:, :, 0]
    assert within(estimate(q1), mean, family=82, allowance=0.01)
    assert within(estimate((q1 - mean) ** 2), var, family=82, allowance=0.01)
    np.testing.assert_allclose(x[0, :, 1], np.exp(-TIMES), atol=0.01)  # Q_2 decays alone
    assert np.all(x[:, :, 2] == 0.0)


@pytest.mark.slow
def test_reflected_paths_stay_below_zero_and_push_q2_up_only():
    x = diffusion.integrate(0.5, TIMES, paths=PATHS, dt=0.01, seed=2)
    q1, q2, u = x[:, :, 0], x[:, :, 1], x[:, :, 2]
    assert np.all(q1 <= 0.0) and np.all(q2 >= 0.0)
    assert np.all(np.diff(u, axis=1) >= 0.0) and np.all(u[:, -1] > 0.0)
    assert np.all(x[:, 0] == 0.0)  # the start
    r = diffusion.diffusion_paths(0.5, TIMES, paths=PATHS, dt=0.01, seed=2, quantiles=(0.1, 0.9))
    np.testing.assert_array_equal(r.q1.mean, x[:, :, 0].mean(axis=0))  # fixed keys
    assert r.q1.mean.shape == (41,) and r.q1.n == PATHS and r.q2_quantiles.shape == (2, 41)
    assert np.all(r.q1_quantiles[0] <= r.q1_quantiles[1]) and r.settings["paths"] == PATHS


@pytest.mark.slow
def test_the_stationary_moments_satisfy_itos_identities():
    """Time averages over ``t`` in [10, 30] of each path, across 2048 paths
    (family 3). Allowance 0.02 for the step ``dt = 0.02`` (its measured error is
    below 0.01, docs/diffusion.md) and the start's remnant at ``t = 10``."""
    beta = 1.0
    x = diffusion.integrate(beta, 10.0 + 5.0 * TIMES, paths=PATHS, dt=0.02, seed=1)
    q1, q2 = x[:, :, 0], x[:, :, 1]
    assert within(estimate(q1.mean(axis=1)), -beta, family=3, allowance=0.02)
    second = (q1**2 + beta * q2 / 2.0).mean(axis=1)
    assert within(estimate(second), 1.0 + beta**2, family=3, allowance=0.02)
    cross = (q1 * q2 + beta * q2 / 2.0).mean(axis=1)
    assert within(estimate(cross), 0.0, family=3, allowance=0.02)


def test_refusals_come_before_anything_compiles():
    for bad in (
        dict(times=[0.0, 0.105]),  # not on the step's grid
        dict(times=[1.0, 0.5]),
        dict(times=[0.5], dt=0.0),
        dict(times=[0.5], start=(0.5, 0.0)),
        dict(times=[0.5], paths=1),
    ):
        args = {"times": bad.pop("times")}
        with pytest.raises(ValueError):
            diffusion.integrate(1.0, args["times"], **bad)
    with pytest.raises(ValueError):
        diffusion.integrate(0.0, [0.5])


#: The limit's paths for the gap's order in N: 2^16 (2^14, the script's, leaves
#: the ratio's interval at t = 0.5 at 0.30-0.59 once the step's allowance is in).
GAP_PATHS = 1 << 16
#: The diffusion step's error in ``Qbar_2`` at ``dt = 0.01``: about 0.0025
#: (``O(dt)`` from 0.006 at ``dt = 0.025``, docs/diffusion.md), allowed twice.
STEP_ALLOWANCE = 0.005


@pytest.mark.slow
def test_jsq_transient_matches_its_exact_chain_whose_gap_to_the_limit_halves():
    """Simulated JSQ at N = 100 against the exact chain, no allowance; the
    chain's ``Q_2`` gap to the diffusion (2^16 paths) at N = 100 and 400 at
    t = 0.5, 1, 1.5, 2: 0.075-0.115 and 0.037-0.059, each far beyond the
    limit's tolerance (0.012-0.017, the step's allowance included).

    The gap's order in N: the chains are exact, so the ratio ``gap(400) /
    gap(100)``, increasing in the limit's value, has the interval of the
    limit's two ends: 0.40-0.57 at t = 0.5 to 0.43-0.57 at t = 2 (ratios
    0.50-0.52). Quadrupling N halves an ``O(1/sqrt(N))`` gap (1/2) and
    quarters an ``O(1/N)`` one (1/4): each interval holds 1/2 and excludes 1/4.

    Family 12: ``Q_1`` and ``Q_2`` at 4 times (the simulation), the limit at
    4 times (every statement about the gaps follows from those intervals)."""
    family = 12
    t = np.array([0.5, 1.0, 1.5, 2.0])
    exact = {n: _script().jsq_chain(n, 1.0, t) for n in (100, 400)}
    res = jq.transient(
        "jsq", jq.halfin_whitt_load(100, 1.0), 100, times=t, replicas=256, seed=3, init=[0, 1]
    )
    sim = _script().scaled(res, 100)
    assert within(sim["q1"], exact[100][:, 0], family=family)
    assert within(sim["q2"], exact[100][:, 1], family=family)
    at = np.searchsorted(_script().TIMES, t)
    full = diffusion.diffusion_paths(1.0, _script().TIMES, paths=GAP_PATHS, dt=0.01, seed=0).q2
    limit = Estimate(full.mean[at], full.ci95[at], full.n)
    noise = tolerance(limit, family=family, allowance=STEP_ALLOWANCE)
    low, high = limit.mean - noise, limit.mean + noise
    assert np.all(low - exact[100][:, 1] > 0.05) and np.all(low - exact[400][:, 1] > 0.02)

    def ratio(value):
        return (value - exact[400][:, 1]) / (value - exact[100][:, 1])

    assert np.all(exact[400][:, 1] > exact[100][:, 1])  # so the ratio increases with the limit
    lo, hi = ratio(low), ratio(high)
    assert np.all(lo > 0.25), lo  # not O(1/N)
    assert np.all((lo <= 0.5) & (0.5 <= hi)), (lo, hi)  # O(1/sqrt(N))


@pytest.mark.slow
def test_quick_mode_slice_runs_and_sits_near_the_limit(tmp_path):
    """The script at N = 400 for d = 2 and N (256 replicas): ``Q_1(t)`` and
    ``Q_2(t)`` at the 20 times past 0 within tolerance (family 80: two
    metrics, two d, 20 times) plus a finite-N allowance of 0.15 (JSQ's exact
    gap at N = 400 is below 0.09; d = 2's largest in the quick mode is 0.10 ±
    0.10) plus the limit's interval."""
    script = _script()
    mode = {"servers": (400,), "replicas": 256, "paths": 1 << 14, "labels": ("2", "N")}
    store = tmp_path / "process.json"
    data = script.run(mode, 1.0, 0, log=None, store=store)
    assert [row["d"] for row in data["curves"]] == [2, 400]
    # a rerun resumes from the store: nothing is simulated again, the curves are the same
    script.simulate = lambda *a: pytest.fail("a finished curve was simulated again")
    assert script.run(mode, 1.0, 0, log=None, store=store)["curves"] == data["curves"]
    with pytest.raises(SystemExit, match="replicas"):
        script.run(dict(mode, replicas=128), 1.0, 0, log=None, store=store)
    lim = {k: Estimate.from_dict(data["limit"][k]) for k in ("q1", "q2")}
    for row in data["curves"]:
        for key in ("q1", "q2"):
            sim = Estimate.from_dict(row[key])
            allowance = 0.15 + lim[key].ci95[1:]
            sliced = Estimate(sim.mean[1:], sim.ci95[1:], sim.n)
            assert within(sliced, lim[key].mean[1:], family=80, allowance=allowance), (row, key)
        assert row["max_q3"] < 0.1
    assert "400 (N)" in script.table(data)
    path = tmp_path / "process.png"
    script.plot(data, str(path))
    assert path.stat().st_size > 10_000


def _poisson_sf(mean: float, k: int) -> float:
    """``P(X >= k)`` for ``X ~ Poisson(mean)``, summed (float64)."""
    terms = [math.exp(j * math.log(mean) - mean - math.lgamma(j + 1)) for j in range(k, k + 400)]
    return math.fsum(terms)


def test_the_horizon_bound_covers_the_poisson_arrivals_of_the_transients_steps():
    """``horizon_levels`` for idle-first d = 1 from every server at one task
    over 5 time units: far below the stationary default (Random's tail), and
    ``N P(A >= L) < 1e-6`` for the arrivals ``A`` a server can be picked by
    (Poisson of mean ``lambda`` per time unit over the horizon and the
    steps past it), exactly. Other policies get None."""
    pol = jq.make("idle-first", d=1)
    for n in (100, 400, 1600, 102400):
        lam = jq.halfin_whitt_load(n, 1.0)
        top = bounds.horizon_levels(pol, n, lam, 5.0, start_top=1)
        assert top % 4 == 0 and 8 <= top <= 40
        assert top < bounds.default_levels(pol, n, 1, lam) / 5
        rate = n * (lam + 1.0)
        steps = rate * 5.0 + 8.0 * math.sqrt(rate * 5.0) + 40 + 256  # sim.transient's, to a block
        assert n * _poisson_sf(steps * lam / rate, top) < 1e-6  # queue <= 1 + A passes top
        assert bounds.required_levels(pol, n, 1, lam) == 2  # the mean field: none past 1
    at_1600 = bounds.horizon_levels(pol, 1600, 0.975, 5.0)
    assert bounds.horizon_levels(pol, 1600, 0.975, 10.0) > at_1600  # a longer horizon
    assert bounds.horizon_levels(pol, 1600, 0.975, 5.0, start_top=9) == at_1600 + 8
    for other in (jq.make("idle-first", d=2), jq.make("jsq"), jq.make("random")):
        assert bounds.horizon_levels(other, 1600, 0.975, 5.0) is None
    assert bounds.required_levels(jq.make("random"), 1600, 1, 0.975) == 292


@pytest.mark.slow
def test_a_queue_past_an_explicit_bound_fails_the_transient():
    """Idle-first d = 1 at N = 100 from every server at one task: with
    ``levels=2`` the queues that reach three tasks are overflows and the run
    fails; with the horizon's bound it runs, within the steps the bound covers."""
    lam = jq.halfin_whitt_load(100, 1.0)
    args = dict(times=[0.0, 5.0], replicas=16, seed=0, init=[0.0, 1.0])
    with pytest.raises(jq.LevelOverflowError, match="levels=2"):
        jq.transient("idle-first", lam, 100, d=1, levels=2, **args)
    top = bounds.horizon_levels(jq.make("idle-first", d=1), 100, lam, 5.0)
    res = jq.transient("idle-first", lam, 100, d=1, levels=top, **args)
    assert res.tail.mean.shape == (2, top + 1) and res.tail.mean[1, 3] > 0.0
    rate = 100 * (lam + 1.0)  # the steps the bound covers hold the run's
    assert res.settings["steps"] <= rate * 5.0 + 12.0 * math.sqrt(rate * 5.0) + 64 + 512


@pytest.mark.slow
def test_the_gap_of_d2_from_the_limit_shrinks_from_n400_to_n1600():
    """Idle-first d = 2, ``E[Qbar_2(5)]`` at N = 400 and 1600 (16384 replicas
    each, 95% half-widths 0.013 and 0.014): its gap below the limit (2^14
    paths, the script's; 0.740 ± 0.014) shrinks, 0.087 to 0.046 (JSQ's exact
    chain: 0.089 to 0.048). At the house family-wise 0.001 (family 2): the
    shrink (0.041 against about 0.034 tolerated), and the N = 1600 curve still
    below the limit (0.046 against about 0.036), so it shrinks towards it, not
    past it."""
    sim = {}
    for n in (400, 1600):
        res = jq.transient(
            "idle-first",
            jq.halfin_whitt_load(n, 1.0),
            n,
            d=2,
            times=[5.0],
            replicas=16384,
            seed=5,
            init=[0.0, 1.0],
        )
        sim[n] = _script().scaled(res, n)["q2"]
    full = diffusion.diffusion_paths(1.0, _script().TIMES, paths=1 << 14, dt=0.01, seed=0).q2
    limit = Estimate(full.mean[-1:], full.ci95[-1:], full.n)

    def tol(est):
        return tolerance(est, family=2)

    shrink, left = sim[1600].mean - sim[400].mean, limit.mean - sim[1600].mean
    assert np.all(shrink > np.hypot(tol(sim[400]), tol(sim[1600]))), shrink
    assert np.all(left > np.hypot(tol(limit), tol(sim[1600]))), left
