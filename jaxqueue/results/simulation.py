"""Simulation results: per-replica running sums turned into estimates with 95% intervals.

Every replica runs the same number of uniformized steps, so a replica's time
average is its step average. Response times need no tagged tasks: service is
exponential and FIFO, so a task that finds ``k`` tasks at its server has an
Erlang(``k + 1``, mu) response time, and the histogram of ``k`` seen by
accepted arrivals gives the mean, the percentiles and the whole law as an
Erlang mixture (:mod:`jaxqueue.results.response`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from jaxqueue.core.system import SERVICE_RATE, event_rate
from jaxqueue.results.estimates import estimate
from jaxqueue.results.response import erlang_mixture_mean, erlang_mixture_quantile
from jaxqueue.results.schema import QUANTILES, Result

__all__ = ["SimulationResult", "from_stats"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimulationResult(Result):
    """What one simulated configuration measured (metrics are Estimates).

    ``settings`` holds the policy, its options, ``n_servers``,
    ``n_dispatchers``, ``ratio``, ``load``, ``buffer``, the level bounds,
    ``replicas``, ``steps`` and ``warmup`` (and in time units), ``seed``, the
    start, the devices, the wall time and the versions. ``diagnostics`` holds
    ``overflow`` (arrivals that found a queue at the level bound; 0 for a
    valid run with infinite buffers) and ``iq_overflow`` (idle servers that
    found their I-queue at its bound).
    """

    source: ClassVar[str] = "simulation"


def _occupancy(tail: np.ndarray) -> np.ndarray:
    return tail - np.concatenate([tail[:, 1:], np.zeros_like(tail[:, :1])], axis=1)


def from_stats(stats: dict, load: np.ndarray, policy, single_dispatcher: bool,
               settings: dict) -> SimulationResult:  # fmt: skip
    """Turn per-replica running sums (numpy, leading replica axis) into a result.

    Args:
        stats: the fields of :class:`jaxqueue.sim.state.Stats` as numpy arrays.
        load: float ``(R,)`` the replicas' lambda.
        policy: the Policy simulated (which metrics apply comes from it).
        single_dispatcher: only ``p0`` is measured of the I-queues (exchangeable
            policies with ``M = 1``, whose one I-queue holds every idle server).
        settings: recorded with the result.
    """
    steps = stats["steps"].astype(np.float64)
    tail = (stats["tail_sum"].astype(np.float64) - stats["tail_comp"]) / steps[:, None]
    seen = stats["seen"].astype(np.float64)
    accepted = seen.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        seen_dist = seen / accepted[:, None]
        mean_t = erlang_mixture_mean(seen) / SERVICE_RATE
        wait = 1.0 - seen_dist[:, 0]
        blocking = stats["blocked"] / stats["arrivals"].astype(np.float64)
    # messages per server per unit time: count / (N * time), time = steps / (N (lambda + mu))
    per_time = event_rate(load) / steps
    qvals = erlang_mixture_quantile(seen, np.array(QUANTILES)) / SERVICE_RATE  # (R, Q)
    quantiles = {q: estimate(qvals[:, j]) for j, q in enumerate(QUANTILES)}
    p0 = iq_dist = None
    if policy.uses_iqueues:
        iq_tail = (stats["iq_sum"].astype(np.float64) - stats["iq_comp"]) / steps[:, None]
        p0 = estimate(1.0 - iq_tail[:, 1])
        if not single_dispatcher:
            iq_dist = estimate(_occupancy(iq_tail))
    stale = None
    if policy.stale_picks:
        stale = estimate(stats["stale"] / stats["arrivals"].astype(np.float64))
    return SimulationResult(
        tail=estimate(tail),
        occupancy=estimate(_occupancy(tail)),
        mean_queue_length=estimate(tail[:, 1:].sum(axis=1)),
        mean_response_time=estimate(mean_t),
        waiting_probability=estimate(wait),
        blocking_probability=estimate(blocking),
        response_quantiles=quantiles,
        arrival_seen=estimate(seen_dist),
        p0=p0,
        iqueue_distribution=iq_dist,
        join_rate=estimate(stats["joins"] * per_time),
        delete_rate=estimate(stats["deletes"] * per_time),
        probe_rate=estimate(stats["probes"] * per_time),
        stale_fraction=stale,
        settings=settings,
        diagnostics={
            "overflow": int(stats["overflow"].sum()),
            "iq_overflow": int(stats["iq_overflow"].sum()),
        },
    )
