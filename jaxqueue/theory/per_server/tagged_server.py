"""Mean field of JIQ without delete requests (JIQ-Original and Mitzenmacher's variants).

In the limit an I-queue's size does not depend on its members' queue
lengths, so one tagged server's cycle of listed and unlisted phases is a
pair of Markov chains given ``p0``; :func:`jiq_no_delete_mean_field` finds
the ``p0`` at which the cycle's state fractions sum to one. The model and
the cycle: docs/theory-derivations.md. Infinite buffers only; host-side
numpy, float64.
"""

from __future__ import annotations

import math

import numpy as np

from jaxqueue.core.status import Status
from jaxqueue.theory.generic.solvers import bracketed_root
from jaxqueue.theory.result import MeanFieldResult, PerServerSolution, per_server_result

__all__ = ["jiq_no_delete_mean_field", "TAIL_EPS", "MAX_LEVELS", "MAX_SIZE"]

#: Truncation: tail mass left out of the queue lengths and I-queue sizes.
TAIL_EPS = 1e-13
#: Largest queue length represented (the solve fails beyond, with advice).
MAX_LEVELS = 20_000
#: Largest I-queue size represented.
MAX_SIZE = 20_000
#: Smallest p0 the solver tries (mean I-queue size about 1 / p0 with d = 1).
_P0_LOW = 0.0025


def _size_tail(rho: float, d: int, eps: float) -> np.ndarray:
    """``Q_j`` for ``j = 0..J`` (``Q_0 = 1``, ``Q_{j+1} = rho Q_j^d``) until below ``eps``."""
    q = [1.0]
    while q[-1] >= eps:
        if len(q) > MAX_SIZE:
            raise RuntimeError(
                f"the I-queue sizes need more than {MAX_SIZE} places (p0 = {1 - rho:.3g}); the "
                "load is too small for this solver"
            )
        q.append(rho * q[-1] ** d)
    return np.array(q)


def _k_generator(up: float, levels: int) -> np.ndarray:
    """Generator of the queue length on 0..levels: up at ``up`` (blocked at the top), down at 1."""
    n = levels + 1
    a = np.zeros((n, n))
    idx = np.arange(n - 1)
    a[idx, idx + 1] = up
    a[idx + 1, idx] = 1.0
    a[np.arange(n), np.arange(n)] = -a.sum(axis=1)
    return a


class _Phases:
    """The linear maps of one tagged-server cycle at a given ``p0``."""

    def __init__(
        self, lam: float, ratio: float, p0: float, order: str, z: int, d: int, levels: int
    ):
        self.lam, self.ratio, self.p0, self.order, self.z, self.d = lam, ratio, p0, order, z, d
        self.levels = levels
        rho = 1.0 - p0
        self.join = lam * rho  # J, per server per unit time
        big_q = _size_tail(rho, d, TAIL_EPS)
        self.size_tail = big_q
        # Law of the size of the I-queue a join request picks: Q_j^d - Q_{j+1}^d.
        qd = big_q**d
        self.chosen = qd - np.append(qd[1:], 0.0)
        self.a = _k_generator(lam * p0, levels)
        pick = lam * ratio
        n = levels + 1
        if order == "fifo":
            # After an Exp(pick) time: the law of k (a stochastic matrix).
            self.step = pick * np.linalg.inv(pick * np.eye(n) - self.a)
        else:
            qj = big_q - np.append(big_q[1:], 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                births = np.where(qj > 0, ratio * self.join * self.chosen / qj, 0.0)
            self.births = births  # b_j per size j = 0..
        # Unlisted phase: a completion from k in 1..z+1 ends it (a join with k - 1 tasks).
        b = self.a.copy()
        for k in range(1, min(z + 1, levels) + 1):
            b[k, k - 1] = 0.0
        self.unlisted_inv = np.linalg.inv(-b)

    def listed(self, entry: np.ndarray):
        """Occupation (per k, summed over places) and the law of k at the pick, from a flux."""
        lam_r = self.lam * self.ratio
        n = self.levels + 1
        sizes = self.chosen.size  # enters at place j + 1 behind the j members there
        if self.order == "fifo":
            occupation = np.zeros(n)
            carry = np.zeros(n)
            for place in range(sizes, 0, -1):  # place = j + 1
                flux = carry + self.chosen[place - 1] * entry
                out = flux @ self.step
                occupation += out / lam_r
                carry = out
            return occupation, carry  # carry: the flux picked at the head
        return self._listed_random(entry, lam_r, n)

    def _listed_random(self, entry, lam_r, n):
        """Random order: the tagged member's (k, size) chain, solved by block elimination."""
        top = self.chosen.size  # sizes 1..top, itself included (beyond: truncated)
        births = np.zeros(top + 1)
        births[1:top] = self.births[1:top]  # a queue of size j grows at b_j (none at the top)
        rhs = np.zeros((top + 1, n))
        rhs[1:] = self.chosen[:, None] * entry[None, :]  # size j + 1 after joining j members
        # Row-vector equations, j = 1..top: x_{j-1} b_{j-1} + x_j (A - (b_j + lam_r) I)
        #   + x_{j+1} lam_r j / (j + 1) = -rhs_j; transposed for column solves.
        eye = np.eye(n)
        s_inv, t = [None] * (top + 1), [None] * (top + 1)
        for j in range(1, top + 1):
            s = (self.a - (births[j] + lam_r) * eye).T
            tj = -rhs[j]
            if j > 1:
                lower, upper = births[j - 1], lam_r * (j - 1) / j
                s = s - lower * upper * s_inv[j - 1]
                tj = tj - lower * (s_inv[j - 1] @ t[j - 1])
            s_inv[j], t[j] = np.linalg.inv(s), tj
        x = np.zeros((top + 1, n))
        x[top] = s_inv[top] @ t[top]
        for j in range(top - 1, 0, -1):
            x[j] = s_inv[j] @ (t[j] - lam_r * j / (j + 1) * x[j + 1])
        sizes = np.arange(top + 1)
        picked = (lam_r / np.maximum(sizes, 1))[1:, None] * x[1:]
        return x[1:].sum(axis=0), picked.sum(axis=0)

    def unlisted(self, entry: np.ndarray):
        """Occupation per k and the flux of joins per k (0..z), from the picked flux."""
        start = np.zeros(self.levels + 1)
        start[1:] = entry[:-1]  # the picked server receives the task
        start[-1] += entry[-1]  # (at the truncation bound: counted at the top)
        occupation = start @ self.unlisted_inv
        joins = np.zeros(self.z + 1)
        top = min(self.z + 1, self.levels)
        joins[:top] = occupation[1 : top + 1]  # rate 1 from k, joining with k - 1
        return occupation, joins

    def cycle(self):
        """Stationary fractions at this ``p0``: (listed, unlisted, picked flux, join law)."""
        n = self.levels + 1
        z = self.z
        # The law of k at a join: stationary vector of the (z+1)-state join-to-join map.
        if z == 0:
            g = np.array([1.0])
        else:
            m = np.zeros((z + 1, z + 1))
            for k in range(z + 1):
                e = np.zeros(n)
                e[k] = 1.0
                _, picked = self.listed(e)
                _, joins = self.unlisted(picked)
                m[k] = joins / max(joins.sum(), 1e-300)
            w, v = np.linalg.eig(m.T)
            g = np.abs(np.real(v[:, np.argmin(np.abs(w - 1.0))]))
            g /= g.sum()
        entry = np.zeros(n)
        entry[: z + 1] = self.join * g[: min(z + 1, n)]
        listed, picked = self.listed(entry)
        unlisted, joins = self.unlisted(picked)
        return listed, unlisted, picked, g


def _solve_p0(lam, ratio, order, z, d, levels, guess=None):
    """The ``p0`` at which the cycle's fractions sum to 1 (bisection), and its phases."""

    def excess(p0):
        ph = _Phases(lam, ratio, p0, order, z, d, levels)
        listed, unlisted, _, _ = ph.cycle()
        return listed.sum() + unlisted.sum() - 1.0, ph

    # The fractions fall as p0 grows (shorter I-queues). A small p0 means long I-queues
    # and costly solves, so the bracket is searched downwards from a guess.
    hi = 1.0 - 1e-12
    f_hi, _ = excess(hi)
    lo = 0.5 if guess is None else guess
    while True:
        f_lo, _ = excess(lo)
        if f_lo > 0:
            break
        if lo <= _P0_LOW:
            raise RuntimeError(
                f"the tagged-server fixed point has no root for p0 in [{_P0_LOW}, 1) (excess "
                f"{f_lo:.3g} at p0 = {lo}): I-queues this long (ratio={ratio:g}, load={lam:g}) "
                "are beyond this solver"
            )
        hi, f_hi = lo, f_lo
        lo = max(lo / 2 if guess is None else lo * 0.9, _P0_LOW)
    if not f_hi < 0:
        raise RuntimeError(
            f"the tagged-server fixed point has no root: excess {f_hi:.3g} at p0 -> 1"
        )
    root = bracketed_root(excess, lo, hi, f_lo, f_hi, rtol=1e-13, ftol=1e-14)
    if root.status != Status.CONVERGED:
        raise RuntimeError(
            f"the tagged-server fixed point did not converge in {root.iterations} iterations"
        )
    return root.x, root.aux, root.residual


def jiq_no_delete_mean_field(
    policy, load: float, ratio: float, levels: int | None = None, with_quantiles: bool = True
) -> MeanFieldResult:
    """The mean field of JIQ-Original with its options (``order``, ``z``, ``d``).

    Args:
        policy: a :class:`~jaxqueue.policies.per_server.JIQOriginal`.
        load: ``lambda`` in ``(0, 1)``.
        ratio: ``r = N / M > 0``.
        levels: the largest queue length represented (``None``: grown until
            less than :data:`TAIL_EPS` of mass sits at the bound).

    Returns:
        A :class:`~jaxqueue.theory.result.MeanFieldResult` with ``stale_fraction``,
        ``delete_rate = 0``, and diagnostics ``busy_fraction_error`` (``|s_1 -
        lambda|``), ``little_error`` (relative gap of the two mean response
        times), ``residual`` (of the fixed point), ``join_law`` (the law of
        the queue length at a join request, ``k = 0..z``) and
        ``listed_occupancy`` (the fraction of servers that are listed and hold
        ``k`` tasks, ``k = 0..levels``; the rest of ``occupancy`` is unlisted).
    """
    lam = float(load)
    if ratio is None or not float(ratio) > 0 or not math.isfinite(float(ratio)):
        raise ValueError(f"ratio={ratio!r} is out of range: {policy.name!r} needs ratio > 0")
    ratio = float(ratio)
    order, z, d = policy.order, int(policy.z), int(policy.d)
    auto = levels is None
    n_levels = 32 if auto else int(levels)
    p0 = None
    while True:
        p0, ph, residual = _solve_p0(
            lam, ratio, order, z, d, n_levels, None if p0 is None else 0.98 * p0
        )
        listed, unlisted, picked, g = ph.cycle()
        occupancy = listed + unlisted
        at_bound = occupancy[-1]
        if not auto or at_bound < TAIL_EPS:
            break
        # The queue lengths fall off geometrically: jump to where the mass is below TAIL_EPS.
        decay = occupancy[-2] / occupancy[-3] if occupancy[-3] > 0 else 0.5
        extra = math.log(TAIL_EPS / at_bound) / math.log(min(max(decay, 1e-3), 1 - 1e-6))
        grown = max(2 * n_levels, int(1.25 * (n_levels + extra)) + 8)
        if grown > MAX_LEVELS:
            raise RuntimeError(
                f"the queue lengths need more than {MAX_LEVELS} levels at "
                f"load={lam}: the load is too close to 1 for this solver"
            )
        n_levels = grown
    occupancy = np.maximum(occupancy, 0.0)  # rounding can leave -1e-18 in empty states
    total = occupancy.sum()
    occupancy = occupancy / total
    listed = np.minimum(np.maximum(listed, 0.0) / total, occupancy)
    tail = np.cumsum(occupancy[::-1])[::-1]
    join = ph.join
    seen = np.maximum((lam * p0 * occupancy + picked) / lam, 0.0)
    seen = seen / seen.sum()
    iq = ph.size_tail - np.append(ph.size_tail[1:], 0.0)
    solution = PerServerSolution(
        tail=tail,
        occupancy=occupancy,
        seen=seen,
        p0=p0,
        iqueue_distribution=iq,
        join_rate=join,
        delete_rate=0.0,
        probe_rate=d * join if d >= 2 else 0.0,
        tail_remainder=at_bound,
        iqueue_remainder=ph.size_tail[-1],
        residual=residual,
        join_law=g,
        listed_occupancy=listed,
        stale_fraction=float(picked[1:].sum()) / lam,
    )
    return per_server_result(
        policy, solution, load=lam, ratio=ratio, d=d, with_quantiles=with_quantiles
    )
