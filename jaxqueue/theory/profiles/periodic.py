"""Mean field under a periodic arrival-rate profile: the periodic regime of the ODE.

:func:`periodic_orbit` finds the orbit the mean-field ODE settles into under a
:class:`~jaxqueue.core.arrivals.Profile` (shooting on the period map, then
averages over a period or a window); :func:`largest_tail` the largest tails
along a load path. How it is solved: docs/theory.md, "Periodic rate profiles".
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxqueue.core.config import Bounds
from jaxqueue.core.host import host_float64
from jaxqueue.core.status import Status
from jaxqueue.core.system import check_load
from jaxqueue.theory.generic import meanfield, phases
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.generic.models import model_of
from jaxqueue.theory.generic.settings import LevelGrowth, Newton, Settle, Solver
from jaxqueue.theory.profiles.periodic_flow import (
    MIN_STEPS,
    flow,
    flow_integrals,
    flow_largest,
    period_newton,
    schedule,
)
from jaxqueue.theory.profiles.periodic_result import (
    PeriodicOrbit,
    as_profile,
    as_result,
    averages,
    orbit_curve,
    tail_decay,
)

__all__ = [
    "PeriodicOrbit",
    "periodic_orbit",
    "largest_tail",
    "as_result",
    "refusal",
    "DEFAULT_DT",
    "REMAINDER",
    "MAX_AUTO_LEVELS",
]

#: The longest RK4 step (time units); steps end on the profile's segment boundaries.
DEFAULT_DT = 0.02

#: The orbit's largest mass at an automatic bound (``s_levels`` or ``Q_iqueue_levels``).
REMAINDER = 1e-10

#: Automatic bounds grow up to this many levels.
MAX_AUTO_LEVELS = 5120

_NEWTON_DIM = 160  # Newton (a Jacobian of dim^2 entries through a period) up to this dimension
_WARM_PERIODS = 3  # periods before the contraction rate is judged
_SLOW = 30  # periods left at which Newton is tried
_MAX_PERIODS = 5000


def _check_window(window, period: float):
    if window is None:
        return (0.0, float(period))
    try:
        start, length = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window={window!r} must be (start, length), two numbers") from None
    if not (math.isfinite(start) and start >= 0.0):
        raise ValueError(f"window start={start!r} is out of range: need a finite start >= 0")
    if not (math.isfinite(length) and length > 0.0):
        raise ValueError(f"window length={length!r} is out of range: need a finite length > 0")
    return (start, length)


def periodic_orbit(
    limit: Limit,
    load: float,
    *,
    bounds: Bounds | None = None,
    window=None,
    solver: Solver | Newton | Settle | None = None,
) -> PeriodicOrbit:
    """The periodic regime of the generic mean field under a rate profile (float64).

    Args:
        limit: the system (:class:`~jaxqueue.theory.generic.limit.Limit`): a
            policy with the generic mean field or a closed form, its ratio
            (``None``: one dispatcher) and ``d``, the buffer, the service law
            and the pools (then the ODE by class of
            :mod:`jaxqueue.theory.generic.phases`, the module docstring, "By
            class"; ``averages`` is a
            :class:`jaxqueue.theory.generic.phases.FixedPoint`), and its
            ``arrivals``: a :class:`~jaxqueue.core.arrivals.Profile` or a
            profile CSV file (``time,rate``), its rates relative (scaled to time
            mean 1).
        load: ``lambda``, the time-mean arrivals per server per unit time
            (``< 1`` with infinite buffers, or below the pools' capacity; the
            peak may pass it).
        bounds: ``levels`` and ``iqueue_levels``; ``None`` grows them from the
            fixed point's defaults until the orbit's mass at the bound is
            below :data:`REMAINDER`. Given bounds are used as they are (the
            mass at them is reported in ``averages.truncated``).
        window: ``(start, length)``: average over ``[start, start + length]``
            of the periodic regime (time 0 is phase 0 of the profile), as a
            simulation's measured window; ``None``: one period.
        solver: :class:`~jaxqueue.theory.generic.settings.Newton` on the period
            map (``tol``: ``max |Phi(x) - x|`` at which the orbit counts as
            found, default ``1e-10``; ``max_iter``: the most Newton steps, tried
            once where iterating the map contracts slowly, default 30, 0:
            iterate the map only) and
            :class:`~jaxqueue.theory.generic.settings.Settle`'s ``dt``, the
            longest RK4 step, in ``(0, 1]`` (default 0.1; with a service law or
            pools at most the step :mod:`jaxqueue.theory.generic.phases` takes
            at the peak); a :class:`~jaxqueue.theory.generic.settings.Solver` of
            them, or one alone. The level growth is the orbit's own
            (:data:`REMAINDER`).

    Returns:
        A :class:`PeriodicOrbit`.

    Raises:
        ValueError: invalid arguments (naming the parameter and its range).
        NotImplementedError: a policy without a generic mean field, or
            arrivals that are not a rate profile.
    """
    profile = as_profile(limit.arrivals)
    b = Bounds() if bounds is None else bounds
    levels, iqueue_levels = b.levels, b.iqueue_levels
    policy, ratio, d, buffer = limit.policy, limit.ratio, limit.d, limit.buffer
    solver = Solver.of(solver)
    tol, max_newton = solver.newton.of(1e-10, 30)
    dt = solver.settle.of(0.0, DEFAULT_DT)[1]
    if solver.settle.time is not None or solver.levels != LevelGrowth():
        raise ValueError(
            f"solver={solver!r}: a periodic regime takes Newton's tol and max_iter and "
            "Settle's dt only (its level growth is its own)"
        )
    if not dt <= 1.0:
        raise ValueError(
            f"Settle.dt={dt!r} is out of range for a periodic regime: need 0 < dt <= 1"
        )
    win = _check_window(window, profile.period)
    classes, lam, cap, levels = _first_bounds(limit, load, levels)
    auto_levels, auto_iq = levels is None and buffer is None, iqueue_levels is None
    pol, system = meanfield.policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels)
    while True:
        orbit, decay = _solve(
            pol, lam, ratio, system, profile, float(dt), tol, max_newton, win, classes
        )
        mass = orbit.averages.truncated
        grow_s = auto_levels and mass[0] > REMAINDER
        grow_q = auto_iq and system.iqueue_levels and mass[1] > REMAINDER
        if not (grow_s or grow_q):
            return orbit
        levels = min(_grown(system.levels, mass[0], decay[0]), cap) if grow_s else system.levels
        iqueue_levels = (
            _grown(system.iqueue_levels, mass[1], decay[1]) if grow_q else system.iqueue_levels
        )
        if (levels, iqueue_levels) == (system.levels, system.iqueue_levels):
            raise RuntimeError(
                f"the orbit of {pol.label()!r} still reaches the bound at {system.levels} levels "
                f"and {system.iqueue_levels} I-queue levels (mass {orbit.averages.truncated}); "
                "the profile's peak builds queues too long to represent: give a finite buffer "
                "or a lower load"
            )
        _, system = meanfield.policy_and_system(
            pol, ratio, None, buffer, levels, iqueue_levels if system.iqueue_levels else None
        )


def largest_tail(
    limit: Limit,
    load: float,
    segments,
    *,
    bounds: Bounds | None = None,
    dt: float = 0.1,
) -> np.ndarray:
    """The largest queue-length tail along the mean-field ODE through a load path.

    From the fixed point at ``load`` (the mean load: a run's start), the ODE
    runs through ``segments``, ``((load_1, duration_1), ...)`` (absolute loads
    per server, any of them past the capacity), by RK4 steps of at most ``dt``.
    For each ``k`` it keeps the largest ``s_k`` met on the way (by class: the
    tails summed over the classes). What a simulator's default level bound
    under a time-varying source is sized from: the queues a peak builds.

    Args:
        limit: as for :func:`periodic_orbit` (infinite buffers; its
            ``arrivals`` unused).
        load: the start's load, below the capacity.
        segments: the path, ``(load, duration)`` pairs (durations > 0).
        bounds: ``levels``, the first bound tried (``None``: the fixed
            point's default); it grows until the largest ``s_levels`` on the
            path is below :data:`REMAINDER` (at most :data:`MAX_AUTO_LEVELS`);
            ``iqueue_levels``, the I-queue bound (``None``: the fixed point's
            default). The JIQ family's drift costs about the cube of it; a
            smaller one leaves idle servers past it unlisted, which sends more
            arrivals to random servers and only lengthens the tails.
        dt: the longest RK4 step (with a service law or pools at most the
            step :mod:`jaxqueue.theory.generic.phases` takes at the path's largest load).

    Returns:
        ``s`` (float64, ``s[0] = 1``): ``s[k]`` the largest ``s_k`` on the path.

    Raises:
        RuntimeError: the path builds queues past :data:`MAX_AUTO_LEVELS`.
    """
    loads = np.array([float(a) for a, _ in segments], np.float64)
    spans = np.array([float(b) for _, b in segments], np.float64)
    if loads.size == 0 or not (np.all(loads >= 0) and np.all(spans > 0)):
        raise ValueError("segments must be (load >= 0, duration > 0) pairs, at least one")
    b = Bounds() if bounds is None else bounds
    limit = limit.replace(buffer=None)
    policy, ratio, d = limit.policy, limit.ratio, limit.d
    classes, lam, cap, levels = _first_bounds(limit, load, b.levels)
    pol, system = meanfield.policy_and_system(policy, ratio, d, None, levels, b.iqueue_levels)
    r = float(ratio) if system.iqueue_levels else 1.0
    if classes is not None:
        dt = min(dt, phases.step_size(classes, float(loads.max()), pol, system, r))
    n = np.maximum(np.ceil(spans / dt - 1e-9), 1).astype(np.int64)
    step_loads, lengths = np.repeat(loads, n), np.repeat(spans / n, n)
    size = max(MIN_STEPS, 1 << max(0, int(step_loads.size) - 1).bit_length())
    step_loads = np.concatenate([step_loads, np.zeros(size - step_loads.size)])
    lengths = np.concatenate([lengths, np.zeros(size - lengths.size)])
    per_level = 1 if classes is None else classes.n_classes
    start, start_levels = _start(pol, lam, ratio, system, classes, r), system.levels
    while True:
        with host_float64():
            law = None if classes is None else phases.law_arrays(classes)
            model = model_of(pol, system, law)
            # the start on grown bounds: the mean load's fixed point, empty past its bound
            at = start_levels * per_level
            x = np.concatenate(
                [start[:at], np.zeros((system.levels - start_levels) * per_level), start[at:]]
            )
            x = jnp.asarray(x, jnp.float64)
            top = np.asarray(
                flow_largest(
                    x,
                    jnp.asarray(step_loads),
                    jnp.asarray(lengths),
                    jnp.float64(r),
                    model,
                )
            )
        tail = np.concatenate([[1.0], top])
        L = system.levels
        if tail[L] <= REMAINDER:
            return tail
        decay = tail[L] / tail[L - 1] if tail[L - 1] > 0 else math.nan
        grown = min(_grown(L, tail[L], decay), cap)
        if grown == L:
            raise RuntimeError(
                f"under {pol.label()!r} the load path builds queues past {L} levels "
                f"(s_{L} = {tail[L]:.3g}): too long to represent"
            )
        _, system = meanfield.policy_and_system(
            pol, ratio, None, None, grown, system.iqueue_levels or None
        )


def _first_bounds(limit: Limit, load, levels) -> tuple:
    """``(classes, lam, cap, levels)``: the server classes (None for identical
    exponential servers), the checked load, the largest level bound allowed, and
    the first level bound (by class with infinite buffers: the fixed point's
    first; else ``levels`` as given)."""
    if not limit.by_class():
        return None, check_load(load, limit.buffer), MAX_AUTO_LEVELS, levels
    classes, pol, lam = phases.check_inputs(limit, load, levels)
    cap = max(1, phases.MAX_STATE // classes.n_classes)
    if levels is None and limit.buffer is None:
        levels = min(phases.initial_levels(pol, lam, classes, phases.LEVEL_TOL), cap)
    return classes, lam, cap, levels


def refusal(limit: Limit, load: float) -> str | None:
    """Why :func:`periodic_orbit` does not cover a setting it would be given, or
    None where it does: a policy without the generic mean field, or one that
    routes by the pools' speeds (``jsew``) with pools of different mean
    service times. It does not check the other arguments
    (:func:`periodic_orbit` does). For callers that run many settings and
    give theory where there is one, such as grids."""
    as_profile(limit.arrivals)
    pol = limit.built()
    if pol.mean_field_kind() not in ("generic", "closed-form"):
        return pol.no_mean_field or f"its mean field is {pol.mean_field_kind()!r}"
    if limit.pools is None:
        return None
    classes = phases.server_classes(limit.service, limit.pools)
    if pol.routes_by_speed and len({lw.mean for lw in classes.laws}) > 1:
        return f"{pol.name!r} routes by expected wait, which the mean field does not cover"
    return None


def _grown(bound: int, mass: float, decay: float) -> int:
    """A larger automatic bound: where the tail, falling by ``decay`` a level from
    ``mass`` at ``bound`` (as it does there when that mass peaks), is below
    ``REMAINDER / 10``, with half as many levels again to spare; at least 8
    levels more, at most twice ``bound``, a multiple of 8, and at most
    :data:`MAX_AUTO_LEVELS`. (The solve that follows checks the mass again:
    a tail that falls more slowly further out grows the bound once more.)"""
    rho = min(max(decay, 1e-3), 0.95) if math.isfinite(decay) else 0.95
    more = math.ceil(1.5 * math.log(REMAINDER / 10.0 / mass) / math.log(rho))
    grown = min(2 * bound, max(bound + 8, -(-(bound + more) // 8) * 8))
    return max(bound, min(grown, MAX_AUTO_LEVELS))


def _newton_phase(x, loads, lengths, rj, model, tol, max_newton):
    """Damped Newton on ``Phi(x) - x`` from ``x``: ``(x, converged, residual, steps)``."""
    residual, it = math.inf, 0
    for it in range(1, max_newton + 1):
        gap, dx = (np.asarray(v) for v in period_newton(x, loads, lengths, rj, model))
        residual = float(np.max(np.abs(gap)))
        if residual < tol:
            return x, True, residual, it
        if not np.all(np.isfinite(dx)):
            break
        # the longest of 1, 1/2, .., 1/16 of the step that shrinks the gap
        for step in 0.5 ** np.arange(5):
            trial = jnp.asarray(np.clip(np.asarray(x) + step * dx, 0.0, 1.0))
            moved = flow(trial, loads, lengths, rj, model)
            if float(jnp.max(jnp.abs(moved - trial))) < (1.0 - step / 4.0) * residual:
                x = trial
                break
        else:
            break  # Newton stalls (the clipped flow has kinks where a peak saturates the servers)
    return x, False, residual, it


def _find(x, loads, lengths, rj, model, tol, max_newton):
    """The orbit's start by iterating the period map, and by Newton where the map
    contracts slowly (more than :data:`_SLOW` periods left at the observed rate)
    and the state is small enough for a Jacobian (:data:`_NEWTON_DIM`).

    Returns ``(x, status, residual, newton_steps, periods)``.
    """
    newton_allowed = max_newton > 0 and x.size <= _NEWTON_DIM
    previous, it = None, 0
    for periods in range(1, _MAX_PERIODS + 1):
        nxt = flow(x, loads, lengths, rj, model)
        residual = float(jnp.max(jnp.abs(nxt - x)))
        x = nxt
        if residual < tol:
            return x, Status.CONVERGED, residual, it, periods
        if newton_allowed and previous is not None and periods >= _WARM_PERIODS:
            rate = residual / previous
            left = math.log(tol / residual) / math.log(rate) if 0.0 < rate < 1.0 else math.inf
            if left > _SLOW:
                newton_allowed = False  # one try
                x, done, res, it = _newton_phase(x, loads, lengths, rj, model, tol, max_newton)
                if done:
                    return x, Status.CONVERGED, res, it, periods
        previous = residual
    return x, Status.MAX_ITERATIONS, residual, it, _MAX_PERIODS


def _start(pol, lam, ratio, system, classes, r) -> np.ndarray:
    """The fixed point at the mean load on ``system``'s bounds (the empty
    system where Newton cannot reach it)."""
    J = system.iqueue_levels
    if classes is None:
        fp = meanfield.fixed_point(
            pol,
            lam,
            ratio if J else None,
            buffer=system.buffer,
            levels=system.levels,
            iqueue_levels=J or None,
        )
        if fp.status == Status.CONVERGED:
            return np.concatenate([fp.tail[1:], fp.iq_tail[1:]])
        return meanfield.empty_start(system, r)
    fp = phases.fixed_point_on(classes, pol, lam, ratio if J else None, system)
    if fp.status == Status.CONVERGED:
        return np.concatenate(
            [fp.phase_counts[1:].reshape(-1), fp.iq_tail[1:] if J else np.zeros(0)]
        )
    return phases.empty_start(system.levels, classes.n_classes, system, r)


def _solve(pol, lam, ratio, system, profile, dt, tol, max_newton, window, classes=None) -> tuple:
    """The orbit on ``system``'s bounds, and the tails' decay at them (:func:`tail_decay`).

    It starts from the fixed point at the mean load on the same bounds (not
    from an orbit on smaller ones: the levels past those would start empty
    and fill over many periods, a slow mode the residual test can stop in).
    """
    r = float(ratio) if system.iqueue_levels else 1.0
    period = profile.period
    if classes is not None:  # RK4 stable at the peak (phases.step_size)
        dt = min(dt, phases.step_size(classes, lam * profile.peak, pol, system, r))
    with host_float64():
        rj = jnp.float64(r)
        law = None if classes is None else phases.law_arrays(classes)
        model = model_of(pol, system, law)
        loads, lengths, n = schedule(profile, lam, 0.0, period, dt)
        loads, lengths = jnp.asarray(loads), jnp.asarray(lengths)
        x = jnp.asarray(_start(pol, lam, ratio, system, classes, r), jnp.float64)
        x, status, residual, it, periods = _find(x, loads, lengths, rj, model, tol, max_newton)
        start = np.asarray(x)
        # the averages over the window, and the orbit over one period from phase 0
        _, total_p, seen = flow_integrals(x, loads, lengths, rj, model)
        total_p, seen = np.asarray(total_p), np.asarray(seen)
        w0, length = window
        whole, rest = divmod(length, period)
        phase = math.fmod(w0, period)
        total = whole * total_p
        if rest > 0:
            y = x
            if phase > 0:
                a, b, _ = schedule(profile, lam, 0.0, phase, dt)
                y = flow(x, jnp.asarray(a), jnp.asarray(b), rj, model)
            end = min(period, phase + rest)
            a, b, _ = schedule(profile, lam, phase, end, dt)
            y, part, _ = flow_integrals(y, jnp.asarray(a), jnp.asarray(b), rj, model)
            total = total + np.asarray(part)
            if phase + rest > period:  # the window wraps into the next period
                a, b, _ = schedule(profile, lam, 0.0, phase + rest - period, dt)
                _, part, _ = flow_integrals(y, jnp.asarray(a), jnp.asarray(b), rj, model)
                total = total + np.asarray(part)
    seen = seen[:n]
    times = np.concatenate([[0.0], np.cumsum(np.asarray(lengths)[: n - 1])])
    mean = total / length
    avg, p0 = averages(pol, system, lam, mean, seen, status, residual, it, classes)
    curve = orbit_curve(pol, classes, times, np.asarray(loads)[:n], seen)
    orbit = PeriodicOrbit(
        start, avg, p0, window, curve, Status(status), float(residual), it, periods, system
    )
    return orbit, tail_decay(seen)
