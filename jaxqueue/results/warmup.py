"""Warm-up diagnostics: is the measured window free of the start's transient?

The drift between the halves of the window's batch means of the mean queue
length decides; MSER's truncation point is reported beside it
(docs/simulation.md, "Warm-up").
"""

from __future__ import annotations

import math

import numpy as np

from jaxqueue.results.student import student_t_quantile

__all__ = ["mser_truncation", "half_drift", "diagnose", "WarmupWarning", "failure_message"]


class WarmupWarning(UserWarning):
    """A run's warm-up diagnostic failed: its estimates may carry the start's bias.

    Make it an error with ``warnings.simplefilter("error", jaxqueue.WarmupWarning)``."""


def mser_truncation(series) -> int:
    """MSER's truncation point ``d*`` in ``0 .. len(series) // 2`` (in batches)."""
    y = np.asarray(series, np.float64)
    n = y.size
    if n < 2:
        return 0
    best, best_d = math.inf, 0
    for d in range(n // 2 + 1):
        rest = y[d:]
        value = float(((rest - rest.mean()) ** 2).sum()) / (n - d) ** 2
        if value < best - 1e-15 * abs(best if math.isfinite(best) else 0.0):
            best, best_d = value, d
    return best_d


def _detrended(h: np.ndarray) -> np.ndarray:
    x = np.arange(h.size) - (h.size - 1) / 2.0
    slope = float((x * (h - h.mean())).sum() / (x * x).sum())
    return h - h.mean() - slope * x


def half_drift(series) -> tuple[float, float]:
    """Second-half mean minus first-half mean, and the half-width of its 99% interval.

    The noise is measured on the residuals of a straight line fitted to each
    half (so that a trend, the thing looked for, does not pass for noise):
    their variance over ``B - 4`` degrees of freedom, scaled by
    ``(1 + rho) / (1 - rho)`` where their lag-1 correlation ``rho`` is
    positive (capped at 0.9; the variance factor of an AR(1) series).
    """
    y = np.asarray(series, np.float64)
    n = y.size
    if n < 6:
        return math.nan, math.nan
    a, b = y[: n // 2], y[n - n // 2 :]
    ra, rb = _detrended(a), _detrended(b)
    ss = float((ra**2).sum() + (rb**2).sum())
    dof = a.size + b.size - 4
    rho = float((ra[:-1] * ra[1:]).sum() + (rb[:-1] * rb[1:]).sum()) / ss if ss > 0 else 0.0
    rho = min(max(rho, 0.0), 0.9)
    se = math.sqrt(ss / dof * (1.0 / a.size + 1.0 / b.size) * (1.0 + rho) / (1.0 - rho))
    return float(b.mean() - a.mean()), student_t_quantile(0.995, dof) * se


def diagnose(series, metric: str = "mean_queue_length") -> dict:
    """The warm-up diagnostic of a window's batch series (see the module docstring).

    Returns:
        ``{"metric", "batches", "mser_truncation", "half_drift",
        "half_drift_ci99", "passed"}``; with fewer than 6 batches nothing can
        be judged and ``passed`` is ``None``.
    """
    y = np.asarray(series, np.float64)
    n = int(y.size)
    d_star = mser_truncation(y)
    drift, ci = half_drift(y)
    if n < 6:
        passed = None
    else:
        # the verdict is the half-drift test's; MSER's truncation is reported for
        # information (at the end of its range it fires on 2.6% of stationary
        # windows and adds almost no power: docs/simulation.md)
        passed = bool(abs(drift) <= ci)
    return {
        "metric": metric,
        "batches": n,
        "mser_truncation": d_star,
        "half_drift": None if math.isnan(drift) else drift,
        "half_drift_ci99": None if math.isnan(ci) else ci,
        "passed": passed,
    }


#: How :func:`failure_message` names what to change: the Python keywords or
#: the command line's flags (the warm-up, the start, the automatic warm-up,
#: the window).
SPELLINGS = {
    "python": ("warmup= or warmup_time=", 'init="mean-field"', 'warmup="auto"', "steps= or time="),
    "cli": ("--warmup or --warmup-time", "--init mean-field", "--warmup auto", "--steps or --time"),
}


def failure_message(
    diagnostic, load, n_servers=None, spelling: str = "python", init=None
) -> str | None:
    """What to say of a failed warm-up diagnostic (:func:`diagnose`'s dict,
    with the run's ``auto`` and ``extensions``), with advice; ``None`` where
    it passed or could not judge.

    ``spelling`` names the settings as keywords (``"python"``) or flags
    (``"cli"``), :data:`SPELLINGS`. ``init`` is the run's start as it ran
    (``settings["init"]``): a mean-field start is not advised to one that
    started there.
    """
    if not diagnostic or diagnostic.get("passed") is not False:
        return None
    longer, mean_field, auto, window = SPELLINGS[spelling]
    where = f"load {load:g}" + ("" if n_servers is None else f", N={n_servers}")
    detail = f"MSER truncation {diagnostic['mser_truncation']} of {diagnostic['batches']} batches"
    if diagnostic.get("half_drift") is not None:
        detail += (
            f", half drift {diagnostic['half_drift']:.3g} "
            f"± {diagnostic['half_drift_ci99']:.2g} (99%)"
        )
    started_empty = init != "mean-field"
    if diagnostic.get("auto"):
        start = f", or start from the mean field ({mean_field})" if started_empty else ""
        return (
            f"the warm-up diagnostic still fails at {where} after {auto} extended the warm-up "
            f"{diagnostic.get('extensions', 0)} times ({detail}): the estimates may carry the "
            f"start's bias; lengthen the warm-up ({longer}) or the window ({window}){start}"
        )
    if started_empty:
        advice = (
            f"lengthen the warm-up ({longer}), start from the mean field ({mean_field}), "
            f"or let {auto} extend it until the diagnostic passes"
        )
    else:
        advice = (
            f"lengthen the warm-up ({longer}) or the window ({window}), or let {auto} "
            "extend the warm-up until the diagnostic passes"
        )
    return (
        f"the warm-up diagnostic failed at {where} ({detail}): the estimates may carry the "
        f"start's bias; {advice}"
    )
