"""Estimators with 95% confidence intervals across independent replicas.

Every replica runs the same number of uniformized steps, so a replica's time
average is its step average. Each metric is computed per replica and the
replicas are treated as independent samples: the estimate is their mean and
``ci95`` the half-width of the Student-t 95% interval.

Response times need no tagged tasks: service is exp(1) and FIFO, so a task
that finds ``k`` tasks at its server has an Erlang(``k + 1``, 1) response
time, and the histogram of ``k`` seen by accepted arrivals gives the mean,
the percentiles and the whole distribution as an Erlang mixture.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from jaxqueue.response import erlang_mixture_mean, erlang_mixture_quantile

__all__ = ["Estimate", "SimulationResult", "t_quantile_975", "estimate", "QUANTILES"]

#: Response-time percentiles reported by default.
QUANTILES = (0.5, 0.9, 0.99, 0.999)


def t_quantile_975(dof: int) -> float:
    """The 97.5% quantile of Student's t with ``dof`` degrees of freedom.

    Exact for 1 and 2 degrees of freedom, Cornish-Fisher expansion (error
    below 1e-4 from 3 on) otherwise.
    """
    if dof < 1:
        return math.nan
    if dof == 1:
        return 12.706204736174694
    if dof == 2:
        return 4.302652729749464
    z = 1.959963984540054
    v = float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A mean across replicas and the half-width of its 95% confidence interval.

    ``mean`` and ``ci95`` are floats, or 1-D arrays for vector metrics such as
    the tail. ``ci95`` is NaN with a single replica.
    """

    mean: Any
    ci95: Any

    def to_json(self):
        conv = lambda x: _json_number(x)  # noqa: E731
        return {"mean": conv(self.mean), "ci95": conv(self.ci95)}


def _json_number(x):
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_json_number(v) for v in np.asarray(x).tolist()]
    x = float(x)
    return None if math.isnan(x) else x


def estimate(samples, axis: int = 0) -> Estimate:
    """Mean and 95% CI half-width of per-replica samples along ``axis``.

    Replicas whose sample is NaN (e.g. a ratio with no arrivals) are left out.
    """
    x = np.asarray(samples, np.float64)
    count = np.sum(~np.isnan(x), axis=axis)
    mean = np.nanmean(x, axis=axis) if x.size else np.nan
    if np.all(count > 1):
        sd = np.nanstd(x, axis=axis, ddof=1)
        tq = np.vectorize(t_quantile_975)(count - 1)
        half = tq * sd / np.sqrt(count)
    else:
        half = np.full_like(np.asarray(mean, np.float64), np.nan)
    if np.ndim(mean) == 0:
        return Estimate(float(mean), float(half))
    return Estimate(np.asarray(mean), np.asarray(half))


@dataclasses.dataclass(frozen=True)
class SimulationResult:
    """What one simulated configuration measured.

    Attributes:
        tail: s_i, the time-average fraction of servers with >= i tasks (i = 0..levels).
        occupancy: fraction of servers with exactly k tasks.
        mean_queue_length: mean tasks per server (sum_{i>=1} s_i).
        mean_response_time: mean response time of accepted tasks.
        waiting_probability: probability an accepted task finds its server busy.
        blocking_probability: probability an arrival is blocked (finite buffers).
        response_quantiles: {q: Estimate} for q in :data:`QUANTILES`.
        arrival_seen: distribution of the tasks found by accepted arrivals;
            the response-time law is the Erlang mixture with these weights.
        p0: fraction of empty I-queues (JIQ family, else None).
        iqueue_distribution: fraction of I-queues holding exactly j servers
            (JIQ family with several dispatchers, else None).
        join_rate, delete_rate, probe_rate: messages per server per unit time.
        stale_fraction: JIQ-Original: fraction of arrivals sent to a listed
            server that was no longer idle (else None).
        overflow: arrivals lost at the level bound (infinite buffers; should be 0).
        iq_overflow: idle servers that found their I-queue at its bound.
        settings: the settings and versions that produced the result.
    """

    tail: Estimate
    occupancy: Estimate
    mean_queue_length: Estimate
    mean_response_time: Estimate
    waiting_probability: Estimate
    blocking_probability: Estimate
    response_quantiles: dict
    arrival_seen: Estimate
    p0: Estimate | None
    iqueue_distribution: Estimate | None
    join_rate: Estimate
    delete_rate: Estimate
    probe_rate: Estimate
    stale_fraction: Estimate | None
    overflow: int
    iq_overflow: int
    settings: dict

    def scalar_metrics(self) -> dict[str, Estimate]:
        """The scalar metrics by name (percentiles as ``response_p50`` etc.)."""
        out = {
            name: getattr(self, name)
            for name in (
                "mean_queue_length", "mean_response_time", "waiting_probability",
                "blocking_probability", "join_rate", "delete_rate", "probe_rate",
            )
        }  # fmt: skip
        for q, est in self.response_quantiles.items():
            out[_qname(q)] = est
        if self.p0 is not None:
            out["p0"] = self.p0
        if self.stale_fraction is not None:
            out["stale_fraction"] = self.stale_fraction
        return out

    def to_dict(self) -> dict:
        """A JSON-serialisable dict: each metric as ``{"mean", "ci95"}``."""
        out: dict[str, Any] = {k: v.to_json() for k, v in self.scalar_metrics().items()}
        out["p0"] = self.p0.to_json() if self.p0 is not None else None
        out["stale_fraction"] = (
            self.stale_fraction.to_json() if self.stale_fraction is not None else None
        )
        out["tail"] = self.tail.to_json()
        out["occupancy"] = self.occupancy.to_json()
        out["arrival_seen"] = self.arrival_seen.to_json()
        out["response_quantiles"] = {
            str(q): est.to_json() for q, est in self.response_quantiles.items()
        }
        out["iqueue_distribution"] = (
            self.iqueue_distribution.to_json() if self.iqueue_distribution is not None else None
        )
        out["overflow"] = self.overflow
        out["iq_overflow"] = self.iq_overflow
        out["settings"] = self.settings
        return out

    def records(self) -> list[dict]:
        """A flat table: one row per metric (and per index for vector metrics)."""
        base = {
            k: self.settings[k]
            for k in ("policy", "n_servers", "n_dispatchers", "load", "buffer")
        }
        rows = []
        for name, est in self.scalar_metrics().items():
            rows.append({**base, "metric": name, "index": None, "mean": est.mean, "ci95": est.ci95})
        for name in ("tail", "occupancy", "iqueue_distribution"):
            est = getattr(self, name)
            if est is None:
                continue
            for i, (m, h) in enumerate(zip(np.atleast_1d(est.mean), np.atleast_1d(est.ci95))):
                rows.append({**base, "metric": name, "index": i, "mean": float(m), "ci95": float(h)})
        return rows

    def to_frame(self):
        """The :meth:`records` as a pandas DataFrame (needs pandas)."""
        try:
            import pandas as pd
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError("to_frame needs pandas: pip install pandas") from err
        return pd.DataFrame(self.records())


def _qname(q: float) -> str:
    return "response_p" + f"{100 * q:g}".replace(".", "_")


def from_stats(stats: dict[str, np.ndarray], load: np.ndarray, uses_iqueues: bool,
               single_dispatcher: bool, settings: dict, stale: bool = False,
               ) -> SimulationResult:  # fmt: skip
    """Turn per-replica running sums (numpy, leading replica axis) into a result.

    Args:
        stats: the fields of :class:`jaxqueue.engine.Stats` as numpy arrays.
        load: float ``(R,)`` the replicas' lambda.
        uses_iqueues: whether the policy keeps I-queues.
        single_dispatcher: only ``p0`` is measured of the I-queues (exchangeable
            policies with ``M = 1``, whose one I-queue holds every idle server).
        stale: report the fraction of stale picks (JIQ-Original).
        settings: recorded with the result.
    """
    steps = stats["steps"].astype(np.float64)
    tail = (stats["tail_sum"].astype(np.float64) - stats["tail_comp"]) / steps[:, None]
    occupancy = tail - np.concatenate([tail[:, 1:], np.zeros_like(tail[:, :1])], axis=1)
    seen = stats["seen"].astype(np.float64)
    accepted = seen.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        seen_dist = seen / accepted[:, None]
        mean_T = erlang_mixture_mean(seen)
        wait = 1.0 - seen_dist[:, 0]
        blocking = stats["blocked"] / stats["arrivals"].astype(np.float64)
    # messages per server per unit time: count / (N * time), time = steps / (N (1 + lambda))
    per_time = (1.0 + load) / steps
    quantiles = {}
    qs = np.array(QUANTILES)
    qvals = erlang_mixture_quantile(seen, qs)  # (R, len(qs))
    for j, q in enumerate(QUANTILES):
        quantiles[q] = estimate(qvals[:, j])
    p0 = iq_dist = None
    if uses_iqueues:
        iq_tail = (stats["iq_sum"].astype(np.float64) - stats["iq_comp"]) / steps[:, None]
        p0 = estimate(1.0 - iq_tail[:, 1])
        if not single_dispatcher:
            iq_occ = iq_tail - np.concatenate(
                [iq_tail[:, 1:], np.zeros_like(iq_tail[:, :1])], axis=1
            )
            iq_dist = estimate(iq_occ)
    return SimulationResult(
        tail=estimate(tail),
        occupancy=estimate(occupancy),
        mean_queue_length=estimate(tail[:, 1:].sum(axis=1)),
        mean_response_time=estimate(mean_T),
        waiting_probability=estimate(wait),
        blocking_probability=estimate(blocking),
        response_quantiles=quantiles,
        arrival_seen=estimate(seen_dist),
        p0=p0,
        iqueue_distribution=iq_dist,
        join_rate=estimate(stats["joins"] * per_time),
        delete_rate=estimate(stats["deletes"] * per_time),
        probe_rate=estimate(stats["probes"] * per_time),
        stale_fraction=estimate(stats["stale"] / stats["arrivals"].astype(np.float64))
        if stale
        else None,
        overflow=int(stats["overflow"].sum()),
        iq_overflow=int(stats["iq_overflow"].sum()),
        settings=settings,
    )
