"""Linear algebra of the exact solver: the irreducibility check and the
stationary solve of a finite chain given by its transitions (scipy: its
strongly connected components, sparse LU, and its GMRES with an incomplete-LU
preconditioner; without scipy, a breadth-first search and dense numpy). How:
docs/exact.md.
"""

from __future__ import annotations

import contextlib

import numpy as np

try:  # optional: sparse LU for speed
    import scipy.sparse as _sp
    import scipy.sparse.csgraph as _csgraph
    import scipy.sparse.linalg as _spla
except ImportError:  # pragma: no cover - exercised only without scipy
    _sp = None
    _csgraph = None
    _spla = None

try:  # optional: GMRES under one BLAS thread (docs/exact.md)
    from threadpoolctl import threadpool_limits as _threadpool_limits
except ImportError:  # (not a dependency of scipy: then no limit is set)
    _threadpool_limits = None

__all__ = [
    "check_irreducible",
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

    With scipy: the states in state 0's strongly connected component
    (``scipy.sparse.csgraph.connected_components``); without, a breadth-first
    search from state 0 on the reversed graph.

    Args:
        n_states: number of states (all reachable from state 0).
        rows, cols: int arrays, the transitions ``rows[i] -> cols[i]``.
    """
    if _sp is not None and _csgraph is not None:
        graph = _sp.csr_matrix(
            (np.ones(len(rows)), (rows, cols)), shape=(n_states, n_states)
        )  # (repeated pairs add up: positive, so no explicit zero drops an edge)
        _, labels = _csgraph.connected_components(graph, directed=True, connection="strong")
        back = labels == labels[0]  # all reachable from 0: those that also reach it
    else:
        back = _reaches_zero(n_states, rows, cols)
    if not back.all():
        raise RuntimeError(
            f"{int((~back).sum())} of {n_states} reachable states cannot return to the "
            "empty system: the chain is not irreducible (a bug in the transition rules)"
        )


def _reaches_zero(n_states, rows, cols):
    """Which states lead to state 0: breadth-first search on the reversed graph (no scipy)."""
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
    return seen


def _one_blas_thread():
    """One BLAS thread for the block (threadpoolctl, where installed; else no limit):
    GMRES's level-1 BLAS calls, threaded at these lengths, crawl on shared cores."""
    if _threadpool_limits is None:
        return contextlib.nullcontext()
    return _threadpool_limits(limits=1, user_api="blas")


def _gmres(a, ilu, rhs):
    """``scipy.sparse.linalg.gmres`` (restart 60, at most 10 cycles, relative residual
    1e-13) preconditioned by the incomplete LU ``ilu``, under one BLAS thread where
    threadpoolctl is installed (:func:`_one_blas_thread`)."""
    precond = _spla.LinearOperator(a.shape, matvec=ilu.solve, dtype=np.float64)
    with _one_blas_thread():
        x, _ = _spla.gmres(a, rhs, M=precond, rtol=1e-13, atol=0.0, restart=60, maxiter=10)
    return x  # (the caller checks the residual: info is not needed)


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
        x = _gmres(a, ilu, rhs)
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
