"""The simulator against the exact stationary solution of small systems.

The exact solutions come from :mod:`jaxqueue.exact` (an independent
per-server implementation of the same rules). Every comparison is a two-sided
Student-t test for the replicas used (:func:`jaxqueue.tolerance`), family-wise
0.001 (Bonferroni) over the comparisons its tier makes, counted in one place
from the tables below (:data:`FAST_FAMILY`, :func:`_family`). The exact
solutions' truncated mass is below 1e-7, far below the intervals.

Two tiers:

* fast: every registered policy (``jaxqueue.available()``, default options)
  once, on a 3-server system with 4 places per server (a small exact chain,
  no truncation), comparing the mean response time, the waiting and blocking
  probabilities and, where it applies, ``p0``; the simulated and exact results
  also have the same keys;
* slow: a table of cases (options, finite buffers, per-server policies), each
  compared metric by metric.
"""

import functools
import math

import jax
import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.exact import solve_exact
from jaxqueue.results.stats import tolerance

LOAD = 0.6
REPLICAS = 32
STEPS = 2**18

# ---------------------------------------------------------------------------- fast tier

FAST_STEPS = 2**15
FAST_BUFFER = 4
FAST_POLICIES = jq.available()
FAST_METRICS = ("mean_response_time", "waiting_probability", "blocking_probability", "p0")
#: The comparisons made: three metrics of every policy, and p0 where it has I-queues
#: (39 of the 44 policy-metric pairs; 44 was stated before they were counted).
FAST_FAMILY = len(FAST_POLICIES) * (len(FAST_METRICS) - 1) + sum(
    jq.make(name).uses_iqueues for name in FAST_POLICIES
)


def _exact(name, opts, lam, n, m, b):
    return _solved(name, tuple(sorted(opts.items())), lam, n, m, b)


@functools.cache
def _solved(name, opts, lam, n, m, b):
    opts = dict(opts)
    # the per-server chains are larger: their automatic bound stops near 1e-7
    tol = 1e-7 if jq.make(name, **opts).per_server else 1e-9
    ex = solve_exact(name, lam, n, m, buffer=b, tol=tol, **opts)
    assert ex.truncated_mass < 1e-7
    return ex


#: Policies checked in the fast tier; the others run in the full suite (same family).
FAST_TIER = ("pod", "jiq")


@pytest.mark.parametrize(
    "name",
    [n if n in FAST_TIER else pytest.param(n, marks=pytest.mark.slow) for n in FAST_POLICIES],
)
def test_every_policy_against_its_exact_chain(name):
    policy = jq.make(name)
    n, m = 3, (1 if policy.single_dispatcher or not policy.uses_iqueues else 2)
    sim = jq.simulate(
        name,
        LOAD,
        n,
        m,
        buffer=FAST_BUFFER,
        replicas=REPLICAS,
        steps=FAST_STEPS,
        warmup=4096,
        seed=11,
        devices=jax.devices()[:1],
        iqueue_levels=n if policy.uses_iqueues and (m > 1 or policy.per_server) else None,
    )
    ex = _exact(name, {}, LOAD, n, m, FAST_BUFFER)
    assert set(sim.to_dict()) == set(ex.to_dict())
    for metric in FAST_METRICS:
        est, exact = getattr(sim, metric), getattr(ex, metric)
        if exact is None:
            assert est is None, metric
            continue
        _close(est, exact, metric, FAST_FAMILY)


# ---------------------------------------------------------------------------- slow tier

CASES = [
    # (policy, options, N, M, buffer, load)
    ("random", {}, 3, 1, None, LOAD),
    ("jsq", {}, 3, 1, None, LOAD),
    ("pod", {"d": 2}, 3, 1, None, LOAD),
    ("i1f", {}, 3, 1, None, LOAD),
    ("jiq", {}, 3, 2, None, LOAD),
    ("jiq-pod", {"d": 2}, 3, 2, None, LOAD),
    ("jiq-sq", {"d": 2}, 3, 2, None, LOAD),
    ("idle-first", {"d": 2}, 3, 1, None, LOAD),
    ("pod", {"d": 2}, 3, 1, 2, 1.2),
    ("jiq", {}, 4, 2, 3, 0.9),
    ("jiq-original", {}, 3, 2, None, LOAD),
    ("jiq-threshold", {"z": 1}, 3, 2, None, LOAD),
    ("jiq-threshold", {"z": 0}, 3, 2, None, LOAD),
    ("jiq-original", {}, 3, 1, 3, 0.9),
]
MESSAGES = ("join_rate", "delete_rate", "probe_rate")


def _compared(case) -> int:
    """The comparisons the tests below make for one case: s_1..s_3, T, P(wait)
    and E[Q]; the blocking probability with a finite buffer; each message rate
    the exact chain does not put at zero; p0, the stale picks and the I-queue
    sizes (N + 1 entries, with several dispatchers) where they apply."""
    name, opts, n, m, b, lam = case
    ex = _exact(name, opts, lam, n, m, b)
    count = 3 + 3 + (b is not None) + sum(getattr(ex, r) != 0.0 for r in MESSAGES)
    if ex.p0 is not None:
        count += 1 + (ex.stale_fraction is not None) + (n + 1 if m > 1 else 0)
    return count


@functools.cache
def _family() -> int:
    """The slow tier's family: every case's comparisons and the JSQ identity
    test below (148; 239 was stated before they were counted). It solves every
    case's chain, which the cases then reuse."""
    return sum(_compared(case) for case in CASES) + 1


def _ids(case):
    name, opts, n, m, b, lam = case
    return f"{name}{''.join(str(v) for v in opts.values())}-N{n}-M{m}-b{b}-l{lam}"


@pytest.fixture(scope="module", params=CASES, ids=_ids)
def pair(request):
    name, opts, n, m, b, lam = request.param
    sim = jq.simulate(
        name,
        lam,
        n,
        m,
        buffer=b,
        replicas=REPLICAS,
        steps=STEPS,
        warmup=4096,
        seed=1,
        iqueue_levels=n if m > 1 else None,
        **opts,
    )
    return sim, _exact(name, opts, lam, n, m, b)


def _close(est, exact, what, family=None):
    family = _family() if family is None else family
    exact = np.asarray(exact, np.float64)
    err = np.abs(np.asarray(est.mean) - exact)
    tol = tolerance(est, family)
    assert np.all(err <= tol), f"{what}: simulated {est.mean} ± {tol}, exact {exact}"
    # a zero-width interval is only acceptable where the value is exactly right
    assert np.all((np.asarray(est.ci95) > 0) | (err == 0)), what


def _slice(est, a, b):
    return jq.Estimate(np.asarray(est.mean)[a:b], np.asarray(est.ci95)[a:b], est.n)


@pytest.mark.slow
def test_tail(pair):
    sim, ex = pair
    _close(_slice(sim.tail, 1, 4), ex.tail[1:4], "tail s_1..s_3")


@pytest.mark.slow
def test_response_time_and_waiting(pair):
    sim, ex = pair
    _close(sim.mean_response_time, ex.mean_response_time, "mean response time")
    _close(sim.waiting_probability, ex.waiting_probability, "waiting probability")
    _close(sim.mean_queue_length, ex.mean_queue_length, "mean queue length")


@pytest.mark.slow
def test_blocking(pair):
    sim, ex = pair
    if ex.buffer is None:
        assert sim.blocking_probability is None and ex.blocking_probability is None
    else:
        assert ex.blocking_probability > 0.01
        _close(sim.blocking_probability, ex.blocking_probability, "blocking probability")


@pytest.mark.slow
def test_messages(pair):
    sim, ex = pair
    for name in MESSAGES:
        exact = getattr(ex, name)
        est = getattr(sim, name)
        if exact is None:  # an I-queue message without I-queues
            assert est is None, name
        elif exact == 0.0:
            assert est.mean == 0.0, name
        else:
            _close(est, exact, name)


@pytest.mark.slow
def test_iqueues(pair):
    sim, ex = pair
    if ex.p0 is None:
        assert sim.p0 is None and sim.iqueue_distribution is None
        return
    _close(sim.p0, ex.p0, "p0")
    assert (sim.stale_fraction is None) == (ex.stale_fraction is None)
    if sim.stale_fraction is not None:
        _close(sim.stale_fraction, ex.stale_fraction, "stale picks")
    if sim.iqueue_distribution is not None:
        k = len(sim.iqueue_distribution.mean)
        _close(sim.iqueue_distribution, ex.iqueue_distribution[:k], "I-queue sizes")
        assert math.isclose(float(np.sum(ex.iqueue_distribution[k:])), 0.0, abs_tol=1e-12)


@pytest.mark.slow
def test_pod_with_all_servers_probed_is_jsq():
    kw = dict(replicas=REPLICAS, steps=STEPS, warmup=4096, seed=2, levels=24)
    sim = jq.simulate("jiq-pod", LOAD, 3, 1, d=3, **kw)
    ex = solve_exact("jsq", LOAD, 3, 1)
    _close(sim.mean_response_time, ex.mean_response_time, "jiq-pod(d=N), M=1 vs JSQ")
