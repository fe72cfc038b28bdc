"""The exact solver's linear algebra on scipy (jaxqueue/exact/linalg.py): the
irreducibility check by strongly connected components (the breadth-first search
without scipy gives the same answer) and GMRES by ``scipy.sparse.linalg.gmres``
under one BLAS thread where threadpoolctl is installed (the same stationary law as
the sparse LU)."""

import contextlib

import numpy as np
import pytest

from jaxqueue.exact import linalg, solve_exact

pytest.importorskip("scipy")


def _chain(n, seed, extra=3):
    """A random chain on ``n`` states, all reachable from state 0 (a path 0 -> 1 -> ...)
    and returning to it (n - 1 -> 0), with ``extra`` random transitions per state."""
    rng = np.random.default_rng(seed)
    rows = np.concatenate([np.arange(n), np.repeat(np.arange(n), extra)])
    cols = np.concatenate([(np.arange(n) + 1) % n, rng.integers(0, n, n * extra)])
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
    return rows, cols, rng.uniform(0.1, 2.0, rows.size)


def _unreturned(n, rows, cols):
    """How many states cannot return to state 0, as check_irreducible says (0: none)."""
    try:
        linalg.check_irreducible(n, rows, cols)
    except RuntimeError as err:
        assert "not irreducible" in str(err)
        return int(str(err).split()[0])
    return 0


def test_irreducibility_by_components_matches_the_search(monkeypatch):
    assert _unreturned(3, np.array([0, 1, 2]), np.array([1, 2, 1])) == 2  # 0 -> 1 <-> 2
    assert _unreturned(3, np.array([0, 1, 2]), np.array([1, 2, 0])) == 0
    assert _unreturned(1, np.array([], int), np.array([], int)) == 0
    cases = []
    for seed in range(20):
        n = 50 + seed
        rows, cols, _ = _chain(n, seed, extra=1)
        if seed % 2:  # cut the way back from the states past a point: they cannot return
            cut = n // 2
            back = (cols <= cut) & (rows > cut)
            rows, cols = rows[~back], cols[~back]
            rows, cols = np.append(rows, n - 1), np.append(cols, cut + 1)
        cases.append((n, rows, cols, _unreturned(n, rows, cols)))
    assert any(c[3] for c in cases) and any(not c[3] for c in cases)
    monkeypatch.setattr(linalg, "_sp", None)  # without scipy: the breadth-first search
    assert [_unreturned(n, r, c) for n, r, c, _ in cases] == [c[3] for c in cases]


def test_repeated_transitions_keep_their_edge():
    # 300 copies of the only way back: they add up, never to an explicit zero
    rows = np.array([0] + [1] * 300)
    cols = np.array([1] + [0] * 300)
    linalg.check_irreducible(2, rows, cols)


def test_gmres_gives_the_lu_law(monkeypatch):
    n = 3000
    rows, cols, vals = _chain(n, 7)
    calls = []
    real = linalg._spla.gmres
    monkeypatch.setattr(linalg._spla, "gmres", lambda *a, **k: calls.append(k) or real(*a, **k))
    iterative = linalg.stationary(n, rows, cols, vals)  # above DIRECT_STATE_LIMIT: GMRES
    assert n > linalg.DIRECT_STATE_LIMIT and len(calls) == 1
    assert calls[0]["rtol"] == 1e-13 and calls[0]["restart"] == 60
    monkeypatch.setattr(linalg, "DIRECT_STATE_LIMIT", 10**9)  # the sparse LU
    direct = linalg.stationary(n, rows, cols, vals)
    assert np.abs(iterative - direct).max() <= 1e-13


def test_one_blas_thread_where_threadpoolctl_is(monkeypatch):
    seen = []

    @contextlib.contextmanager
    def limits(limits, user_api):
        seen.append((limits, user_api))
        yield

    monkeypatch.setattr(linalg, "_threadpool_limits", limits)
    rows, cols, vals = _chain(300, 1)
    monkeypatch.setattr(linalg, "DIRECT_STATE_LIMIT", 10)
    linalg.stationary(300, rows, cols, vals)
    assert seen and set(seen) == {(1, "blas")}
    monkeypatch.setattr(linalg, "_threadpool_limits", None)  # not installed: no limit
    assert isinstance(linalg._one_blas_thread(), contextlib.nullcontext)
    linalg.stationary(300, rows, cols, vals)


def test_exact_solutions_by_gmres_and_by_lu_agree(monkeypatch):
    # 2098 states: GMRES (above DIRECT_STATE_LIMIT) against the full LU
    iterative = solve_exact("jiq-threshold", 0.8, 4, 2, z=1, queue_bound=12)
    assert iterative.n_states > linalg.DIRECT_STATE_LIMIT
    monkeypatch.setattr(linalg, "DIRECT_STATE_LIMIT", 10**9)
    direct = solve_exact("jiq-threshold", 0.8, 4, 2, z=1, queue_bound=12)
    for name in ("mean_response_time", "mean_queue_length", "p0", "join_rate"):
        assert getattr(iterative, name) == pytest.approx(getattr(direct, name), abs=1e-10)
    assert np.abs(np.asarray(iterative.tail) - np.asarray(direct.tail)).max() <= 1e-10
    assert not hasattr(linalg, "gmres")  # scipy's, not one written out
