"""The 1/N expansion of the mean field (Gast and Van Houdt): the population process's
jumps, the Lyapunov equation and the corrections at a fixed point.

Derivation and notes: docs/theory.md, "Refined mean field".
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.system import System
from jaxqueue.policies import Policy
from jaxqueue.theory.generic import meanfield

__all__ = [
    "Corrections",
    "transitions",
    "jump_covariance",
    "reduced",
    "embed",
    "project",
    "model",
    "lyapunov",
    "corrections",
    "corrections_at",
    "metrics_at",
    "quantile_corrections",
]

_DIRECTIONS = 64  # derivative directions evaluated at once


# ---------------------------------------------------------------------------
# The population process
# ---------------------------------------------------------------------------


def transitions(x, load, ratio, policy: Policy, system: System):
    """The transitions of the population process at fractions ``x`` (see the module notes).

    Args:
        x: ``[s_1..s_L, Q_1..Q_J]`` (``L = system.levels``, ``J = system.iqueue_levels``).
        load: ``lambda``.
        ratio: ``r = N / M`` (the size of a ``Q`` jump in units of ``1 / N``;
            unused without I-queue coordinates).
        policy: the policy; system: its limit :class:`~jaxqueue.core.system.System`
            (:func:`jaxqueue.theory.generic.meanfield.limit_system`).

    Returns:
        ``(jumps, rates)``: ``jumps`` ``[n_trans, L + J]`` in units of ``1 / N``
        and ``rates`` ``[n_trans]`` per ``N`` (per server), with
        ``sum_l jumps[l] * rates[l] == meanfield.drift(x, ...)``. There are
        ``(L + 1)(J + 1)`` arrival transitions (by level found and I-queue
        size hit), ``L - 1`` completions at levels ``2..L`` and ``J + 1``
        completions at level 1 (one per I-queue size joined below ``J``, one
        that moves no ``Q``).
    """
    L, J = system.levels, system.iqueue_levels
    D = L + J
    dtype = x.dtype
    s = jnp.concatenate([jnp.ones((1,), dtype), x[:L], jnp.zeros((1,), dtype)])  # s_0..s_{L+1}
    # arrivals: (a, j) -> +e_{s_{a+1}} (a < L), -r e_{Q_j} (j >= 1)
    a_s = np.zeros((L + 1, J + 1, D))
    a_q = np.zeros((L + 1, J + 1, D))
    for a in range(L):
        a_s[a, :, a] = 1.0
    for j in range(1, J + 1):
        a_q[:, j, L + j - 1] = -1.0
    arrival_jumps = (a_s + ratio * a_q).reshape(-1, D)
    arrival_rates = load * meanfield.arrival_law(x, policy, system).reshape(-1)
    # completions at levels 2..L
    dep = np.zeros((max(L - 1, 0), D))
    for k in range(2, L + 1):
        dep[k - 2, k - 1] = -1.0
    dep_rates = s[2 : L + 1] - s[3 : L + 2]
    # completions at level 1, with the join of the newly idle server
    idle = s[1] - s[2]
    one_s = np.zeros((J + 1, D))
    one_s[:, 0] = -1.0
    one_q = np.zeros((J + 1, D))
    for j in range(J):
        one_q[j, L + j] = 1.0
    one_jumps = one_s + ratio * one_q
    if J:
        join = meanfield.rates(x, policy, system).join[:J]
        one_rates = idle * jnp.concatenate([join, (1.0 - jnp.sum(join))[None]])
    else:
        one_rates = idle[None]
    jumps = jnp.concatenate([arrival_jumps, jnp.asarray(dep, dtype), one_jumps.astype(dtype)])
    rates = jnp.concatenate([arrival_rates, dep_rates, one_rates])
    return jumps.astype(dtype), rates


def jump_covariance(x, load, ratio, policy: Policy, system: System):
    """``sum_l rates[l] jumps[l] jumps[l]^T`` of :func:`transitions`, built from
    their structure: ``[L + J, L + J]``, in ``O((L + J)^2 + L J)`` memory and
    work (the dense product over the ``(L + 1)(J + 1)`` arrival transitions
    would take ``O(L J (L + J))``: gigabytes at a thousand levels).

    Every jump moves one ``s`` coordinate by ``+-1`` and at most one ``Q``
    coordinate by ``-+r``: an arrival that finds level ``a`` and an I-queue of
    size ``j`` is ``+e_{s_{a+1}} - r e_{Q_j}``, a completion at level ``k`` is
    ``-e_{s_k}``, and one at level 1 whose server joins an I-queue of size
    ``j`` is ``-e_{s_1} + r e_{Q_{j+1}}``.
    """
    L, J = system.levels, system.iqueue_levels
    dtype = x.dtype
    s = jnp.concatenate([jnp.ones((1,), dtype), x[:L], jnp.zeros((1,), dtype)])  # s_0..s_{L+1}
    arrivals = load * meanfield.arrival_law(x, policy, system)  # [L + 1, J + 1]
    s_diag = jnp.sum(arrivals[:L], axis=1)  # arrivals that lift s_{a+1}
    s_diag = s_diag.at[1:].add(s[2 : L + 1] - s[3 : L + 2])  # completions at levels 2..L
    idle = s[1] - s[2]
    s_diag = s_diag.at[0].add(idle)  # completions at level 1, whatever they join
    if not J:
        return jnp.diag(s_diag)
    join = idle * meanfield.rates(x, policy, system).join[:J]  # level-1 completions joining j
    q_diag = ratio**2 * (jnp.sum(arrivals[:, 1:], axis=0) + join)
    cross = (-ratio * arrivals[:L, 1:]).at[0].add(-ratio * join)  # [L, J]
    return jnp.block([[jnp.diag(s_diag), cross], [cross.T, jnp.diag(q_diag)]])


def reduced(policy: Policy, system: System) -> bool:
    """Whether the conservation law of the JIQ family holds (then ``Q_1`` is eliminated)."""
    return policy.uses_iqueues and system.iqueue_levels > 0


def embed(y, ratio, policy, system):
    """Full state from plane coordinates (``Q_1 = r (1 - s_1) - sum_{j>=2} Q_j``)."""
    if not reduced(policy, system):
        return y
    L = system.levels
    q1 = ratio * (1.0 - y[0]) - jnp.sum(y[L:])
    return jnp.concatenate([y[:L], q1[None], y[L:]])


def project(x, policy, system):
    """Plane coordinates of a full state or vector (``Q_1`` dropped)."""
    if not reduced(policy, system):
        return x
    L = system.levels
    return jnp.concatenate([x[:L], x[L + 1 :]])


def _n_observables(system: System) -> int:
    return system.levels + 3


def model(y, eps, load, ratio, policy, system):
    """``[drift in plane coordinates, observables]`` at plane state ``y`` and ``1 / N = eps``.

    Observables (expectations of functions of the state, per server per unit
    time): accepted-or-not arrivals by level found ``lambda P(level = k)``,
    ``k = 0..L``; delete requests; probe messages.
    """
    x = embed(y, ratio, policy, system)
    population = (eps, eps * ratio)
    rt = meanfield.rates(x, policy, system, population)
    f = meanfield.drift_from_rates(x, load, ratio, rt, system)
    L = system.levels
    idle = x[0] - (x[1] if L >= 2 else 0.0)
    join = idle if policy.uses_iqueues else 0.0
    h = jnp.concatenate(
        [
            load * rt.level,
            (load * rt.deletes)[None],
            (load * rt.probes + join * rt.join_probes)[None],
        ]
    )
    return jnp.concatenate([project(f, policy, system), h])


# ---------------------------------------------------------------------------
# Linear algebra
# ---------------------------------------------------------------------------


def _lyapunov(a, q):
    """:func:`lyapunov`, and the eigenvalues of ``a`` (the diagonal of its Schur form)."""
    n = a.shape[-1]
    cdtype = jnp.result_type(a.dtype, jnp.complex64)
    t, z = jax.scipy.linalg.schur(a.astype(cdtype), output="complex")
    c = z.conj().T @ q.astype(cdtype) @ z
    eye = jnp.eye(n, dtype=cdtype)

    def column(i, y):
        j = n - 1 - i
        # columns > j are solved and columns <= j are still 0, and T[j, :j] = 0
        rhs = -c[:, j] - y @ jnp.conj(t[j, :])
        col = jax.scipy.linalg.solve_triangular(t + jnp.conj(t[j, j]) * eye, rhs, lower=False)
        return y.at[:, j].set(col)

    y = jax.lax.fori_loop(0, n, column, jnp.zeros((n, n), cdtype))
    w = jnp.real(z @ y @ z.conj().T)
    return 0.5 * (w + w.T), jnp.diagonal(t)


def lyapunov(a, q):
    """``W`` with ``a W + W a^T + q = 0`` (``a`` stable), by Bartels-Stewart.

    ``a = Z T Z^H`` (complex Schur form, ``T`` upper triangular); then
    ``T Y + Y T^H = -Z^H q Z`` is solved column by column from the last,
    each column one triangular solve, and ``W = Z Y Z^H``. Jittable and
    vmappable; ``O(n^3)``. ``jax.scipy.linalg.schur`` is implemented on CPU.
    (Diagonalising ``a`` instead is cheaper but useless here: the Jacobians
    of these drifts are far from normal, with eigenvector matrices whose
    condition number reaches 1e30.)

    Args:
        a: ``[n, n]`` real, with eigenvalues in the open left half-plane.
        q: ``[n, n]`` real symmetric.

    Returns:
        ``[n, n]`` real symmetric ``W``.
    """
    return _lyapunov(a, q)[0]


# ---------------------------------------------------------------------------
# The corrections at one fixed point (jitted, vmappable)
# ---------------------------------------------------------------------------


class Corrections(NamedTuple):
    """The refined mean field's pieces at one fixed point (arrays; batched under vmap).

    Attributes:
        state: ``V``, ``[L + J]``: ``E[X_N] = x* + V / N + o(1 / N)``.
        covariance: ``W``, ``[L + J, L + J]``: ``N Cov(X_N) -> W``.
        observables: the observables at ``x*`` (``[L + 3]``: ``lambda P(level = k)``
            for ``k = 0..L``, delete and probe rates).
        observables_correction: their ``1 / N`` coefficients.
        residual: max-norm of the drift at ``x*``.
        spectral_abscissa: the largest real part of an eigenvalue of ``A``
            (in plane coordinates); negative at a stable fixed point.
    """

    state: jax.Array
    covariance: jax.Array
    observables: jax.Array
    observables_correction: jax.Array
    residual: jax.Array
    spectral_abscissa: jax.Array


def corrections_at(x, load, ratio, policy, system, with_covariance=True):
    y0 = project(x, policy, system)
    n = y0.shape[0]
    zero = jnp.zeros((), x.dtype)

    def at(y, eps=zero):
        return model(y, eps, load, ratio, policy, system)

    value = at(y0)
    eye = jnp.eye(n, dtype=x.dtype)
    batch = min(n, _DIRECTIONS)  # directions at once: each holds the whole model's tangents
    jac = jax.lax.map(lambda e: jax.jvp(at, (y0,), (e,))[1], eye, batch_size=batch).T
    a, dh = jac[:n], jac[n:]
    _, by_eps = jax.jvp(lambda e: at(y0, e), (zero,), (jnp.ones((), x.dtype),))
    q_full = jump_covariance(x, load, ratio, policy, system)
    q = jax.vmap(lambda row: project(row, policy, system))(
        jax.vmap(lambda col: project(col, policy, system))(q_full).T
    )
    w, eigenvalues = _lyapunov(a, q)

    def second(e, we):  # D^2 F [e, W e]
        return jax.jvp(lambda y: jax.jvp(at, (y,), (we,))[1], (y0,), (e,))[1]

    # B : W, drift and observables
    contraction = jnp.sum(jax.lax.map(lambda ew: second(*ew), (eye, w.T), batch_size=batch), axis=0)
    v_plane = -jnp.linalg.solve(a, 0.5 * contraction[:n] + by_eps[:n])
    dobs = dh @ v_plane + 0.5 * contraction[n:] + by_eps[n:]
    embed_lin = jax.jacfwd(lambda y: embed(y, ratio, policy, system))(y0)  # [L + J, n]
    v = embed_lin @ v_plane
    cov = embed_lin @ w @ embed_lin.T if with_covariance else jnp.zeros((0, 0), x.dtype)
    abscissa = jnp.max(jnp.real(eigenvalues))
    return Corrections(v, cov, value[n:], dobs, jnp.max(jnp.abs(value[:n])), abscissa)


@functools.partial(jax.jit, static_argnames=("policy", "system", "with_covariance"))
def corrections(
    x, load, ratio, policy: Policy, system: System, with_covariance: bool = True
) -> Corrections:
    """The refined mean field at the fixed point ``x`` (jitted; vmappable over ``x``, load, ratio).

    Args:
        x: the fixed point ``[s_1..s_L, Q_1..Q_J]`` of :func:`meanfield.drift`
            (float64; call under ``jaxqueue.core.host.host_float64()``).
        load: ``lambda``; ratio: ``r = N / M`` (1.0 without I-queues).
        policy: a smooth policy (see :meth:`~jaxqueue.policies.Policy.mean_field_kink`;
            not checked here); system: its limit System.
        with_covariance: return ``W`` (``False``: a ``(0, 0)`` array, for grids).

    Returns:
        :class:`Corrections`.
    """
    return corrections_at(x, load, ratio, policy, system, with_covariance)


# ---------------------------------------------------------------------------
# Metrics and their corrections (pure JAX: shared by one point and a grid)
# ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("policy", "system", "buffer"))
def metrics_at(x, v, obs, dobs, load, policy, system, buffer):
    """``{metric: (mean-field value, 1/N coefficient)}`` for every metric of the schema
    but the quantiles (which :func:`quantile_corrections` adds on the host)."""
    L, J = system.levels, system.iqueue_levels
    one = jnp.ones((1,), x.dtype)
    nil = jnp.zeros((1,), x.dtype)
    s, vs = jnp.concatenate([one, x[:L]]), jnp.concatenate([nil, v[:L]])

    def diff(t):
        return t - jnp.concatenate([t[1:], jnp.zeros((1,), t.dtype)])

    arrivals, darrivals = obs[: L + 1], dobs[: L + 1]
    accepted, daccepted = jnp.sum(arrivals[:L]), jnp.sum(darrivals[:L])
    seen = arrivals[:L] / accepted
    dseen = (darrivals[:L] - seen * daccepted) / accepted
    seen, dseen = jnp.concatenate([seen, nil]), jnp.concatenate([dseen, nil])
    k1 = jnp.arange(1, L + 2, dtype=x.dtype)
    zero = jnp.zeros((), x.dtype)
    out = {
        "tail": (s, vs),
        "occupancy": (diff(s), diff(vs)),
        "arrival_seen": (seen, dseen),
        "mean_queue_length": (jnp.sum(s[1:]), jnp.sum(vs[1:])),
        "mean_response_time": (jnp.sum(k1 * seen), jnp.sum(k1 * dseen)),
        "waiting_probability": (1.0 - seen[0], -dseen[0]),
        "blocking_probability": (
            (arrivals[L] / load, darrivals[L] / load) if buffer is not None else (zero, zero)
        ),
        "join_rate": (
            (s[1] - s[2], vs[1] - vs[2])
            if policy.uses_iqueues and L >= 2
            else (s[1], vs[1])
            if policy.uses_iqueues
            else (zero, zero)
        ),
        "delete_rate": (obs[L + 1], dobs[L + 1]),
        "probe_rate": (obs[L + 2], dobs[L + 2]),
    }
    if J:
        q, vq = jnp.concatenate([one, x[L:]]), jnp.concatenate([nil, v[L:]])
        out["p0"] = (1.0 - q[1], -vq[1])
        out["iqueue_distribution"] = (diff(q), diff(vq))
    return out


def quantile_corrections(seen: np.ndarray, dseen: np.ndarray, quantiles: dict) -> dict:
    """First-order change of the Erlang-mixture quantiles when ``seen`` moves by ``dseen``.

    ``t_q`` solves ``sum_k seen_k G_k(t) = q`` (``G_k`` the Erlang(``k + 1``, 1)
    distribution function); by the implicit function theorem
    ``dt_q = sum_k dseen_k P(Poisson(t_q) <= k) / sum_k seen_k pois(k; t_q)``
    (``1 - G_k(t) = P(Poisson(t) <= k)``, and the Erlang(``k + 1``) density is
    ``pois(k; t)``).
    """
    k = np.arange(seen.size, dtype=np.float64)
    log_fact = np.array([math.lgamma(i + 1.0) for i in range(seen.size)])
    out = {}
    for q, t in quantiles.items():
        pmf = np.exp(k * math.log(t) - t - log_fact)
        out[q] = float(np.sum(dseen * np.cumsum(pmf)) / np.sum(seen * pmf))
    return out
