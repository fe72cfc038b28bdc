"""The 1/N-refined mean field: ``E[X_N] = x* + V / N + o(1 / N)``.

Gast and Van Houdt, "A refined mean field approximation" (SIGMETRICS 2018),
expand the stationary mean of a density-dependent population process around
its mean-field fixed point ``x*``. Here the process is the generic mean field
of :mod:`jaxqueue.theory.meanfield` read at finite ``N``: the state ``x`` is
``[s_1..s_L, Q_1..Q_J]`` and, at fractions ``x``, a transition ``l`` moves
``x`` by ``l / N`` at rate ``N * beta_l(x)``. :func:`transitions` lists them:

* an arrival (rate ``N lambda``) that finds ``a`` tasks and takes a listed
  server from an I-queue of size ``j`` raises ``s_{a+1}`` by ``1 / N`` (for
  ``a < L``; at ``a = L`` it is blocked or leaves the truncated model) and
  lowers ``Q_j`` by ``1 / M = r / N`` (for ``j >= 1``), at rate
  ``N lambda P(level = a, iq_remove = j)`` (:func:`meanfield.arrival_law`,
  the joint law on the policy's own outcome grid);
* a completion at a server with ``k >= 2`` tasks lowers ``s_k`` by ``1 / N``
  at rate ``N (s_k - s_{k+1})``;
* a completion at a server with one task lowers ``s_1`` by ``1 / N`` and, in
  the JIQ family, the newly idle server joins an I-queue of size ``j``,
  raising ``Q_{j+1}`` by ``r / N``, at rate ``N (s_1 - s_2) P(join size j)``
  (a join at the size bound ``J`` moves no ``Q``, as in the drift).

So the I-queue coordinates live on the coarser grid ``1 / M``: in units of
``1 / N`` their jumps have size ``r``, and the expansion is in ``1 / N`` at
fixed ``r = N / M``. The sum of jump times rate is
:func:`meanfield.drift` (tested to 1e-12).

**The formula.** With ``f`` the drift, ``A = Df(x*)`` (Jacobian),
``B = D^2 f(x*)`` (Hessian, a tensor) and ``Q = sum_l l l^T beta_l(x*)``
(the jumps' covariance), the covariance ``W = lim N Cov(X_N)`` solves the
Lyapunov equation ``A W + W A^T + Q = 0``, and taking the stationary mean of
the drift to second order gives ``0 = A V + (1/2) B:W + f~(x*)``, where
``(B:W)_j = sum_{k,m} B_{jkm} W_{km}``. The last term is the ``1 / N`` part
of the finite system's drift, ``f_N = f + f~ / N + O(1 / N^2)``: probes of
``d`` *distinct* servers (or I-queues) find all ``d`` in a fraction ``p``
with probability ``prod_{i<d} (p - i/N) / (1 - i/N) = p**d + O(1 / N)``
(:meth:`~jaxqueue.policies.Draw.finite_law`), so Pod(d), JIQ-Pod(d) and
JIQ-SQ(d) have one; with sampling with replacement it would vanish and the
formula is the paper's ``A V = -(1/2) B:W``. For a function ``g`` of the
state, ``E[g(X_N)] = g(x*) + (Dg V + (1/2) D^2 g : W + g~) / N``; the
metrics that are ratios of expectations (the response time and the law seen
by an accepted arrival: accepted arrivals per unit time by level over all
accepted arrivals) take the first-order term of the ratio. Every correction
is that ``1 / N`` coefficient, and the refined value at ``N`` is the
mean-field value plus the correction over ``N`` (no clipping: a small tail
entry can come out negative at small ``N``).

**The conservation law.** In the JIQ family with several dispatchers the
I-queues list exactly the idle servers, ``sum_j Q_j / r = 1 - s_1``, for
every ``N``: every jump is orthogonal to ``c = e_{s_1} + sum_j e_{Q_j} / r``
and ``c^T f = 0``, so ``A`` is singular (left null vector ``c``) and the
Lyapunov equation has no unique solution in the full coordinates. The
process lives on the affine plane ``c . x = 1``; everything here is computed
in the coordinates of that plane, ``Q_1 = r (1 - s_1) - sum_{j>=2} Q_j``
eliminated (the equation the fixed point also replaces), where ``A`` is
regular, and mapped back: ``V`` then satisfies ``c . V = 0`` and ``W c = 0``.

**Where it is undefined.** The expansion needs a drift with a Taylor
expansion at ``x*``. Policies that route on whether a count is zero (JSQ,
I1F, an idle server first with one dispatcher, Pod(d) with ``d = N``) have
a fixed point on the set where their drift jumps; the policy says so
(:meth:`~jaxqueue.policies.Policy.mean_field_kink`) and the result carries
``Status.NOT_DIFFERENTIABLE`` with the reason, and no numbers. A fixed point
that did not converge passes its status on.

**Computation.** Float64 throughout. ``A`` is ``jax.jacfwd`` of the drift,
``B:W`` is the sum over ``k`` of the second directional derivatives
``D^2 f[e_k, W e_k]`` (nested ``jax.jvp``, ``n`` passes instead of the
``n^2`` of the full ``jax.hessian``; equal to the contraction of the full
Hessian, tested), ``f~`` is ``jax.jvp`` in ``1 / N`` at 0, and the Lyapunov
equation is solved by Bartels-Stewart on the complex Schur form of ``A``
(``jax.scipy.linalg.schur``, which JAX implements on CPU), ``O(n^3)`` per
point. :func:`corrections` is jitted and vmappable over the fixed point, the
load and the ratio; ``N`` enters only as the final ``1 / N``, so one
correction serves every ``N`` (:func:`refined_grid` does a grid and a list
of ``N`` at once).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.host import host_float64
from jaxqueue.core.status import Status
from jaxqueue.core.system import MAX_SERVERS, System, as_int, check_int, check_load
from jaxqueue.policies import Policy, make
from jaxqueue.results.estimates import json_number
from jaxqueue.theory import meanfield
from jaxqueue.theory.result import TRUNCATION_LIMIT, MeanFieldResult, build

__all__ = [
    "RefinedMeanField",
    "RefinedGrid",
    "Corrections",
    "GRID_METRICS",
    "refined_mean_field",
    "refined_grid",
    "transitions",
    "jump_covariance",
    "corrections",
    "lyapunov",
    "working_bytes",
    "MAX_WORKING_BYTES",
]

_MAX_LEVELS = 10**6
_DIRECTIONS = 64  # derivative directions evaluated at once

#: The most working memory (bytes) the correction of one point, or of one
#: chunk of a grid, may be estimated to take before it is refused (raise it
#: on a machine with more). See :func:`working_bytes`.
MAX_WORKING_BYTES = 16 * 2**30


def working_bytes(system: System) -> int:
    """Estimated working memory of :func:`corrections` at one point, in bytes.

    The derivatives of the outcome-grid sums hold, for each outcome law, the
    grid's sums keyed by (result, outcome): ``(L + 1)(J + 1)`` results times
    ``L + 1`` outcomes for the JIQ family's arrival law, so the memory grows
    as ``L^2 J``; the Schur and Lyapunov steps add ``O((L + J)^2)``.
    Measured on the CPU (JIQ, ``J = 30``): 0.64 GB at ``L = 600``, 2.4 GB
    at 1200 and 7.9 GB at 2048, against this estimate's 0.72, 2.9 and 9.2.
    """
    L, J = system.levels, system.iqueue_levels
    return 64 * (L + 1) ** 2 * (J + 1) + 200 * (L + J + 1) ** 2


def _check_work(pol, system: System, points: int = 1) -> None:
    """Refuse, before compiling, a correction estimated past :data:`MAX_WORKING_BYTES`."""
    need = working_bytes(system) * points
    if need > MAX_WORKING_BYTES:
        what = "the correction" if points == 1 else f"a chunk of {points} points"
        advice = ("give a smaller chunk, or " if points > 1 else "") + (
            "lower the load (the levels the tail needs grow like 1 / (1 - load)), "
            "or raise jaxqueue.theory.refined.MAX_WORKING_BYTES on a machine with more memory"
        )
        raise ValueError(
            f"the refined mean field of {pol.label()} with levels={system.levels} and "
            f"iqueue_levels={system.iqueue_levels}: {what} would take about "
            f"{need / 2**30:.1f} GiB of working memory, more than MAX_WORKING_BYTES = "
            f"{MAX_WORKING_BYTES / 2**30:.1f} GiB; {advice}"
        )


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
            (:func:`jaxqueue.theory.meanfield.limit_system`).

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


def _reduced(policy: Policy, system: System) -> bool:
    """Whether the conservation law of the JIQ family holds (then ``Q_1`` is eliminated)."""
    return policy.uses_iqueues and system.iqueue_levels > 0


def _embed(y, ratio, policy, system):
    """Full state from plane coordinates (``Q_1 = r (1 - s_1) - sum_{j>=2} Q_j``)."""
    if not _reduced(policy, system):
        return y
    L = system.levels
    q1 = ratio * (1.0 - y[0]) - jnp.sum(y[L:])
    return jnp.concatenate([y[:L], q1[None], y[L:]])


def _project(x, policy, system):
    """Plane coordinates of a full state or vector (``Q_1`` dropped)."""
    if not _reduced(policy, system):
        return x
    L = system.levels
    return jnp.concatenate([x[:L], x[L + 1 :]])


def _n_observables(system: System) -> int:
    return system.levels + 3


def _model(y, eps, load, ratio, policy, system):
    """``[drift in plane coordinates, observables]`` at plane state ``y`` and ``1 / N = eps``.

    Observables (expectations of functions of the state, per server per unit
    time): accepted-or-not arrivals by level found ``lambda P(level = k)``,
    ``k = 0..L``; delete requests; probe messages.
    """
    x = _embed(y, ratio, policy, system)
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
    return jnp.concatenate([_project(f, policy, system), h])


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


def _corrections(x, load, ratio, policy, system, with_covariance=True):
    y0 = _project(x, policy, system)
    n = y0.shape[0]
    zero = jnp.zeros((), x.dtype)

    def model(y, eps=zero):
        return _model(y, eps, load, ratio, policy, system)

    value = model(y0)
    eye = jnp.eye(n, dtype=x.dtype)
    batch = min(n, _DIRECTIONS)  # directions at once: each holds the whole model's tangents
    jac = jax.lax.map(lambda e: jax.jvp(model, (y0,), (e,))[1], eye, batch_size=batch).T
    a, dh = jac[:n], jac[n:]
    _, by_eps = jax.jvp(lambda e: model(y0, e), (zero,), (jnp.ones((), x.dtype),))
    q_full = jump_covariance(x, load, ratio, policy, system)
    q = jax.vmap(lambda row: _project(row, policy, system))(
        jax.vmap(lambda col: _project(col, policy, system))(q_full).T
    )
    w, eigenvalues = _lyapunov(a, q)

    def second(e, we):  # D^2 F [e, W e]
        return jax.jvp(lambda y: jax.jvp(model, (y,), (we,))[1], (y0,), (e,))[1]

    # B : W, drift and observables
    contraction = jnp.sum(jax.lax.map(lambda ew: second(*ew), (eye, w.T), batch_size=batch), axis=0)
    v_plane = -jnp.linalg.solve(a, 0.5 * contraction[:n] + by_eps[:n])
    dobs = dh @ v_plane + 0.5 * contraction[n:] + by_eps[n:]
    embed_lin = jax.jacfwd(lambda y: _embed(y, ratio, policy, system))(y0)  # [L + J, n]
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
    return _corrections(x, load, ratio, policy, system, with_covariance)


# ---------------------------------------------------------------------------
# Metrics and their corrections (pure JAX: shared by one point and a grid)
# ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("policy", "system", "buffer"))
def _metrics(x, v, obs, dobs, load, policy, system, buffer):
    """``{metric: (mean-field value, 1/N coefficient)}`` for every metric of the schema
    but the quantiles (which :func:`_quantile_corrections` adds on the host)."""
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


def _quantile_corrections(seen: np.ndarray, dseen: np.ndarray, quantiles: dict) -> dict:
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


# ---------------------------------------------------------------------------
# One point
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RefinedMeanField:
    """The refined mean field of one policy at one point and one ``N``.

    Attributes:
        mean_field: the :class:`~jaxqueue.theory.result.MeanFieldResult` of the
            generic fixed point (the model the correction expands; ``None`` if
            the fixed point failed).
        correction: ``{metric: V}``, the ``1 / N`` coefficient of every metric
            of the result schema (floats, float64 arrays, ``{q: value}`` for
            ``response_quantiles``; ``None`` where the metric does not apply),
            or ``None`` unless ``status`` is ``CONVERGED``.
        refined: a :class:`~jaxqueue.theory.result.MeanFieldResult` holding
            ``mean field + V / N`` for every metric, its settings with
            ``n_servers`` and ``approximation = "refined"``; ``None`` unless
            ``status`` is ``CONVERGED``.
        n_servers: ``N``.
        status: :class:`~jaxqueue.core.status.Status`: ``CONVERGED``,
            ``NOT_DIFFERENTIABLE`` (JSQ-like routing; ``reason`` says why), the
            fixed point's failure status, or ``NON_FINITE`` (a non-finite
            correction, e.g. an unstable fixed point).
        reason: why there are no numbers (``None`` when ``CONVERGED``).
        state_correction: ``V`` for ``x = [s_1..s_L, Q_1..Q_J]``.
        covariance: ``W``, the limit of ``N Cov(X_N)``.
    """

    mean_field: MeanFieldResult | None
    correction: dict | None
    refined: MeanFieldResult | None
    n_servers: int
    status: Status
    reason: str | None = None
    state_correction: np.ndarray | None = None
    covariance: np.ndarray | None = None

    def at(self, n_servers: int) -> MeanFieldResult | None:
        """The refined values at another ``N``: the correction ``V`` does not depend on N.

        None unless ``status`` is ``CONVERGED``. For the JIQ family the ratio
        ``r = N / M`` stays the one the correction was computed for.
        """
        if self.correction is None:
            return None
        check_int("n_servers", n_servers, 1, MAX_SERVERS)
        mf = self.mean_field
        pol = make(mf.settings["policy"], **mf.settings["options"])
        if pol.uses_iqueues and not pol.single_dispatcher:
            _check_whole(n_servers, _check_ratio(mf.settings["ratio"], None))
        return _refined_result(
            mf,
            self.correction,
            pol,
            mf.settings["load"],
            mf.settings["ratio"],
            mf.settings["buffer"],
            n_servers,
        )

    def to_dict(self) -> dict:
        """JSON-ready: ``refined`` (the keys of the mean field's ``to_dict``),
        ``correction`` (plain numbers and lists, same metric names), ``status``
        and ``reason``."""
        corr = None
        if self.correction is not None:
            corr = {
                k: (v if v is None or isinstance(v, dict) else json_number(v))
                for k, v in self.correction.items()
            }
            corr["response_quantiles"] = {
                str(q): json_number(v)
                for q, v in sorted(self.correction["response_quantiles"].items())
            }
        return {
            "n_servers": self.n_servers,
            "status": self.status.name,
            "reason": self.reason,
            "refined": None if self.refined is None else self.refined.to_dict(),
            "correction": corr,
        }


def _check_ratio(ratio, n_servers):
    if ratio is None or (isinstance(ratio, float) and math.isinf(ratio)):
        return None
    try:
        r = float(ratio)
    except (TypeError, ValueError):
        raise TypeError(f"ratio must be a number or None, got {ratio!r}") from None
    if not (r > 0 and math.isfinite(r)):
        raise ValueError(f"ratio={ratio!r} is out of range: need 0 < ratio")
    if n_servers is not None and r > n_servers:
        raise ValueError(
            f"ratio={ratio!r} is out of range: need ratio <= n_servers "
            f"({n_servers}), at least one dispatcher"
        )
    return r


def _setup(policy, load, ratio, d, buffer, n_servers, levels, iqueue_levels):
    """Validate everything (before any compilation); the policy, limit and finite systems."""
    if buffer is not None:
        check_int("buffer", buffer, 1, _MAX_LEVELS)
    if levels is not None:
        check_int("levels", levels, 1, _MAX_LEVELS)
    if iqueue_levels is not None:
        check_int("iqueue_levels", iqueue_levels, 1, MAX_SERVERS)
    for n in np.atleast_1d(np.asarray(n_servers, dtype=object)):
        check_int("n_servers", n, 1, MAX_SERVERS)
    n_min = int(np.min(np.atleast_1d(np.asarray(n_servers, dtype=object))))
    lam = check_load(load, buffer) if load is not None else None
    pol, system = meanfield._policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels)
    one_dispatcher = system.iqueue_levels == 0
    r = None if one_dispatcher else _check_ratio(ratio, n_min)
    if not one_dispatcher and r is None:
        raise ValueError(f"ratio is required for {pol.label()} with several dispatchers")
    return pol, system, lam, r, n_min


def _whole(n_servers: int, ratio: float) -> bool:
    """Whether ``N / ratio`` dispatchers is a whole number."""
    m = n_servers / ratio
    return math.isclose(m, round(m), rel_tol=1e-9)


def _check_whole(n_servers: int, ratio) -> None:
    """Refuse ``N`` servers at a ratio that does not make ``M = N / r`` whole: the
    refined value is that of a system of ``N`` servers and ``N / r`` dispatchers."""
    if ratio is None or _whole(n_servers, ratio):
        return
    m = n_servers / ratio
    near = sorted({k for k in (math.floor(m), math.ceil(m)) if 1 <= k <= n_servers})
    advice = " or ".join(f"ratio={n_servers / k:g} (M = {k})" for k in near)
    raise ValueError(
        f"n_servers={n_servers} and ratio={ratio:g} give N / ratio = {m:g} dispatchers: the "
        f"refined mean field is at N servers and M = N / ratio dispatchers, which must be a "
        f"whole number; give a ratio that divides n_servers, e.g. {advice}"
    )


def _finite_system(pol, system, n_servers, ratio, buffer) -> System:
    """The finite system ``N`` servers, ``M = round(N / r)`` dispatchers (1 for one dispatcher)."""
    m = 1 if ratio is None else min(n_servers, max(1, round(n_servers / ratio)))
    return System(n_servers, m, buffer, buffer if buffer is not None else system.levels, 0)


def refined_mean_field(
    policy,
    load: float,
    ratio: float | None = None,
    *,
    d: int | None = None,
    buffer: int | None = None,
    n_servers: int,
    levels: int | None = None,
    iqueue_levels: int | None = None,
) -> RefinedMeanField:
    """The 1/N-refined mean field of a policy at one point (float64, host side).

    The fixed point is the generic one (:func:`jaxqueue.theory.meanfield.fixed_point`;
    for closed-form policies it equals the closed form to about 1e-10), so the
    mean field and its correction describe the same truncated model. See the
    module docstring for the formula, the conservation law of the JIQ family
    and where the expansion is undefined.

    Args:
        policy: a policy name or :class:`~jaxqueue.policies.Policy` with an
            occupancy mean field (not ``jiq-original``, ``jiq-threshold``).
        load: ``lambda > 0`` (``< 1`` unless ``buffer`` is given).
        ratio: ``r = N / M`` (``0 < r <= n_servers``, with ``n_servers / r``
            a whole number of dispatchers) for the JIQ family with several
            dispatchers; ``None`` (or inf) for one dispatcher, which is
            JSQ-like (``NOT_DIFFERENTIABLE``). Ignored by policies without I-queues.
        d: probes of ``pod``, ``jiq-pod``, ``idle-first``, ``jiq-sq`` (default:
            the policy's own); ``1 <= d <= n_servers`` (``d = N`` is JSQ).
        buffer: places per server (``>= 1``), or ``None`` for infinite buffers.
        n_servers: ``N >= 1``; the refined values are at this ``N``.
        levels: the largest queue length represented (default ``buffer``, or
            :data:`meanfield.DEFAULT_LEVELS` grown by the fixed point's
            adaptive count where the tail needs more); a given one that
            leaves more than ``1e-6`` of the tail at the bound is refused.
        iqueue_levels: the largest I-queue size represented (default
            :func:`jaxqueue.theory.meanfield.default_iqueue_levels`).

    Returns:
        :class:`RefinedMeanField`.

    Raises:
        NotImplementedError: a policy without an occupancy mean field.
        ValueError, TypeError: an argument out of range (named, with its range),
            raised before anything is compiled; ValueError also where the
            levels the tail needs would take the correction past
            :data:`MAX_WORKING_BYTES` of memory (:func:`working_bytes`).

    Example:
        >>> from jaxqueue import theory
        >>> rf = theory.refined_mean_field("pod", 0.9, n_servers=100)
        >>> rf.refined.mean_response_time > rf.mean_field.mean_response_time
        True
    """
    buffer, n_servers, levels, iqueue_levels = (
        as_int(v) for v in (buffer, n_servers, levels, iqueue_levels)
    )
    pol, system, lam, r, _ = _setup(
        policy, load, ratio, d, buffer, n_servers, levels, iqueue_levels
    )
    _check_whole(n_servers, r)
    fsys = _finite_system(pol, system, n_servers, r, buffer)
    pol.validate(fsys)  # d against N (and M for jiq-sq)
    _check_work(pol, system)
    kink = pol.mean_field_kink(fsys)
    start = None
    if _closed_form_starts(pol, buffer):
        with host_float64():  # Newton from the closed form, not from an ODE run
            start = np.asarray(
                _closed_form_start(pol, system, jnp.asarray([lam]), jnp.asarray([r or 1.0]))[0, 0]
            )
    fp = meanfield.fixed_point(
        pol,
        lam,
        r,
        buffer=buffer,
        levels=system.levels,
        iqueue_levels=system.iqueue_levels or None,
        start=start,
    )
    converged = fp.status == Status.CONVERGED
    if converged and buffer is None and levels is None and fp.truncated[0] > meanfield.LEVEL_TOL:
        # the load builds longer queues than the first level count holds: the adaptive one
        fp = meanfield.fixed_point(pol, lam, r, iqueue_levels=system.iqueue_levels or None)
        pol, system, lam, r, _ = _setup(
            pol, lam, ratio, d, buffer, n_servers, fp.tail.size - 1, iqueue_levels
        )
        converged = fp.status == Status.CONVERGED
        if converged:
            _check_work(pol, system)
    if converged and buffer is None and fp.truncated[0] > TRUNCATION_LIMIT:
        raise ValueError(
            f"levels={system.levels} is too small for the refined mean field of {pol.label()} "
            f"at load={lam}: the mean field leaves {fp.truncated[0]:.3g} of its tail at the "
            f"bound (at most {TRUNCATION_LIMIT:g} may); pass more levels"
        )
    mf = meanfield.as_result(fp, pol, lam, ratio, buffer=buffer) if converged else None
    if kink is not None:  # whether or not Newton converged there
        return RefinedMeanField(mf, None, None, n_servers, Status.NOT_DIFFERENTIABLE, reason=kink)
    if not converged:
        return RefinedMeanField(
            None,
            None,
            None,
            n_servers,
            Status(fp.status),
            reason=f"the mean-field fixed point did not converge: "
            f"{Status(fp.status).name} (residual {fp.residual:.3g})",
        )
    x = np.concatenate([fp.tail[1:], fp.iq_tail[1:]])
    with host_float64():
        c = corrections(
            jnp.asarray(x, jnp.float64), jnp.float64(lam), jnp.float64(r or 1.0), pol, system
        )
        metrics = _metrics(
            jnp.asarray(x),
            c.state,
            c.observables,
            c.observables_correction,
            jnp.float64(lam),
            pol,
            system,
            buffer,
        )
        metrics = {
            k: (np.asarray(a, np.float64), np.asarray(b, np.float64))
            for k, (a, b) in metrics.items()
        }
        c = Corrections(*(np.asarray(v, np.float64) for v in c))
    finite = all(np.all(np.isfinite(b)) for _, b in metrics.values())
    if not finite or not float(c.spectral_abscissa) < 0:
        return RefinedMeanField(
            mf,
            None,
            None,
            n_servers,
            Status.NON_FINITE,
            reason="the correction is not finite, or the fixed point is not "
            f"stable (spectral abscissa {float(c.spectral_abscissa):.3g})",
        )
    correction = {k: (float(b) if b.ndim == 0 else b) for k, (_, b) in metrics.items()}
    for name in ("p0", "iqueue_distribution"):
        if name not in correction and getattr(mf, name) is not None:
            raise AssertionError(f"{name} of the mean field has no correction")  # pragma: no cover
        correction.setdefault(name, None)
    correction["stale_fraction"] = None
    seen, dseen = metrics["arrival_seen"]
    correction["response_quantiles"] = _quantile_corrections(seen, dseen, mf.response_quantiles)
    refined = _refined_result(mf, correction, pol, lam, ratio, buffer, n_servers)
    return RefinedMeanField(
        mf,
        correction,
        refined,
        n_servers,
        Status.CONVERGED,
        state_correction=c.state,
        covariance=c.covariance,
    )


def _refined_result(mf, corr, pol, lam, ratio, buffer, n) -> MeanFieldResult:
    """``mean field + correction / N`` as a MeanFieldResult (settings note the approximation)."""

    def at_n(name):
        base = getattr(mf, name)
        if base is None:
            return None
        return base + corr[name] / n

    res = build(
        pol,
        load=lam,
        ratio=ratio,
        d=int(pol.options().get("d", 1)),
        buffer=buffer,
        tail=at_n("tail"),
        occupancy=at_n("occupancy"),
        arrival_seen=at_n("arrival_seen"),
        mean_queue_length=at_n("mean_queue_length"),
        mean_response_time=at_n("mean_response_time"),
        waiting_probability=at_n("waiting_probability"),
        blocking_probability=at_n("blocking_probability"),
        p0=at_n("p0"),
        iqueue_distribution=at_n("iqueue_distribution"),
        join_rate=at_n("join_rate"),
        delete_rate=at_n("delete_rate"),
        probe_rate=at_n("probe_rate"),
        response_quantiles={
            q: t + corr["response_quantiles"][q] / n for q, t in mf.response_quantiles.items()
        },
        status=Status.CONVERGED,
        tail_remainder=mf.tail_remainder,
        iqueue_remainder=mf.iqueue_remainder,
    )
    res.settings["n_servers"] = n
    res.settings["approximation"] = "refined"
    return res


# ---------------------------------------------------------------------------
# A grid of (load, ratio), vmapped
# ---------------------------------------------------------------------------

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


def _plane_drift(y, load, ratio, policy, system):
    x = _embed(y, ratio, policy, system)
    return _project(meanfield.drift(x, load, ratio, policy, system), policy, system)


def _newton(x0, load, ratio, policy, system, tol, max_newton):
    """Newton (steps clipped to [0, 1]) on the plane drift from ``x0`` (vmappable): ``(x, status, steps)``."""
    g = functools.partial(_plane_drift, load=load, ratio=ratio, policy=policy, system=system)

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

    y0 = _project(x0, policy, system)
    init = (jnp.zeros((), jnp.int32), y0, jnp.int32(Status.MAX_ITERATIONS), jnp.bool_(False))
    it, y, status, _ = jax.lax.while_loop(cond, body, init)
    return _embed(y, ratio, policy, system), status, it


def _closed_form_starts(pol, buffer) -> bool:
    """Whether Newton can start at the policy's closed form (Pod or JIQ-Pod, infinite buffers)."""
    cf = pol.closed_form()
    return cf is not None and cf.family in ("pod", "jiq-pod") and buffer is None


@functools.partial(jax.jit, static_argnames=("pol", "system"))
def _closed_form_start(pol, system, loads, ratios):
    """Fixed points of the untruncated closed form on the grid, as states ``[A, B, L + J]``."""
    from jaxqueue.theory.closed_forms import _tail
    from jaxqueue.theory.p0 import iqueue_distribution, solve_p0

    cf = pol.closed_form()
    lam, r = jnp.broadcast_arrays(loads[:, None], ratios[None, :])
    s = _tail(cf.family, cf.d, lam, r, system.levels + 1)[..., 1:]
    if not system.iqueue_levels:
        return s
    p0 = solve_p0(lam, r, cf.d).p0
    law = iqueue_distribution(p0, lam, r, cf.d, jmax=system.iqueue_levels)
    q = 1.0 - jnp.cumsum(law, axis=-1)[..., :-1]  # Q_j = P(size >= j), j = 1..J
    return jnp.concatenate([s, q], axis=-1)


def _rk4_start(pol, system, loads, ratios, warmup_time=50.0, dt=0.1):
    """The ODE from the empty system (as :func:`meanfield.fixed_point` starts), ``[A, B, L + J]``."""
    starts = jnp.asarray(np.stack([meanfield._empty_start(system, float(r)) for r in ratios]))
    steps = int(math.ceil(warmup_time / dt))

    def one(x0, lam, r):
        return meanfield._rk4_end(x0, lam, r, jnp.float64(dt), steps, pol, system)

    per_ratio = jax.vmap(one, in_axes=(0, None, 0))
    return jax.vmap(per_ratio, in_axes=(None, 0, None))(starts, loads, ratios)


@functools.partial(jax.jit, static_argnames=("policy", "system", "buffer", "max_newton", "chunk"))
def _grid_core(x0, loads, ratios, policy, system, buffer, tol, max_newton, chunk):
    lam, r = jnp.broadcast_arrays(loads[:, None], ratios[None, :])
    flat = (x0.reshape(-1, x0.shape[-1]), lam.reshape(-1), r.reshape(-1))

    def point(args):
        x_start, load, ratio = args
        x, status, it = _newton(x_start, load, ratio, policy, system, tol, max_newton)
        c = _corrections(x, load, ratio, policy, system, with_covariance=False)
        metrics = _metrics(
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


def refined_grid(
    policy,
    loads,
    ratios=None,
    n_servers=(100,),
    *,
    d: int | None = None,
    buffer: int | None = None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    tol: float = 1e-12,
    max_newton: int = 30,
    chunk: int = 64,
) -> RefinedGrid:
    """The refined mean field on the grid ``loads x ratios``, vmapped (float64).

    One compiled program for the whole grid: per point a Newton solve of the
    generic fixed point (in the plane of the JIQ conservation law) from the
    closed form where the policy declares ``pod`` or ``jiq-pod`` and the
    buffers are infinite, else from the ODE run :func:`meanfield.fixed_point`
    starts from; then :func:`corrections`. Points run in vmapped chunks of
    ``chunk`` under :func:`jax.lax.map` (memory grows with ``chunk`` times
    the outcome grid of the policy's draws). ``N`` enters last: the refined
    values for every ``N`` of ``n_servers`` come from one correction.

    Args:
        policy: a policy name or Policy (as for :func:`refined_mean_field`).
        loads: 1-D ``lambda`` values (``> 0``; ``< 1`` unless ``buffer``).
        ratios: 1-D ``r`` values for the JIQ family with several dispatchers;
            ``None`` for policies without I-queues (one column, ``r`` unused).
        n_servers: the ``N`` values (ints ``>= 1``).
        d, buffer: as for :func:`refined_mean_field`.
        levels, iqueue_levels: the truncation, shared by every point (default
            :data:`meanfield.DEFAULT_LEVELS` or ``buffer``;
            :func:`meanfield.default_iqueue_levels` at the largest ``r``); a
            point whose tail it cuts is ``TRUNCATED``.
        tol: residual at which Newton stops; max_newton: its step limit.
        chunk: points per vmapped batch (``>= 1``).

    Returns:
        :class:`RefinedGrid`.

    Raises:
        ValueError, TypeError: an argument out of range (named, with its range),
            or a chunk whose working memory :func:`working_bytes` estimates
            past :data:`MAX_WORKING_BYTES`, before anything is compiled.
        NotImplementedError: a policy without an occupancy mean field.
    """
    loads = np.asarray(loads, np.float64)
    if loads.ndim != 1 or loads.size == 0:
        raise ValueError(f"loads must be a non-empty 1-D array, got shape {loads.shape}")
    for lam in loads:
        check_load(float(lam), buffer)
    ns = [n for n in np.atleast_1d(np.asarray(n_servers, dtype=object))]
    if not ns:
        raise ValueError("n_servers must hold at least one N")
    for n in ns:
        check_int("n_servers", n, 1, MAX_SERVERS)
    check_int("chunk", chunk, 1, 1 << 20)
    check_int("max_newton", max_newton, 1, 10_000)
    if not (isinstance(tol, float) and tol > 0):
        raise ValueError(f"tol={tol!r} is out of range: need a float > 0")
    if ratios is None:
        ratio_list, top = [None], None
    else:
        ratio_arr = np.asarray(ratios, np.float64)
        if ratio_arr.ndim != 1 or ratio_arr.size == 0:
            raise ValueError(f"ratios must be a non-empty 1-D array, got shape {ratio_arr.shape}")
        ratio_list = [_check_ratio(float(r), min(ns)) for r in ratio_arr]
        top = max(ratio_list)
    pol, system, _, _, _ = _setup(policy, None, top, d, buffer, ns, levels, iqueue_levels)
    if system.iqueue_levels and ratios is None:
        raise ValueError(f"ratios is required for {pol.label()} with several dispatchers")
    if not system.iqueue_levels:
        ratio_list = [None] if ratios is None else ratio_list
    kinks = np.array(
        [
            [pol.mean_field_kink(_finite_system(pol, system, n, r, buffer)) is not None for n in ns]
            for r in ratio_list
        ]
    )  # [B, K]
    for r in ratio_list:
        pol.validate(_finite_system(pol, system, min(ns), r, buffer))
    _check_work(pol, system, min(chunk, loads.size * len(ratio_list)))
    limit_kink = pol.mean_field_kink(system) is not None
    r_values = np.array([1.0 if (r is None or not system.iqueue_levels) else r for r in ratio_list])
    with host_float64():
        lam_j, r_j = jnp.asarray(loads), jnp.asarray(r_values)
        if _closed_form_starts(pol, buffer):
            x0 = _closed_form_start(pol, system, lam_j, r_j)
        else:
            x0 = _rk4_start(pol, system, lam_j, r_j)
        mf, corr, tail, dtail, status, its = jax.tree_util.tree_map(
            np.asarray,
            _grid_core(x0, lam_j, r_j, pol, system, buffer, jnp.float64(tol), max_newton, chunk),
        )
    status = np.broadcast_to(status[:, :, None], status.shape + (len(ns),)).copy()
    if limit_kink:
        status[:] = int(Status.NOT_DIFFERENTIABLE)
    status[:, kinks] = int(Status.NOT_DIFFERENTIABLE)
    if system.iqueue_levels:  # N servers and N / r dispatchers: a system only where it is whole
        for b, r in enumerate(ratio_list):
            for k, n in enumerate(ns):
                if r is not None and not _whole(int(n), r):
                    status[:, b, k] = int(Status.INVALID_INPUT)
    if buffer is None:  # the shared bound cuts these points' tails: no mean field there either
        cut = tail[..., -1] > TRUNCATION_LIMIT  # [A, B]
        status[cut] = int(Status.TRUNCATED)
        mf = {
            k: np.where(cut.reshape(cut.shape + (1,) * (v.ndim - 2)), np.nan, v)
            for k, v in mf.items()
        }
    good_any = np.any(status == int(Status.CONVERGED), axis=-1)
    n_arr = np.asarray(ns, np.float64)
    corr = {k: np.where(good_any, v, np.nan) for k, v in corr.items()}
    dtail = np.where(good_any[..., None], dtail, np.nan)
    refined = {
        k: np.where(status == 0, mf[k][..., None] + corr[k][..., None] / n_arr, np.nan) for k in mf
    }
    return RefinedGrid(
        loads,
        r_values if ratios is not None else np.array([np.nan]),
        np.asarray(ns, np.int64),
        mf,
        corr,
        refined,
        status,
        tail,
        dtail,
        its,
    )
