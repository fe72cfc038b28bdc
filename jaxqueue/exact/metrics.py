"""The metrics of a solved exact chain: queue-length laws, I-queues, messages,
the response time (Little's law, checked against what arrivals find) and its
law, and the :class:`~jaxqueue.exact.result.ExactResult` in the package's time
unit (docs/exact.md).
"""

from __future__ import annotations

import numpy as np

from jaxqueue.core.service import pool_laws
from jaxqueue.core.system import SERVICE_RATE
from jaxqueue.core.versions import versions
from jaxqueue.exact.markov import DELETE, JOIN, LOST, N_FIXED_REWARDS, PROBE, STALE
from jaxqueue.exact.result import ExactResult
from jaxqueue.results.pools import pool_metrics, result_fields
from jaxqueue.results.response import (
    erlang_mixture_quantile,
    ph_mixture_quantiles,
    ph_response_mean,
    ph_response_quantiles,
)
from jaxqueue.results.schema import QUANTILES

__all__ = ["chain_metrics", "exact_result"]


def _occupancy(chain, decoded, pi, pools):
    """``(qs, occupancy, pool_occupancy)``: each state's queue lengths, the
    fraction of servers with ``k`` tasks, and per pool its servers' (or None)."""
    n, cap = chain.n, chain.cap
    if not chain.sparse_rewards:  # Chain
        qs = np.array([q for q, _ in decoded], dtype=np.int64)  # (S, N)
        counts = np.stack([(qs == k).sum(axis=1) for k in range(cap + 1)], axis=1)  # (S, K+1)
        occupancy = pi @ counts / n
    else:  # PhaseChain: server entries are (queue length, phase), with pools (pool, queue
        # length, phase); bounds run higher: no (S, K+1) array
        qs = np.array([chain.queue_lengths(q) for q, _ in decoded], dtype=np.int64)
        occupancy = np.bincount(qs.ravel(), weights=np.repeat(pi, n), minlength=cap + 1) / n
    if pools is None:
        return qs, occupancy, None
    # per pool: the fraction of its servers with exactly k tasks
    labels = np.array([chain.pool_labels(q) for q, _ in decoded], dtype=np.int64)
    weights = np.broadcast_to(pi[:, None], qs.shape)
    pool_occupancy = np.stack(
        [
            np.bincount(qs[labels == i], weights=weights[labels == i], minlength=cap + 1) / p.count
            for i, p in enumerate(pools)
        ]
    )
    return qs, occupancy, pool_occupancy


def _pasta_response(chain, ev, arrival_seen, accepted, law, pools):
    """``(t_pasta, seen_phase)``: the mean response time from what accepted
    arrivals find, and the joint law of what they find with the phase in
    service (``None`` with exp(1) service)."""
    cap = chain.cap
    if pools is not None:
        # Pools: as with phases (below), per pool, with the pool's law at its
        # speed; the law of (pool, k, p) seen by accepted arrivals.
        seen_phase = ev[chain.seen_phase_offset :].reshape(len(pools), cap, chain.n_phases)
        seen_phase = seen_phase / accepted
        t_pasta = sum(
            float(sp.sum()) * float(ph_response_mean(x, sp[:, 0], sp[1:, : x.n_phases]))
            for x, sp in zip(pool_laws(pools, law), seen_phase)
            if sp.sum() > 0
        )
        return t_pasta, seen_phase
    if law is None:
        # exp(1) service: a task that finds k tasks stays k + 1 mean services
        return float(np.arange(1, cap + 1) @ arrival_seen), None
    # Phase-type service: residual service from the phase in service, k - 1
    # full services, its own (docs/exact.md)
    seen_phase = ev[chain.seen_phase_offset :].reshape(cap - 1, law.n_phases) / accepted
    return float(ph_response_mean(law, arrival_seen, seen_phase)), seen_phase


def chain_metrics(chain, decoded, pi, rewards, lam, buffer, law=None, pools=None):
    """``(metrics, diagnostics)`` of a chain solved with queues bounded by
    ``chain.cap``, in the time unit of its rates.

    ``decoded``: each state's labelled representative (``chain.decode``);
    ``pi``: the stationary law; ``rewards``: the per-state event rates.
    ``law``: ``None`` for exp(1) service, else the phase-type law; then
    ``metrics`` also holds ``"_seen_phase"`` (for the response-time law,
    :func:`exact_result` takes it out), and with ``pools`` ``"_pool_occupancy"``.
    """
    n, m, cap = chain.n, chain.m, chain.cap
    qs, occupancy, pool_occupancy = _occupancy(chain, decoded, pi, pools)
    tail = np.cumsum(occupancy[::-1])[::-1]
    mean_q = float(np.arange(cap + 1) @ occupancy)

    ev = pi @ rewards  # expected event rates (rewards: an array, or SparseRewards with phases)
    arrival_rate = lam * n
    seen_rate = ev[N_FIXED_REWARDS : N_FIXED_REWARDS + cap]  # (PhaseChain: more follow)
    accepted = float(seen_rate.sum())
    arrival_seen = seen_rate / accepted  # k = 0..cap-1: an accepted arrival never finds cap
    lost = float(ev[LOST]) / arrival_rate
    t_little = n * mean_q / accepted
    t_pasta, seen_phase = _pasta_response(chain, ev, arrival_seen, accepted, law, pools)
    if abs(t_little - t_pasta) > 1e-6 * max(1.0, t_pasta):
        raise RuntimeError(
            f"Little's law ({t_little!r}) and PASTA ({t_pasta!r}) response times disagree"
        )

    if chain.listed:
        ls = np.array([l for _, l in decoded], dtype=np.int64)
        sizes = np.stack([(ls == j).sum(axis=1) for j in range(m)], axis=1)  # (S, M)
        hist = np.stack([(sizes == k).sum(axis=1) for k in range(n + 1)], axis=1) / m
        iq_dist = pi @ hist
        p0 = float(iq_dist[0])
    else:
        iq_dist = p0 = None

    at_bound = (qs == cap).any(axis=1)
    metrics = dict(
        tail=tail,
        occupancy=occupancy,
        arrival_seen=np.concatenate([arrival_seen, [0.0]]),
        iqueue_distribution=iq_dist,
        mean_queue_length=mean_q,
        mean_response_time=t_little,
        waiting_probability=float(1.0 - arrival_seen[0]),
        blocking_probability=lost if buffer is not None else 0.0,
        p0=p0,
        join_rate=float(ev[JOIN]) / n,
        delete_rate=float(ev[DELETE]) / n,
        probe_rate=float(ev[PROBE]) / n,
        stale_fraction=float(ev[STALE]) / arrival_rate,
    )
    if law is not None or pools is not None:
        metrics["_seen_phase"] = seen_phase
    diagnostics = dict(
        truncated_mass=float(pi @ at_bound) if buffer is None else 0.0,
        truncation_loss=lost if buffer is None else 0.0,
        n_states=len(decoded),
    )
    if pools is not None:
        metrics["_pool_occupancy"] = pool_occupancy
    return metrics, diagnostics


def exact_result(inputs, cap, symmetry, metrics, diagnostics):
    """The :class:`ExactResult` of a solved chain, in the package's time unit.

    ``inputs``: the :class:`~jaxqueue.exact.inputs.Inputs` of the solve;
    ``metrics`` and ``diagnostics``: :func:`chain_metrics`'s.
    """
    law, pools = inputs.law, inputs.pools
    seen = metrics["arrival_seen"]
    seen_phase = metrics.pop("_seen_phase", None)
    if pools is not None:
        components = [
            (float(sp.sum()), x, sp[:, 0], sp[1:, : x.n_phases])
            for x, sp in zip(pool_laws(pools, law), seen_phase)
        ]
        quantiles = ph_mixture_quantiles(components, QUANTILES) / SERVICE_RATE
        metrics.update(result_fields(pool_metrics(components, metrics.pop("_pool_occupancy"))))
    elif inputs.phases:
        quantiles = ph_response_quantiles(law, seen[:-1], seen_phase, QUANTILES) / SERVICE_RATE
    else:
        quantiles = erlang_mixture_quantile(seen, np.array(QUANTILES)) / SERVICE_RATE
    for name in ("join_rate", "delete_rate", "probe_rate"):
        metrics[name] = metrics[name] * SERVICE_RATE
    metrics["mean_response_time"] = metrics["mean_response_time"] / SERVICE_RATE
    if not inputs.policy.stale_picks:
        metrics["stale_fraction"] = None
    return ExactResult(
        **metrics,
        response_quantiles={q: float(t) for q, t in zip(QUANTILES, quantiles)},
        settings=_settings(inputs, cap, symmetry, len(metrics["tail"]) - 1),
        diagnostics=diagnostics,
    )


def _settings(inputs, cap, symmetry, levels):
    policy, n, m, buffer = inputs.policy, inputs.n, inputs.m, inputs.buffer
    settings = dict(
        policy=policy.name,
        policy_label=policy.label(),
        options=policy.options(),
        n_servers=n,
        n_dispatchers=m,
        ratio=n / m,
        load=inputs.load,
        buffer=buffer,
        levels=levels,
        queue_bound=None if buffer is not None else cap,
        symmetry=symmetry,
        rule=inputs.rule,
        versions=versions(),
    )
    if inputs.law is not None:
        settings["service"] = inputs.law.to_dict()
    if inputs.pools is not None:
        settings["pools"] = [
            {
                "servers": p.count,
                "speed": p.speed,
                "service": None if p.law is None else p.law.to_dict(),
            }
            for p in inputs.pools
        ]
    return settings
