"""The M/PH/1 queue: what Random routing makes of each server, and a bound on
the tails of the policies that route better.

:func:`mph1_tail` is its queue-length tail by the matrix-geometric method (the
simulator's default level bound with a service law or pools is sized from
it); :func:`mph1_tail_decay` is the tail's geometric decay rate (the generic
mean field by class starts its level count from it).
"""

from __future__ import annotations

import numpy as np

from jaxqueue.core.service import PhaseType
from jaxqueue.theory.generic.solvers import bracketed_root

__all__ = ["mph1_tail", "mph1_tail_decay"]


def mph1_tail(load: float, law, levels: int) -> np.ndarray:
    """``P(Q >= k)``, ``k = 0..levels``, of the M/PH/1 queue (matrix-geometric).

    With arrivals at rate ``lambda`` and service ``PH(alpha, S)``, the
    stationary law of (queue length ``k >= 1``, phase) is ``pi_1 R^(k-1)``,
    ``R`` the minimal solution of ``A0 + R A1 + R^2 A2 = 0`` with ``A0 =
    lambda I``, ``A1 = S - lambda I``, ``A2 = s alpha`` (Neuts, "Matrix-Geometric
    Solutions in Stochastic Models", 1981). It is Random routing's exact
    tail, and bounds the tails of the policies that route better.
    """
    a = np.asarray(law.alpha)
    s = law.matrix
    exit_ = law.exit_rates
    n = a.size
    a0, a1, a2 = load * np.eye(n), s - load * np.eye(n), np.outer(exit_, a)
    r = np.zeros((n, n))
    for _ in range(100_000):
        new = a0 @ np.linalg.inv(-(a1 + r @ a2))
        if np.max(np.abs(new - r)) < 1e-15:
            r = new
            break
        r = new
    # level 1 entered from idle at rate lambda alpha: pi_1 = pi_0 lambda alpha (-(A1 + R A2))^-1
    pi1 = load * a @ np.linalg.inv(-(a1 + r @ a2))
    tail_mass = pi1 @ np.linalg.inv(np.eye(n) - r)  # sum_{k >= 1} pi_k per phase
    pi0 = 1.0 / (1.0 + tail_mass.sum())
    out = np.empty(levels + 1)
    out[0] = 1.0
    v = pi1 * pi0
    inv = np.linalg.inv(np.eye(n) - r)
    for k in range(1, levels + 1):
        out[k] = float((v @ inv).sum())
        v = v @ r
    return out


def mph1_tail_decay(load: float, law: PhaseType) -> float:
    """The geometric decay rate ``eta`` of the M/PH/1 queue-length tail, ``P(Q >= k) ~ C eta**k``,
    at arrival rate ``load`` (``load * law.mean < 1``).

    ``eta = lambda / (lambda + theta)`` with ``theta > 0`` the root of
    ``E[exp(theta X)] = 1 + theta / lambda`` (the pole of the queue-length
    generating function of the M/G/1 queue), found below the
    decay rate of ``S`` (:func:`~jaxqueue.theory.generic.solvers.bracketed_root`).
    """
    S, a = law.matrix, np.asarray(law.alpha)
    exits = law.exit_rates
    P = law.n_phases
    top = -float(np.max(np.linalg.eigvals(S).real))

    def excess(theta):
        mgf = a @ np.linalg.solve(-S - theta * np.eye(P), exits)
        return mgf - 1.0 - theta / load, None

    hi = top * (1.0 - 1e-12)
    f_hi = excess(hi)[0]
    if f_hi <= 0:
        theta = top
    else:  # excess is 0 at theta = 0, below it just above (E[X] < 1 / lambda)
        lo = 0.5 * hi
        for _ in range(64):
            f_lo = excess(lo)[0]
            if f_lo < 0:
                break
            lo *= 0.5
        else:
            raise RuntimeError(f"no M/PH/1 tail decay found for {law.label} at load={load}")
        theta = bracketed_root(excess, lo, hi, f_lo, f_hi, rtol=1e-15, ftol=0.0).x
    return load / (load + theta)
