"""Metrics of server pools, the same for the simulation, the mean field and the exact chain.

With pools of servers of their own speeds (and laws), a user wants to know
how the policy shares the work out: each pool's share of the accepted tasks,
how busy its servers are, how long its tasks stay. Every source describes
the arrivals by pool the same way (``components``, as for the response-time
quantiles, :func:`jaxqueue.results.response.ph_mixture_quantiles`): pool
``i``'s share of the accepted arrivals, its law at its speed, and the law of
what its arrivals find there (``seen[..., 0]``: an idle server;
``seen_phase[..., k - 1, p]``: ``k >= 1`` tasks, the one in service in
phase ``p``). With the pools' occupancy (the fraction of each pool's servers
with ``k`` tasks) this gives :data:`~jaxqueue.results.schema.POOL_METRICS`,
and each pool's response-time quantiles.
"""

from __future__ import annotations

import numpy as np

from jaxqueue.core.system import SERVICE_RATE
from jaxqueue.results.response import ph_mixture_quantiles, ph_response_mean
from jaxqueue.results.schema import QUANTILES

__all__ = ["pool_metrics", "result_fields"]


def pool_metrics(components, occupancy) -> dict:
    """Each pool's metrics from what its arrivals find and its occupancy.

    Args:
        components: ``(share, law, seen, seen_phase)`` per pool: its share of
            the accepted arrivals (``(...)`` with sample axes), its service
            law at its speed, and the law (or counts) of what they find:
            ``seen`` ``(..., K)`` (only ``k = 0``, an idle server, is read)
            and ``seen_phase`` ``(..., K - 1, P)``.
        occupancy: ``(..., pools, levels + 1)``: row ``i`` the fraction of
            pool ``i``'s servers with exactly ``k`` tasks.

    Returns:
        ``{name: float64 array}`` for :data:`~jaxqueue.results.schema.POOL_METRICS`
        with a last axis over the pools (``(..., pools)``), ``pool_occupancy``
        (``occupancy`` as float64) and ``pool_response_quantiles``, ``(...,
        pools, Q)``: the response-time quantiles
        (:data:`~jaxqueue.results.schema.QUANTILES`) of the tasks sent to
        each pool. A pool that got no arrivals has NaN for the metrics of its
        arrivals.
    """
    occupancy = np.asarray(occupancy, np.float64)
    share, waiting, response, quantiles = [], [], [], []
    with np.errstate(invalid="ignore", divide="ignore"):
        for w, law, seen, seen_phase in components:
            idle = np.asarray(seen, np.float64)[..., 0]
            sent = idle + np.asarray(seen_phase, np.float64).sum(axis=(-2, -1))
            share.append(np.asarray(w, np.float64))
            waiting.append(np.where(sent > 0, 1.0 - idle / sent, np.nan))
            response.append(ph_response_mean(law, seen, seen_phase) / SERVICE_RATE)
            alone = [((sent > 0).astype(np.float64), law, seen, seen_phase)]  # this pool's law
            quantiles.append(ph_mixture_quantiles(alone, np.array(QUANTILES)) / SERVICE_RATE)
    stack = lambda xs, axis=-1: np.stack(np.broadcast_arrays(*xs), axis=axis)  # noqa: E731
    return {
        "pool_response_quantiles": stack(quantiles, -2),
        "pool_arrival_share": stack(share),
        "pool_utilization": 1.0 - occupancy[..., 0],
        "pool_mean_queue_length": occupancy @ np.arange(occupancy.shape[-1], dtype=np.float64),
        "pool_mean_response_time": stack(response),
        "pool_waiting_probability": stack(waiting),
        "pool_occupancy": occupancy,
    }


def result_fields(metrics: dict) -> dict:
    """:func:`pool_metrics` of one point (no sample axes) as a result's fields:
    ``pool_response_quantiles`` as ``{q: value per pool}``."""
    out = dict(metrics)
    table = out.pop("pool_response_quantiles")
    out["pool_response_quantiles"] = {q: table[:, j] for j, q in enumerate(QUANTILES)}
    return out
