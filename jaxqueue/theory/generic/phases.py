"""The generic mean field by server class: phase-type service and server pools.

Its fixed point (with the adaptive level count) and transient; the model
(state ``x[k, c]`` by queue length and class, drift, sliding flow) is
:mod:`jaxqueue.theory.generic.byclass`, the classes :mod:`jaxqueue.theory.generic.classes`,
the results :mod:`jaxqueue.theory.generic.phases_result`. Derivation: docs/theory.md,
"The mean field by class".
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.config import Bounds
from jaxqueue.core.host import host_float64
from jaxqueue.core.status import Status
from jaxqueue.core.system import System
from jaxqueue.policies import Policy
from jaxqueue.theory.generic.byclass import (
    FULL,
    Sliding,
    class_drift,
    class_tails,
    drift,
    drift_and_rates,
    flat_state,
    iqueue_gap,
    joined,
    ode_drift,
    onto_full,
    sliding,
    split_at_filling,
    split_classes,
    tail_of,
)
from jaxqueue.theory.generic.classes import (
    MAX_STATE,
    ClassLaw,
    ServerClasses,
    check_inputs,
    empty_start,
    initial_levels,
    law_arrays,
    mph1_tail_decay,
    server_classes,
    step_size,
)
from jaxqueue.theory.generic.exponential import Rates, kinked
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.generic.meanfield import LEVEL_TOL, TRANSIENT_TOL, policy_and_system
from jaxqueue.theory.generic.models import ByClass, rk4_run, settle_flow, transient_states
from jaxqueue.theory.generic.phases_result import FixedPoint, Transient, as_result, summarize
from jaxqueue.theory.generic.settings import NEWTON, LevelGrowth, Newton, Settle, Solver
from jaxqueue.theory.generic.solvers import grow_levels, newton

#: How long the ODE run that gives Newton its start lasts by default (time units).
WARMUP_TIME = 20.0

__all__ = [
    "FixedPoint",
    "Transient",
    "ServerClasses",
    "ClassLaw",
    "MAX_STATE",
    "LEVEL_TOL",
    "drift",
    "law_arrays",
    "server_classes",
    "fixed_point",
    "fixed_point_on",
    "transient",
    "as_result",
    "summarize",
    "mph1_tail_decay",
    "sliding",
    "Sliding",
    "ode_drift",
    "split_classes",
    "class_tails",
    "tail_of",
    "flat_state",
    "joined",
    "class_drift",
    "onto_full",
    "split_at_filling",
    "iqueue_gap",
    "check_inputs",
    "step_size",
    "initial_levels",
    "empty_start",
]


def _residual(x, load, ratio, law, policy, system):
    """The drift with, for the JIQ family with many dispatchers, the conservation
    law in place of the ``Q_1`` equation; and the :class:`Rates` at ``x``."""
    f, rt = drift_and_rates(x, load, ratio, law, policy, system)
    if system.iqueue_levels:
        L, P = system.levels, law.alpha.shape[0]
        # the I-queues list exactly the idle servers: replaces the Q_1 equation
        f = f.at[L * P].set(iqueue_gap(x, ratio, L, P))
    return f, rt


def _advance(x, n_steps, h, load, ratio, law, policy, system):
    """``n_steps`` RK4 steps of size ``h`` (:func:`jaxqueue.theory.generic.models.rk4_run`:
    both traced, one compilation for all runs; JSQ-like routing integrates the
    sliding drift and cuts a step where it fills a level)."""
    return rk4_run(ByClass(policy, system, law), x, load, ratio, h, n_steps)


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _linearize(x, load, ratio, law, policy, system):
    """The residual at ``x``, its Jacobian and the policy's :class:`Rates` there
    (the linear solve is on the host: cheaper to compile)."""

    def g(y):
        f, rt = _residual(y, load, ratio, law, policy, system)
        return f, (f, rt)

    jac, (f, rt) = jax.jacfwd(g, has_aux=True)(x)
    return f, jac, rt


def _newton_step(x, load, ratio, law, policy, system):
    f, jac, rt = _linearize(x, load, ratio, law, policy, system)
    f, jac = np.asarray(f), np.asarray(jac)
    try:
        dx = np.linalg.solve(jac, -f)
    except np.linalg.LinAlgError:
        dx = np.full_like(f, np.nan)
    return f, dx, rt


# -- solving ------------------------------------------------------------------


def _newton(x, lam, r, lawa, pol, system, settings: Newton):
    """Newton with backtracking on the max-norm of the residual; x stays in [0, 1]:
    ``(x, status, iterations, residual, rates)``."""
    tol, max_iter = settings.of(*NEWTON)
    out = newton(
        lambda y: _newton_step(y, lam, r, lawa, pol, system), x, tol=tol, max_iter=max_iter
    )
    rt = Rates(*(np.asarray(v, np.float64) for v in out.aux))
    return out.x, out.status, out.iterations, out.residual, rt


def _solve(lawa, lam, r, pol, system, ratio, start, dt, solver: Solver):
    """Newton from ``start``, or from the end of an ODE run from the empty system;
    if Newton fails from there, the ODE runs four times as long again and Newton
    restarts from its end. JSQ-like routing whose run ends on a full level
    (above capacity, with a finite buffer) has no zero of Newton's drift there:
    the sliding flow settles on the fixed point instead (:func:`_settle`), as it
    does where Newton fails. ``dt``: the ODE's step (the model's default where
    ``solver.settle`` leaves it)."""
    tol, warmup_time = solver.newton.of(*NEWTON)[0], solver.settle.of(WARMUP_TIME, None)[0]
    if start is not None:
        return _newton(jnp.asarray(start, jnp.float64), lam, r, lawa, pol, system, solver.newton)
    L, P = system.levels, int(lawa.alpha.shape[0])
    jumps = kinked(pol, system)
    x = jnp.asarray(empty_start(L, P, system, ratio), jnp.float64)
    out = None
    for run in (warmup_time, 4.0 * warmup_time):
        steps = int(math.ceil(run / dt))
        if steps > 0:
            x = _advance(x, steps, jnp.float64(run / steps), lam, r, lawa, pol, system)
        if jumps and float(jnp.sum(x[: L * P])) >= 1.0 - FULL:  # on a full level
            return _settle(x, lam, r, lawa, pol, system, dt, tol)
        out = _newton(x, lam, r, lawa, pol, system, solver.newton)
        if out[1] is Status.CONVERGED or steps == 0:
            break
    if jumps and out[1] is not Status.CONVERGED:
        return _settle(x, lam, r, lawa, pol, system, dt, tol)
    return out


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _sliding_at(x, load, ratio, law, policy, system):
    """:func:`sliding` compiled, with the max-norm of its drift."""
    sl = sliding(x, load, ratio, law, policy, system)
    return sl, jnp.max(jnp.abs(sl.drift))


def _settle(x, lam, r, lawa, pol, system, dt, tol):
    """Run the sliding ODE until its drift is below ``tol``: what :func:`_newton`
    returns (``MAX_ITERATIONS`` if it does not settle; the count is of runs)."""
    out = settle_flow(ByClass(pol, system, lawa), x, lam, r, dt, tol)
    sl, _ = _sliding_at(out.x, lam, r, lawa, pol, system)
    rt = Rates(*(np.asarray(v, np.float64) for v in sl.rates))
    return np.asarray(out.x, np.float64), out.status, out.runs, out.residual, rt


def _seen_on_level(x, lam, r, lawa, pol, system):
    """``(seen_phase, seen_idle)`` of :class:`FixedPoint` for JSQ-like routing on a
    full level, where the arrivals sent just below it join the classes completions
    leave there (:func:`sliding`), not those of the level's (empty) state; None
    off a full level (or for other policies), where the state says."""
    L, P = system.levels, int(lawa.alpha.shape[0])
    if not kinked(pol, system) or float(np.sum(x[: L * P])) < 1.0 - FULL:
        return None, None
    sl, _ = _sliding_at(jnp.asarray(x, jnp.float64), lam, r, lawa, pol, system)
    level = np.asarray(sl.rates.level, np.float64)
    seen = level[:L] / level[:L].sum()
    share, pick = np.asarray(sl.share, np.float64), np.asarray(sl.pick, np.float64)
    return seen[1:, None] * share[: L - 1], seen[0] * pick


def fixed_point(
    limit: Limit,
    load: float,
    *,
    bounds: Bounds | None = None,
    solver: Solver | Newton | Settle | LevelGrowth | None = None,
) -> FixedPoint:
    """Fixed point of the phase-type mean field (float64: x64 is switched on for the call).

    Args:
        limit: the system (:class:`~jaxqueue.theory.generic.limit.Limit`): an
            exchangeable policy (the per-server JIQ-Original and JIQ-Threshold
            are refused), its ratio and ``d``, the buffer, the service law
            (``None``: exp(1)) and the pools (``service`` may then be None:
            exponential service at the pools' speeds; infinite buffers need
            ``load`` below the pools' capacity; see :func:`server_classes` and
            the module docstring, "Server pools").
        load: ``lambda``, arrivals per server per unit time (``> 0``; the load
            per server ``lambda * service.mean`` must be ``< 1`` unless a
            buffer is given).
        bounds: ``levels``, the largest queue length represented (tails
            ``s_0..s_levels``; None: the buffer with a finite buffer, else
            adaptive (module docstring): grown until ``s_levels`` is at most
            the level growth's ``tol`` or the state would pass
            :data:`MAX_STATE` coordinates, then a warning), and
            ``iqueue_levels``, the largest I-queue size represented (default
            :func:`jaxqueue.theory.generic.meanfield.default_iqueue_levels`;
            its mass ``Q_J`` is reported in ``truncated``).
        solver: the solver's settings (:class:`~jaxqueue.theory.generic.settings.Solver`,
            or one of its parts): Newton's ``tol`` and ``max_iter`` (per level
            count), the level growth's ``tol``, and the ODE run (RK4,
            :class:`~jaxqueue.theory.generic.settings.Settle`) that gives Newton
            its start: by default 20 time units in steps of about ``1.25 /
            (largest rate)``, at most 0.1; if Newton fails from there, the run
            goes on for four times as long and Newton starts again; a ``time``
            of 0: Newton from the empty system.

    Raises:
        ValueError: an invalid ``service``, ``load``, ``ratio``, ``buffer``,
            ``levels`` or ``pools``, or a per-server policy.
        TypeError: a ``service`` that is neither a PhaseType nor a string.
        NotImplementedError: a policy without a mean field, or one that routes
            by the pools' speeds (``jsew``).
    """
    solver = Solver.of(solver)
    level_tol = solver.levels.tol
    b = Bounds() if bounds is None else bounds
    levels, iqueue_levels = b.levels, b.iqueue_levels
    ratio, d, buffer = limit.ratio, limit.d, limit.buffer
    classes, pol, lam = check_inputs(limit, load, levels)
    P = classes.n_classes
    adaptive = levels is None and buffer is None
    if adaptive:
        levels = initial_levels(pol, lam, classes, level_tol)
        levels = max(1, min(levels, MAX_STATE // P))
    pol, system = policy_and_system(pol, ratio, d, buffer, levels, iqueue_levels)
    one_r = float(ratio) if system.iqueue_levels else 1.0
    systems = {system.levels: system}

    def solve(levels, start):
        if levels not in systems:
            systems[levels] = policy_and_system(pol, ratio, d, buffer, levels, iqueue_levels)[1]
        sys_l = systems[levels]
        step = solver.settle.of(WARMUP_TIME, step_size(classes, lam, pol, sys_l, one_r))[1]
        out = _solve(lawa, lam64, r64, pol, sys_l, ratio, start, step, solver)
        return out, out[1], tail_of(np.asarray(out[0][: levels * P]).reshape(levels, P)), out[0]

    with host_float64():
        lawa = law_arrays(classes)
        lam64, r64 = jnp.float64(lam), jnp.float64(one_r)
        if adaptive:
            out, L, capped = grow_levels(
                solve, system.levels, level_tol=level_tol, cap=MAX_STATE // P, classes=P
            )
        else:
            out, L, capped = solve(system.levels, None)[0], system.levels, False
        system = systems[L]
        x, status, it, res, rt = out
        tail = tail_of(np.asarray(x[: L * P]).reshape(L, P))
        if capped:
            warnings.warn(
                f"phases.fixed_point: the tail mass at levels={L} is {tail[L]:.3g} > "
                f"LevelGrowth.tol={level_tol:g}, and more levels would pass MAX_STATE={MAX_STATE} "
                f"coordinates ({P} classes); pass levels to choose",
                stacklevel=2,
            )
        seen = _seen_on_level(np.asarray(x, np.float64), lam64, r64, lawa, pol, system)
    return summarize(pol, lam, classes, system, x, rt, status, res, it, seen)


def fixed_point_on(
    classes: ServerClasses,
    pol: Policy,
    lam: float,
    ratio,
    system: System,
    solver: Solver = Solver(),
) -> FixedPoint:
    """The fixed point on ``system``'s bounds, for validated settings (no level
    search): the start of the periodic solver (:mod:`jaxqueue.theory.profiles.periodic`)."""
    one_r = float(ratio) if system.iqueue_levels else 1.0
    with host_float64():
        lawa = law_arrays(classes)
        step = step_size(classes, lam, pol, system, one_r)
        lam64, r64 = jnp.float64(lam), jnp.float64(one_r)
        x, status, it, res, rt = _solve(lawa, lam64, r64, pol, system, ratio, None, step, solver)
        x = np.asarray(x, np.float64)
        seen = _seen_on_level(x, lam64, r64, lawa, pol, system)
    return summarize(pol, lam, classes, system, x, rt, status, res, it, seen)


def _transient_start(start, system: System, P: int, ratio) -> np.ndarray:
    """:func:`transient`'s start as a flat state, checked against ``system``'s bounds."""
    L, J = system.levels, system.iqueue_levels
    dim = L * P + J
    if start is None:
        x0 = empty_start(L, P, system, ratio)
    elif isinstance(start, FixedPoint):
        if (
            start.phase_counts.shape != (L + 1, P)
            or (start.iq_tail is None) != (J == 0)
            or (J and start.iq_tail.size != J + 1)
        ):
            raise ValueError(
                f"start: a FixedPoint with levels={start.levels} and "
                f"{start.phase_counts.shape[1]} phases does not match levels={L}, "
                f"{P} phases, iqueue_levels={J}"
            )
        x0 = np.concatenate(
            [start.phase_counts[1:].reshape(-1), start.iq_tail[1:] if J else np.zeros(0)]
        )
    else:
        x0 = np.asarray(start, np.float64)
        if x0.shape != (dim,):
            raise ValueError(
                f"start must have shape ({dim},) (levels * phases + iqueue_levels), got {x0.shape}"
            )
    return x0


def transient(
    limit: Limit,
    load: float,
    *,
    times,
    start=None,
    bounds: Bounds | None = None,
    dt: float | None = None,
    tol: float | None = TRANSIENT_TOL,
) -> Transient:
    """The phase-type mean-field ODE, recorded at ``times``.

    Arguments as for :func:`fixed_point`, except:

    Args:
        times: non-decreasing times ``>= 0`` (a sequence or 1-D array); the
            steps end on them, so the states are at exactly these times.
        tol: the error per step allowed (Dormand-Prince 5(4) with step-size
            control, from a first step ``dt``); None: each interval split
            into equal RK4 steps of at most ``dt``, with no error estimate.
        start: None (the empty system: every server idle, ``r`` idle servers
            listed per I-queue), a :class:`FixedPoint` of the same setting, or
            the flat state ``[x[1..L, :].ravel(), Q_1..Q_J]``.
        bounds: ``levels``, the largest queue length represented (no
            adaptivity here): default the buffer, else the first level count
            of :func:`fixed_point`'s search (or the FixedPoint's given as
            ``start``); ``iqueue_levels`` as for :func:`fixed_point`.
        dt: the first step (``tol`` given) or the RK4 step; default about
            ``1.25 / (largest rate)``, at most 0.1.

    Returns:
        A :class:`Transient`.
    """
    b = Bounds() if bounds is None else bounds
    levels, iqueue_levels = b.levels, b.iqueue_levels
    ratio, d, buffer = limit.ratio, limit.d, limit.buffer
    classes, pol, lam = check_inputs(limit, load, levels)
    P = classes.n_classes
    t = np.asarray(times, np.float64)
    if (
        t.ndim != 1
        or t.size == 0
        or not np.all(np.isfinite(t))
        or np.any(t < 0)
        or np.any(np.diff(t) < 0)
    ):
        raise ValueError(
            "times must be a non-empty 1-D sequence of finite, non-decreasing times >= 0"
        )
    if isinstance(start, FixedPoint) and levels is None and buffer is None:
        levels = start.levels
    if levels is None and buffer is None:
        levels = min(initial_levels(pol, lam, classes, LEVEL_TOL), max(1, MAX_STATE // P))
    pol, system = policy_and_system(pol, ratio, d, buffer, levels, iqueue_levels)
    L, J = system.levels, system.iqueue_levels
    one_r = float(ratio) if J else 1.0
    dim = L * P + J
    x0 = _transient_start(start, system, P, ratio)
    step = step_size(classes, lam, pol, system, one_r) if dt is None else float(dt)
    out = np.empty((t.size, dim))
    with host_float64():
        lawa = law_arrays(classes)
        lam64, r64 = jnp.float64(lam), jnp.float64(one_r)
        x, now = jnp.asarray(x0, jnp.float64), 0.0
        if tol is not None:
            model = ByClass(pol, system, lawa)
            xs, _, _, failed = transient_states(
                model, x, jnp.asarray(t), lam64, r64, jnp.float64(tol), step
            )
            if bool(failed):
                warnings.warn("phases.transient: the integrator ran out of steps", stacklevel=2)
            out[:] = np.asarray(xs)
        for i, ti in enumerate(t if tol is None else ()):
            n = int(math.ceil((ti - now) / step - 1e-9)) if ti > now else 0
            if n:
                x = _advance(x, n, jnp.float64((ti - now) / n), lam64, r64, lawa, pol, system)
            now = ti
            out[i] = np.asarray(x)
    X = out[:, : L * P].reshape(t.size, L, P)
    counts = np.concatenate([np.zeros((t.size, 1, P)), X], axis=1)
    occ = X.sum(axis=2)
    tails = np.concatenate([np.ones((t.size, 1)), np.cumsum(occ[:, ::-1], axis=1)[:, ::-1]], axis=1)
    iq = np.concatenate([np.ones((t.size, 1)), out[:, L * P :]], axis=1) if J else None
    return Transient(t, tails, counts, iq)
