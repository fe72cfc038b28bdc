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
import numbers
import warnings
from typing import Any

import numpy as np

from jaxqueue.results.student import student_t_quantile

__all__ = ["Estimate", "estimate", "entries", "t_quantile_975", "json_number"]


@functools.lru_cache(maxsize=4096)
def t_quantile_975(dof: int) -> float:
    """The 97.5% quantile of Student's t with ``dof`` degrees of freedom (NaN for ``dof < 1``)."""
    return student_t_quantile(0.975, int(dof)) if dof >= 1 else math.nan


def _with_number(op: str):
    """An Estimate's arithmetic ``op`` with a plain number (int or float):
    with another Estimate a TypeError saying why, with anything else
    ``NotImplemented``."""

    def wrap(method):
        @functools.wraps(method)
        def with_number(self, other):
            if isinstance(other, Estimate):
                raise TypeError(_between_estimates(op))
            if not isinstance(other, numbers.Real) or isinstance(other, bool):
                return NotImplemented
            return method(self, other)

        return with_number

    return wrap


def _between_estimates(op: str) -> str:
    """Why ``Estimate op Estimate`` is refused, and what to do instead."""
    why = (
        f"Estimate {op} Estimate is not defined: the two estimates' errors may be correlated "
        "(replicas are keyed by position, so runs with one seed share their random streams), "
        "and the interval of a difference needs the paired replicas, which an Estimate does "
        "not keep"
    )
    if op in ("+", "-"):
        return (
            f"{why}: for the difference of two systems, run them as one paired comparison, "
            "jq.paired(models or loads, ...) (both on one random stream: each metric's "
            "difference with its paired 95% interval, e.g. "
            "jq.paired('pod', [0.9, 0.95], 100, d=2)['mean_response_time']), or combine "
            "the means (.mean) without an interval"
        )
    return (
        f"{why}: combine the means (.mean) without an interval (a difference of two "
        "systems with its interval: jq.paired)"
    )


def _pair(mean, half, spec: str) -> str:
    """``mean ± half`` with ``spec`` applied to both; an empty spec gives the
    half-width two significant digits and the mean as many decimals (at most 6)."""
    mean, half = float(mean), float(half)
    if spec:
        return f"{format(mean, spec)} ± {format(half, spec)}"
    if not math.isfinite(half) or half <= 0 or not math.isfinite(mean):
        return f"{mean:.6g} ± {half:g}"
    decimals = max(0, 1 - math.floor(math.log10(half)))
    if decimals > 6:  # a tiny half-width: significant digits, not a run of zeros
        return f"{mean:.3g} ± {half:.2g}"
    return f"{mean:.{decimals}f} ± {half:.{decimals}f}"


#: Entries shown of a long vector Estimate's text (that many at each end).
EDGE_ENTRIES = 3


def _nested(mean: np.ndarray, half: np.ndarray, spec: str) -> str:
    """A vector Estimate's text: ``[a ± b, c ± d, ...]`` along each axis, long
    axes shortened to their first and last :data:`EDGE_ENTRIES` entries."""
    if mean.ndim == 0:
        return _pair(mean, half, spec)
    index = list(range(len(mean)))
    if len(index) > 2 * EDGE_ENTRIES + 1:
        index = index[:EDGE_ENTRIES] + [None] + index[-EDGE_ENTRIES:]
    parts = ["..." if i is None else _nested(mean[i], half[i], spec) for i in index]
    return "[" + ", ".join(parts) + "]"


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
        replicas: where ``n`` counts batch means, the independent replicas
            whose batches they are (``n = replicas * batches``; an int, or per
            entry); ``None`` where ``n`` counts the replicas themselves, or
            where it was not recorded. :attr:`counts` says which in words.

    ``f"{est:.3f}"`` reads ``1.446 ± 0.025``; ``est.lo`` and ``est.hi`` are
    the interval's ends and ``float(est)`` the mean. Adding or multiplying by
    a plain number shifts or scales the estimate (the half-width by ``|c|``);
    arithmetic between two Estimates is not defined, as their errors may be
    correlated.
    """

    mean: Any
    ci95: Any
    n: Any = None
    replicas: Any = None

    @property
    def counts(self) -> str:
        """What :attr:`n` counts: ``"replicas"``, or ``"batch means of R replicas"``
        where the interval is from batch means (:attr:`replicas` given)."""
        if self.replicas is None:
            return "replicas"
        r = self.replicas if np.ndim(self.replicas) == 0 else np.asarray(self.replicas).tolist()
        return f"batch means of {r} replicas"

    @property
    def lo(self):
        """The interval's lower end, ``mean - ci95``."""
        return self.mean - self.ci95

    @property
    def hi(self):
        """The interval's upper end, ``mean + ci95``."""
        return self.mean + self.ci95

    def __float__(self) -> float:
        return float(self.mean)

    def __format__(self, spec: str) -> str:
        """``f"{est:.3f}"`` is ``1.446 ± 0.025``: the spec applies to the mean
        and the half-width alike (entry by entry for a vector); an empty spec
        is :meth:`__str__`."""
        if np.ndim(self.mean) == 0:
            return _pair(self.mean, self.ci95, spec)
        return _nested(np.asarray(self.mean), np.broadcast_to(self.ci95, np.shape(self.mean)), spec)

    def __str__(self) -> str:
        return format(self, "")

    def __repr__(self) -> str:
        r = self.replicas
        if np.ndim(self.mean) == 0:
            r = "" if r is None else f", replicas={r!r}"
            return f"Estimate(mean={self.mean!r}, ci95={self.ci95!r}, n={self.n!r}{r})"
        show = functools.partial(np.array2string, precision=6, threshold=8, edgeitems=3)
        n = self.n if np.ndim(self.n) == 0 else show(np.asarray(self.n))
        r = "" if r is None else f", replicas={r if np.ndim(r) == 0 else show(np.asarray(r))}"
        return (
            f"Estimate(shape={np.shape(self.mean)}, mean={show(np.asarray(self.mean))}, "
            f"ci95={show(np.asarray(self.ci95, np.float64))}, n={n}{r})"
        )

    def _with(self, mean, ci95) -> Estimate:
        """This estimate's counts with another mean and half-width."""
        return Estimate(mean, ci95, self.n, self.replicas)

    # Arithmetic with a plain number: a shift moves the mean and keeps the
    # half-width, a scale by c scales both (the half-width by |c|).
    __array_ufunc__ = None  # numpy defers to the methods below (np.float64(2) * est)

    @_with_number("+")
    def __add__(self, c) -> Estimate:
        return self._with(self.mean + c, self.ci95)

    @_with_number("+")
    def __radd__(self, c) -> Estimate:
        return self._with(c + self.mean, self.ci95)

    @_with_number("-")
    def __sub__(self, c) -> Estimate:
        return self._with(self.mean - c, self.ci95)

    @_with_number("-")
    def __rsub__(self, c) -> Estimate:
        return self._with(c - self.mean, self.ci95)

    @_with_number("*")
    def __mul__(self, c) -> Estimate:
        return self._with(self.mean * c, self.ci95 * abs(c))

    @_with_number("*")
    def __rmul__(self, c) -> Estimate:
        return self._with(c * self.mean, abs(c) * self.ci95)

    @_with_number("/")
    def __truediv__(self, c) -> Estimate:
        return self._with(self.mean / c, self.ci95 / abs(c))

    def __neg__(self) -> Estimate:
        return self._with(-self.mean, self.ci95)

    def to_dict(self) -> dict:
        """``{"mean": ..., "ci95": ..., "n": ...}`` with NaN as ``None`` (``n``
        an int, a list of ints where it is per entry, or ``None``), and
        ``"replicas"`` where ``n`` counts batch means: enough to rebuild the
        Estimate (:meth:`from_dict`) and test it against a value
        (:func:`jaxqueue.results.stats.tolerance` takes the dict as it is)."""
        n = self.n
        if n is not None:
            n = np.asarray(n).tolist()
        out = {"mean": json_number(self.mean), "ci95": json_number(self.ci95), "n": n}
        if self.replicas is not None:
            out["replicas"] = np.asarray(self.replicas).tolist()
        return out

    @classmethod
    def from_dict(cls, data) -> Estimate:
        """The Estimate of :meth:`to_dict`'s dict (``None`` entries back to NaN)."""
        if not (isinstance(data, dict) and {"mean", "ci95"} <= set(data)):
            raise TypeError(f"an Estimate's JSON is a dict with mean, ci95 and n; got {data!r}")

        def number(x):
            if isinstance(x, list):
                return np.array([math.nan if v is None else v for v in x], np.float64)
            return math.nan if x is None else float(x)

        n, r = data.get("n"), data.get("replicas")
        return cls(
            number(data["mean"]),
            number(data["ci95"]),
            np.asarray(n) if isinstance(n, list) else n,
            np.asarray(r) if isinstance(r, list) else r,
        )

    def to_json(self) -> dict:
        """:meth:`to_dict` under its older name."""
        return self.to_dict()

    @classmethod
    def from_json(cls, data) -> Estimate:
        """:meth:`from_dict` under its older name."""
        return cls.from_dict(data)


def entries(value) -> list:
    """A vector value's entries along its first axis: for an :class:`Estimate`
    one Estimate each (with its own ``n`` where ``n`` is per entry), else the
    plain values."""
    if not isinstance(value, Estimate):
        return list(np.atleast_1d(value))
    n = value.n if np.ndim(value.n) == 0 else np.asarray(value.n)
    r = value.replicas if np.ndim(value.replicas) == 0 else np.asarray(value.replicas)
    return [
        Estimate(m, h, n if np.ndim(n) == 0 else n[i], r if np.ndim(r) == 0 else r[i])
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
