"""Fast checks of simulated values against references the simulator did not compute.

The slow tests compare these paths with exact values at length; these are the
fast tier's short versions, each a few seconds, so that a change that makes
them wrong fails every run:

* a derivative by common random numbers (``jq.sensitivity``) against the
  exact chain's central difference at the same loads;
* paired differences (``jq.paired``) against the exact chain's differences;
* Pod(d) with ``d > 64`` (the draw from the occupancy tail,
  :func:`jaxqueue.policies.probes.shortest_by_tail`) against the exact chain
  of the occupancy tail, written here from the rule's text.

(A per-arrival user metric with blocking is checked against a chain written
in the tests by ``tests/core/test_user_metrics.py``,
``test_per_arrival_metrics_count_only_accepted_arrivals``, in this tier too.)

Each comparison is a two-sided Student-t test for the replicas used
(:func:`jaxqueue.results.stats.within`), family-wise 0.001 (Bonferroni) over
the family its test states; fixed seeds. The sensitivity and paired tests share
one compiled shape, Pod(2) at N = 3 with four loads of 16 replicas (that of
tests/studies/test_sensitivity.py and tests/studies/test_paired.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.sparse import coo_matrix, diags
from scipy.sparse.linalg import spsolve

import jaxqueue as jq
from jaxqueue.exact import solve_exact
from jaxqueue.policies import probes
from jaxqueue.results.stats import within

#: Pod(2) at N = 3: four loads (or sides) of 16 replicas, one compiled shape.
SMALL = dict(d=2, replicas=16, levels=24, steps=51_200)


def _exact(load: float, metric: str) -> float:
    return getattr(solve_exact("pod", float(load), 3, d=2), metric)


def test_a_derivative_against_the_exact_chain():
    """``D(h)`` of the mean response time and of the waiting probability, Pod(2) at
    N = 3, load 0.7, against the exact chain's ``(X(hi) - X(lo)) / (hi - lo)`` at
    the same float32 loads (no bias: the same difference of exact values), family
    2, no allowance. Measured (seed 1): 4.51 +- 0.28 beside 4.306, and
    1.352 +- 0.053 beside 1.359. A derivative off by a factor 2 (dividing by
    2h where ``hi - lo`` is already 2h) or of the wrong sign fails."""
    s = jq.sensitivity("pod", 0.7, 3, seed=1, richardson=False, **SMALL)
    lo, hi = s.values
    assert hi - lo == pytest.approx(2 * s.h, rel=1e-5)
    for metric in ("mean_response_time", "waiting_probability"):
        ref = (_exact(hi, metric) - _exact(lo, metric)) / (hi - lo)
        assert within(s[metric], ref, family=2), (metric, s[metric], ref)


def test_paired_differences_against_the_exact_chain():
    """Pod(2) at N = 3, loads 0.6, 0.65, 0.7 and 0.75: each point's difference in
    mean response time from the first against the exact chain's difference at
    the loads run, family 3, no allowance. Measured (seed 2): 0.1384 +- 0.0073,
    0.326 +- 0.012 and 0.576 +- 0.020 beside 0.1426, 0.3288 and 0.5831. A
    difference of the wrong sign, or from the previous point instead of the
    first, fails."""
    c = jq.paired("pod", (0.6, 0.65, 0.7, 0.75), 3, seed=2, **SMALL)
    t = [_exact(r.settings["load"], "mean_response_time") for r in c.results]
    for k in (1, 2, 3):
        est = c["mean_response_time", k]
        assert within(est, t[k] - t[0], family=3), (k, est, t[k] - t[0])


# -- Pod(d) past MAX_PROBES: the exact chain of the occupancy tail ----------------------

#: Pod(80) at N = 100, two places per server, load 0.9: the draw reads the table of
#: C(t, 80) / C(100, 80) (tests/policies/test_large_d.py checks the table itself).
LARGE_D = dict(n=100, d=80, buffer=2, load=0.9)


def _tail_chain(n: int, d: int, load: float) -> dict:
    """Pod(d) on ``n`` unit-rate servers of two places each: ``(t1, t2)``, the
    servers holding at least one and two tasks, is a Markov chain. An arrival
    (rate ``load * n``) probes ``d`` distinct servers: all hold a task with
    probability ``a(t1) = C(t1, d) / C(n, d)``, all two with ``a(t2)``; it joins
    an idle server (``t1 + 1``) with probability ``1 - a(t1)``, one with one task
    (``t2 + 1``) with ``a(t1) - a(t2)``, and is blocked with ``a(t2)``. A server
    with one task ends it at rate 1 (``t1 - 1``), one with two ends one
    (``t2 - 1``). Its stationary law by a sparse solve (5,151 states at n = 100).

    Returns the waiting probability of an accepted task (``E[a(t1) - a(t2)] / (1 -
    B)``, ``B = E a(t2)`` the blocking probability by PASTA) and the mean tasks per
    server (``E[t1 + t2] / n``)."""
    states = [(t1, t2) for t1 in range(n + 1) for t2 in range(t1 + 1)]
    index = {s: i for i, s in enumerate(states)}
    a = np.array([math.comb(t, d) / math.comb(n, d) for t in range(n + 1)])
    rows, cols, rates = [], [], []
    for (t1, t2), i in index.items():
        moves = {
            (t1 + 1, t2): load * n * (1.0 - a[t1]),
            (t1, t2 + 1): load * n * (a[t1] - a[t2]),
            (t1 - 1, t2): float(t1 - t2),
            (t1, t2 - 1): float(t2),
        }
        for to, rate in moves.items():
            if rate > 0.0:
                rows.append(i)
                cols.append(index[to])
                rates.append(rate)
    size = len(states)
    q = coo_matrix((rates, (rows, cols)), shape=(size, size)).tocsr()
    q = (q - diags(np.asarray(q.sum(axis=1)).ravel())).T.tolil()
    q[size - 1, :] = 1.0  # one balance equation replaced by the normalisation
    pi = spsolve(q.tocsc(), np.eye(size)[size - 1])
    t1, t2 = (np.array([s[j] for s in states]) for j in (0, 1))
    blocking = float(pi @ a[t2])
    return {
        "waiting_probability": float(pi @ (a[t1] - a[t2])) / (1.0 - blocking),
        "mean_queue_length": float(pi @ (t1 + t2)) / n,
    }


def test_pod_past_max_probes_against_the_exact_tail_chain():
    """Pod(80) at N = 100, two places per server, load 0.9 (the tail's draw,
    ``d > MAX_PROBES``, from the table): the waiting probability and the mean
    tasks per server against :func:`_tail_chain`, family 2, no allowance. Exact:
    0.07045 and 0.96341; measured (seed 3): 0.0714 +- 0.0021 and 0.9649 +- 0.0027.
    Pod(d) with many probes is nearly JSQ, and its metrics move little with the
    probes' law: probes drawn with replacement (``(t / N)**d`` in place of the
    hypergeometric ratio) give 0.0825 and 0.9742, which these 32 replicas of
    2**19 steps resolve (measured 0.0836 +- 0.0023: fails)."""
    n, d, buffer, load = LARGE_D["n"], LARGE_D["d"], LARGE_D["buffer"], LARGE_D["load"]
    assert d > probes.MAX_PROBES and probes.draws_by_table(n, d)
    ref = _tail_chain(n, d, load)
    assert ref["waiting_probability"] == pytest.approx(0.070454, rel=1e-4)
    sim = jq.simulate(
        "pod",
        load,
        n,
        d=d,
        buffer=buffer,
        replicas=32,
        steps=2**19,
        warmup=2**13,
        seed=3,
        init="empty",
        interval="replicas",
    )
    for metric, value in ref.items():
        est = getattr(sim, metric)
        assert within(est, value, family=len(ref)), (metric, est, value)
