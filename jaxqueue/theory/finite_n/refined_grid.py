"""The refined mean field's grid: a Newton solve and the correction per point, vmapped.

The pieces :func:`jaxqueue.theory.finite_n.refined.refined_grid` compiles once for a
whole ``loads x ratios`` grid: the starts (a closed form, or an ODE run),
Newton in the plane of the JIQ conservation law, and the corrections.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.status import Status
from jaxqueue.theory.closed.closed_forms import family_tail
from jaxqueue.theory.closed.p0 import iqueue_distribution, solve_p0
from jaxqueue.theory.finite_n.expansion import corrections_at, embed, metrics_at, project
from jaxqueue.theory.generic import meanfield

__all__ = [
    "GRID_METRICS",
    "RefinedGrid",
    "plane_drift",
    "plane_newton",
    "closed_form_starts",
    "closed_form_start",
    "ode_start",
    "grid_core",
]


#: The scalar metrics a grid reports (each ``[A, B]``; refined ``[A, B, K]``).
GRID_METRICS = (
    "mean_queue_length",
    "mean_response_time",
    "waiting_probability",
    "blocking_probability",
    "p0",
    "join_rate",
    "delete_rate",
    "probe_rate",
)


class RefinedGrid(NamedTuple):
    """The refined mean field on a grid ``loads x ratios`` and a list of ``N`` (host arrays).

    Attributes:
        loads: ``[A]``; ratios: ``[B]``; n_servers: ``[K]``.
        mean_field: ``{metric: [A, B]}`` for the metrics of :data:`GRID_METRICS`
            that apply (``p0`` only with I-queue coordinates).
        correction: ``{metric: [A, B]}``, the ``1 / N`` coefficients (NaN where
            ``status`` is not ``CONVERGED`` for every ``N``).
        refined: ``{metric: [A, B, K]}``, ``mean field + correction / N``
            (NaN where ``status`` is not ``CONVERGED``).
        status: ``[A, B, K]`` :class:`~jaxqueue.core.status.Status` codes:
            ``INVALID_INPUT`` where ``N / r`` dispatchers is not a whole
            number (the JIQ family with several dispatchers: no such
            system; its mean field and correction are still given);
            ``NOT_DIFFERENTIABLE`` where the policy routes JSQ-like at that
            ``(r, N)``; ``TRUNCATED`` where, with infinite buffers, the shared
            level bound leaves more than ``1e-6`` of the tail at it (the
            point's mean field is NaN too: give more ``levels``); else the
            fixed point's status, or ``NON_FINITE``.
        tail: ``[A, B, L + 1]`` the mean-field tails; tail_correction: their
            ``1 / N`` coefficients.
        newton_iterations: ``[A, B]`` Newton steps of the fixed point.
    """

    loads: np.ndarray
    ratios: np.ndarray
    n_servers: np.ndarray
    mean_field: dict
    correction: dict
    refined: dict
    status: np.ndarray
    tail: np.ndarray
    tail_correction: np.ndarray
    newton_iterations: np.ndarray


def plane_drift(y, load, ratio, policy, system):
    x = embed(y, ratio, policy, system)
    return project(meanfield.drift(x, load, ratio, policy, system), policy, system)


def plane_newton(x0, load, ratio, policy, system, tol, max_newton):
    """Newton (steps clipped to [0, 1]) on the plane drift from ``x0`` (vmappable): ``(x, status, steps)``."""
    g = functools.partial(plane_drift, load=load, ratio=ratio, policy=policy, system=system)

    def body(state):
        it, y, _, _ = state
        f = g(y)
        res = jnp.max(jnp.abs(f))
        dy = jnp.linalg.solve(jax.jacfwd(g)(y), -f)
        done = res < tol
        bad = ~jnp.all(jnp.isfinite(dy)) & ~done
        y = jnp.where(done | bad, y, jnp.clip(y + dy, 0.0, 1.0))
        status = jnp.where(
            done,
            int(Status.CONVERGED),
            jnp.where(bad, int(Status.NON_FINITE), int(Status.MAX_ITERATIONS)),
        )
        return it + jnp.where(done | bad, 0, 1), y, status.astype(jnp.int32), done | bad

    def cond(state):
        it, _, _, stop = state
        return (it < max_newton) & ~stop

    y0 = project(x0, policy, system)
    init = (jnp.zeros((), jnp.int32), y0, jnp.int32(Status.MAX_ITERATIONS), jnp.bool_(False))
    it, y, status, _ = jax.lax.while_loop(cond, body, init)
    return embed(y, ratio, policy, system), status, it


def closed_form_starts(pol, buffer) -> bool:
    """Whether Newton can start at the policy's closed form (Pod or JIQ-Pod, infinite buffers)."""
    cf = pol.closed_form()
    return cf is not None and cf.family in ("pod", "jiq-pod") and buffer is None


@functools.partial(jax.jit, static_argnames=("pol", "system"))
def closed_form_start(pol, system, loads, ratios):
    """Fixed points of the untruncated closed form on the grid, as states ``[A, B, L + J]``."""
    cf = pol.closed_form()
    lam, r = jnp.broadcast_arrays(loads[:, None], ratios[None, :])
    s = family_tail(cf.family, cf.d, lam, r, system.levels + 1)[..., 1:]
    if not system.iqueue_levels:
        return s
    p0 = solve_p0(lam, r, cf.d).p0
    law = iqueue_distribution(p0, lam, r, cf.d, jmax=system.iqueue_levels)
    q = 1.0 - jnp.cumsum(law, axis=-1)[..., :-1]  # Q_j = P(size >= j), j = 1..J
    return jnp.concatenate([s, q], axis=-1)


def ode_start(pol, system, loads, ratios, warmup_time=50.0, dt=0.1):
    """The ODE from the empty system (as :func:`meanfield.fixed_point` starts), ``[A, B, L + J]``."""
    starts = jnp.asarray(np.stack([meanfield.empty_start(system, float(r)) for r in ratios]))
    steps = int(math.ceil(warmup_time / dt))

    def one(x0, lam, r):
        return meanfield.rk4_end(x0, lam, r, jnp.float64(dt), steps, pol, system)

    per_ratio = jax.vmap(one, in_axes=(0, None, 0))
    return jax.vmap(per_ratio, in_axes=(None, 0, None))(starts, loads, ratios)


@functools.partial(jax.jit, static_argnames=("policy", "system", "buffer", "max_newton", "chunk"))
def grid_core(x0, loads, ratios, policy, system, buffer, tol, max_newton, chunk):
    lam, r = jnp.broadcast_arrays(loads[:, None], ratios[None, :])
    flat = (x0.reshape(-1, x0.shape[-1]), lam.reshape(-1), r.reshape(-1))

    def point(args):
        x_start, load, ratio = args
        x, status, it = plane_newton(x_start, load, ratio, policy, system, tol, max_newton)
        c = corrections_at(x, load, ratio, policy, system, with_covariance=False)
        metrics = metrics_at(
            x, c.state, c.observables, c.observables_correction, load, policy, system, buffer
        )
        ok = (status == int(Status.CONVERGED)) & (c.spectral_abscissa < 0)
        scal = {k: v for k, v in metrics.items() if k in GRID_METRICS}
        finite = functools.reduce(jnp.logical_and, [jnp.isfinite(b) for _, b in scal.values()])
        converged = status == int(Status.CONVERGED)
        status = jnp.where(converged & ~(ok & finite), int(Status.NON_FINITE), status)
        return (
            {k: a for k, (a, _) in scal.items()},
            {k: b for k, (_, b) in scal.items()},
            metrics["tail"][0],
            metrics["tail"][1],
            status,
            it,
        )

    out = jax.lax.map(point, flat, batch_size=chunk)
    shape = lam.shape
    return jax.tree_util.tree_map(lambda a: a.reshape(shape + a.shape[1:]), out)
