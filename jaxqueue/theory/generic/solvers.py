"""The solver core of the mean fields: Newton, settling an ODE, growing the level count.

Host loops in float64 that report how they ended (a
:class:`~jaxqueue.core.status.Status`, the residual, the count) instead of
raising; the models supply the compiled pieces (a linearization, an ODE run).
Why these are written here rather than taken from a library: docs/theory.md,
"Solvers".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.status import Status

__all__ = [
    "DEFAULT_LEVELS",
    "MAX_AUTO_LEVELS",
    "MAX_DENSE_LEVELS",
    "NewtonResult",
    "SettleResult",
    "newton",
    "settle",
    "RootResult",
    "bracketed_root",
    "grow_levels",
    "grown_levels",
    "extend_levels",
    "round8",
    "dormand_prince_step",
    "integrate",
]


#: The first ``levels`` of the generic mean field's adaptive count (infinite buffers).
DEFAULT_LEVELS = 40
#: Most levels the adaptive count of the exponential fixed point grows to.
MAX_AUTO_LEVELS = 2048
#: Most levels of a finite buffer's fixed point where the queues fill it (dense
#: Newton: a Jacobian of this order); below capacity only the levels the queues
#: reach are solved, whatever the buffer.
MAX_DENSE_LEVELS = 4096


class NewtonResult(NamedTuple):
    """How :func:`newton` ended.

    Attributes:
        x: the last iterate (host float64).
        status: ``CONVERGED``, ``MAX_ITERATIONS`` or ``NON_FINITE``.
        residual: the max-norm of the residual at ``x``.
        iterations: the linearizations accepted (the count at which it stopped).
        aux: what the linearization returned besides the residual and step at ``x``.
    """

    x: np.ndarray
    status: Status
    residual: float
    iterations: int
    aux: Any


def newton(
    linearize: Callable,
    x,
    *,
    tol: float,
    max_iter: int,
    halvings: int = 7,
    bounds: tuple | None = (0.0, 1.0),
) -> NewtonResult:
    """Newton's method with backtracking on the max-norm of the residual.

    ``linearize(x) -> (f, dx, aux)``: the residual at ``x``, the Newton step
    there (``J^-1 (-f)``) and anything else the caller wants back at the last
    iterate. From ``x`` each step tries ``x + t dx`` for ``t = 1, 1/2, ..``
    (at most ``halvings`` times; 0: the full step always), clipped to
    ``bounds`` (None: no clip), and takes the first whose residual is below
    the current one (the last tried otherwise). It stops at a residual below
    ``tol`` (``CONVERGED``), a non-finite residual or step (``NON_FINITE``),
    or after ``max_iter`` steps (``MAX_ITERATIONS``, unless the last step
    reached ``tol``).
    """

    def clip(y):
        return y if bounds is None else np.clip(y, *bounds)

    x = np.asarray(x, np.float64)
    f, dx, aux = linearize(x)
    res = float(np.max(np.abs(f)))
    status, it = Status.MAX_ITERATIONS, 0
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is returned)
        if not (math.isfinite(res) and np.all(np.isfinite(dx))):
            status = Status.NON_FINITE
            break
        if res < tol:
            status = Status.CONVERGED
            break
        step = 1.0
        for _ in range(halvings + 1):
            y = clip(x + step * dx)
            fy, dy, ay = linearize(y)
            ry = float(np.max(np.abs(fy)))
            if ry < res or not math.isfinite(ry):
                break
            step *= 0.5
        x, dx, res, aux = y, dy, ry, ay
    else:
        if res < tol:
            status = Status.CONVERGED
    return NewtonResult(x, status, res, it, aux)


class SettleResult(NamedTuple):
    """How :func:`settle` ended: the state, ``CONVERGED`` or ``MAX_ITERATIONS``,
    the residual there, the runs taken and what ``residual`` returned besides."""

    x: Any
    status: Status
    residual: float
    runs: int
    aux: Any


def settle(advance: Callable, residual: Callable, x, *, tol: float, runs: int) -> SettleResult:
    """Run an ODE until it settles: ``x = advance(x)`` (one run of the flow)
    until ``residual(x) -> (max-norm of the drift, aux)`` is below ``tol``,
    at most ``runs`` times. Where Newton has no zero to find (a fixed point on
    a full level, where the drift jumps) the flow still settles on it."""
    res, aux, status, n = math.inf, None, Status.MAX_ITERATIONS, 0
    for n in range(1, runs + 1):  # noqa: B007 (the count is returned)
        x = advance(x)
        res, aux = residual(x)
        res = float(res)
        if res < tol:
            status = Status.CONVERGED
            break
    return SettleResult(x, status, res, n, aux)


class RootResult(NamedTuple):
    """How :func:`bracketed_root` ended: the root, ``CONVERGED`` or
    ``MAX_ITERATIONS``, ``|f|`` there, the evaluations taken and what ``f``
    returned besides its value at the root."""

    x: float
    status: Status
    residual: float
    iterations: int
    aux: Any


def bracketed_root(
    f: Callable,
    lo: float,
    hi: float,
    f_lo: float,
    f_hi: float,
    *,
    rtol: float,
    ftol: float,
    max_iter: int = 200,
) -> RootResult:
    """A root of a scalar ``f`` in ``(lo, hi)``, where ``f_lo = f(lo)`` and
    ``f_hi = f(hi)`` have opposite signs: regula falsi with the Illinois rule
    (the end that stays twice in a row has its value halved), bisecting
    where the secant leaves the bracket or while the bracket is wider than
    1/2 after a first step. ``f(x)`` returns ``(value, aux)``. Stops where
    ``f`` is 0, the bracket is narrower than ``rtol`` times the point, or
    ``|f| < ftol``; after ``max_iter`` evaluations the status is
    ``MAX_ITERATIONS`` (the host loops of the theory report, not raise)."""
    side, mid, f_mid, aux = 0, 0.5 * (lo + hi), math.inf, None
    for n in range(1, max_iter + 1):
        mid = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        if not lo < mid < hi or (hi - lo) > 0.5 and side != 0:
            mid = 0.5 * (lo + hi)
        f_mid, aux = f(mid)
        if f_mid == 0:
            return RootResult(mid, Status.CONVERGED, 0.0, n, aux)
        if (f_mid > 0) == (f_lo > 0):
            lo, f_lo = mid, f_mid
            f_hi = f_hi / 2 if side == 1 else f_hi
            side = 1
        else:
            hi, f_hi = mid, f_mid
            f_lo = f_lo / 2 if side == -1 else f_lo
            side = -1
        if hi - lo < rtol * abs(mid) or abs(f_mid) < ftol:
            return RootResult(mid, Status.CONVERGED, abs(f_mid), n, aux)
    return RootResult(mid, Status.MAX_ITERATIONS, abs(f_mid), max_iter, aux)


def round8(n: float) -> int:
    """``n`` rounded up to a multiple of 8 (level counts share compiled shapes)."""
    return int(8 * math.ceil(n / 8))


def grown_levels(tail: np.ndarray, L: int, level_tol: float) -> int:
    """More levels for a solved tail ``s_0..s_L`` whose mass at the bound passes
    ``level_tol``, from its decay near (not at) the bound."""
    hi, lo = max(1, L - 4), max(1, L - 12)
    eta = (tail[hi] / tail[lo]) ** (1.0 / (hi - lo)) if tail[lo] > 0 and hi > lo else 0.0
    if not 0.0 < eta < 1.0:
        return 2 * L
    more = math.log(level_tol / max(tail[L], 1e-300)) / math.log(eta)
    return round8(L + max(8.0, 1.25 * more + 8))


def extend_levels(x, L_old: int, L_new: int, P: int, J: int) -> np.ndarray:
    """A state ``[x[1..L_old, :P].ravel(), Q_1..Q_J]`` at ``L_old`` levels (by
    class, ``P`` classes; ``P = 1`` is the tails ``s_1..s_L``) extended to
    ``L_new`` levels by its geometric tail decay: the start of a solve with more levels."""
    X = np.asarray(x[: L_old * P]).reshape(L_old, P)
    q = np.asarray(x[L_old * P :])
    base = max(1, L_old - 3)  # the last levels are distorted by the truncation
    n = X.sum(axis=1)
    lo = max(0, base - 1 - 4)
    eta = (n[base - 1] / n[lo]) ** (1.0 / (base - 1 - lo)) if n[lo] > 0 and base - 1 > lo else 0.5
    eta = min(max(eta, 0.0), 0.999)
    out = np.zeros((L_new, P))
    out[:base] = X[:base]
    k = np.arange(base, L_new) - (base - 1)
    out[base:] = X[base - 1][None, :] * (eta**k)[:, None]
    return np.concatenate([out.reshape(-1), q[:J]])


def grow_levels(solve: Callable, levels: int, *, level_tol: float, cap: int, classes: int = 1):
    """The adaptive level count: solve on ``levels``, and while the tail mass at
    the bound passes ``level_tol``, on more (:func:`grown_levels`, at most
    ``cap``) from the last solution extended by its tail's decay
    (:func:`extend_levels`).

    ``solve(levels, start) -> (result, status, tail, x)``: a solve on
    ``levels`` from ``start`` (None: the model's own start), its status, its
    tail ``s_0..s_levels`` and its state (``classes`` per level, then the
    I-queues). A solve from an extended start that fails is done again from
    the model's start.

    Returns:
        ``(result, levels, capped)``: ``capped`` where more levels would pass
        ``cap`` though the mass at the bound is still above ``level_tol``.
    """
    start = None
    while True:
        result, status, tail, x = solve(levels, start)
        if start is not None and status != Status.CONVERGED:  # the extension failed
            result, status, tail, x = solve(levels, None)
        if status != Status.CONVERGED or tail[levels] <= level_tol:
            return result, levels, False
        more = min(grown_levels(tail, levels, level_tol), cap)
        if more <= levels:
            return result, levels, True
        x = np.asarray(x)
        start = extend_levels(x, levels, more, classes, x.size - levels * classes)
        levels = more


#: Dormand and Prince's RK5(4) pair: stage rows ``a``, the fifth-order weights
#: ``b`` (the seventh stage is at the fifth-order solution) and ``e = b - b*``,
#: the difference from the embedded fourth-order weights (the error estimate).
_DP_A = (
    (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    (1 / 5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    (3 / 40, 9 / 40, 0.0, 0.0, 0.0, 0.0, 0.0),
    (44 / 45, -56 / 15, 32 / 9, 0.0, 0.0, 0.0, 0.0),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729, 0.0, 0.0, 0.0),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656, 0.0, 0.0),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0),
)
_DP_B = _DP_A[6]
_DP_E = (
    71 / 57600,
    0.0,
    -71 / 16695,
    71 / 1920,
    -17253 / 339200,
    22 / 525,
    -1 / 40,
)


def dormand_prince_step(rhs: Callable, y, h):
    """One Dormand-Prince 5(4) step of ``dy/dt = rhs(y)`` (autonomous):
    ``(y + h * fifth-order increment, error estimate, rhs(y))``.

    The seven stages are one loop (:func:`jax.lax.scan`), so ``rhs`` is
    compiled twice (the first stage and the loop), not seven times.
    """
    a = jnp.asarray(_DP_A, y.dtype)
    k1 = rhs(y)
    stages = jnp.zeros((7,) + y.shape, y.dtype).at[0].set(k1)

    def stage(ks, i):
        return ks.at[i].set(rhs(y + h * jnp.tensordot(a[i], ks, axes=1))), None

    stages, _ = jax.lax.scan(stage, stages, jnp.arange(1, 7))
    new = y + h * jnp.tensordot(jnp.asarray(_DP_B, y.dtype), stages, axes=1)
    err = h * jnp.tensordot(jnp.asarray(_DP_E, y.dtype), stages, axes=1)
    return new, err, k1


def integrate(
    rhs: Callable,
    x0,
    times,
    *,
    rtol: float,
    atol: float,
    h0: float,
    cut: Callable | None = None,
    finish: Callable | None = None,
    max_steps: int = 100_000,
):
    """``dy/dt = rhs(y)`` from ``x0`` at time 0, recorded at ``times`` (non-decreasing,
    ``>= 0``), by Dormand-Prince 5(4) steps whose size is controlled by the error estimate.

    A step is accepted where ``max |err| / (atol + rtol max(|y|, |y'|)) <= 1``;
    the next is ``0.9 err^(-1/5)`` times as long (between 1/5 and 5 times). The
    steps end on the recorded times; ``h0`` is the first step's length.

    Args:
        cut: ``cut(step, y, h, new, err, slope) -> (new, err)``: the kink
            handling of JSQ-like routing (a step cut where a level fills,
            :func:`jaxqueue.theory.generic.exponential.split_at_filling`); ``step(y,
            h) -> (y', err)``, ``slope = rhs(y)``. The error estimates of the
            two parts add up.
        finish: applied to every accepted state (the clip to [0, 1], a level
            made exactly full).
        max_steps: the most step attempts in all; past them the states left
            are those reached (``failed`` says so).

    Returns:
        ``(states, steps, rejected, failed)``: ``(T, n)``, the step attempts
        accepted and rejected, and whether ``max_steps`` ran out. Traceable
        (call it under :func:`jax.jit`).
    """
    finish = finish or (lambda y: y)

    def attempt(y, h):
        new, err, slope = dormand_prince_step(rhs, y, h)
        if cut is not None:
            new, err = cut(lambda z, s: dormand_prince_step(rhs, z, s)[:2], y, h, new, err, slope)
        scale = atol + rtol * jnp.maximum(jnp.abs(y), jnp.abs(new))
        return new, jnp.max(jnp.abs(err) / scale)

    def to(carry, t_out):
        def cond(c):
            t, _, _, n, _ = c
            return (t < t_out) & (n < max_steps)

        def body(c):
            t, y, h, n, rejected = c
            last = h >= t_out - t
            hh = jnp.where(last, t_out - t, h)
            new, e = attempt(y, hh)
            ok = e <= 1.0
            grow = jnp.clip(0.9 * jnp.where(e > 0, e, 1e-10) ** -0.2, 0.2, 5.0)
            t = jnp.where(ok, jnp.where(last, t_out, t + hh), t)
            y = jnp.where(ok, finish(new), y)
            h = jnp.where(ok & last, jnp.maximum(h, hh * grow), hh * grow)
            return t, y, h, n + 1, rejected + jnp.where(ok, 0, 1)

        carry = jax.lax.while_loop(cond, body, carry)
        return carry, carry[1]

    zero = jnp.zeros((), jnp.int32)
    init = (jnp.zeros((), x0.dtype), x0, jnp.asarray(h0, x0.dtype), zero, zero)
    (t, _, _, n, rejected), states = jax.lax.scan(to, init, jnp.asarray(times, x0.dtype))
    return states, n - rejected, rejected, t < jnp.asarray(times, x0.dtype)[-1]
