"""The ``p0`` equation of JIQ-Pod(d) in the mean-field limit (JAX).

``p0``, the fraction of empty I-queues, solves the normalisation of one
I-queue's birth-death size law (Wang, Feng and Cheng, arXiv:1709.10119):
:func:`solve_p0` (safeguarded Newton, implicit gradients), :func:`p0_grid`,
:func:`host_p0` and :func:`iqueue_distribution`, indexed by the fallback's
probe count ``d`` (``d = 1``: JIQ). The equation, its exact rewriting, the
solver and its accuracy in float64 and float32: docs/theory-derivations.md.

Example:
    >>> from jaxqueue import theory
    >>> sol = theory.solve_p0(0.9, 10.0)  # JIQ at lambda = 0.9, r = 10
    >>> int(sol.status)
    0
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.host import host_float64
from jaxqueue.core.status import Status
from jaxqueue.theory.closed.numerics import as_float_arrays, check_d, float_dtype

__all__ = ["P0Solution", "solve_p0", "host_p0", "p0_grid", "iqueue_distribution"]

_MAX_ITER = 60
_GRID_CHUNK = 16384  # points per vectorised solve in p0_grid

# Evaluation of G(c) = int_0^inf exp(-c q(s) - delta (1 - e^-s)) ds.
_SERIES_MAX_C = 10.0  # series below, quadrature above
_SERIES_TERMS = 48  # terms <= c**k Gamma(c+1)/Gamma(c+k+1) < 1e-23 at c = 10, k = 48
_TRUNC_LOG = 40.0  # the quadrature stops where the integrand is e**-40
_GL_X, _GL_W = np.polynomial.legendre.leggauss(24)
_GL_X = (_GL_X + 1.0) / 2.0  # nodes and weights on [0, 1]
_GL_W = _GL_W / 2.0
# q(s) = s**2 * sum_n (-s)**n / (n + 2)!  for s < 1/2 (15 terms: < 1e-17 relative)
_Q_COEFS = tuple((-1.0) ** n / math.factorial(n + 2) for n in range(15))


# ---------------------------------------------------------------------------
# The p0 equation
# ---------------------------------------------------------------------------


def _q(s, em):
    """``q(s) = s - 1 + exp(-s)`` without cancellation (``s >= 0``, ``em = expm1(-s)``)."""
    small = s < 0.5
    x = jnp.where(small, s, 0.0)
    poly = jnp.full_like(x, _Q_COEFS[-1])
    for coef in _Q_COEFS[-2::-1]:
        poly = poly * x + coef
    return jnp.where(small, x * x * poly, s + em)


def _truncation(c, a, delta):
    """``S`` with ``psi(S) ~ -40`` for ``psi(s) = -c q(s) - delta (1 - e**-s)`` (``S`` >= root).

    Starts right of the root from the bounds ``psi(s) <= a - c s`` and, for
    ``s <= 1``, ``psi(s) <= -delta s - a s**2 / 3``; Newton steps on the concave
    ``psi`` then stay right of the root.
    """
    t = _TRUNC_LOG
    s_lin = (t + a) / c
    s_quad = 2.0 * t / (delta + jnp.sqrt(delta * delta + 4.0 * a * t / 3.0))
    s = jnp.where(s_quad <= 1.0, jnp.minimum(s_quad, s_lin), s_lin)
    for _ in range(2):
        em = jnp.expm1(-s)
        one_minus_e = -em
        psi = -c * _q(s, em) - delta * one_minus_e
        dpsi = -c * one_minus_e - delta * (1.0 - one_minus_e)
        s = s - (psi + t) / dpsi
    return s


def _series(c, a):
    """Series branch (``c <= 10``): ``S - 1 = sum_{k>=1} t_k`` and ``d log S / du``.

    ``S = M(1, c + 1, a) = sum_{k>=0} t_k``, ``t_k = prod_{j=1..k} a / (c + j)``.
    Along ``u = log p0`` both ``c`` and ``a`` move by ``-c du``, so with
    ``H_k = sum_{j<=k} 1/(c + j)``: ``d log t_k / du = -c (k / a - H_k)``; the term
    ``t_k k / a = k t_{k-1} / (c + k)`` needs no division by ``a``.
    """

    def add_term(k, carry):
        term, rest, k_over_a, harmonic, t_harmonic = carry
        k = k.astype(c.dtype)
        inv = 1.0 / (c + k)
        k_over_a = k_over_a + k * inv * term  # sum_k t_k k / a
        term = term * a * inv  # t_k
        harmonic = harmonic + inv  # H_k
        return term, rest + term, k_over_a, harmonic, t_harmonic + term * harmonic

    zero = jnp.zeros_like(c)
    _, rest, k_over_a, _, t_harmonic = jax.lax.fori_loop(
        1, _SERIES_TERMS + 1, add_term, (jnp.ones_like(c), zero, zero, zero, zero), unroll=8
    )
    return rest, -c * (k_over_a - t_harmonic) / (1.0 + rest)


def _quadrature(c, a, delta):
    """Quadrature branch (``c > 10``): ``(log G, a I1, <q>)``.

    ``G = I0 = int_0^inf e**psi ds`` with ``psi = -c q(s) - delta (1 - e**-s)``
    ``= -delta s - a q(s)``, ``I1 = int_0^inf (1 - e**-s) e**psi ds`` and
    ``<q> = int q e**psi / I0``. Integrating ``-psi' e**psi`` gives the identity
    ``delta I0 + a I1 = 1``, used by the caller where ``a I1`` is small.
    """
    dtype = c.dtype
    length = jax.lax.stop_gradient(_truncation(c, a, delta))  # G does not depend on it
    s = length[..., None] * jnp.asarray(_GL_X, dtype)
    em = jnp.expm1(-s)
    q = _q(s, em)
    weighted = jnp.asarray(_GL_W, dtype) * jnp.exp(-c[..., None] * q + delta[..., None] * em)
    sum0 = jnp.sum(weighted, -1)
    a_i1 = -a * length * jnp.sum(weighted * em, -1)
    return jnp.log(length) + jnp.log(sum0), a_i1, jnp.sum(weighted * q, -1) / sum0


def _coefficients(load, ratio, d: int):
    """``(r g, 1 - lambda**d, lambda**d)`` with ``g = (1 - lambda)/(1 - lambda**d)``."""
    if d == 1:
        return ratio, 1.0 - load, load
    om = -jnp.expm1(d * jnp.log(load))
    return ratio * (1.0 - load) / om, om, 1.0 - om


def _residual_and_slope(u, load, ratio, d: int):
    """``F(u) = log p0 + log M(1, c + 1, a)`` at ``p0 = exp(u)``, and ``dF/du > 0``.

    Three exact forms, each where it is well conditioned:

    * ``c <= 10``: ``F = u + log1p(S - 1)`` (series);
    * ``c > 10``, ``a I1 <= 1/2``: ``F = -d log(lambda) + log1p(-a I1)``, since
      ``r g / delta = lambda**-d`` and ``delta G = 1 - a I1``. Near ``lambda = 1``
      the two terms nearly cancel and ``F`` is flat in ``u`` (slope down to
      ``1e-4`` at ``lambda = 1 - 1e-6``, ``r = 1e4``): the small correction
      ``a I1`` must carry the relative accuracy, not ``log G``;
    * otherwise ``F = log(r g) + log G``.

    The slope is ``1 + d log S / du`` (series) or ``c <q>`` (quadrature).
    """
    rg, om, lam_d = _coefficients(load, ratio, d)
    c = rg * jnp.exp(-u)
    a = rg * (jnp.expm1(-u) + om)  # c - delta without cancellation
    delta = rg * lam_d
    small = c <= _SERIES_MAX_C
    # Safe stand-ins keep the branch that is not taken finite (and its gradient).
    rest, dlog_s = _series(jnp.where(small, c, 1.0), jnp.where(small, a, 0.5))
    f_series = u + jnp.log1p(rest)
    cq = jnp.where(small, 2.0 * _SERIES_MAX_C, c)
    log_g, a_i1, mean_q = _quadrature(
        cq, jnp.where(small, _SERIES_MAX_C, a), jnp.where(small, _SERIES_MAX_C, delta)
    )
    near_one = a_i1 <= 0.5
    log_lam_d = d * jnp.log(load)
    log1p_term = jnp.log1p(-jnp.where(near_one, a_i1, 0.0))
    f_quad = jnp.where(near_one, log1p_term - log_lam_d, jnp.log(rg) + log_g)
    f = jnp.where(small, f_series, f_quad)
    slope = jnp.where(small, 1.0 + dlog_s, cq * mean_q)
    # Size of the terms whose rounding makes up the error of f.
    scale = jnp.where(
        small,
        jnp.abs(u) + jnp.log1p(rest),
        jnp.where(near_one, jnp.abs(log_lam_d) - log1p_term, jnp.abs(jnp.log(rg)) + jnp.abs(log_g)),
    )
    return f, slope, scale


class P0Solution(NamedTuple):
    """Solution of the ``p0`` equation, per point (arrays of the broadcast input shape).

    Attributes:
        p0: the fraction of empty I-queues (NaN where ``status != 0``).
        status: int32 :class:`~jaxqueue.core.status.Status` codes: ``CONVERGED``
            (0), ``MAX_ITERATIONS``, ``NON_FINITE`` or ``INVALID_INPUT`` (need
            ``0 < load < 1`` and ``0 < ratio < inf``); ``status.message(code)``
            describes one.
        iterations: int32 Newton/bisection steps taken.
        residual: the equation's left side at the last evaluation (the returned
            ``p0`` differs from that point by one Newton step of rounding size).
    """

    p0: jax.Array
    status: jax.Array
    iterations: jax.Array
    residual: jax.Array


def _newton(load, ratio, d: int) -> P0Solution:
    """Safeguarded Newton in ``u = log p0``.

    ``F`` increases in ``u`` and ``F(0) >= 0``, so the bracket starts as
    ``(-inf, 0]``; a Newton step that leaves the bracket is replaced by
    bisection (or a step of -4 while the bracket is open below). A point is done
    when the step that reached it was below ``1e3 eps`` or ``|F|`` is at rounding
    level there; it then takes that last Newton step (of rounding size), and the
    reported residual is ``F`` just before it.
    """
    dtype = load.dtype
    valid = (load > 0) & (load < 1) & (ratio > 0) & jnp.isfinite(ratio)
    lam = jnp.where(valid, load, 0.5)
    r = jnp.where(valid, ratio, 1.0)
    eps = jnp.finfo(dtype).eps
    tol = 1e3 * eps  # on u = log p0, i.e. relative on p0

    u0 = -jnp.log1p(0.5 * jnp.pi * r * (1.0 - lam))
    init = (
        u0,
        jnp.full_like(u0, jnp.inf),  # size of the step that reached u
        jnp.full_like(u0, -jnp.inf),  # lo: F(lo) < 0
        jnp.zeros_like(u0),  # hi: F(0) >= 0 always
        jnp.full_like(u0, jnp.nan),  # F at u
        jnp.zeros(u0.shape, jnp.int32),  # steps taken
        ~valid,  # done
        jnp.zeros(u0.shape, bool),  # non-finite F or F' seen
        jnp.zeros((), jnp.int32),  # evaluations so far
    )

    def cond(state):
        done, n = state[6], state[8]
        return jnp.any(~done) & (n <= _MAX_ITER)

    def body(state):
        u, last, lo, hi, f_kept, it, done, bad, n = state
        f, df, scale = _residual_and_slope(u, lam, r, d)
        bad_now = ~(jnp.isfinite(f) & jnp.isfinite(df)) & ~done
        # Below `noise`, F is rounding error (where F is flat in u, rounding can
        # move u by more than tol and Newton would cycle).
        noise = 16.0 * eps * scale
        finished = (jnp.abs(last) <= tol) | (jnp.abs(f) <= noise) | (hi - lo <= tol) | bad_now
        pos = f > 0
        hi = jnp.where(pos, jnp.minimum(hi, u), hi)
        lo = jnp.where(pos, lo, jnp.maximum(lo, u))
        u_newton = u - f / df
        inside = jnp.isfinite(u_newton) & (u_newton >= lo) & (u_newton <= hi)
        fallback = jnp.where(jnp.isfinite(lo), 0.5 * (lo + hi), hi - 4.0)
        u_new = jnp.where(inside, u_newton, fallback)
        move = ~done & ~finished & (it < _MAX_ITER)
        # A point that finishes still takes its last (rounding-sized) Newton step.
        polish = ~done & finished & ~bad_now & inside
        return (
            jnp.where(move | polish, u_new, u),
            jnp.where(move, u_new - u, last),
            lo,
            hi,
            jnp.where(done, f_kept, f),
            jnp.where(move, it + 1, it),
            done | finished,
            bad | bad_now,
            n + 1,
        )

    u, _, _, _, f, it, done, bad, _ = jax.lax.while_loop(cond, body, init)
    p0 = jnp.exp(u)
    status = jnp.where(
        ~valid,
        int(Status.INVALID_INPUT),
        jnp.where(
            bad | ~jnp.isfinite(p0),
            int(Status.NON_FINITE),
            jnp.where(done, int(Status.CONVERGED), int(Status.MAX_ITERATIONS)),
        ),
    ).astype(jnp.int32)
    p0 = jnp.where(status == int(Status.CONVERGED), p0, jnp.nan)
    return P0Solution(p0, status, it, jnp.where(valid, f, jnp.nan))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _p0_core(load, ratio, d: int) -> P0Solution:
    return _newton(load, ratio, d)


@_p0_core.defjvp
def _p0_core_jvp(d, primals, tangents):
    load, ratio = primals
    dload, dratio = tangents
    sol = _p0_core(load, ratio, d)
    u = jnp.log(sol.p0)
    # One pass gives dF/du (the slope output) and dF/dtheta . tangent (the JVP of F).
    (_, f_u, _), (f_theta, _, _) = jax.jvp(
        lambda lam, r: _residual_and_slope(u, lam, r, d), (load, ratio), (dload, dratio)
    )
    dp0 = -sol.p0 * f_theta / f_u
    zero_int = np.zeros(sol.status.shape, dtype=jax.dtypes.float0)
    return sol, P0Solution(dp0, zero_int, zero_int, jnp.zeros_like(sol.residual))


def solve_p0(load, ratio, d: int = 1) -> P0Solution:
    """Fraction ``p0`` of empty I-queues of JIQ-Pod(d) (JIQ for ``d = 1``), mean field.

    Wang, Feng and Cheng, "Distributed Join-the-Idle-Queue for Low Latency Cloud
    Services" (arXiv:1709.10119), Theorem 1 and its JIQ-Pod analogue: the
    normalisation of the I-queue size law (docs/theory-derivations.md gives the
    exact rewriting that keeps it finite for large ``r`` and small ``p0``).
    Elementwise over the broadcast shape of ``load`` and ``ratio``; jit-compiled
    (``d`` static; one program per shape, whatever the inputs' float types);
    differentiable in ``load`` and ``ratio`` by implicit differentiation.

    This is the raw equation of JIQ-Pod(d), indexed by ``d`` rather than by a
    policy (``d = 1``: JIQ; the default is JIQ, unlike the policy ``jiq-pod``
    whose default is ``d = 2``). For a policy, use its declared closed form
    (``make(name).closed_form()``).

    Args:
        load: ``lambda``, array-like, in ``(0, 1)``.
        ratio: ``r = N / M``, array-like, positive.
        d: probes of the Pod(d) fallback (``d = 1``: JIQ). Static.

    Returns:
        :class:`P0Solution` of arrays of the broadcast shape. Points that fail
        carry ``p0 = NaN`` and a nonzero ``status`` (a
        :class:`~jaxqueue.core.status.Status` code).
    """
    d = check_d(d)
    # strong-typed float arrays before the jit boundary: a Python float and a
    # NumPy float64 (weak and strong types) would otherwise compile twice
    load, ratio = as_float_arrays(load, ratio)
    return _solve_p0(load, ratio, d)


@functools.partial(jax.jit, static_argnames=("d",))
def _solve_p0(load, ratio, d: int) -> P0Solution:
    return _p0_core(load, ratio, d)


def host_p0(load: float, ratio: float, d: int = 1) -> tuple[float, int]:
    """``(p0, status)`` of one point as Python numbers, always in float64.

    The host's entry to :func:`solve_p0` (x64 switched on for the call), so
    that every host caller (the closed forms, the simulator's default
    bounds) shares one compiled program per ``d``.
    """
    with host_float64():
        sol = solve_p0(float(load), float(ratio), d)
        return float(sol.p0), int(sol.status)


@functools.partial(jax.jit, static_argnames=("d",))
def p0_grid(loads, ratios, d: int = 1) -> P0Solution:
    """:func:`solve_p0` on the grid ``loads x ratios``, in chunks of about 16k points.

    A chunk is a block of whole rows solved as one vectorised Newton iteration
    (it stops when its slowest point has converged); chunks run one after the
    other under :func:`jax.lax.map`, which bounds memory and lets one chunk's
    arrays stay in cache. Measured on 2 shared CPU cores, 1000 x 1000 points
    (``lambda`` in [0.01, 0.999], ``r`` in [0.1, 1000], ``d = 1``): 2.2 s in
    float64 (4.4 s including compilation), 0.7 s in float32 (3.1 s); every
    point converged, in at most 5 Newton steps.

    Args:
        loads: 1-D ``[A]`` values of ``lambda``.
        ratios: 1-D ``[B]`` values of ``r``.
        d: Pod(d) fallback probes (static; ``d = 1``: JIQ).

    Returns:
        :class:`P0Solution` with fields of shape ``[A, B]``.
    """
    d = check_d(d)
    dtype = float_dtype()
    loads = jnp.asarray(loads, dtype)
    ratios = jnp.asarray(ratios, dtype)
    if loads.ndim != 1 or ratios.ndim != 1:
        raise ValueError("loads and ratios must be 1-D")
    n_loads = loads.shape[0]
    rows = max(1, min(n_loads, _GRID_CHUNK // max(1, ratios.shape[0])))
    n_chunks = -(-n_loads // rows)
    padded = jnp.concatenate([loads, jnp.full((n_chunks * rows - n_loads,), 0.5, dtype)])

    def solve_chunk(chunk):
        lam, r = jnp.broadcast_arrays(chunk[:, None], ratios[None, :])
        return _p0_core(lam, r, d)

    out = jax.lax.map(solve_chunk, padded.reshape(n_chunks, rows))
    return jax.tree_util.tree_map(
        lambda x: x.reshape((n_chunks * rows,) + x.shape[2:])[:n_loads], out
    )


@functools.partial(jax.jit, static_argnames=("d", "jmax"))
def iqueue_distribution(p0, load, ratio, d: int = 1, jmax: int = 64):
    """Law of one I-queue's size: ``p_k = p0 a**k Gamma(c+1) / Gamma(c+k+1)``.

    Wang, Feng and Cheng, "Distributed Join-the-Idle-Queue for Low Latency Cloud
    Services" (arXiv:1709.10119), Theorem 1: the stationary law of the
    birth-death chain with births ``r q1`` and deaths ``lambda r + k h``.
    Computed in log space as ``log p0 - sum_{j<=k} log1p((delta + j) / a)``.
    Its mean is ``r (1 - lambda)`` (the idle servers per dispatcher). Like
    :func:`solve_p0`, the raw JIQ-Pod(d) law indexed by ``d`` (``d = 1``: JIQ).

    Args:
        p0: the fraction of empty I-queues (from :func:`solve_p0`).
        load: ``lambda``.
        ratio: ``r``.
        d: Pod(d) fallback probes (static; ``d = 1``: JIQ).
        jmax: largest size included (static).

    Returns:
        ``[..., jmax + 1]`` array of ``p_0 .. p_jmax`` (broadcast batch shape).
    """
    d = check_d(d)
    p0, load, ratio = as_float_arrays(p0, load, ratio)
    rg, om, lam_d = _coefficients(load, ratio, d)
    a = rg * ((1.0 - p0) / p0 + om)  # r q1 / h, without cancellation near p0 = lambda = 1
    delta = rg * lam_d
    j = jnp.arange(1, jmax + 1, dtype=p0.dtype)
    log_ratio = -jnp.log1p((delta[..., None] + j) / a[..., None])
    log_p = jnp.log(p0)[..., None] + jnp.concatenate(
        [jnp.zeros_like(log_ratio[..., :1]), jnp.cumsum(log_ratio, axis=-1)], axis=-1
    )
    return jnp.exp(log_p)
