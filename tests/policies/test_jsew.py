"""JSEW (join the shortest expected wait): JSQ that sees the servers' speeds.

With identical servers it is JSQ, bit for bit; with pools the simulator is
checked against the exact chain with pools (Bonferroni Student-t tolerance
over the family of this module's comparisons), and the rank table that
decides ties against a direct computation.
"""

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.core.service import make_pools
from jaxqueue.core.system import System
from jaxqueue.exact import solve_exact
from jaxqueue.results.schema import POOL_METRICS
from jaxqueue.results.stats import tolerance
from jaxqueue.sim.classes import class_table, wait_ranks

# comparisons: 4 metrics, 4 quantiles, and 5 pool metrics and 4 quantiles of
# 2 pools with a buffer; 2 metrics and 4 quantiles with a phase-type law
FAMILY = 32


@pytest.mark.slow
def test_identical_servers_are_jsq_bit_for_bit():
    kw = dict(replicas=4, steps=5_000, seed=2, init="empty")
    a, b = jq.simulate("jsq", 0.8, 5, **kw), jq.simulate("jsew", 0.8, 5, **kw)
    assert np.array_equal(a.tail.mean, b.tail.mean)
    assert a.mean_response_time == b.mean_response_time
    assert jq.make("jsew").exact_rule() == ("jsew", {})


def test_wait_ranks_tie_equal_expected_waits():
    """Speeds 2 and 1: a fast server with one task ties an idle slow one."""
    system = System(4, levels=6, pools=make_pools("0.5:2,0.5:1", 4))
    rank = wait_ranks(system)
    table = class_table(system)
    fast, slow = table.base[0], table.base[1]
    assert rank[1, fast] == rank[0, slow] and rank[0, fast] < rank[0, slow]
    waits = (np.arange(7)[:, None] + 1.0) * np.array([0.5, 1.0])[None, :]
    order = np.argsort(waits.ravel(), kind="stable")
    assert np.all(np.diff(rank[:, [fast, slow]].ravel()[order]) >= 0)  # ranks follow the waits


@pytest.mark.slow
def test_pools_against_exact_chain():
    """One server twice as fast beside two, load 1.0 (capacity 4/3), buffer 4."""
    pools = "0.34:2,0.66:1"
    ex = solve_exact("jsew", 1.0, 3, buffer=4, pools=pools)
    res = jq.simulate("jsew", 1.0, 3, buffer=4, pools=pools, replicas=32, steps=200_000, seed=3)
    for name in (
        "mean_response_time",
        "blocking_probability",
        "waiting_probability",
        "mean_queue_length",
    ):
        est, value = getattr(res, name), getattr(ex, name)
        assert abs(est.mean - value) <= tolerance(est, FAMILY), (name, est, value)
    _quantiles_close(res, ex)
    for name in POOL_METRICS:  # each pool's share, utilization, queue, response, wait
        est, value = getattr(res, name), getattr(ex, name)
        assert np.all(np.abs(est.mean - value) <= tolerance(est, FAMILY)), (name, est, value)
    for q, est in res.pool_response_quantiles.items():
        value = ex.pool_response_quantiles[q]
        assert np.all(np.abs(est.mean - value) <= tolerance(est, FAMILY)), (q, est, value)
    assert ex.pool_arrival_share[0] > 0.34  # the fast server gets more than its share
    # and it is not JSQ: sending work to the fast server first lowers T
    assert (
        ex.mean_response_time
        < solve_exact("jsq", 1.0, 3, buffer=4, pools=pools).mean_response_time - 0.05
    )


@pytest.mark.slow
def test_pools_with_a_phase_type_law_infinite_buffer():
    pools = "0.5:2,0.5:1"
    ex = solve_exact("jsew", 0.7, 2, pools=pools, service="erlang:2", queue_bound=30)
    res = jq.simulate(
        "jsew", 0.7, 2, pools=pools, service="erlang:2", replicas=16, steps=100_000, seed=4
    )
    for name in ("mean_response_time", "waiting_probability"):
        est, value = getattr(res, name), getattr(ex, name)
        assert abs(est.mean - value) <= tolerance(est, FAMILY), (name, est, value)
    _quantiles_close(res, ex)


def _quantiles_close(res, ex):
    """The response-time quantiles: the class of the server an arrival joins
    is the policy's choice here, not a uniform draw within its level."""
    for q, est in res.response_quantiles.items():
        value = ex.response_quantiles[q]
        assert abs(est.mean - value) <= tolerance(est, FAMILY), (q, est, value)
    assert len(res.response_quantiles) == 4
