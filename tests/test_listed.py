"""JIQ-Original and JIQ-Threshold at large N (per-server state, jaxqueue.listed).

N = 1000, r = 10, lambda = 0.9, 8 replicas of 60 time units after 20 of
warm-up from the mean-field state, fixed seeds. Tolerances: the 95%
half-widths (combined in quadrature for two independent runs) scaled to a
family-wise 99.9% level over the 9 comparisons of this file (z = 3.87,
factor 1.97), plus a finite-N allowance of 10/N relative where a run is
compared with the mean field.
"""

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue import theory

N, M, LOAD = 1000, 100, 0.9
PER_TIME = N * (1 + LOAD)
F = 3.87 / 1.96
KW = dict(replicas=8, steps=int(60 * PER_TIME), warmup=int(20 * PER_TIME))


@pytest.fixture(scope="module")
def jiq_mean_field():
    return theory.mean_field("jiq", LOAD, N / M)


def test_threshold_zero_is_jiq_two_engines_and_the_mean_field(jiq_mean_field):
    mf = jiq_mean_field
    per_server = jq.simulate("jiq-threshold", N, M, LOAD, z=0, init=mf.occupancy, seed=1, **KW)
    occupancy = jq.simulate("jiq", N, M, LOAD, init=mf.occupancy, seed=2, **KW)
    for name in ("mean_response_time", "p0", "delete_rate", "join_rate"):
        a, b = getattr(per_server, name), getattr(occupancy, name)
        assert abs(a.mean - b.mean) <= F * np.hypot(a.ci95, b.ci95), (name, a, b)
    t = per_server.mean_response_time
    assert abs(t.mean - mf.mean_response_time) <= F * t.ci95 + 10 / N * mf.mean_response_time


def test_jiq_original_little_law_and_closeness_to_jiq(jiq_mean_field):
    res = jq.simulate("jiq-original", N, M, LOAD, init=jiq_mean_field.occupancy, seed=3, **KW)
    # two ways to the mean response time: the Erlang mixture of the queue
    # lengths seen by arrivals, and Little's law on the time-average queue
    little = res.mean_queue_length.mean / LOAD
    t = res.mean_response_time
    assert abs(t.mean - little) <= F * np.hypot(t.ci95, res.mean_queue_length.ci95 / LOAD)
    # stale picks happen, no delete requests are sent, and it stays close to JIQ (Wang et al., Fig. 8)
    assert 0 < res.stale_fraction.mean < 0.2 and res.delete_rate.mean == 0.0
    assert abs(t.mean / jiq_mean_field.mean_response_time - 1) < 0.1


def test_threshold_one_lists_exactly_the_servers_with_at_most_one_task(jiq_mean_field):
    res = jq.simulate("jiq-threshold", N, M, LOAD, z=1, init=jiq_mean_field.occupancy, seed=4,
                      **KW)  # fmt: skip
    # listed servers per dispatcher: the idle ones and those with one task,
    # r (1 - s_2) at every step, so also on average (up to float32 sums)
    iq = res.iqueue_distribution
    mean_size = np.arange(iq.mean.size) @ iq.mean
    want = (N / M) * (1 - res.tail.mean[2])
    assert abs(mean_size - want) <= 1e-4 * want
    # a pick can land on a server with one task, so tasks wait more often than
    # under JIQ at this load: P(wait) is well above JIQ's lambda p0 (0.434)
    wait = res.waiting_probability
    assert wait.mean - F * wait.ci95 > jiq_mean_field.waiting_probability
