"""Estimates with 95% confidence intervals across independent replicas.

Each metric is computed per replica and the replicas are treated as
independent samples: the estimate is their mean and ``ci95`` the half-width
of the two-sided Student-t 95% interval. To compare an estimate with a known
value use :func:`jaxqueue.results.stats.tolerance`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any

import numpy as np

from jaxqueue.results.student import student_t_quantile

__all__ = ["Estimate", "estimate", "entries", "t_quantile_975", "json_number"]


@functools.lru_cache(maxsize=4096)
def t_quantile_975(dof: int) -> float:
    """The 97.5% quantile of Student's t with ``dof`` degrees of freedom (NaN for ``dof < 1``)."""
    return student_t_quantile(0.975, int(dof)) if dof >= 1 else math.nan


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A mean across replicas and the half-width of its 95% confidence interval.

    Attributes:
        mean: float, or a 1-D array for vector metrics such as the tail.
        ci95: the half-width, of the same shape; NaN with a single replica.
        n: the number of samples behind the interval, whose t quantile has
            ``n - 1`` degrees of freedom: the replicas (an int, or per entry
            where replicas with no sample were left out), or replicas times
            batches for an interval from batch means
            (:func:`jaxqueue.results.simulation.batch_means`).
    """

    mean: Any
    ci95: Any
    n: Any = None

    def to_json(self) -> dict:
        """``{"mean": ..., "ci95": ..., "n": ...}`` with NaN as ``None`` (``n``
        an int, a list of ints where it is per entry, or ``None``): enough to
        rebuild the Estimate (:meth:`from_json`) and test it against a value
        (:func:`jaxqueue.results.stats.tolerance` takes the dict as it is)."""
        n = self.n
        if n is not None:
            n = np.asarray(n).tolist()
        return {"mean": json_number(self.mean), "ci95": json_number(self.ci95), "n": n}

    @classmethod
    def from_json(cls, data) -> Estimate:
        """The Estimate of :meth:`to_json`'s dict (``None`` entries back to NaN)."""
        if not (isinstance(data, dict) and {"mean", "ci95"} <= set(data)):
            raise TypeError(f"an Estimate's JSON is a dict with mean, ci95 and n; got {data!r}")

        def number(x):
            if isinstance(x, list):
                return np.array([math.nan if v is None else v for v in x], np.float64)
            return math.nan if x is None else float(x)

        n = data.get("n")
        return cls(
            number(data["mean"]), number(data["ci95"]), np.asarray(n) if isinstance(n, list) else n
        )


def entries(value) -> list:
    """A vector value's entries along its first axis: for an :class:`Estimate`
    one Estimate each (with its own ``n`` where ``n`` is per entry), else the
    plain values."""
    if not isinstance(value, Estimate):
        return list(np.atleast_1d(value))
    n = value.n if np.ndim(value.n) == 0 else np.asarray(value.n)
    return [
        Estimate(m, h, n if np.ndim(n) == 0 else n[i])
        for i, (m, h) in enumerate(zip(np.atleast_1d(value.mean), np.atleast_1d(value.ci95)))
    ]


def json_number(x):
    """A float, or a nested list of floats, with NaN written as ``None`` (``None`` stays ``None``)."""
    if x is None:
        return None
    if isinstance(x, (list, tuple, np.ndarray)):
        return [json_number(v) for v in np.asarray(x).tolist()]
    x = float(x)
    return None if math.isnan(x) else x


def estimate(samples, axis: int = 0) -> Estimate:
    """Mean and 95% CI half-width of per-replica samples along ``axis``.

    Replicas whose sample is NaN (e.g. a ratio with no arrivals) are left out.
    """
    x = np.asarray(samples, np.float64)
    count = np.sum(~np.isnan(x), axis=axis)
    with warnings.catch_warnings():  # an entry with no sample is NaN, said by its n = 0
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(x, axis=axis)
    if np.all(count > 1):
        sd = np.nanstd(x, axis=axis, ddof=1)
        tq = np.vectorize(t_quantile_975)(count - 1)
        half = tq * sd / np.sqrt(count)
    else:
        half = np.full_like(np.asarray(mean, np.float64), np.nan)
    if np.ndim(mean) == 0:
        return Estimate(float(mean), float(half), int(count))
    n = int(count.flat[0]) if np.all(count == count.flat[0]) else np.asarray(count)
    return Estimate(np.asarray(mean), np.asarray(half), n)
