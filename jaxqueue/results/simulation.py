"""Simulation results: per-replica running sums turned into estimates with 95% intervals.

A replica's time average is its step average; response times come from what
accepted arrivals found at their server, as Erlang or phase-type mixtures
(docs/simulation.md, "Response times without tagged tasks", and by pool,
"Service laws and server pools").
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import ClassVar, NamedTuple

import numpy as np

from jaxqueue.core.system import SERVICE_RATE, event_rate
from jaxqueue.results.estimates import Estimate, estimate, t_quantile_975
from jaxqueue.results.pools import pool_metrics
from jaxqueue.results.response import (
    erlang_mixture_mean,
    erlang_mixture_quantile,
    ph_mixture_quantiles,
    ph_response_mean,
)
from jaxqueue.results.schema import POOL_METRICS, QUANTILES, Result

__all__ = [
    "SimulationResult",
    "LoadSums",
    "samples",
    "from_stats",
    "metric_samples",
    "batch_samples",
    "class_response_quantiles",
    "pool_metric_samples",
    "batch_means",
    "user_metric_samples",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimulationResult(Result):
    """What one simulated configuration measured (metrics are Estimates).

    ``settings`` holds the policy, its options, ``n_servers``,
    ``n_dispatchers``, ``ratio``, ``load``, ``buffer``, the level bounds,
    ``replicas``, ``steps`` and ``warmup`` (and in time units), ``seed``, the
    start, the devices, the wall time and the versions. ``diagnostics`` holds
    ``overflow`` (arrivals that found a queue at the level bound; 0 for a
    valid run with infinite buffers), ``iq_overflow`` (idle servers that
    found their I-queue at its bound), ``interval`` (``"replicas"`` or
    ``"batch-means"``, with ``batches``, ``lag1_correlation`` and
    ``widened`` for the latter) and ``warmup_diagnostic`` (the diagnostic of
    :mod:`jaxqueue.results.warmup`).
    """

    source: ClassVar[str] = "simulation"


def _occupancy(tail: np.ndarray) -> np.ndarray:
    return tail - np.concatenate([tail[..., 1:], np.zeros_like(tail[..., :1])], axis=-1)


def metric_samples(
    sums: dict,
    load: np.ndarray,
    policy,
    single_dispatcher: bool,
    rate=None,
    step_rate=None,
    laws=None,
    fractions=None,
    metrics=(),
) -> dict:
    """Each metric of a set of windows (replicas, or replicas' batches).

    Args:
        sums: a window's sums with a leading sample axis
            (:meth:`jaxqueue.sim.totals.Totals.sums`): ``steps``, ``tail``
            (``sum_t tail_t / N``), ``iq``, ``seen`` and the counters.
        load: float ``(S,)``, each sample's lambda.
        policy: the Policy simulated (which metrics apply comes from it).
        single_dispatcher: only ``p0`` is measured of the I-queues (exchangeable
            policies with ``M = 1``, whose one I-queue holds every idle server).
        rate: with server classes (phase-type service, pools), their
            uniformization rate of service (:attr:`System.service_rate`);
            ``None``: identical servers with exponential service.
        step_rate: the steps counted in ``steps`` per server and unit time
            (:meth:`System.step_rate`; a trace's service candidates: the
            service rate); default ``lambda + rate``.
        laws: with server classes, ``(law, base)`` per pool
            (:func:`class_response_quantiles`), and ``sums`` holds
            ``seen_class``.
        fractions: with pools, each pool's share of the servers: the pools'
            metrics are reported (:func:`pool_metric_samples`; ``sums`` also
            holds ``sampled_class``); ``None``: no pools.
        metrics: the user metrics' result names, ``(time average, per arrival)``
            pairs (``sums`` holds their ``user`` sums): reported in ``user_metrics``.

    Returns:
        ``{metric: float64 array}`` with the sample axis first (metrics that
        do not apply are left out); ``response_quantiles`` is ``(S, Q)``,
        the pool metrics ``(S, pools)`` (:func:`pool_metric_samples`).
    """
    steps = np.asarray(sums["steps"], np.float64)
    tail = sums["tail"] / steps[:, None]
    seen = np.asarray(sums["seen"], np.float64)
    accepted = seen.sum(axis=1)
    arrivals = np.asarray(sums["arrivals"], np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        seen_dist = seen / accepted[:, None]
        out = {
            "tail": tail,
            "occupancy": _occupancy(tail),
            "mean_queue_length": tail[:, 1:].sum(axis=1),
            "mean_response_time": erlang_mixture_mean(seen) / SERVICE_RATE,
            "waiting_probability": 1.0 - seen_dist[:, 0],
            "blocking_probability": sums["blocked"] / arrivals,
            # every arrival that did not find an idle server: blocked ones found a full one
            "busy_routing_probability": 1.0 - seen[:, 0] / arrivals,
            "arrival_seen": seen_dist,
        }
        if rate is None:
            out["response_quantiles"] = (
                erlang_mixture_quantile(seen, np.array(QUANTILES)) / SERVICE_RATE
            )
        # messages per server per unit time: count / (N * time), time = steps / (N (lambda + mu))
        if step_rate is None:
            step_rate = event_rate(load, SERVICE_RATE if rate is None else rate)
        per_time = step_rate / steps
        if rate is not None:  # the mean and quantiles of the mixture over what arrivals found
            out["mean_response_time"] = class_response_mean(sums["seen_class"], laws)
            out["response_quantiles"] = class_response_quantiles(sums["seen_class"], laws)
        out.update(
            join_rate=sums["joins"] * per_time,
            delete_rate=sums["deletes"] * per_time,
            probe_rate=sums["probes"] * per_time,
        )
        if policy.uses_iqueues:
            iq_tail = sums["iq"] / steps[:, None]
            out["p0"] = 1.0 - iq_tail[:, 1]
            if not single_dispatcher:
                out["iqueue_distribution"] = _occupancy(iq_tail)
        if policy.stale_picks:
            out["stale_fraction"] = sums["stale"] / arrivals
    if fractions is not None:
        out.update(pool_metric_samples(sums["seen_class"], sums["sampled_class"], laws, fractions))
    out.update(user_metric_samples(sums, metrics))
    return out


def batch_samples(*args, **kwargs) -> dict:
    """:func:`metric_samples` of the batches, without a second
    :class:`~jaxqueue.core.user_metrics.UserMetricWarning`: a user metric not
    finite in a batch is not finite over the whole window, which warned."""
    from jaxqueue.core.user_metrics import UserMetricWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserMetricWarning)
        return metric_samples(*args, **kwargs)


def user_metric_samples(sums: dict, metrics) -> dict:
    """Each user metric's time average (its sum over the steps counted in ``steps``)
    and average over accepted arrivals (NaN without arrivals), by the names of
    ``metrics``: ``(time average, per arrival)`` pairs, in the order of ``sums["user"]``.

    A metric that was infinite or undefined in a visited state has an infinite or NaN
    sum: every sample of that average is then that value (NaN where the sums disagree),
    not the mean of the samples left (those that never visited such a state), with a
    :class:`~jaxqueue.core.user_metrics.UserMetricWarning` that names the metric."""
    if not metrics:
        return {}
    user = np.asarray(sums["user"], np.float64)
    steps = np.asarray(sums["steps"], np.float64)
    accepted = np.asarray(sums["seen"], np.float64).sum(axis=1)
    out = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for i, (over_time, per_arrival) in enumerate(metrics):
            broken = {}
            for j, name, count in ((0, over_time, steps), (1, per_arrival, accepted)):
                total = user[:, j, i]
                out[name] = total / count
                bad = total[~np.isfinite(total)]  # (not a window without arrivals: 0 / 0)
                if bad.size:
                    value = bad[0] if np.all(bad == bad[0]) else np.nan  # inf, -inf or NaN
                    out[name] = np.full_like(out[name], value)
                    broken[name] = value
            if broken:
                # here, not at the top: the CLI's argument checks import this module without JAX
                from jaxqueue.core.user_metrics import UserMetricWarning, nonfinite_message

                message = nonfinite_message(over_time, broken)
                warnings.warn(message, UserMetricWarning, stacklevel=2)
    return out


def pool_metric_samples(seen_class, sampled_class, laws, fractions) -> dict:
    """Each pool's metrics (:func:`jaxqueue.results.pools.pool_metrics`)
    from where accepted arrivals found their servers and what the service
    candidates drew.

    Args:
        seen_class, sampled_class: ``(S, levels + 1, C)`` counts
            (:class:`~jaxqueue.sim.totals.Totals`).
        laws: ``(law, base)`` per pool (:func:`class_response_quantiles`).
        fractions: each pool's share of the servers.

    Returns:
        ``{metric: float64 array}``: ``(S, pools)``, ``pool_occupancy``
        ``(S, pools, levels + 1)`` and ``pool_response_quantiles`` ``(S,
        pools, Q)``; NaN where a sample has no arrivals (or none at that
        pool) or no candidates.
    """
    drawn = np.asarray(sampled_class, np.float64)
    candidates = drawn.sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        occupancy = np.stack(
            [
                drawn[:, :, base : base + law.n_phases].sum(axis=2)
                / (candidates[:, None] * fraction)
                for (law, base), fraction in zip(laws, fractions)
            ],
            axis=1,
        )
    return pool_metrics(_components(seen_class, laws), occupancy)


def class_response_mean(seen_class, laws) -> np.ndarray:
    """The mean response time ``(S,)`` of the accepted arrivals, from where
    they found their servers, with server classes: the mean of the mixture
    :func:`class_response_quantiles` inverts (NaN for a sample without
    arrivals)."""
    total = 0.0
    for share, law, seen, busy in _components(seen_class, laws):
        total = total + np.where(
            share > 0, share * np.nan_to_num(ph_response_mean(law, seen, busy)), 0.0
        )
    found = np.asarray(seen_class, np.float64).sum(axis=(1, 2))
    return np.where(found > 0, total, np.nan)


def class_response_quantiles(seen_class, laws) -> np.ndarray:
    """Response-time quantiles (:data:`~jaxqueue.results.schema.QUANTILES`)
    from where accepted arrivals found their servers, with server classes.

    Args:
        seen_class: ``(S, levels + 1, C)`` counts: accepted arrivals that
            found ``k`` tasks at a server of class ``c`` (an idle server is
            in its pool's first class).
        laws: ``(law, base)`` per pool: its service law at its speed
            (:func:`jaxqueue.core.service.pool_laws`) and its first class.

    Returns:
        float64 ``(S, Q)``, NaN for a sample without accepted arrivals.
    """
    return ph_mixture_quantiles(_components(seen_class, laws), np.array(QUANTILES)) / SERVICE_RATE


def _components(seen_class, laws) -> list:
    """``(share, law, seen, seen_phase)`` per pool (as
    :func:`~jaxqueue.results.response.ph_mixture_quantiles` takes them) from
    ``(S, levels + 1, C)`` counts of where accepted arrivals found their servers."""
    found = np.asarray(seen_class, np.float64)
    total = found.sum(axis=(1, 2))
    components = []
    for law, base in laws:
        mine = found[:, :, base : base + law.n_phases]
        first, busy = mine[:, 0, 0], mine[:, 1:, :]
        seen = np.concatenate([first[:, None], busy.sum(axis=2)], axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(total > 0, seen.sum(axis=1) / total, 0.0)
        components.append((share, law, seen, busy))
    return components


def batch_means(whole: np.ndarray, batches: np.ndarray):
    """An Estimate from each replica's whole window and its batch means.

    The point estimate is the mean over replicas of their whole-window value.
    Its variance comes from the ``R B`` batch values of ``R`` replicas of
    ``B`` batches taken as one sample: ``s^2`` is their variance about the
    grand mean over ``R B - 1`` degrees of freedom, and the half-width is
    ``t_0.975(R B - 1) * s / sqrt(R B)``. With one replica this is the
    classical batch-means interval; with several it combines the spread
    within replicas with the spread between them (replicas that disagree
    more than their batches do widen it). ``lag1`` is the lag-1 correlation
    of consecutive batches within the replicas, about the grand mean. Where it exceeds
    ``2 / sqrt(R B)`` (about twice its standard error when batches are
    independent), the batches are too short to be independent and the
    half-width is widened by ``sqrt((1 + lag1) / (1 - lag1))`` (the variance
    factor of an AR(1) series; ``lag1`` capped at 0.9).

    Args:
        whole: ``(R, ...)`` each replica's value over its whole window.
        batches: ``(R, B, ...)`` each replica's value over each batch.

    Returns:
        ``(Estimate, lag1, widened)``; the Estimate's ``n`` is ``R B``,
        so :func:`~jaxqueue.results.stats.tolerance` uses the right degrees of freedom.
    """
    x = np.asarray(batches, np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(np.asarray(whole, np.float64), axis=0)
        dev = x - np.nanmean(x, axis=(0, 1))
        count = (~np.isnan(x)).sum(axis=(0, 1))
        dof = count - 1
        ss = np.nansum(dev**2, axis=(0, 1))
        lag1 = np.nansum(dev[:, :-1] * dev[:, 1:], axis=(0, 1)) / ss
        se = np.sqrt(ss / dof / count)
        widened = np.nan_to_num(lag1) > 2.0 / np.sqrt(np.maximum(count, 1))
        rho = np.clip(np.nan_to_num(lag1), 0.0, 0.9)
        factor = np.where(widened, np.sqrt((1.0 + rho) / (1.0 - rho)), 1.0)
        tq = np.vectorize(t_quantile_975)(np.maximum(dof, 0))
        half = np.where(dof >= 1, tq * se * factor, np.nan)
    n = dof + 1
    if np.ndim(mean) == 0:
        return Estimate(float(mean), float(half), int(n)), float(lag1), bool(widened)
    n = int(n.flat[0]) if np.all(n == n.flat[0]) else np.asarray(n)
    return Estimate(np.asarray(mean), np.asarray(half), n), lag1, widened


def _estimates(whole: dict, batches: dict | None):
    """``{metric: Estimate}``, across replicas or from batch means, and the batch diagnostics."""
    out, diag = {}, None
    for name, x in whole.items():
        if batches is None:
            est = estimate(x)
        else:
            est, lag1, widened = batch_means(x, batches[name])
            if name == "mean_queue_length":
                diag = {
                    "batches": int(batches[name].shape[1]),
                    "lag1_correlation": lag1,
                    "widened": widened,
                }
        out[name] = est
    return out, diag


class LoadSums(NamedTuple):
    """One load's window sums and what turns them into metrics (:func:`samples`)."""

    sums: dict  # each replica's window sums, leading axis R (Totals.sums, and the overflows)
    batches: dict | None  # each replica's batches' sums (R, B, ...), or None (no batch means)
    load: np.ndarray  # float64 (R,): the replicas' lambda
    policy: object  # the Policy simulated
    single: bool  # one dispatcher of an exchangeable policy: only p0 of the I-queues
    keywords: dict  # rate, step_rate, laws, fractions, metrics of metric_samples


def samples(x: LoadSums) -> tuple[dict, dict | None]:
    """Each metric's per-replica values (:func:`metric_samples`, sample axis first),
    and per batch, ``(R, B, ...)``, with batch means (else None)."""
    whole = metric_samples(x.sums, x.load, x.policy, x.single, **x.keywords)
    if x.batches is None:
        return whole, None
    r, b = np.shape(x.batches["steps"])[:2]
    flat = {k: np.reshape(v, (r * b,) + np.shape(v)[2:]) for k, v in x.batches.items()}
    per = batch_samples(flat, np.repeat(x.load, b), x.policy, x.single, **x.keywords)
    return whole, {k: v.reshape((r, b) + v.shape[1:]) for k, v in per.items()}


def from_stats(x: LoadSums, settings: dict, diagnostics: dict | None = None) -> SimulationResult:
    """Turn one load's window sums (numpy, leading replica axis) into a result.

    Intervals are across replicas, or with ``x.batches`` from batch means
    (:func:`batch_means`), recorded in the diagnostics as ``interval =
    "batch-means"`` with ``batches`` and ``lag1_correlation``. ``settings``
    are recorded with the result, ``diagnostics`` (the warm-up diagnostic)
    with its own.
    """
    est, batch_diag = _estimates(*samples(x))
    quantiles = {}
    qe = est.pop("response_quantiles", None)
    if qe is not None:
        qn = np.broadcast_to(np.asarray(qe.n), (len(QUANTILES),))
        quantiles = {
            q: Estimate(float(qe.mean[j]), float(qe.ci95[j]), int(qn[j]))
            for j, q in enumerate(QUANTILES)
        }
    pool_quantiles = None
    pq = est.pop("pool_response_quantiles", None)
    if pq is not None:  # (pools, Q): a per-pool Estimate per quantile
        pn = np.broadcast_to(np.asarray(pq.n), pq.mean.shape)
        pool_quantiles = {
            q: Estimate(
                pq.mean[:, j],
                pq.ci95[:, j],
                int(pn[0, j]) if np.all(pn[:, j] == pn[0, j]) else pn[:, j],
            )
            for j, q in enumerate(QUANTILES)
        }
    metrics = x.keywords.get("metrics", ())
    user = {name: est.pop(name) for j in (0, 1) for name in (pair[j] for pair in metrics)}
    diag = {
        "overflow": int(np.sum(x.sums["overflow"])),
        "iq_overflow": int(np.sum(x.sums["iq_overflow"])),
        "interval": "replicas" if x.batches is None else "batch-means",
    }
    if batch_diag is not None:
        diag.update(batch_diag)
    diag.update(diagnostics or {})
    return SimulationResult(
        tail=est["tail"],
        occupancy=est["occupancy"],
        mean_queue_length=est["mean_queue_length"],
        mean_response_time=est["mean_response_time"],
        waiting_probability=est["waiting_probability"],
        blocking_probability=est["blocking_probability"],
        busy_routing_probability=est["busy_routing_probability"],
        response_quantiles=quantiles,
        arrival_seen=est["arrival_seen"],
        p0=est.get("p0"),
        iqueue_distribution=est.get("iqueue_distribution"),
        join_rate=est["join_rate"],
        delete_rate=est["delete_rate"],
        probe_rate=est["probe_rate"],
        stale_fraction=est.get("stale_fraction"),
        **{name: est.get(name) for name in POOL_METRICS + ("pool_occupancy",)},
        pool_response_quantiles=pool_quantiles,
        user_metrics=user,
        settings=settings,
        diagnostics=diag,
    )
