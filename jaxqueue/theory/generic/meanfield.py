"""The generic mean field of identical exponential servers: its fixed point and transient.

The model (state, routing laws, drift, the sliding flow of JSQ-like routing)
is :mod:`jaxqueue.theory.generic.exponential`; the solvers (Newton, settling, the
adaptive level count) are :mod:`jaxqueue.theory.generic.solvers`. Derivation and
notes: docs/theory.md, "The generic mean field".
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.host import host_float64
from jaxqueue.core.status import Status
from jaxqueue.core.system import MAX_SERVERS, System, check_int
from jaxqueue.policies import Policy, make
from jaxqueue.theory.generic.exponential import (
    Rates,
    Sliding,
    arrival_law,
    cut_step,
    default_iqueue_levels,
    drift,
    drift_from_rates,
    iqueue_gap,
    kinked,
    limit_system,
    ode_drift,
    rates,
    sliding,
    split_at_filling,
    split_state,
    view_of,
)
from jaxqueue.theory.generic.jiqsq import jiq_sq_start
from jaxqueue.theory.generic.meanfield_result import FixedPoint, as_result
from jaxqueue.theory.generic.models import (
    Exponential,
    rk4_path,
    rk4_run,
    settle_flow,
    transient_states,
)
from jaxqueue.theory.generic.settings import LEVEL_TOL, NEWTON, LevelGrowth, Newton, Settle, Solver
from jaxqueue.theory.generic.solvers import (
    DEFAULT_LEVELS,
    MAX_AUTO_LEVELS,
    MAX_DENSE_LEVELS,
    extend_levels,
    grow_levels,
    grown_levels,
    newton,
    round8,
)

__all__ = [
    "Rates",
    "FixedPoint",
    "Sliding",
    "DEFAULT_LEVELS",
    "LEVEL_TOL",
    "MAX_AUTO_LEVELS",
    "MAX_DENSE_LEVELS",
    "TRANSIENT_TOL",
    "limit_system",
    "policy_and_system",
    "split_state",
    "drift",
    "drift_from_rates",
    "rates",
    "arrival_law",
    "kinked",
    "sliding",
    "split_at_filling",
    "cut_step",
    "ode_drift",
    "fixed_point",
    "transient",
    "as_result",
    "iqueue_gap",
    "round8",
    "grown_levels",
    "extend_levels",
    "default_iqueue_levels",
    "working_bytes",
    "check_work",
    "empty_start",
    "rk4_end",
    "jiq_sq_start",
    "MAX_WORKING_BYTES",
]


def _residual(x, load, ratio, policy, system):
    f = drift(x, load, ratio, policy, system)
    if system.iqueue_levels:
        # the I-queues list exactly the idle servers: replaces the Q_1 equation
        f = f.at[system.levels].set(iqueue_gap(x, ratio, system))
    return f


def rk4_end(x, load, ratio, dt, steps, policy, system):
    """The state after ``steps`` RK4 steps of ``dt``
    (:func:`jaxqueue.theory.generic.models.rk4_run`: both traced, so the fixed point's
    start, the sliding flow's runs and any other length share one compiled
    program per policy and system, and no trajectory is kept)."""
    return rk4_run(Exponential(policy, system), x, load, ratio, dt, steps)


#: :func:`rates` compiled, for the host side (not op by op: each op would compile on its own).
_rates_at = jax.jit(rates, static_argnames=("policy", "system"))


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _newton_step(x, load, ratio, policy, system):
    f = _residual(x, load, ratio, policy, system)
    jac = jax.jacobian(lambda y: _residual(y, load, ratio, policy, system))(x)
    dx = jnp.linalg.solve(jac, -f)
    return f, dx


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _sliding_rates(x, load, ratio, policy, system):
    return sliding(x, load, ratio, policy, system).rates


def _settle(x, load, ratio, dt, policy, system, tol):
    """Run the sliding ODE until its drift is below ``tol``:
    ``(x, status, residual)`` (``MAX_ITERATIONS`` if it does not settle)."""
    out = settle_flow(Exponential(policy, system), x, load, ratio, dt, tol)
    return np.asarray(out.x), out.status, out.residual


def empty_start(system: System, ratio) -> np.ndarray:
    x = np.zeros(system.levels + system.iqueue_levels)
    if system.iqueue_levels:  # all servers idle, r listed per I-queue
        x[system.levels : system.levels + min(int(ratio), system.iqueue_levels)] = 1.0
    return x


#: The error per step :func:`transient` allows by default (relative and absolute).
TRANSIENT_TOL = 1e-10


def policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels):
    """The policy (``make(policy, d=d)``, with a mean field) and the limit System.

    Raises ValueError, before anything is compiled, for a policy that is not
    valid with the limit's one dispatcher (``ratio=None``: JIQ-SQ(d) with
    ``d >= 2``) and for a System whose working memory :func:`working_bytes`
    estimates past :data:`MAX_WORKING_BYTES`.
    """
    pol = make(policy, d=d)
    if pol.no_mean_field is not None:
        raise NotImplementedError(f"no mean field for policy {pol.name!r}: {pol.no_mean_field}")
    if pol.mean_field_kind() != "generic" and pol.closed_form() is None:
        raise NotImplementedError(
            f"policy {pol.name!r} has no generic mean field: its mean "
            f"field is {pol.mean_field_kind()!r}"
        )
    if "d" in pol.options():
        check_int("d", pol.options()["d"], 1, MAX_SERVERS)
    if levels is None:
        levels = DEFAULT_LEVELS if buffer is None else buffer
    elif buffer is not None and levels != buffer:
        raise ValueError(f"levels={levels} must equal buffer={buffer} for finite buffers")
    if iqueue_levels is None:
        iqueue_levels = default_iqueue_levels(pol, ratio)
    system = limit_system(pol, ratio, levels, iqueue_levels, buffer)
    if pol.uses_iqueues and system.n_dispatchers == 1:
        _check_one_dispatcher(pol, ratio, buffer)
    _check_work(pol, system, ratio)
    return pol, system


def _check_one_dispatcher(pol: Policy, ratio, buffer) -> None:
    """Refuse a policy of the JIQ family that is not valid with one dispatcher (the limit
    of ``ratio=None``) with the simulator's own message: JIQ-SQ(d) probes ``d`` distinct
    I-queues, so ``d >= 2`` needs ``M >= d`` (JIQ-Pod(d) with ``M = 1`` is idle-first)."""
    # d servers and one dispatcher: any bound on probes of servers holds (d <= N, or
    # d = N, JSQ), so only a bound on the dispatchers can fail
    n = max(1, int(pol.options().get("d", 1)))
    try:
        pol.validate(System(n, 1, buffer, buffer if buffer is not None else 1, 0))
    except ValueError as err:
        raise ValueError(
            f"{pol.label()} with ratio={ratio!r} is not valid: ratio=None (or inf) is one "
            f"dispatcher (M = 1), and {err}; give a ratio r = N / M for several dispatchers, "
            f"or d=1"
        ) from None


#: The most working memory (bytes) a generic mean-field solve may be estimated
#: to take before it is refused, before anything is compiled (raise it on a
#: machine with more). See :func:`working_bytes`. JIQ-SQ(2) at ``lambda = 0.9``
#: (40 levels) passes it up to ``r`` of about 790; measured on 2 CPU cores
#: (from :func:`jiq_sq_start`), ``r = 500`` solves in 4 s, ``r = 780`` in 6 s,
#: and past the bound ``r = 1000`` in 10 s (1.9 GB peak, 1.6 GiB estimated) and
#: ``r = 2000`` in 30 s (6.5 GB peak). (From the ODE run, before: 3.5 min at
#: ``r = 500``, and no convergence at 800 or 1000 after 6 and 9 min.)
MAX_WORKING_BYTES = 2**30


def _grid_entries(policy: Policy, system: System) -> int:
    """The most entries of an outcome grid :func:`rates` walks: the product of the
    law sizes of the arrival's draws, or of the join's (shapes only: nothing runs)."""
    n = system.levels + system.iqueue_levels
    x = jax.ShapeDtypeStruct((n,), jnp.float32)
    most = 1
    for draws in (policy.draws(system), policy.join_draws(system)):
        entries = 1
        for draw in draws:
            shape = jax.eval_shape(lambda y, draw=draw: draw.law(view_of(y, system), system), x)
            entries *= max(1, math.prod(shape.shape))
        most = max(most, entries)
    return most


def working_bytes(policy: Policy, system: System) -> int:
    """Estimated working memory of the generic mean field on ``system``, in bytes.

    Every drift evaluation sums the policy's decision over the grid of its
    draws' outcomes (:func:`rates`): for the JIQ family ``(L + 1)(J + 1)^2``
    entries (a random server's queue length, the dispatcher's I-queue size,
    the I-queue of the idle server a delete request hits), so with ``J``
    growing with the ratio the memory grows as ``L r^2``. A Newton step
    takes about 38 bytes an entry (the grid's float64 weights and int32 keys,
    and the derivative's pass keyed by outcome), the ODE's steps 12, and the
    dense Jacobian and its solve ``24 (L + J + 1)^2``: XLA's own count for
    the compiled Newton step (``memory_analysis``) is 37.4 to 37.9 bytes an
    entry for JIQ-SQ(2) at ``(L, J) = (40, 130), (40, 330), (200, 130)``, and
    24.0 ``(L + 1)^2`` for Pod(2) at ``L = 2000``. Peak RSS of JIQ-SQ(2) at
    ``r = 1000`` (``J = 1030``): 1.9 GB, against 1.6 GiB here (plus the
    interpreter's 0.3 GB). At ``J = 40010`` (``r = 10^4`` with ``J = 4 r +
    10``) XLA asked for one buffer of 788 GB.
    """
    L, J = system.levels, system.iqueue_levels
    return 38 * _grid_entries(policy, system) + 24 * (L + J + 1) ** 2


def _check_work(pol: Policy, system: System, ratio) -> None:
    """Refuse, before compiling, a solve estimated past :data:`MAX_WORKING_BYTES`."""
    need = working_bytes(pol, system)
    if need > MAX_WORKING_BYTES:
        if system.iqueue_levels:
            grows = "; the I-queue levels grow with the ratio, the grid as ratio^2"
            advice = "use a smaller ratio (r = N / M)"
        else:
            grows, advice = "", "give fewer levels"
        shown = "None" if ratio is None else f"{float(ratio):g}"
        raise ValueError(
            f"the mean field of {pol.label()} at ratio={shown} with levels={system.levels} "
            f"and iqueue_levels={system.iqueue_levels} would take about {need / 2**30:.1f} GiB "
            f"of working memory (its outcome grid has {_grid_entries(pol, system):.3g} "
            f"entries{grows}), more than MAX_WORKING_BYTES = {MAX_WORKING_BYTES / 2**30:.1f} "
            f"GiB; {advice}, simulate from init='empty', or raise "
            f"jaxqueue.theory.generic.meanfield.MAX_WORKING_BYTES on a machine with more memory"
        )


def check_work(
    policy,
    ratio: float | None = None,
    *,
    d: int | None = None,
    buffer: int | None = None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
) -> int:
    """The working memory (bytes) :func:`fixed_point` is estimated to take at its first
    level count (:func:`working_bytes`), or a ValueError past :data:`MAX_WORKING_BYTES`
    (also one for a policy not valid with one dispatcher at ``ratio=None``), without
    compiling or solving anything: a simulation's ``init='auto'`` asks it first."""
    pol, system = policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels)
    return working_bytes(pol, system)


def fixed_point(
    policy,
    load: float,
    ratio: float | None = None,
    *,
    d: int | None = None,
    buffer: int | None = None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    start=None,
    solver: Solver | Newton | Settle | LevelGrowth | None = None,
) -> FixedPoint:
    """Fixed point of the generic mean field (float64: x64 is switched on for the call).

    With infinite buffers and ``levels`` left to it, the level count is
    adaptive: from :data:`DEFAULT_LEVELS`, grown (the solution extended by
    its tail's decay as Newton's start) until the mass at the bound
    ``s_levels`` is at most the level growth's ``tol``, up to :data:`MAX_AUTO_LEVELS`
    (past that a warning, and ``truncated`` says what is left out). Heavy
    loads need hundreds of levels: JIQ-SQ(2) at ``lambda = 0.99``, ``r = 1``
    takes 1168.

    A finite ``buffer`` above :data:`DEFAULT_LEVELS` at a load below 1 is
    solved the same way, on the levels its queues reach (at most the
    buffer), and is zero above them (``truncated`` holds the at most
    the level growth's ``tol`` at the last level solved); where the queues fill more,
    on all ``buffer`` levels, which must then be at most
    :data:`MAX_DENSE_LEVELS` (a ``ValueError`` otherwise).

    Args:
        policy: name or Policy (options via ``d``).
        load: ``lambda`` (> 0; < 1 unless ``buffer`` is given).
        ratio: ``r = N / M`` for the JIQ family; None (or inf) for one dispatcher.
        buffer: places per server, or None (then ``levels`` bounds the tail).
        levels: the largest queue length represented (tails ``s_0..s_levels``);
            default adaptive (above), or ``buffer`` (which it must equal for
            finite buffers). A given ``levels`` with infinite buffers solves
            the truncated model: arrivals to a server at the bound are left
            out, and ``truncated`` holds the mass there.
        iqueue_levels: the largest I-queue size represented (default
            :func:`default_iqueue_levels`: ``max(30, 4 r + 10)``, or
            ``max(30, r + 30)`` where idle servers join the shortest of
            ``d >= 2`` I-queues); the mass at both bounds is reported.
        solver: the solver's settings (:class:`~jaxqueue.theory.generic.settings.Solver`,
            or one of its parts): Newton's ``tol`` and ``max_iter``, the level
            growth's ``tol`` (the adaptive count's target mass at the bound), and
            the ODE run (RK4, :class:`~jaxqueue.theory.generic.settings.Settle`;
            default 50 time units in steps of 0.1) that gives Newton its start: from
            the empty system, or at a load of 1 or more with a buffer from the
            full one (overload fills the buffer at ``load - 1`` tasks per unit
            time: from empty, a buffer of 100 would take 500). Not used for
            JIQ-SQ(d) with several dispatchers: Newton starts from its fixed
            point reduced to ``p0`` (:func:`jiq_sq_start`; the ODE's RK4 steps
            are unstable past ``r`` of about 30). There ``1 - Q_j`` below
            about 1e-16 (``p0`` is about ``d^-(r (1 - lambda))``: 3e-25 at
            ``r = 800``, ``lambda = 0.9``) is 0 in float64, as is ``p0 = 1 -
            Q_1`` past ``r`` of about 520 there (``s_2``, about ``lambda^2
            p0``, keeps it), and the residual Newton reaches grows as about
            ``r`` times 2e-16 (4e-13 at ``r = 2000``): Newton's ``tol`` is met up to
            ``r`` of a few thousand, past the memory bound
            (:data:`MAX_WORKING_BYTES`).
        start: ``[s_1..s_L, Q_1..Q_J]`` to start Newton from instead of the
            ODE run (e.g. a closed form's fixed point); its length must match
            ``levels`` (:data:`DEFAULT_LEVELS` with infinite buffers unless
            given: no adaptive count then) plus ``iqueue_levels``.

    Raises:
        NotImplementedError: for a policy without a mean field (with the reason).
        ValueError: before anything is compiled, for JIQ-SQ(d >= 2) at ``ratio=None``
            (one dispatcher; it probes ``d`` I-queues), and where the working memory
            :func:`working_bytes` estimates passes :data:`MAX_WORKING_BYTES` (the
            JIQ family's outcome grid grows as ``r^2``: JIQ-SQ at large ratios).
    """
    solver = Solver.of(solver)
    level_tol = solver.levels.tol
    if buffer is not None and start is None and buffer > DEFAULT_LEVELS:
        check_int("buffer", buffer, 1, 10**6)
        # a buffer far above the queues the load builds: the fixed point on the levels
        # the queues reach (at most level_tol at their bound), zero above
        if float(load) < 1.0:
            pol, system = policy_and_system(policy, ratio, d, None, None, iqueue_levels)
            fp, system = _grow(
                pol, system, load, ratio, d, iqueue_levels, solver, min(buffer, MAX_AUTO_LEVELS)
            )
            if fp.status == Status.CONVERGED and fp.tail[system.levels] <= level_tol:
                return _padded(fp, buffer)
        if buffer > MAX_DENSE_LEVELS:
            why = (
                "at a load of 1 or more the queues fill it"
                if float(load) >= 1.0
                else f"the queues reach past {min(buffer, MAX_AUTO_LEVELS)} places"
            )
            raise ValueError(
                f"buffer={buffer} is too large for the mean field at load={load}: {why}, and a "
                f"finite buffer's fixed point is solved on at most {MAX_DENSE_LEVELS} levels; "
                f"give a buffer of at most {MAX_DENSE_LEVELS} (or simulate from init='empty')"
            )
    adaptive = levels is None and buffer is None and start is None
    pol, system = policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels)
    dim = system.levels + system.iqueue_levels
    if start is not None and np.shape(start) != (dim,):
        raise ValueError(
            f"start must have shape ({dim},) (levels + iqueue_levels), got {np.shape(start)}"
        )
    if not adaptive:
        return _solve_on(pol, system, load, ratio, solver, start)
    fp, system = _grow(pol, system, load, ratio, d, iqueue_levels, solver, MAX_AUTO_LEVELS)
    L = system.levels
    if fp.status == Status.CONVERGED and fp.tail[L] > level_tol:
        warnings.warn(
            f"meanfield.fixed_point: the tail mass at levels={L} is {fp.tail[L]:.3g} > "
            f"LevelGrowth.tol={level_tol:g}, and more levels would pass MAX_AUTO_LEVELS="
            f"{MAX_AUTO_LEVELS}; pass levels to choose",
            stacklevel=2,
        )
    return fp


def _grow(pol, system, load, ratio, d, iqueue_levels, solver: Solver, cap: int) -> tuple:
    """The adaptive level count (infinite buffers): ``(fixed point, system)`` with at most
    ``level_tol`` at the bound, or at ``cap`` levels with more (or not converged)."""
    systems = {system.levels: system}

    def solve(levels, start):
        if levels not in systems:
            systems[levels] = policy_and_system(pol, ratio, d, None, levels, iqueue_levels)[1]
        sys_l = systems[levels]
        fp = _solve_on(pol, sys_l, load, ratio, solver, start)
        return fp, fp.status, fp.tail, np.concatenate([fp.tail[1:], fp.iq_tail[1:]])

    fp, levels, _ = grow_levels(solve, system.levels, level_tol=solver.levels.tol, cap=cap)
    return fp, systems[levels]


def _padded(fp: FixedPoint, buffer: int) -> FixedPoint:
    """A fixed point on ``L < buffer`` levels as the finite buffer's: zero above ``L``
    (nothing is blocked; ``truncated`` keeps the at most ``level_tol`` at ``L``)."""
    L = fp.tail.size - 1
    pad = np.zeros(buffer - L)
    rates = fp.rates._replace(level=np.concatenate([fp.rates.level, pad]))
    return fp._replace(tail=np.concatenate([fp.tail, pad]), rates=rates)


def _solve_on(pol, system, load, ratio, solver: Solver, start) -> FixedPoint:
    """The fixed point on ``system``'s bounds: Newton from ``start`` or from an ODE run."""
    buffer = system.buffer
    warmup_time, dt = solver.settle.of(50.0, 0.1)
    tol, max_newton = solver.newton.of(*NEWTON)
    with host_float64():
        lam = jnp.float64(load)
        r = jnp.float64(ratio if system.iqueue_levels else 1.0)
        if start is None:
            start = jiq_sq_start(pol, system, load, ratio)
        if start is None:
            if buffer is not None and float(load) >= 1.0:  # every place taken, none listed
                x0 = jnp.asarray(np.r_[np.ones(system.levels), np.zeros(system.iqueue_levels)])
            else:
                x0 = jnp.asarray(empty_start(system, ratio or 1.0), jnp.float64)
            steps = int(math.ceil(warmup_time / dt))
            x = rk4_end(x0, lam, r, jnp.float64(dt), steps, pol, system)
            x0_run = x
        else:
            x = jnp.asarray(start, jnp.float64)
        status, it, res = Status.MAX_ITERATIONS, 0, math.inf
        # the ODE run ended on a full level (JSQ-like routing above capacity): Newton's drift
        # jumps there, so the sliding flow settles on the fixed point instead (below)
        if not (kinked(pol, system) and start is None and float(x[0]) >= 1.0):
            # the host side in NumPy (nothing to compile); full steps, clipped to [0, 1]
            x, status, res, it, _ = newton(
                lambda y: (
                    *(np.asarray(v, np.float64) for v in _newton_step(y, lam, r, pol, system)),
                    None,
                ),
                x,
                tol=tol,
                max_iter=max_newton,
                halvings=0,
            )
        x = np.asarray(x, np.float64)
        if kinked(pol, system):
            if status != Status.CONVERGED and start is None:
                x, status, res = _settle(np.asarray(x0_run), lam, r, dt, pol, system, tol)
            rt = Rates(*(np.asarray(v, np.float64) for v in _sliding_rates(x, lam, r, pol, system)))
        else:
            rt = Rates(*(np.asarray(v, np.float64) for v in _rates_at(x, pol, system)))
    s, q = split_state(x, system)
    truncated = (float(s[-1]) if buffer is None else 0.0, float(q[-1]) if q.size > 1 else 0.0)
    return FixedPoint(s, q, rt, res, status, it, truncated)


def transient(
    policy,
    load: float,
    ratio: float | None = None,
    *,
    d: int | None = None,
    buffer: int | None = None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    t_end: float = 50.0,
    dt: float = 0.1,
    x0=None,
    tol: float | None = TRANSIENT_TOL,
):
    """The mean-field ODE from ``x0`` (default: empty system), at the times ``dt, 2 dt, ..``
    up to ``t_end``.

    Arguments as for :func:`fixed_point`; ``x0`` is ``[s_1..s_L, Q_1..Q_J]``.
    ``tol``: the error per step the integrator allows (Dormand-Prince 5(4)
    with step-size control, relative and absolute: the states are fractions);
    None: RK4 with a fixed step ``dt`` and no error estimate.

    Returns:
        ``(times, tails, iq_tails)``: ``(T,)``, ``(T, L + 1)``, ``(T, J + 1)``.
    """
    pol, system = policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels)
    steps = int(math.ceil(t_end / dt))
    times = dt * np.arange(1, steps + 1)
    with host_float64():
        start = empty_start(system, ratio or 1.0) if x0 is None else np.asarray(x0)
        args = (
            jnp.float64(load),
            jnp.float64(ratio if system.iqueue_levels else 1.0),
        )
        x = jnp.asarray(start, jnp.float64)
        if tol is None:
            xs = rk4_path(Exponential(pol, system), x, *args, jnp.float64(dt), steps)
        else:
            xs, _, _, failed = transient_states(
                Exponential(pol, system), x, jnp.asarray(times), *args, jnp.float64(tol), dt
            )
            if bool(failed):
                warnings.warn("meanfield.transient: the integrator ran out of steps", stacklevel=2)
        xs = np.asarray(xs)
    L = system.levels
    ones = np.ones((steps, 1))
    tails = np.concatenate([ones, xs[:, :L]], axis=1)
    iq = np.concatenate([ones, xs[:, L:]], axis=1)
    return times, tails, iq
