"""Power-law exponents fitted across system sizes, with intervals from the points' own.

A metric measured at several N with 95% half-widths (a sweep's store rows)
is fitted as ``log y = a + b log x`` by weighted least squares; the exponent
``b`` gets a 95% interval from the points' intervals. The method:
docs/theory.md (Exponents fitted across N).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxqueue.results.estimates import t_quantile_975

__all__ = ["Slope", "power_law_fit", "positive_fit", "local_slopes", "store_series"]


@dataclasses.dataclass(frozen=True)
class Slope:
    """A fitted exponent ``b`` of ``y = e^a x^b``.

    Attributes:
        slope: ``b``; ci95: its 95% half-width from the points' intervals
            (``nan`` where it has none); intercept: ``a``.
        chi2: the weighted residual sum of squares, against ``dof = points - 2``:
            a ``chi2 / dof`` well above 1 says a pure power law does not fit
            within the points' intervals (a log factor, or N too small).
        points: how many points were fitted; replicas: the fewest replicas
            behind a point (its intervals' Student-t degrees of freedom + 1).
    """

    slope: float
    ci95: float
    intercept: float
    chi2: float
    dof: int
    points: int
    replicas: int | None

    def __str__(self) -> str:
        return f"{self.slope:.3f} ± {self.ci95:.3f}"


def power_law_fit(x, y, ci95=None, replicas=None) -> Slope:
    """The exponent of ``y`` against ``x`` (both positive), fitted in log-log space.

    With ``ci95`` (each point's 95% half-width) and ``replicas`` (the
    replicas behind each, or one count for all), each point is weighted by
    the inverse variance of ``log y``, ``(se / y)^-2`` with ``se`` the
    half-width over Student's ``t_{0.975}`` of its ``replicas - 1`` degrees of
    freedom (the delta method), and the exponent's half-width is that
    quantile (of the fewest replicas, a conservative choice) times its
    standard error ``(sum w (log x - mean)^2)^-1/2``. Without ``ci95`` it is
    ordinary least squares with the residuals' interval (Student-t with
    ``points - 2`` degrees of freedom; ``nan`` with two points).

    Raises:
        ValueError: fewer than two points, two equal ``x`` only, a ``x`` or
            ``y`` that is not positive (a zero estimate has no log), or
            ``ci95`` without ``replicas``.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2 or np.unique(x).size < 2:
        raise ValueError("a power-law fit needs two or more points at distinct x")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError(f"a power-law fit needs positive x and y, got x={x}, y={y}")
    lx, ly = np.log(x), np.log(y)
    if ci95 is None:
        weights, fewest = np.ones_like(lx), None
    else:
        if replicas is None:
            raise ValueError("intervals (ci95) need the replicas behind them (replicas)")
        counts = np.broadcast_to(np.asarray(replicas, dtype=np.int64), x.shape)
        fewest = int(counts.min())
        t = np.array([t_quantile_975(int(n) - 1) for n in counts])
        se = np.asarray(ci95, dtype=np.float64) / t / y
        if np.any(~np.isfinite(se)) or np.any(se <= 0):
            raise ValueError(f"each point needs a positive finite interval, got {ci95}")
        weights = se**-2
    centre = np.sum(weights * lx) / np.sum(weights)
    sxx = float(np.sum(weights * (lx - centre) ** 2))
    slope = float(np.sum(weights * (lx - centre) * ly) / sxx)
    intercept = float(np.sum(weights * (ly - slope * lx)) / np.sum(weights))
    chi2 = float(np.sum(weights * (ly - intercept - slope * lx) ** 2))
    dof = x.size - 2
    if ci95 is not None:
        half = t_quantile_975(fewest - 1) / math.sqrt(sxx)
    elif dof > 0:
        half = t_quantile_975(dof) * math.sqrt(chi2 / dof / sxx)
    else:
        half = math.nan
    return Slope(slope, float(half), intercept, chi2, dof, int(x.size), fewest)


def positive_fit(x, y, ci95, replicas) -> Slope | None:
    """:func:`power_law_fit` of the points with a positive estimate and a positive
    finite half-width (a zero estimate, as where no replica saw the event, has no
    log), or None with fewer than two of them at distinct ``x``."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ci95 = np.asarray(ci95, dtype=np.float64)
    keep = (y > 0) & (ci95 > 0) & np.isfinite(y) & np.isfinite(ci95)
    if np.unique(x[keep]).size < 2:
        return None
    counts = np.broadcast_to(np.asarray(replicas), x.shape)[keep]
    return power_law_fit(x[keep], y[keep], ci95[keep], counts)


def local_slopes(x, y, ci95=None, replicas=None) -> list[Slope]:
    """The exponent between each two consecutive points (sorted by ``x``)."""
    order = np.argsort(np.asarray(x, dtype=np.float64))
    x, y = np.asarray(x, dtype=np.float64)[order], np.asarray(y, dtype=np.float64)[order]
    half = None if ci95 is None else np.asarray(ci95, dtype=np.float64)[order]
    counts = None
    if replicas is not None:
        counts = np.broadcast_to(np.asarray(replicas), order.shape)[order]
    return [
        power_law_fit(
            x[i : i + 2],
            y[i : i + 2],
            None if half is None else half[i : i + 2],
            None if counts is None else counts[i : i + 2],
        )
        for i in range(x.size - 1)
    ]


def store_series(rows, metric: str, index=None, *, scale=None, **where) -> dict:
    """A store's rows (:meth:`~jaxqueue.studies.grids.store.Store.rows`) of one metric at
    ``k = index`` as ``{"x": N, "y", "ci95", "replicas"}`` arrays, sorted by N, for
    the points matching ``where`` (column = value).

    ``scale(row)`` multiplies each row's mean and half-width (e.g. by its N).
    """
    chosen = [
        r
        for r in rows
        if r["metric"] == metric
        and (index is None or float(r["k"]) == float(index))
        and all(_same(r[k], v) for k, v in where.items())
    ]
    chosen.sort(key=lambda r: r["n_servers"])
    factor = np.array([1.0 if scale is None else float(scale(r)) for r in chosen])
    return {
        "x": np.array([float(r["n_servers"]) for r in chosen]),
        "y": np.array([float(r["mean"]) for r in chosen]) * factor,
        "ci95": np.array([float(r["ci95"]) for r in chosen]) * factor,
        "replicas": np.array([int(r["replicas"]) for r in chosen]),
    }


def _same(value, wanted) -> bool:
    if isinstance(wanted, float) and value is not None:
        return math.isclose(float(value), wanted, rel_tol=1e-12)
    return value == wanted
