"""Newton's start for JIQ-SQ(d) with several dispatchers: its fixed point reduced to ``p0``.

The ODE run that starts the other fixed points is unstable here past ``r`` of
about 30; the tails given ``p0`` and a bisection on ``log p0`` are not.
"""

from __future__ import annotations

import math

import numpy as np

from jaxqueue.core.system import System
from jaxqueue.policies import JIQSQ, Policy
from jaxqueue.theory.generic.exponential import kinked

__all__ = ["jiq_sq_start"]


def _jiq_sq_tails(p0: float, load: float, L: int) -> tuple:
    """JIQ-SQ's tails ``s_1..s_L`` at a given ``p0`` (the truncated model: arrivals
    at a server with ``L`` tasks are left out) and ``s_1 - s_2``.

    An arrival takes a listed (idle) server with probability ``1 - p0``, else a
    random one, so ``s_k - s_{k+1} = (lambda p0)^(k-1) (s_1 - s_2)`` and the
    arrivals accepted at level 0 give ``s_1 - s_2 = lambda / (1 + lambda p0 S)``,
    ``S = sum_{k<L} (lambda p0)^k`` (JIQ's ``s_k = lambda^k p0^(k-1)`` as ``L``
    grows)."""
    a = float(load) * p0
    powers = a ** np.arange(L)
    e1 = float(load) / (1.0 + a * powers.sum())
    return np.cumsum((e1 * powers)[::-1])[::-1], e1


def _jiq_sq_iqueues(log_p0: float, c: float, ratio: float, d: int, J: int) -> np.ndarray:
    """JIQ-SQ(d)'s I-queue tails ``Q_0..Q_J`` at ``p0 = 1 - Q_1 = exp(log_p0)``.

    The flux across each cut ``j - 1 | j`` balances: joins to the shortest of
    ``d`` at rate ``r (s_1 - s_2) (Q_{j-1}^d - Q_j^d)`` against removals at
    rate ``r lambda (Q_j - Q_{j+1}) (1 + p0 j / r)`` (an arrival at its own
    I-queue, or a delete request that hits one of its ``j`` servers). With
    ``c = (s_1 - s_2) / lambda``, ``delta_j = Q_{j-1} - Q_j`` grows by
    ``c sum_i Q_{j-1}^i Q_j^(d-1-i) / (1 + p0 j / r)``, about ``d``, per level:
    summed from ``p0`` up, in logarithms (no cancellation, and no underflow:
    ``p0`` is about ``d^-(r (1 - lambda))``, 3e-25 at ``r = 800``, ``lambda =
    0.9``, far below the spacing of float64 near 1) while ``Q_j`` is large;
    past the drop the flux summed to infinity, ``Q_j = c Q_{j-1}^d / (1 + p0 j / r)`` (up to
    ``p0 / r`` times the tail beyond), which the forward sum would lose to
    cancellation.
    """
    p0 = math.exp(log_p0)  # 0 below 1e-308: then 1 - Q_j is too, until delta_j grows
    Q = np.zeros(J + 1)
    Q[0], Q[1] = 1.0, 1.0 - p0
    gone, log_delta, j = p0, log_p0, 1
    while j < J and Q[j] > 0.25:
        g = sum(Q[j - 1] ** i * Q[j] ** (d - 1 - i) for i in range(d))
        log_delta += math.log(c * g / (1.0 + p0 * j / ratio))
        gone += math.exp(log_delta)
        j += 1
        Q[j] = 1.0 - gone
    for j in range(j + 1, J + 1):  # noqa: B020 (continues after the loop above)
        Q[j] = c * max(Q[j - 1], 0.0) ** d / (1.0 + p0 * j / ratio)
    return Q


def jiq_sq_start(pol: Policy, system: System, load, ratio) -> np.ndarray | None:
    """Newton's start for JIQ-SQ(d) with several dispatchers (any ``d``, load and
    buffer), or None for other policies and one dispatcher.

    The fixed point in one unknown, ``p0``: the tails given ``p0``
    (:func:`_jiq_sq_tails`, :func:`_jiq_sq_iqueues`) must list exactly the idle
    servers, ``sum_j Q_j = r (1 - s_1)``; the sum falls as ``p0`` grows (the
    I-queue sizes drop from near 1 to near 0 about ``log_d(1 / p0)`` levels
    up), so bisection on ``log p0`` finds it (to about 1e-8 in the state: the
    tail's ``p0 / r`` term is left out; Newton polishes). Instead of the ODE
    run: its RK4 steps are unstable where ``dt lambda r`` passes about 2.8
    (the I-queue equations are ``r`` times faster than the servers'), so past
    ``r`` of about 30 it ends at an arbitrary state (at ``r = 500``: ``s_1 = 0,
    s_2 = 1``, alternating ``Q_j`` in {0, 1}), from which Newton, its steps
    clipped to [0, 1], moved the I-queues' drop about one level a step (16
    steps at ``r = 100``, 49 of the 50 allowed at ``r = 500`` with a residual
    of ``lambda r`` meanwhile, none converging at ``r = 800`` or 1000); at
    ``r = 500`` the run also took 156 of the solve's 210 s.
    """
    if not (
        isinstance(pol, JIQSQ)
        and system.iqueue_levels
        and float(load) > 0.0
        and not kinked(pol, system)
    ):
        return None
    lam, r, L, J, d = float(load), float(ratio), system.levels, system.iqueue_levels, pol.d

    def excess(log_p0):
        s, e1 = _jiq_sq_tails(math.exp(log_p0), lam, L)
        q = _jiq_sq_iqueues(log_p0, e1 / lam, r, d, J)
        return q[1:].sum() - r * (1.0 - s[0]), s, q

    # 1 - Q_j grows at most d-fold a level: at this p0 the I-queues stay full past J
    lo, hi = -(J + 2) * math.log(d + 1.0) - 50.0, 0.0
    if excess(lo)[0] <= 0.0:  # not expected: J levels cannot hold r (1 - s_1) per I-queue
        return None
    while hi - lo > 1e-14 * max(1.0, -lo):
        mid = 0.5 * (lo + hi)
        if excess(mid)[0] > 0.0:
            lo = mid
        else:
            hi = mid
    _, s, q = excess(lo)
    return np.concatenate([s, q[1:]])
