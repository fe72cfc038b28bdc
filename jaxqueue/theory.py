"""Mean-field theory of the JIQ family and closed-form tails (JAX).

The model and formulas are those of Wang, Feng and Cheng, "Distributed
Join-the-Idle-Queue for Low Latency Cloud Services" (``papers/000``; restated in
NOTES.md): in the limit ``N, M -> inf`` with ``r = N / M`` fixed, JIQ-Pod(d)
(JIQ is ``d = 1``) has the tail

    s_i = p0**((d**(i-1) - 1)/(d - 1)) * lambda**((d**i - 1)/(d - 1)),

where ``p0``, the fraction of empty I-queues, solves the normalisation of the
birth-death law of one I-queue's size (births ``r q1``, deaths ``lambda r + k h``):

    log p0 + lgamma(c + 1) + a - c log(a) + log P(c, a) = 0,
    q1 = s_1 - s_2,  h = lambda p0 (1 - lambda**d) / (1 - lambda),
    a = r q1 / h,    c = lambda r / h.

How the equation is solved (:func:`solve_p0`)
--------------------------------------------
``P(c, a)`` underflows and ``lgamma(c + 1) - c log a`` cancels catastrophically
when ``c`` is large (large ``r``, small ``p0``), so the equation is rewritten
exactly. With ``g = (1 - lambda)/(1 - lambda**d)``, ``c = r g / p0`` and
``delta = c - a = r g lambda**d`` (which does not depend on ``p0``), the
identity ``Gamma(c+1) e**a a**-c P(c, a) = c * int_0^inf exp(a (1 - e**-s) - c s) ds``
turns it into

    F = log(r g) + log G(c) = 0,  G(c) = int_0^inf exp(-c q(s) - delta (1 - e**-s)) ds,
    q(s) = s - 1 + e**-s >= 0.

``G`` is smooth and strictly decreasing in ``c``, so the root is unique; ``F``
increases in ``u = log p0`` and ``F(u = 0) >= 0``. Safeguarded Newton in ``u``
(bisection bracket) starts from ``p0 ~ 1 / (1 + (pi/2) r (1 - lambda))`` (the
Gaussian approximation of ``G``) and takes 1 to 5 steps. ``G`` needs no
special functions: for ``c <= 10`` the series
``c G = sum_k prod_{j<=k} a/(c + j)`` (48 terms, exact to rounding); otherwise
24-point Gauss-Legendre on ``[0, S]``, ``S`` where the integrand is ``e**-40``.
Near ``lambda = 1`` ``F`` is very flat in ``u`` (slope ``1e-4`` at
``lambda = 1 - 1e-6``, ``r = 1e4``), so there it is evaluated as
``-d log(lambda) + log1p(-a I1)`` with ``I1 = int (1 - e**-s) e**psi ds`` (exact,
from ``delta G + a I1 = 1``), whose small second term carries the relative
accuracy. Checked against 34-digit references: ``p0`` is accurate to about
``1e-15`` absolute over ``lambda`` in ``[1e-4, 1 - 1e-6]``, ``r`` in
``[1e-2, 1e4]``, ``d`` in ``1..64``. Gradients come from implicit
differentiation (:func:`jax.custom_jvp`): ``dp0 = -p0 (dF/dtheta) / (dF/du)`` at
the solution, never through the iterations.

Precision
---------
Array functions compute in JAX's default float type. With x64 enabled
(``jax.config.update("jax_enable_x64", True)`` or the ``jax.enable_x64(True)``
context) that is float64 and ``p0`` meets the ``1e-10`` target with a wide
margin. Without x64 everything runs in float32: ``p0`` is then accurate to about
``5e-7`` absolute (``2e-6`` relative) for the float32-rounded inputs (note that
``1 - 1e-6`` itself is only represented to 6% in float32). The host-side
functions that return Python numbers (:func:`mean_field`,
:func:`headline_ratio`, :func:`max_load_for_target`) switch x64 on locally and
always work in float64.

Policies with a closed form here: ``random``, ``pod`` (option ``d``; ``d = 1`` is
Random), ``jsq`` (mean-field limit ``s_1 = lambda``, ``s_i = 0`` for ``i >= 2``),
``jiq`` and ``jiq-pod`` (option ``d``; ``d = 1`` is JIQ). The other policies of
the package raise :class:`NotImplementedError`.

Example:
    >>> from jaxqueue import theory
    >>> sol = theory.solve_p0(0.9, 10.0)  # JIQ at lambda = 0.9, r = 10
    >>> int(sol.status)
    0
    >>> mf = theory.mean_field("jiq-pod", 0.98, 10.0, d=2)
    >>> round(mf.mean_response_time, 2)
    2.54
    >>> import jax
    >>> dT = jax.grad(lambda lam: theory.mean_response_time("jiq", lam, 10.0))(0.9)
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxqueue import response
from jaxqueue.policies import make as make_policy

__all__ = [
    "CLOSED_FORM_POLICIES",
    "STATUS_MESSAGES",
    "P0Solution",
    "MeanFieldResult",
    "HeadlineFit",
    "MaxLoadResult",
    "solve_p0",
    "p0_grid",
    "iqueue_distribution",
    "tail",
    "mean_response_time",
    "mean_field",
    "to_dict",
    "headline_ratio",
    "max_load_for_target",
]

CLOSED_FORM_POLICIES = ("random", "pod", "jsq", "jiq", "jiq-pod")
#: Policies whose mean field is the generic fixed point of :mod:`jaxqueue.meanfield`.
GENERIC_POLICIES = ("i1f", "jiq-sq", "idle-first")
_OTHER_POLICIES = GENERIC_POLICIES + ("jiq-original", "jiq-threshold")

#: Solver status codes (per point).
STATUS_MESSAGES = {
    0: "converged",
    1: "no convergence within the iteration limit",
    2: "non-finite value during the iteration",
    3: "invalid input: need 0 < load < 1 and 0 < ratio < inf (finite)",
}
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


def _float_dtype():
    return jnp.result_type(float)


def _check_d(d) -> int:
    if isinstance(d, bool) or int(d) != d or int(d) < 1:
        raise ValueError(f"d must be an integer >= 1; got {d!r}")
    return int(d)


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
        jnp.where(
            near_one, jnp.abs(log_lam_d) - log1p_term, jnp.abs(jnp.log(rg)) + jnp.abs(log_g)
        ),
    )
    return f, slope, scale


class P0Solution(NamedTuple):
    """Solution of the ``p0`` equation, per point (arrays of the broadcast input shape).

    Attributes:
        p0: the fraction of empty I-queues (NaN where ``status != 0``).
        status: int32, 0 when converged; see :data:`STATUS_MESSAGES`.
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
        3,
        jnp.where(bad | ~jnp.isfinite(p0), 2, jnp.where(done, 0, 1)),
    ).astype(jnp.int32)
    p0 = jnp.where(status == 0, p0, jnp.nan)
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


def _as_float_arrays(*xs):
    dtype = _float_dtype()
    return jnp.broadcast_arrays(*(jnp.asarray(x, dtype) for x in xs))


@functools.partial(jax.jit, static_argnames=("d",))
def solve_p0(load, ratio, d: int = 1) -> P0Solution:
    """Fraction ``p0`` of empty I-queues of JIQ-Pod(d) (JIQ for ``d = 1``), mean field.

    Wang, Feng and Cheng (papers/000), Theorem 1 and its JIQ-Pod analogue: the
    normalisation of the I-queue size law (see the module docstring for the
    exact rewriting that keeps it finite for large ``r`` and small ``p0``).
    Elementwise over the broadcast shape of ``load`` and ``ratio``; jit-compiled
    (``d`` static); differentiable in ``load`` and ``ratio`` by implicit
    differentiation.

    Args:
        load: ``lambda``, array-like, in ``(0, 1)``.
        ratio: ``r = N / M``, array-like, positive.
        d: probes of the Pod(d) fallback (``d = 1``: JIQ). Static.

    Returns:
        :class:`P0Solution` of arrays of the broadcast shape. Points that fail
        carry ``p0 = NaN`` and a nonzero ``status`` (:data:`STATUS_MESSAGES`).
    """
    d = _check_d(d)
    load, ratio = _as_float_arrays(load, ratio)
    return _p0_core(load, ratio, d)


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
        d: Pod(d) fallback probes (static).

    Returns:
        :class:`P0Solution` with fields of shape ``[A, B]``.
    """
    d = _check_d(d)
    dtype = _float_dtype()
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

    Wang, Feng and Cheng (papers/000), Theorem 1: the stationary law of the
    birth-death chain with births ``r q1`` and deaths ``lambda r + k h``.
    Computed in log space as ``log p0 - sum_{j<=k} log1p((delta + j) / a)``.
    Its mean is ``r (1 - lambda)`` (the idle servers per dispatcher).

    Args:
        p0: the fraction of empty I-queues (from :func:`solve_p0`).
        load: ``lambda``.
        ratio: ``r``.
        d: Pod(d) fallback probes (static).
        jmax: largest size included (static).

    Returns:
        ``[..., jmax + 1]`` array of ``p_0 .. p_jmax`` (broadcast batch shape).
    """
    d = _check_d(d)
    p0, load, ratio = _as_float_arrays(p0, load, ratio)
    rg, om, lam_d = _coefficients(load, ratio, d)
    a = rg * ((1.0 - p0) / p0 + om)  # r q1 / h, without cancellation near p0 = lambda = 1
    delta = rg * lam_d
    j = jnp.arange(1, jmax + 1, dtype=p0.dtype)
    log_ratio = -jnp.log1p((delta[..., None] + j) / a[..., None])
    log_p = jnp.log(p0)[..., None] + jnp.concatenate(
        [jnp.zeros_like(log_ratio[..., :1]), jnp.cumsum(log_ratio, axis=-1)], axis=-1
    )
    return jnp.exp(log_p)


# ---------------------------------------------------------------------------
# Closed-form tails and response times
# ---------------------------------------------------------------------------

_EXPONENT_CAP = 1e30  # exponents past this make s_i = 0 anyway; avoids 0 * inf
_TAIL_TOL = 1e-15  # tail mass left out by the automatic level count
_MAX_AUTO_LEVELS = 100_000
_MAX_AUTO_IQUEUE = 2_000_000
QUANTILES = (0.5, 0.9, 0.99, 0.999)


def _resolve(policy: str, d) -> tuple[str, int]:
    """``(kind, d)``: kind ``"pod"`` (Random is ``d = 1``), ``"jiq"`` (JIQ-Pod(d)) or ``"jsq"``.

    The option ``d`` matters only for ``pod`` and ``jiq-pod``; the other
    policies ignore it.
    """
    if policy in ("random", "pod", "jsq", "jiq", "jiq-pod"):
        d = _check_d(d)
        return {
            "random": ("pod", 1),
            "pod": ("pod", d),
            "jsq": ("jsq", 1),
            "jiq": ("jiq", 1),
            "jiq-pod": ("jiq", d),
        }[policy]
    if policy in GENERIC_POLICIES:
        return "generic", d
    if policy in _OTHER_POLICIES:
        raise NotImplementedError(
            f"no mean field for policy {policy!r}: its I-queues list busy servers, so its "
            f"state is not exchangeable; mean fields exist for "
            f"{', '.join(CLOSED_FORM_POLICIES + GENERIC_POLICIES)}"
        )
    raise ValueError(
        f"unknown policy {policy!r}; valid names: "
        f"{', '.join(CLOSED_FORM_POLICIES + _OTHER_POLICIES)}"
    )


def _exponents(d: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """``(e_lam, e_p0)`` with ``s_i = lambda**e_lam[i] * p0**e_p0[i]``, ``i = 0..levels-1``.

    Wang, Feng and Cheng (papers/000), Table I: ``e_lam = (d**i - 1)/(d - 1)``,
    ``e_p0 = (d**(i-1) - 1)/(d - 1)`` (``i`` and ``i - 1`` for ``d = 1``), ``s_0 = 1``.
    """
    if d == 1:
        i = np.arange(levels, dtype=np.float64)
        e_lam = i
        e_p0 = np.maximum(i - 1.0, 0.0)
    else:  # e_lam[i] = 1 + d e_lam[i-1], e_p0[i] = e_lam[i-1], capped (no int64 overflow)
        e_lam = np.full(levels, _EXPONENT_CAP)
        e_p0 = np.full(levels, _EXPONENT_CAP)
        e, prev = 0.0, 0.0
        for k in range(levels):
            if e >= _EXPONENT_CAP:
                break
            e_lam[k], e_p0[k] = e, prev
            e, prev = 1.0 + d * e, e
        e_p0[0] = 0.0
    return e_lam, e_p0


def _terms_for(d: int) -> int:
    """Levels that make the Pod(d)-type tail negligible for ``1 - lambda >= 4e-11``."""
    return int(math.ceil(12 * math.log(10) / math.log(d))) + 3


def _need_ratio(policy: str, ratio):
    if ratio is None:
        raise ValueError(f"policy {policy!r} needs ratio = N / M")
    return ratio


def tail(policy: str, load, ratio=None, d: int = 1, levels: int = 32):
    """Mean-field tail ``s_0 .. s_{levels-1}`` (``s_i``: fraction with at least ``i`` tasks).

    Wang, Feng and Cheng (papers/000), Table I: Pod(d) ``lambda**((d**i-1)/(d-1))``
    (Random: ``lambda**i``, Mitzenmacher's Pod result), JIQ-Pod(d)
    ``p0**((d**(i-1)-1)/(d-1)) * lambda**((d**i-1)/(d-1))`` (JIQ: ``p0**(i-1) lambda**i``);
    JSQ's limit is ``s_1 = lambda``, ``s_i = 0`` for ``i >= 2``. Differentiable in
    ``load`` and ``ratio`` (through :func:`solve_p0`). Not jitted itself: it calls
    the compiled :func:`solve_p0` and a few array operations, so no second copy
    of the solver is compiled; it works inside ``jax.jit``, ``grad`` and ``vmap``.

    Args:
        policy: one of :data:`CLOSED_FORM_POLICIES` (static).
        load: ``lambda`` in ``(0, 1)``, array-like.
        ratio: ``r = N / M`` (JIQ family only), array-like.
        d: probes for ``pod`` / ``jiq-pod`` (static).
        levels: number of entries (static).

    Returns:
        ``[..., levels]`` array over the broadcast shape of ``load`` and ``ratio``.
    """
    kind, d = _resolve(policy, d)
    if kind == "jiq":
        load, ratio = _as_float_arrays(load, _need_ratio(policy, ratio))
        log_p0 = jnp.log(solve_p0(load, ratio, d).p0)
    else:
        (load,) = _as_float_arrays(load)
        log_p0 = jnp.zeros_like(load)
    if kind == "jsq":
        i = jnp.arange(levels)
        return jnp.where(i == 0, 1.0, jnp.where(i == 1, load[..., None], 0.0))
    e_lam, e_p0 = _exponents(d, levels)
    log_s = jnp.log(load)[..., None] * e_lam + jnp.where(e_p0 > 0, log_p0[..., None] * e_p0, 0.0)
    return jnp.exp(log_s)


def mean_response_time(policy: str, load, ratio=None, d: int = 1):
    """Mean-field mean response time ``T = sum_{i>=1} s_i / lambda`` (Little's law).

    Closed forms (Wang, Feng and Cheng, papers/000, Table I): Random
    ``1/(1 - lambda)``; JIQ ``1/(1 - lambda p0)``; JSQ 1; Pod(d) and JIQ-Pod(d)
    by summing the doubly exponential tail (enough terms for
    ``1 - lambda >= 4e-11``). Differentiable in ``load`` and ``ratio``; not
    jitted itself (see :func:`tail`).

    Args:
        policy: one of :data:`CLOSED_FORM_POLICIES` (static).
        load: ``lambda``, array-like.
        ratio: ``r`` (JIQ family), array-like.
        d: probes for ``pod`` / ``jiq-pod`` (static).

    Returns:
        Array of the broadcast shape of ``load`` and ``ratio``.
    """
    kind, d = _resolve(policy, d)
    if kind == "jsq":
        (load,) = _as_float_arrays(load)
        return jnp.ones_like(load)
    if kind == "jiq":
        load, ratio = _as_float_arrays(load, _need_ratio(policy, ratio))
        p0 = solve_p0(load, ratio, d).p0
    else:
        (load,) = _as_float_arrays(load)
        p0 = jnp.ones_like(load)
    if d == 1:  # geometric: 1 / (1 - lambda p0), 1 - lambda p0 = (1 - lambda) + lambda (1 - p0)
        return 1.0 / ((1.0 - load) + load * (1.0 - p0))
    e_lam, e_p0 = _exponents(d, _terms_for(d))
    # s_i / lambda for i >= 1
    log_terms = jnp.log(load)[..., None] * (e_lam[1:] - 1.0) + jnp.where(
        e_p0[1:] > 0, jnp.log(p0)[..., None] * e_p0[1:], 0.0
    )
    return jnp.sum(jnp.exp(log_terms), axis=-1)


# ---------------------------------------------------------------------------
# Everything at one point, on the host
# ---------------------------------------------------------------------------


class MeanFieldResult(NamedTuple):
    """Mean-field metrics of one policy at one point (host floats and float64 arrays).

    The metric names match :class:`jaxqueue.estimators.SimulationResult`.

    Attributes:
        policy: the policy name as given.
        load: ``lambda``.
        ratio: ``r = N / M`` (``None`` where the policy does not use it).
        d: the effective probe count (1 for random, jsq, jiq).
        tail: ``[levels]`` ``s_0 .. s_{levels-1}``.
        occupancy: ``[levels]`` fraction of servers with exactly ``k`` tasks.
        mean_queue_length: ``sum_{i>=1} s_i`` (the whole tail, not the truncated one).
        mean_response_time: ``mean_queue_length / lambda``.
        waiting_probability: probability that an arrival's server is busy.
        arrival_seen: ``[levels]`` probability that an arrival finds ``k`` tasks.
        response_quantiles: ``{q: t}`` for ``q`` in 0.5, 0.9, 0.99, 0.999.
        p0: fraction of empty I-queues (NaN outside the JIQ family).
        iqueue_distribution: ``[J + 1]`` fraction of I-queues with ``j`` servers
            (JIQ family; ``None`` otherwise).
        join_rate: I-queue joins per server per unit time.
        delete_rate: delete requests per server per unit time.
        probe_rate: server probes per server per unit time.
        blocking_probability: probability an arrival is blocked (finite buffers, generic).
        status: 0, or the generic solver's failure code.
        tail_remainder: ``sum_{i >= levels} s_i``, the mass the truncated tail
            leaves out (below ``1e-15`` with the automatic level count unless
            that would pass 100000 levels).
        iqueue_remainder: the I-queue mass past the returned sizes (0 outside
            the JIQ family).
    """

    policy: str
    load: float
    ratio: float | None
    d: int
    tail: np.ndarray
    occupancy: np.ndarray
    mean_queue_length: float
    mean_response_time: float
    waiting_probability: float
    arrival_seen: np.ndarray
    response_quantiles: dict
    p0: float
    iqueue_distribution: np.ndarray | None
    join_rate: float
    delete_rate: float
    probe_rate: float
    tail_remainder: float
    iqueue_remainder: float
    blocking_probability: float = 0.0
    status: int = 0


def _host_p0(load: float, ratio: float, d: int) -> float:
    """``p0`` in float64 (x64 switched on for the call); raises on solver failure."""
    with jax.enable_x64(True):
        sol = solve_p0(load, ratio, d)
        status = int(sol.status)
        p0 = float(sol.p0)
    if status != 0:
        raise RuntimeError(
            f"p0 solver failed at load={load!r}, ratio={ratio!r}, d={d}: "
            f"status {status} ({STATUS_MESSAGES.get(status, 'unknown')})"
        )
    return p0


def _log_tail_host(d: int, log_lam: float, log_p0: float, levels: int) -> np.ndarray:
    """``log s_i`` for ``i = 0..levels-1`` (float64; ``-inf`` once it underflows)."""
    e_lam, e_p0 = _exponents(d, levels)
    with np.errstate(over="ignore", invalid="ignore"):
        out = e_lam * log_lam + (e_p0 * log_p0 if log_p0 != 0.0 else 0.0)
    return np.where(np.isnan(out), -np.inf, out)


def _auto_levels(d: int, log_lam: float, log_p0: float) -> int:
    """Fewest levels ``L`` with ``sum_{i>=L} s_i < 1e-15`` (at least 2, at most 100000)."""
    if d == 1:
        log_rho = log_lam + log_p0  # s_i = lambda rho**(i-1)
        one_minus_rho = -math.expm1(log_rho)
        need = (math.log(_TAIL_TOL * one_minus_rho) - log_lam) / log_rho
        return int(min(max(2, 1 + math.ceil(need)), _MAX_AUTO_LEVELS))
    log_s = _log_tail_host(d, log_lam, log_p0, _terms_for(d) + 8)
    below = np.nonzero(log_s < math.log(_TAIL_TOL / 2))[0]
    return int(max(2, below[0] if below.size else log_s.size))


def _tail_sum_from(d: int, log_lam: float, log_p0: float, start: int) -> float:
    """``sum_{i >= start} s_i`` (``start >= 1``)."""
    if d == 1:
        log_rho = log_lam + log_p0
        return math.exp(log_lam + (start - 1) * log_rho) / -math.expm1(log_rho)
    n = max(start, _terms_for(d) + 8)
    log_s = _log_tail_host(d, log_lam, log_p0, n + 1)
    return float(np.sum(np.exp(log_s[start:])))


def _iqueue_host(p0: float, load: float, ratio: float, d: int) -> tuple[np.ndarray, float]:
    """I-queue size law in float64 until the rest is below ``1e-15 min(1, 1 - p0)`` (or 2e6 sizes).

    Relative to ``1 - p0`` so that tiny means (``r (1 - lambda)`` down to 1e-8)
    keep their relative accuracy.
    """
    lam = load
    if d == 1:
        rg, om, lam_d = ratio, 1.0 - lam, lam
    else:
        om = -math.expm1(d * math.log(lam))
        rg, lam_d = ratio * (1.0 - lam) / om, 1.0 - om
    a = rg * ((1.0 - p0) / p0 + om)
    delta = rg * lam_d
    log_tol = math.log(_TAIL_TOL * max(min(1.0, 1.0 - p0), 1e-300))
    blocks = [np.array([math.log(p0)])]
    last = blocks[0][0]
    k0 = 0
    block = 4096
    while True:
        j = np.arange(k0 + 1, k0 + block + 1, dtype=np.float64)
        log_p = last + np.cumsum(-np.log1p((delta + j) / a))
        # p_k decreases (a < c): the rest after k is below p_k rho / (1 - rho), rho = a/(c+k+1)
        rho = a / (a + delta + j + 1.0)
        bound = log_p + np.log(rho) - np.log1p(-rho)
        stop = np.nonzero(bound < log_tol)[0]
        if stop.size:
            blocks.append(log_p[: stop[0] + 1])
            rest = float(np.exp(bound[stop[0]]))
            break
        blocks.append(log_p)
        last, k0 = log_p[-1], k0 + block
        if k0 >= _MAX_AUTO_IQUEUE:
            rest = float(np.exp(bound[-1]))
            break
        block *= 2
    return np.exp(np.concatenate(blocks)), rest


def mean_field(
    policy: str,
    load: float,
    ratio: float | None = None,
    d: int = 1,
    levels: int | None = None,
    z: int | None = None,
) -> MeanFieldResult:
    """All mean-field metrics of a closed-form policy at one point (float64, host side).

    Tails from Wang, Feng and Cheng (papers/000), Table I (see :func:`tail`).
    An arrival finds at least ``k >= 1`` tasks with probability ``s_k**d``
    under Pod(d) (the minimum of ``d`` draws), ``p0 s_k**d`` under JIQ-Pod(d)
    (a dispatcher with a non-empty I-queue, probability ``1 - p0``, sends it
    to an idle server), ``0`` under JSQ; the response time given ``k`` is
    Erlang(``k + 1``, 1), so ``sum_k (k+1) arrival_seen[k]`` is the mean
    response time of Little's law. Messages (per server per unit time, Wang et
    al. Fig. 6): joins ``s_1 - s_2``; delete requests ``lambda p0 (1 - lambda**d)``
    (empty-I-queue arrivals that land on an idle server); probes ``d lambda``
    (Pod(d)) or ``d lambda p0`` (JIQ-Pod(d)) for ``d >= 2``, none for JSQ.

    Args:
        policy: a policy name; closed forms for ``random``, ``pod``, ``jsq``,
            ``jiq``, ``jiq-pod``.
        load: ``lambda`` in ``(0, 1)``.
        ratio: ``r = N / M``; required for the JIQ family, ignored otherwise.
        d: probes of ``pod`` and ``jiq-pod`` (ignored by the others).
        levels: entries of the tail and occupancy arrays; ``None`` picks the
            fewest with less than ``1e-15`` of tail mass left out.
        z: JIQ-Threshold's option, accepted so that a policy's options can be
            passed through; that policy has no closed form here.

    Returns:
        A :class:`MeanFieldResult`.

    Raises:
        NotImplementedError: for the package's policies without a closed form.
        ValueError: for unknown names or invalid arguments.
        RuntimeError: if the ``p0`` solver fails.
    """
    del z
    kind, d = _resolve(policy, d)
    if kind == "generic":  # no closed form: the generic fixed point of jaxqueue.meanfield
        from jaxqueue import meanfield

        opts = {"d": d} if policy in ("jiq-sq", "idle-first") else {}
        fp = meanfield.fixed_point(policy, load, ratio if policy == "jiq-sq" else None,
                                   levels=levels or 40, **opts)  # fmt: skip
        if fp.status != 0:
            raise RuntimeError(
                f"the generic mean-field fixed point of {policy!r} did not converge "
                f"(residual {fp.residual:.3g})"
            )
        return meanfield.as_result(fp, make_policy(policy, **opts), load, ratio)
    lam = float(load)
    if not 0.0 < lam < 1.0:
        raise ValueError(f"load must lie in (0, 1); got {load!r}")
    if levels is not None and (int(levels) != levels or levels < 1):
        raise ValueError(f"levels must be a positive integer or None; got {levels!r}")
    log_lam = math.log(lam)
    p0 = math.nan
    log_p0 = 0.0
    if kind == "jiq":
        if ratio is None or not float(ratio) > 0 or not math.isfinite(float(ratio)):
            raise ValueError(f"policy {policy!r} needs a positive finite ratio; got {ratio!r}")
        ratio = float(ratio)
        p0 = _host_p0(lam, ratio, d)
        log_p0 = math.log(p0)
    else:
        ratio = None if ratio is None else float(ratio)

    if kind == "jsq":
        n = 2 if levels is None else int(levels)
        tail_arr = np.zeros(n)
        tail_arr[0] = 1.0
        if n > 1:
            tail_arr[1] = lam
        occupancy = tail_arr - np.append(tail_arr[1:], lam if n == 1 else 0.0)
        seen = np.zeros(n)
        seen[0] = 1.0
        mean_q, remainder, wait = lam, (lam if n == 1 else 0.0), 0.0
        quantiles = {q: -math.log1p(-q) for q in QUANTILES}
    else:
        n = _auto_levels(d, log_lam, log_p0) if levels is None else int(levels)
        log_s = _log_tail_host(d, log_lam, log_p0, n + 1)
        # log s_{k+1} - log s_k, exactly: log(lambda) for k = 0, then
        # d**k log(lambda) + d**(k-1) log(p0) (geometric for d = 1)
        e_lam, e_p0 = _exponents(d, n + 1)
        inc = np.diff(e_lam) * log_lam + (np.diff(e_p0) * log_p0 if log_p0 else 0.0)
        s = np.exp(log_s)
        tail_arr = s[:n]
        occupancy = tail_arr * -np.expm1(inc)
        # P(find >= k): A_k = s_k**d (Pod), A_0 = 1 and A_k = p0 s_k**d (JIQ-Pod)
        log_a = d * log_s
        inc_a = d * inc
        if kind == "jiq":
            log_a = np.concatenate([[0.0], log_p0 + log_a[1:]])
            inc_a = np.concatenate([[log_p0 + d * log_lam], inc_a[1:]])
        seen = np.exp(log_a[:n]) * -np.expm1(inc_a)
        wait = math.exp(log_a[1])
        remainder = _tail_sum_from(d, log_lam, log_p0, n)
        if d == 1:
            one_minus_rho = (1.0 - lam) + lam * (1.0 - (p0 if kind == "jiq" else 1.0))
            mean_q = lam / one_minus_rho
            quantiles = {q: -math.log1p(-q) / one_minus_rho for q in QUANTILES}
        else:
            mean_q = float(np.sum(tail_arr[1:])) + remainder
            qs = response.erlang_mixture_quantile(seen, np.array(QUANTILES))
            quantiles = {q: float(v) for q, v in zip(QUANTILES, qs)}

    iq_dist, iq_rest = None, 0.0
    join = delete = probe = 0.0
    if kind == "jiq":
        iq_dist, iq_rest = _iqueue_host(p0, lam, ratio, d)
        lam_d = math.exp(d * log_lam)
        join = lam * (1.0 - p0 * lam_d)  # s_1 - s_2
        delete = lam * p0 * -math.expm1(d * log_lam)
        probe = d * lam * p0 if d >= 2 else 0.0
    elif kind == "pod" and d >= 2:
        probe = d * lam

    return MeanFieldResult(
        policy=policy,
        load=lam,
        ratio=ratio,
        d=d,
        tail=tail_arr,
        occupancy=occupancy,
        mean_queue_length=float(mean_q),
        mean_response_time=float(mean_q) / lam,
        waiting_probability=float(wait),
        arrival_seen=seen,
        response_quantiles=quantiles,
        p0=p0,
        iqueue_distribution=iq_dist,
        join_rate=join,
        delete_rate=delete,
        probe_rate=probe,
        tail_remainder=float(remainder),
        iqueue_remainder=iq_rest,
    )


def _json_value(x):
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return [_json_value(v) for v in x.tolist()]
    x = float(x)
    return None if math.isnan(x) else x


def to_dict(result: MeanFieldResult) -> dict:
    """A JSON-serialisable dict in the layout of ``SimulationResult.to_dict``.

    Each metric is ``{"mean": value, "ci95": None}`` (a prediction has no
    confidence interval); ``p0`` and ``iqueue_distribution`` are ``None``
    outside the JIQ family; percentiles also appear as ``response_p50`` etc.

    Args:
        result: a :class:`MeanFieldResult`.

    Returns:
        A dict of metrics plus ``"settings"`` (policy, load, ratio, d, levels
        and the truncation remainders).
    """

    def metric(x):
        return None if x is None else {"mean": _json_value(x), "ci95": None}

    out = {
        name: metric(getattr(result, name))
        for name in (
            "mean_queue_length", "mean_response_time", "waiting_probability",
            "join_rate", "delete_rate", "probe_rate",
        )
    }  # fmt: skip
    out["blocking_probability"] = metric(result.blocking_probability)
    for q, t in result.response_quantiles.items():
        out["response_p" + f"{100 * q:g}".replace(".", "_")] = metric(t)
    out["p0"] = None if math.isnan(result.p0) else metric(result.p0)
    for name in ("tail", "occupancy", "arrival_seen", "iqueue_distribution"):
        out[name] = metric(getattr(result, name))
    out["response_quantiles"] = {str(q): metric(t) for q, t in result.response_quantiles.items()}
    out["settings"] = {
        "source": "mean-field",
        "policy": result.policy,
        "load": result.load,
        "ratio": result.ratio,
        "d": result.d,
        "levels": int(result.tail.size),
        "tail_remainder": result.tail_remainder,
        "iqueue_remainder": result.iqueue_remainder,
    }
    return out


# ---------------------------------------------------------------------------
# The Wang et al. headline and inverse design
# ---------------------------------------------------------------------------


class HeadlineFit(NamedTuple):
    """The ``r`` behind Wang et al.'s headline (papers/000, Sec. II, Fig. 4).

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


_HEADLINE_TARGETS = {"jiq": 5.3, "jiq-pod": 2.6}


def _log_t_of_log_r(policy: str, load: float, d: int):
    """``log r -> (log T, d log T / d log r)`` in float64 (x64 must be on).

    Forward mode through the compiled solver (its JVP program is compiled once).
    """

    def log_t(lam, x):
        return jnp.log(mean_response_time(policy, lam, jnp.exp(x), d))

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

    Wang, Feng and Cheng (papers/000) state that at ``lambda = 0.98`` (``d = 2``)
    ``T`` is about 2.6 for JIQ-Pod, 5.3 for JIQ and 4.5 for Pod, without giving
    ``r`` in the text. This solves ``T(policy, r) = target`` for each target and
    fits one ``r`` to all (golden-section search on
    ``sum (log T - log target)**2`` between the single-policy solutions).

    Args:
        load: ``lambda``.
        d: probes of JIQ-Pod(d) and Pod(d).
        targets: ``{policy: T}``; default ``{"jiq": 5.3, "jiq-pod": 2.6}``.

    Returns:
        A :class:`HeadlineFit`. (With the defaults: ``r`` close to 10, where
        ``T`` is about 5.39, 2.54 and 4.52.)
    """
    targets = dict(_HEADLINE_TARGETS if targets is None else targets)
    with jax.enable_x64(True):
        ratios = {p: _ratio_for(p, load, d, t) for p, t in targets.items()}
        def misfit(x):
            return sum(
                (math.log(float(mean_response_time(p, load, math.exp(x), d))) - math.log(t)) ** 2
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
        times = {
            p: float(mean_response_time(p, load, ratio, d if p in ("jiq-pod", "pod") else 1))
            for p in ("jiq", "jiq-pod", "pod")
        }
    return HeadlineFit(float(load), int(d), ratio, ratios, times, targets)


class MaxLoadResult(NamedTuple):
    """Largest load meeting a mean-response-time target.

    Attributes:
        load: ``lambda*`` (0 when infeasible, 1 when every load meets the target).
        mean_response_time: ``T(lambda*)``.
        status: 0 converged; 1 no convergence within ``max_steps``; 2 non-finite;
            3 infeasible (``target <= 1 = T(0+)``); 4 every load in (0, 1) meets it.
        steps: optimiser steps taken.
    """

    load: float
    mean_response_time: float
    status: int
    steps: int


@functools.partial(jax.jit, static_argnames=("policy", "d", "max_steps"))
def _max_load_impl(target, ratio, tol, policy: str, d: int, max_steps: int):
    """L-BFGS (optax) on ``theta = logit(lambda)``, loss ``(log T - log target)**2 / 2``."""
    log_target = jnp.log(target)

    def residual(theta):
        return jnp.log(mean_response_time(policy, jax.nn.sigmoid(theta), ratio, d)) - log_target

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
    return lam, mean_response_time(policy, lam, ratio, d), steps, res


def max_load_for_target(
    target_T: float,
    ratio: float | None = None,
    policy: str = "jiq-pod",
    d: int = 2,
    *,
    tol: float = 1e-11,
    max_steps: int = 100,
) -> MaxLoadResult:
    """Largest ``lambda`` whose mean-field mean response time is at most ``target_T``.

    Inverse design through the differentiable solver: ``T`` increases with
    ``lambda``, so ``lambda*`` is the root of ``log T(lambda) = log target``;
    optax's L-BFGS (zoom line search) minimises its square over the
    unconstrained ``theta = logit(lambda)``, with gradients of ``p0`` from
    implicit differentiation; a last first-order correction moves a root
    approximation from just above to just below the target. Float64 (x64
    switched on for the call).

    Args:
        target_T: the target mean response time (> 1 to be feasible).
        ratio: ``r`` (JIQ family).
        policy: a closed-form policy name.
        d: probes of ``pod`` / ``jiq-pod``.
        tol: tolerance on ``|log T - log target|``.
        max_steps: optimiser step limit.

    Returns:
        A :class:`MaxLoadResult`.
    """
    kind, d = _resolve(policy, d)
    target = float(target_T)
    if kind == "jiq" and ratio is None:
        raise ValueError(f"policy {policy!r} needs ratio")
    if not target > 1.0:
        return MaxLoadResult(0.0, 1.0, 3, 0)
    if kind == "jsq":
        return MaxLoadResult(1.0, 1.0, 4, 0)
    with jax.enable_x64(True):
        lam, t, steps, res = _max_load_impl(
            jnp.float64(target),
            jnp.float64(1.0 if ratio is None else ratio),
            jnp.float64(tol),
            policy=policy,
            d=d,
            max_steps=int(max_steps),
        )
        lam, t, steps, res = float(lam), float(t), int(steps), float(res)
    if not (math.isfinite(lam) and math.isfinite(t) and math.isfinite(res)):
        status = 2
    elif abs(res) <= tol:
        status = 0
    else:
        status = 1
    return MaxLoadResult(lam, t, status, steps)
