"""Linear algebra of the exact solver: the irreducibility check and the
stationary solve of a finite chain given by its transitions (sparse LU, GMRES
with an incomplete-LU preconditioner, or dense numpy without scipy). How,
and why this GMRES rather than scipy's: docs/exact.md.
"""

from __future__ import annotations

import math

import numpy as np

try:  # optional: sparse LU for speed
    import scipy.sparse as _sp
    import scipy.sparse.linalg as _spla
except ImportError:  # pragma: no cover - exercised only without scipy
    _sp = None
    _spla = None

__all__ = [
    "check_irreducible",
    "gmres",
    "sparse_solve",
    "stationary",
    "DENSE_STATE_LIMIT",
    "DIRECT_STATE_LIMIT",
]

#: Largest state count solved with dense numpy when scipy is not importable.
DENSE_STATE_LIMIT = 3000

#: Up to this many states the sparse LU is used directly; above it (where
#: fill-in makes LU slow: ~20 s at 27 000 states) GMRES with an incomplete-LU
#: preconditioner, with the full LU as the last resort.
DIRECT_STATE_LIMIT = 2000


def check_irreducible(n_states, rows, cols):
    """Raise RuntimeError unless every state leads back to state 0 (one closed class).

    Args:
        n_states: number of states (all reachable from state 0).
        rows, cols: int arrays, the transitions ``rows[i] -> cols[i]``.
    """
    # reverse graph in CSR form: for target t, the sources s with s -> t
    order = np.argsort(cols, kind="stable")
    src = rows[order]
    indptr = np.searchsorted(cols[order], np.arange(n_states + 1))
    seen = np.zeros(n_states, dtype=bool)
    seen[0] = True
    frontier = np.array([0])
    while frontier.size:
        starts, ends = indptr[frontier], indptr[frontier + 1]
        lengths = ends - starts
        total = int(lengths.sum())
        if total == 0:
            break
        offs = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(total)
        nb = np.unique(src[offs])
        nb = nb[~seen[nb]]
        seen[nb] = True
        frontier = nb
    if not seen.all():
        raise RuntimeError(
            f"{int((~seen).sum())} of {n_states} reachable states cannot return to the "
            "empty system: the chain is not irreducible (a bug in the transition rules)"
        )


def _dot(u, v):
    # einsum without BLAS: multithreaded BLAS level-1/2 calls can crawl on a
    # busy machine (scipy's gmres, which makes them, ran 3-7x slower here on two
    # shared cores; docs/exact.md), and these vectors are short enough not to need them
    return float(np.einsum("i,i->", u, v))


def gmres(a, precond, b, rtol, restart, max_cycles):
    """Right-preconditioned restarted GMRES (modified Gram-Schmidt, Givens
    rotations), with no BLAS call (see :func:`_dot`).

    Args:
        a: the matrix (anything with ``a @ x``), shape ``(n, n)``.
        precond: ``x -> M^{-1} x``, the right preconditioner.
        b: the right-hand side, shape ``(n,)``.
        rtol: stop when ``||b - a x|| <= rtol ||b||``.
        restart: Krylov dimension of one cycle.
        max_cycles: number of restarts at most.

    Returns:
        The first iterate with ``||b - a x|| <= rtol ||b||``, or the last one
        (the caller checks the residual).
    """
    n = b.shape[0]
    x = np.zeros(n)
    bnorm = math.sqrt(_dot(b, b))
    if bnorm == 0.0:
        return x
    for _ in range(max_cycles):
        r = b - a @ x
        beta = math.sqrt(_dot(r, r))
        if beta <= rtol * bnorm:
            break
        v = np.empty((restart + 1, n))
        v[0] = r / beta
        h = np.zeros((restart + 1, restart))
        cs, sn = np.zeros(restart), np.zeros(restart)
        g = np.zeros(restart + 1)
        g[0] = beta
        k = 0
        for j in range(restart):
            w = a @ precond(v[j])
            for i in range(j + 1):
                h[i, j] = _dot(v[i], w)
                w -= h[i, j] * v[i]
            h[j + 1, j] = math.sqrt(_dot(w, w))
            if h[j + 1, j] > 0.0:
                v[j + 1] = w / h[j + 1, j]
            for i in range(j):  # earlier rotations on the new column
                t = cs[i] * h[i, j] + sn[i] * h[i + 1, j]
                h[i + 1, j] = -sn[i] * h[i, j] + cs[i] * h[i + 1, j]
                h[i, j] = t
            den = math.hypot(h[j, j], h[j + 1, j])
            cs[j], sn[j] = (1.0, 0.0) if den == 0.0 else (h[j, j] / den, h[j + 1, j] / den)
            h[j, j] = den
            h[j + 1, j] = 0.0
            g[j + 1] = -sn[j] * g[j]
            g[j] = cs[j] * g[j]
            k = j + 1
            if abs(g[j + 1]) <= rtol * bnorm or h[j, j] == 0.0:
                break
        y = np.zeros(k)
        for i in range(k - 1, -1, -1):  # back substitution, upper triangular
            y[i] = (g[i] - _dot(h[i, i + 1 : k], y[i + 1 : k])) / h[i, i] if h[i, i] else 0.0
        x = x + precond(np.einsum("ij,i->j", v[:k], y))
    return x


def sparse_solve(a, rhs):
    """Solve ``a x = rhs`` (scipy): direct when small, else GMRES with an ILU preconditioner."""
    if a.shape[0] <= DIRECT_STATE_LIMIT:
        return _spla.spsolve(a, rhs)
    scale = np.abs(rhs).max()
    for drop_tol, fill in ((0.01, 3.0), (1e-3, 8.0)):
        try:
            ilu = _spla.spilu(a, drop_tol=drop_tol, fill_factor=fill, permc_spec="NATURAL")
        except RuntimeError:  # singular factor: try the next setting
            continue
        x = gmres(a, ilu.solve, rhs, rtol=1e-13, restart=60, max_cycles=10)
        if np.all(np.isfinite(x)) and np.abs(a @ x - rhs).max() <= 1e-11 * scale:
            return x
    return _spla.spsolve(a, rhs)


def stationary(n_states, rows, cols, vals):
    """Stationary law of an irreducible chain: ``pi Q = 0, sum(pi) = 1``.

    Fixes ``pi[0] = 1`` and drops state 0's balance equation, solves the rest
    (:func:`sparse_solve`, or dense numpy without scipy), normalises, and
    checks the balance residual and the sign.

    Args:
        n_states: number of states.
        rows, cols, vals: the generator's off-diagonal entries in COO form
            (``vals[i]`` is the rate of ``rows[i] -> cols[i]``, no self-loops;
            repeated pairs add up).

    Returns:
        float64 ``pi`` of shape ``(n_states,)``, non-negative, summing to 1.

    Raises:
        ValueError: no scipy and more than :data:`DENSE_STATE_LIMIT` states.
        RuntimeError: a non-finite or inaccurate solution.
    """
    out_rate = np.bincount(rows, weights=vals, minlength=n_states)
    if n_states == 1:
        return np.ones(1)
    # Balance of state t != 0: sum_s pi_s Q[s, t] - pi_t out_t = 0, unknowns pi_1.. .
    keep = cols != 0
    r_eq, c_var, v = cols[keep] - 1, rows[keep], vals[keep]
    from_zero = c_var == 0
    rhs = -np.bincount(r_eq[from_zero], weights=v[from_zero], minlength=n_states - 1)
    inner = ~from_zero
    diag = np.arange(n_states - 1)
    ri = np.concatenate([r_eq[inner], diag])
    ci = np.concatenate([c_var[inner] - 1, diag])
    vi = np.concatenate([v[inner], -out_rate[1:]])
    if _sp is not None:
        a = _sp.csc_matrix((vi, (ri, ci)), shape=(n_states - 1, n_states - 1))
        x = sparse_solve(a, rhs)
    else:
        if n_states > DENSE_STATE_LIMIT:
            raise ValueError(
                f"{n_states} states exceed the dense solver's limit DENSE_STATE_LIMIT="
                f"{DENSE_STATE_LIMIT} (scipy is not importable): install scipy or use a "
                "smaller system"
            )
        a = np.zeros((n_states - 1, n_states - 1))
        np.add.at(a, (ri, ci), vi)
        x = np.linalg.solve(a, rhs)
    pi = np.concatenate([[1.0], np.asarray(x, dtype=np.float64)])
    if not np.all(np.isfinite(pi)):
        raise RuntimeError("stationary solve failed (non-finite solution)")
    pi /= pi.sum()
    # residual of pi Q = 0, and non-negativity (unique solution of an irreducible chain)
    flow_in = np.bincount(cols, weights=pi[rows] * vals, minlength=n_states)
    resid = np.abs(flow_in - pi * out_rate).max()
    scale = max(1.0, float((pi * out_rate).max()))
    if resid > 1e-8 * scale or pi.min() < -1e-10:
        raise RuntimeError(
            f"stationary solve inaccurate: residual {resid:.3g}, min(pi) {pi.min():.3g}"
        )
    return np.clip(pi, 0.0, None) / np.clip(pi, 0.0, None).sum()
