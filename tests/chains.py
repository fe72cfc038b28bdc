"""Exact references for time-varying arrivals: small chains solved by linear algebra.

Used by the simulator's tests (tests/test_arrivals.py) and the periodic mean
field's (tests/test_periodic.py); independent of the package's own solvers.
"""

import numpy as np

from jaxqueue.core.arrivals import MMPP, Profile


def _jsq_states(n: int, k: int):
    """Sorted queue vectors (non-increasing) of ``n`` servers holding at most ``k`` each."""
    out = [()]
    for _ in range(n):
        out = [s + (q,) for s in out for q in range(k + 1) if not s or q <= s[-1]]
    return out


def _jsq_generator(n: int, k: int, arrival_rate: float):
    """Generator of JSQ on ``n`` unit-rate servers with Poisson arrivals (blocked at ``k``)."""
    states = _jsq_states(n, k)
    index = {s: i for i, s in enumerate(states)}
    q = np.zeros((len(states), len(states)))
    for s, i in index.items():
        if s[-1] < k:  # the shortest queue gains a task
            t = list(s)
            t[-1] += 1
            q[i, index[tuple(sorted(t, reverse=True))]] += arrival_rate
        for j, x in enumerate(s):
            if x:
                t = list(s)
                t[j] -= 1
                q[i, index[tuple(sorted(t, reverse=True))]] += 1.0
    np.fill_diagonal(q, -q.sum(axis=1))
    return states, q


def _stationary(q):
    """``pi Q = 0``, ``sum pi = 1`` (irreducible ``Q``): one balance equation
    replaced by the normalisation."""
    a = q.T.copy()
    a[-1] = 1.0
    b = np.zeros(q.shape[0])
    b[-1] = 1.0
    return np.linalg.solve(a, b)


def mmpp_jsq_reference(src: MMPP, load: float, n: int, k: int = 40):
    """Mean queue length per server, the law of the shortest queue an arrival
    finds, for an MMPP (mean rate ``load * n``) feeding JSQ."""
    rates = load * n * src.shape
    blocks = [_jsq_generator(n, k, r) for r in rates]
    states = blocks[0][0]
    m, size = len(rates), len(states)
    full = np.kron(src.matrix, np.eye(size))
    for s, (_, qs) in enumerate(blocks):
        full[s * size : (s + 1) * size, s * size : (s + 1) * size] += qs
    pi = _stationary(full).reshape(m, size)
    total = np.array([sum(x) for x in states], float)
    shortest = np.array([x[-1] for x in states])
    seen = np.zeros(k + 1)
    for s in range(m):
        np.add.at(seen, shortest, pi[s] * rates[s])
    assert pi[:, total == total.max()].sum() < 1e-9  # the truncation is far out
    return float((pi.sum(axis=0) * total).sum() / n), seen / seen.sum()


def _uniformized_integral(p0, q, t, terms=4000):
    """``p0 exp(q t)`` and ``int_0^t p0 exp(q s) ds`` by uniformization."""
    lam = max(-np.diag(q).min(), 1e-12)
    step = np.eye(q.shape[0]) + q / lam
    weights = np.exp(-lam * t)  # Poisson(lam t) pmf, term by term
    cdf, v = weights, p0.copy()
    end, area = weights * v, (1.0 - cdf) * v / lam
    for n in range(1, terms):
        v = v @ step
        weights *= lam * t / n
        cdf += weights
        end += weights * v
        area += (1.0 - cdf) * v / lam
        if 1.0 - cdf < 1e-15 and n > lam * t:
            break
    return end, area


def profile_mm1_reference(src: Profile, load: float, k: int = 80):
    """Periodic regime of M/M/1 under a rate profile: time-average queue
    length and the law of the queue an arrival finds."""
    gens = [_jsq_generator(1, k, load * r)[1] for r in src.shape]
    area_total, seen = _periodic_regime(gens, src, load, periods=200)
    assert area_total[-1] / src.period < 1e-12
    return float(area_total @ np.arange(k + 1)) / src.period, seen / seen.sum()


def _periodic_regime(gens, src: Profile, load: float, periods: int):
    """The periodic regime of a chain whose generator is ``gens[i]`` on the
    profile's segment ``i``, from the first state, by uniformization: the
    integral of the law over one period from phase 0, and the same weighted
    by the arrival rate ``load * shape`` (what arrivals see, unnormalised)."""
    p = np.zeros(gens[0].shape[0])
    p[0] = 1.0
    for _ in range(periods):  # periods until the regime is periodic
        start = p
        for qg, d in zip(gens, src.durations):
            p, _ = _uniformized_integral(p, qg, d)
        if np.abs(p - start).max() < 1e-13:
            break
    area_total, seen = np.zeros_like(p), np.zeros_like(p)
    for qg, d, r in zip(gens, src.durations, src.shape):
        p, area = _uniformized_integral(p, qg, d)
        area_total += area
        seen += load * r * area
    return area_total, seen


def profile_mph1_reference(src: Profile, load: float, alpha, S, k: int = 80):
    """Periodic regime of the M_t/PH/1 queue under a rate profile, by
    uniformization of the chain on "idle" and ``(n, p)`` (``n = 1..k`` tasks,
    the task in service in phase ``p``; an arrival at ``n = k`` is lost, a
    truncation checked to hold no mass). A task starts in phase ``a`` with
    probability ``alpha[a]``, moves from ``p`` to ``q`` at rate ``S[p, q]``
    and completes at rate ``-sum_q S[p, q]``.

    Returns ``(occupancy, seen)``, both ``(k + 1, P)``: the time-average law of
    ``(n, p)`` and the law of the ``(n, p)`` an arrival finds (weighted by the
    arrival rate), the idle state at ``[0, 0]``."""
    alpha, S = np.asarray(alpha, np.float64), np.asarray(S, np.float64)
    P = alpha.size
    exits = -S.sum(axis=1)
    size = 1 + k * P

    def at(n, p):
        return 0 if n == 0 else 1 + (n - 1) * P + p

    def generator(rate):
        q = np.zeros((size, size))
        q[0, 1 : 1 + P] += rate * alpha
        for n in range(1, k + 1):
            for p in range(P):
                i = at(n, p)
                if n < k:
                    q[i, at(n + 1, p)] += rate
                for r in range(P):
                    if r != p:
                        q[i, at(n, r)] += S[p, r]
                if n == 1:
                    q[i, 0] += exits[p]
                else:
                    q[i, at(n - 1, 0) : at(n - 1, 0) + P] += exits[p] * alpha
        return q - np.diag(q.sum(axis=1))

    gens = [generator(load * r) for r in src.shape]
    area_total, seen = _periodic_regime(gens, src, load, periods=400)
    assert area_total[-P:].sum() / src.period < 1e-12

    def by_class(v):
        out = np.zeros((k + 1, P))
        out[0, 0] = v[0]
        out[1:] = v[1:].reshape(k, P)
        return out

    return by_class(area_total / src.period), by_class(seen / seen.sum())
