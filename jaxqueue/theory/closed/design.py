"""Inverse design: the largest load that meets a mean-response-time target.

Works on the closed forms of :mod:`jaxqueue.theory.closed.closed_forms`, through
the differentiable ``p0`` solver (gradients by implicit differentiation).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxqueue.core.host import host_float64
from jaxqueue.core.status import Status
from jaxqueue.core.system import check_int, is_real
from jaxqueue.theory.closed.closed_forms import (
    closed_form_of,
    family_mean_response_time,
    need_ratio,
)

__all__ = ["MaxLoadResult", "max_load_for_target"]


class MaxLoadResult(NamedTuple):
    """Largest load meeting a mean-response-time target.

    Attributes:
        load: ``lambda*`` (0 when infeasible, 1 when every load meets the target).
        mean_response_time: ``T(lambda*)``.
        status: a :class:`~jaxqueue.core.status.Status`: ``CONVERGED``;
            ``MAX_ITERATIONS`` (no convergence within ``max_steps``);
            ``NON_FINITE``; ``INFEASIBLE`` (``target <= 1 = T(0+)``, one mean
            service time); ``UNBOUNDED`` (every load in ``(0, 1)`` meets it).
        steps: optimiser steps taken.
    """

    load: float
    mean_response_time: float
    status: Status
    steps: int


@functools.partial(jax.jit, static_argnames=("family", "d", "max_steps"))
def _max_load_impl(target, ratio, tol, family: str, d: int, max_steps: int):
    """L-BFGS (optax) on ``theta = logit(lambda)``, loss ``(log T - log target)**2 / 2``."""
    log_target = jnp.log(target)

    def residual(theta):
        t = family_mean_response_time(family, d, jax.nn.sigmoid(theta), ratio)
        return jnp.log(t) - log_target

    def loss(theta):
        return 0.5 * residual(theta) ** 2

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)
    # Random's answer 1 - 1/target: the JIQ family and Pod(d) are faster, so lambda* is above it.
    start = jnp.clip(1.0 - 1.0 / target, 1e-6, 1.0 - 1e-6)
    theta0 = jnp.log(start) - jnp.log1p(-start)

    def cond(carry):
        _, _, k, res = carry
        return (k < max_steps) & ~(jnp.abs(res) <= tol) & jnp.isfinite(res)

    def body(carry):
        theta, state, k, _ = carry
        value, grad = value_and_grad(theta, state=state)
        updates, state = opt.update(grad, state, theta, value=value, grad=grad, value_fn=loss)
        theta = optax.apply_updates(theta, updates)
        return theta, state, k + 1, residual(theta)

    theta, _, steps, res = jax.lax.while_loop(
        cond, body, (theta0, opt.init(theta0), jnp.zeros((), jnp.int32), residual(theta0))
    )
    # Step just below the root if the last iterate is above it (T(lambda*) <= target).
    dres = jax.grad(residual)(theta)
    theta = jnp.where(res > 0, theta - 2.0 * res / dres, theta)
    lam = jax.nn.sigmoid(theta)
    return lam, family_mean_response_time(family, d, lam, ratio), steps, res


def max_load_for_target(
    policy,
    target: float,
    ratio: float | None = None,
    *,
    d: int | None = None,
    tol: float = 1e-11,
    max_steps: int = 100,
) -> MaxLoadResult:
    """Largest ``lambda`` whose mean-field mean response time is at most ``target``.

    Inverse design through the differentiable solver: ``T`` increases with
    ``lambda``, so ``lambda*`` is the root of ``log T(lambda) = log target``;
    optax's L-BFGS (zoom line search) minimises its square over the
    unconstrained ``theta = logit(lambda)``, with gradients of ``p0`` from
    implicit differentiation; a last first-order correction moves a root
    approximation from just above to just below the target. Float64 (x64
    switched on for the call).

    Args:
        policy: a policy name or Policy with a closed form (``random``, ``pod``,
            ``jsq``, ``jiq``, ``jiq-pod``).
        target: the target mean response time, in mean service times (> 0;
            at most 1 is ``INFEASIBLE``, ``inf`` ``UNBOUNDED``).
        ratio: ``r`` (JIQ family), ``0 < r < inf``.
        d: probes, for the policies that take ``d`` (default: the policy's own,
            2 for ``pod`` and ``jiq-pod``).
        tol: tolerance on ``|log T - log target|``.
        max_steps: optimiser step limit.

    Returns:
        A :class:`MaxLoadResult`.

    Raises:
        ValueError: for a policy without a closed form, an option it does not
            take, a missing ratio, or a ``target``, ``ratio``, ``tol`` or
            ``max_steps`` out of range (named, with the range).
    """
    pol, (family, d) = closed_form_of(policy, d)
    if not is_real(target) or not float(target) > 0:
        raise ValueError(
            f"target={target!r} is out of range: need a mean response time > 0 "
            "(in mean service times; above 1 to be feasible)"
        )
    target = float(target)
    if family == "jiq-pod":
        need_ratio(pol, ratio)
        if not is_real(ratio) or not 0 < float(ratio) < math.inf:
            raise ValueError(f"ratio={ratio!r} is out of range: need 0 < ratio < inf")
        ratio = float(ratio)
    if not (is_real(tol) and 0 < float(tol) < 1):
        raise ValueError(f"tol={tol!r} is out of range: need 0 < tol < 1")
    max_steps = check_int("max_steps", max_steps, 1, 100_000)
    if not target > 1.0:
        return MaxLoadResult(0.0, 1.0, Status.INFEASIBLE, 0)
    if family == "jsq" or math.isinf(target):
        return MaxLoadResult(1.0, 1.0 if family == "jsq" else math.inf, Status.UNBOUNDED, 0)
    with host_float64():
        lam, t, steps, res = _max_load_impl(
            jnp.float64(target),
            jnp.float64(1.0 if ratio is None else ratio),
            jnp.float64(tol),
            family=family,
            d=d,
            max_steps=int(max_steps),
        )
        lam, t, steps, res = float(lam), float(t), int(steps), float(res)
    if not (math.isfinite(lam) and math.isfinite(t) and math.isfinite(res)):
        status = Status.NON_FINITE
    elif abs(res) <= tol:
        status = Status.CONVERGED
    else:
        status = Status.MAX_ITERATIONS
    return MaxLoadResult(lam, t, status, steps)
