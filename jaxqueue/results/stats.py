"""Student-t quantiles and the one tolerance helper for comparing estimates with exact values.

An :class:`~jaxqueue.results.estimates.Estimate` is the mean of ``n``
independent replicas with the half-width of its 95% Student-t interval. To
compare it with a value known exactly (an exact CTMC solution) or in a limit
(a mean field), as one of a *family* of ``K`` comparisons with a family-wise
false-alarm rate ``alpha``, each comparison is a two-sided t test at level
``alpha / K`` (Bonferroni) or ``1 - (1 - alpha)**(1/K)`` (Sidak):

    tolerance = t_{1 - a/2}(n - 1) * sd / sqrt(n)
              = ci95 * t_{1 - a/2}(n - 1) / t_{0.975}(n - 1),

plus an optional stated allowance (for instance the O(1/N) bias of a mean
field at finite N). Scaling a Student-t interval by a ratio of *normal*
quantiles is wrong for few replicas: with 8 replicas and a family of 42 at
``alpha = 0.001`` the factor is t_{1-0.001/84}(7) / t_{0.975}(7) = 4.16, not
4.07 / 1.96 = 2.08.

Everything here is pure Python (no scipy): the t distribution function from
the regularised incomplete beta function by its continued fraction, and the
quantile by safeguarded Newton on it (checked against scipy: relative error
below 1e-9 for the levels used in tolerances).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "student_t_cdf",
    "student_t_quantile",
    "comparison_level",
    "tolerance_factor",
    "tolerance",
    "within",
]


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            return h
    raise RuntimeError("incomplete beta continued fraction did not converge")  # pragma: no cover


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(x: float, dof: float) -> float:
    """``P(T <= x)`` for Student's t with ``dof > 0`` degrees of freedom."""
    if dof <= 0:
        raise ValueError(f"dof={dof} is out of range: need dof > 0")
    x = float(x)
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    two_sided = _betainc(0.5 * dof, 0.5, dof / (dof + x * x))  # P(|T| > |x|)
    return 1.0 - 0.5 * two_sided if x >= 0 else 0.5 * two_sided


def student_t_quantile(p: float, dof: float) -> float:
    """The ``p``-quantile of Student's t with ``dof > 0`` degrees of freedom (``0 < p < 1``)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p} is out of range: need 0 < p < 1")
    if dof <= 0:
        raise ValueError(f"dof={dof} is out of range: need dof > 0")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -student_t_quantile(1.0 - p, dof)
    if dof == 1:  # Cauchy
        return 1.0 / math.tan(math.pi * (1.0 - p))
    if dof == 2:
        return (2.0 * p - 1.0) / math.sqrt(2.0 * p * (1.0 - p))
    tail = 1.0 - p
    # bracket: t > 0 with P(T > t) = tail, found by doubling
    lo, hi = 0.0, 1.0
    while 1.0 - student_t_cdf(hi, dof) > tail:
        lo, hi = hi, 2.0 * hi
    log_norm = math.lgamma(0.5 * (dof + 1)) - math.lgamma(0.5 * dof) - 0.5 * math.log(dof * math.pi)
    x = 0.5 * (lo + hi)
    for _ in range(200):
        upper = 0.5 * _betainc(0.5 * dof, 0.5, dof / (dof + x * x))  # P(T > x)
        g = math.log(upper) - math.log(tail)
        if g > 0:
            lo = x
        else:
            hi = x
        log_pdf = log_norm - 0.5 * (dof + 1) * math.log1p(x * x / dof)
        step = g / math.exp(log_pdf - math.log(upper))  # d log P(T > x) / dx = -pdf / upper
        x_new = x + step
        if not lo < x_new < hi:
            x_new = 0.5 * (lo + hi)
        if abs(x_new - x) <= 1e-14 * max(1.0, x) or hi - lo <= 1e-14 * hi:
            return x_new
        x = x_new
    return x  # pragma: no cover


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
    """An Estimate, from itself or its JSON dict; a clear error for anything else."""
    from jaxqueue.results.estimates import Estimate

    if isinstance(value, dict):
        value = Estimate.from_json(value)
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
