"""Tolerances for comparing estimates with exact or limiting values (docs/statistics.md).

Each comparison is one of a family of two-sided Student-t tests at a stated
family-wise false-alarm rate (Bonferroni or Sidak; :mod:`jaxqueue.results.student`).
"""

from __future__ import annotations

import math

import numpy as np

from jaxqueue.results.estimates import Estimate
from jaxqueue.results.student import student_t_cdf, student_t_quantile

__all__ = [
    "student_t_cdf",
    "student_t_quantile",
    "comparison_level",
    "tolerance_factor",
    "tolerance",
    "within",
]


def comparison_level(alpha: float, family: int, correction: str = "bonferroni") -> float:
    """Two-sided level of each of ``family`` comparisons for a family-wise rate ``alpha``."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha} is out of range: need 0 < alpha < 1")
    if isinstance(family, bool) or not isinstance(family, (int, np.integer)) or family < 1:
        raise ValueError(f"family={family!r} is out of range: need an int >= 1")
    if correction == "bonferroni":
        return alpha / family
    if correction == "sidak":
        return -math.expm1(math.log1p(-alpha) / family)
    raise ValueError(f"correction={correction!r} is not valid: use 'bonferroni' or 'sidak'")


def tolerance_factor(
    replicas: int, family: int, alpha: float = 1e-3, correction: str = "bonferroni"
) -> float:
    """``t_{1-a/2}(n-1) / t_{0.975}(n-1)``: what multiplies a 95% half-width of ``replicas`` samples."""
    if replicas < 2:
        raise ValueError(f"replicas={replicas} is out of range: an interval needs replicas >= 2")
    a = comparison_level(alpha, family, correction)
    dof = replicas - 1
    return student_t_quantile(1.0 - a / 2.0, dof) / student_t_quantile(0.975, dof)


def tolerance(
    estimate, family: int, alpha: float = 1e-3, correction: str = "bonferroni", allowance=0.0
):
    """Largest tolerated ``|estimate.mean - value|`` for one of ``family`` two-sided comparisons.

    Args:
        estimate: an :class:`~jaxqueue.results.estimates.Estimate` (its ``n``
            is the number of replicas behind each entry; scalar or per entry),
            or its JSON dict (``{"mean", "ci95", "n"}``, as a result's
            ``to_dict()`` writes it).
        family: the number of comparisons sharing the family-wise rate.
        alpha: the family-wise false-alarm rate (default 0.001).
        correction: ``"bonferroni"`` or ``"sidak"``.
        allowance: added to the statistical tolerance (a documented bias
            allowance such as a mean field's finite-N error); scalar or array.

    Returns:
        A float, or an array of the estimate's shape.
    """
    estimate = _as_estimate(estimate)
    n = np.asarray(estimate.n)
    half = np.asarray(estimate.ci95, np.float64)
    if np.any(n < 2) or np.any(np.isnan(half)):
        raise ValueError("tolerance needs at least 2 replicas behind every entry of the estimate")
    factors = np.vectorize(lambda k: tolerance_factor(int(k), family, alpha, correction))(n)
    out = half * factors + np.asarray(allowance, np.float64)
    return float(out) if out.ndim == 0 else out


def _as_estimate(value):
    """An Estimate, from itself or its dict (:meth:`Estimate.to_dict`); a clear error for anything else."""
    if isinstance(value, dict):
        value = Estimate.from_dict(value)
    if not isinstance(value, Estimate):
        raise TypeError(
            "tolerance takes a simulated metric (an Estimate, or its to_dict() form "
            f"{{'mean', 'ci95', 'n'}}), got {value!r}: a mean-field or exact value has no "
            "sampling error to derive a tolerance from"
        )
    if value.n is None:
        raise ValueError(
            "tolerance needs the number of samples behind the interval: this Estimate has "
            "n=None; build it as Estimate(mean, ci95, n)"
        )
    return value


def within(
    estimate, value, family: int, alpha: float = 1e-3, correction: str = "bonferroni", allowance=0.0
) -> bool:
    """Whether every entry of ``estimate`` is within :func:`tolerance` of ``value``."""
    estimate = _as_estimate(estimate)
    err = np.abs(np.asarray(estimate.mean, np.float64) - np.asarray(value, np.float64))
    return bool(np.all(err <= tolerance(estimate, family, alpha, correction, allowance)))
