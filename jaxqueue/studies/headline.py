"""The ``r`` behind the headline of Wang, Feng and Cheng (a study on the mean field).

Wang, Feng and Cheng, "Distributed Join-the-Idle-Queue for Low Latency Cloud
Services", arXiv:1709.10119 (Sec. II, Fig. 4), state that at ``lambda = 0.98``
(``d = 2``) the mean response time is about 2.6 for JIQ-Pod, 5.3 for JIQ and
4.5 for Pod, without giving ``r = N / M`` in the text. :func:`headline_ratio`
finds the ``r`` that reproduces them from the mean field
(:func:`jaxqueue.theory.mean_response_time`). Depends on :mod:`jaxqueue.theory` only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxqueue import theory
from jaxqueue.core.host import host_float64
from jaxqueue.policies import option_names

__all__ = ["HeadlineFit", "headline_ratio"]

#: The paper's figures fitted by default (Pod(d)'s does not depend on ``r``).
HEADLINE_TARGETS = {"jiq": 5.3, "jiq-pod": 2.6}
#: The policies whose mean response time is reported at the fitted ``r``.
HEADLINE_POLICIES = ("jiq", "jiq-pod", "pod")


class HeadlineFit(NamedTuple):
    """The ``r`` behind Wang et al.'s headline (arXiv:1709.10119, Sec. II, Fig. 4).

    Attributes:
        load: ``lambda`` (0.98 in the paper).
        d: probes (2 in the paper).
        ratio: the ``r`` that fits all targets best (least squares in ``log T``).
        ratios: ``{policy: r}`` with ``T(policy, r)`` equal to its target.
        mean_response_time: ``{policy: T}`` at ``ratio`` for ``jiq``, ``jiq-pod``
            and ``pod`` (which does not depend on ``r``).
        targets: the targets used.
    """

    load: float
    d: int
    ratio: float
    ratios: dict
    mean_response_time: dict
    targets: dict


def _options(policy: str, d: int) -> dict:
    """``{"d": d}`` for a policy that takes ``d``; nothing for one that does not (JIQ)."""
    return {"d": d} if "d" in option_names(policy) else {}


def _mean_response_time(policy: str, load, ratio, d: int):
    return theory.mean_response_time(policy, load, ratio, **_options(policy, d))


def _log_t_of_log_r(policy: str, load: float, d: int):
    """``log r -> (log T, d log T / d log r)`` in float64 (x64 must be on).

    Forward mode through the compiled solver (its JVP program is compiled once).
    """

    def log_t(lam, x):
        return jnp.log(_mean_response_time(policy, lam, jnp.exp(x), d))

    # Both inputs carry tangents (a zero one for the load): the same JVP program
    # as for gradients in (load, ratio), so nothing new is compiled.
    zero, one = jnp.float64(0.0), jnp.float64(1.0)
    return lambda x: jax.jvp(log_t, (jnp.float64(load), jnp.float64(x)), (zero, one))


def _ratio_for(policy: str, load: float, d: int, target: float) -> float:
    """``r`` with ``T(policy, load, r) = target`` (``T`` decreases in ``r``).

    Newton in ``log r`` with gradients from the implicit derivative of ``p0``,
    inside a bisection bracket ``[1e-2, 1e4]``.
    """
    fn = _log_t_of_log_r(policy, load, d)
    lo, hi = math.log(1e-2), math.log(1e4)
    if not float(fn(hi)[0]) < math.log(target) < float(fn(lo)[0]):
        raise ValueError(f"T({policy}) = {target} is not reached for r in [1e-2, 1e4]")
    x = math.log(10.0)
    for _ in range(100):
        val, grad = (float(v) for v in fn(x))
        g = val - math.log(target)
        if g > 0:
            lo = x
        else:
            hi = x
        step = -g / grad if grad != 0 else math.inf
        x_new = x + step
        if not lo < x_new < hi:
            x_new = 0.5 * (lo + hi)
        if abs(x_new - x) < 1e-13:
            return math.exp(x_new)
        x = x_new
    raise RuntimeError(f"no convergence solving T({policy}) = {target} for r")


def headline_ratio(load: float = 0.98, d: int = 2, targets: dict | None = None) -> HeadlineFit:
    """Find the ``r`` behind Wang et al.'s headline figures.

    Solves ``T(policy, r) = target`` for each target and fits one ``r`` to all
    (golden-section search on ``sum (log T - log target)**2`` between the
    single-policy solutions). Float64 (x64 switched on for the call).

    Args:
        load: ``lambda``.
        d: probes, for the policies that take ``d`` (JIQ-Pod(d) and Pod(d)).
        targets: ``{policy: T}``; default :data:`HEADLINE_TARGETS`.

    Returns:
        A :class:`HeadlineFit`. (With the defaults: ``r`` close to 10, where
        ``T`` is about 5.39, 2.54 and 4.52.)
    """
    targets = dict(HEADLINE_TARGETS if targets is None else targets)
    with host_float64():
        ratios = {p: _ratio_for(p, load, d, t) for p, t in targets.items()}

        def misfit(x):
            return sum(
                (math.log(float(_mean_response_time(p, load, math.exp(x), d))) - math.log(t)) ** 2
                for p, t in targets.items()
            )

        lo, hi = math.log(min(ratios.values())), math.log(max(ratios.values()))
        golden = (math.sqrt(5.0) - 1.0) / 2.0
        x1, x2 = hi - golden * (hi - lo), lo + golden * (hi - lo)
        f1, f2 = misfit(x1), misfit(x2)
        while hi - lo > 1e-10:
            if f1 <= f2:
                hi, x2, f2 = x2, x1, f1
                x1 = hi - golden * (hi - lo)
                f1 = misfit(x1)
            else:
                lo, x1, f1 = x1, x2, f2
                x2 = lo + golden * (hi - lo)
                f2 = misfit(x2)
        ratio = math.exp(0.5 * (lo + hi))
        times = {p: float(_mean_response_time(p, load, ratio, d)) for p in HEADLINE_POLICIES}
    return HeadlineFit(float(load), int(d), ratio, ratios, times, targets)
