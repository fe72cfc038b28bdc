"""The simulator at large N against the mean field: the closed forms of Wang, Feng,
Cheng, and the generic fixed point (I1F, JIQ-SQ) of :mod:`jaxqueue.meanfield`.

N = 10^4 servers, r = 10, lambda = 0.9, started at the mean-field occupancy,
20 time units of warm-up and 60 measured, 8 replicas, fixed seed.

Tolerance: the 95% half-width scaled to a family-wise 99.9% level over the
comparisons of this file (Bonferroni over 42: z = 4.07, a factor of 2.08),
plus a finite-N allowance of ``10 / N`` relative to the predicted value
(0.1% here). The mean-field error of these policies is O(1/N); at N = 1000
the differences measured with this set-up were below 0.5% of T.
"""

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue import theory

N, RATIO, LOAD = 10_000, 10.0, 0.9
FAMILY = 4.07 / 1.96
ALLOWANCE = 10.0 / N
PER_TIME = N * (1 + LOAD)

CASES = [
    ("pod", {"d": 2}), ("jiq", {}), ("jiq-pod", {"d": 2}), ("jsq", {}), ("i1f", {}),
    ("jiq-sq", {"d": 2}),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c[0])
def pair(request):
    name, opts = request.param
    # closed forms, or the generic fixed point (i1f, jiq-sq) of jaxqueue.meanfield
    mf = theory.mean_field(name, LOAD, RATIO, d=opts.get("d", 1))
    sim = jq.simulate(
        name, N, int(N / RATIO), LOAD, replicas=8, steps=int(60 * PER_TIME),
        warmup=int(20 * PER_TIME), init=mf.occupancy, seed=9, **opts,
    )  # fmt: skip
    return sim, mf


def _check(est, predicted, what):
    tol = FAMILY * np.asarray(est.ci95) + ALLOWANCE * np.abs(predicted)
    err = np.abs(np.asarray(est.mean) - predicted)
    assert np.all(err <= tol), f"{what}: simulated {est.mean} ± {tol}, mean field {predicted}"


def test_mean_response_time(pair):
    sim, mf = pair
    _check(sim.mean_response_time, mf.mean_response_time, "T")


def test_tail(pair):
    sim, mf = pair
    k = 5
    est = jq.Estimate(sim.tail.mean[1:k], sim.tail.ci95[1:k])
    pred = np.zeros(k - 1)
    pred[: min(k, len(mf.tail)) - 1] = mf.tail[1:k]
    # s_i that the mean field puts below 1e-4 are compared in absolute terms
    _check(est, pred, "s_1..s_4")


def test_p0_and_messages(pair):
    sim, mf = pair
    if sim.p0 is None:
        assert np.isnan(mf.p0)
        return
    _check(sim.p0, mf.p0, "p0")
    _check(sim.join_rate, mf.join_rate, "join rate")
    _check(sim.delete_rate, mf.delete_rate, "delete rate")
    _check(sim.probe_rate, mf.probe_rate, "probe rate")
