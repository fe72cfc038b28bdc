"""Mean field of JIQ-Threshold(z): an I-queue is a small population of servers.

Servers stay listed while they hold at most ``z`` tasks, so one I-queue's
composition by queue length is a Markov chain coupled to the rest only
through ``p0`` and the join rates; :func:`jiq_threshold_mean_field` finds
the fixed point (Newton's method on ``z + 1`` unknowns) over a truncated
chain grown until its bounds hold less than :data:`TAIL_EPS`. The model, the
fixed point and the truncation: docs/theory-derivations.md. Infinite buffers
and exponential service only; host-side numpy, float64.
"""

from __future__ import annotations

import math

import numpy as np

from jaxqueue.core.status import Status
from jaxqueue.theory.result import MeanFieldResult, PerServerSolution, per_server_result

__all__ = [
    "jiq_threshold_mean_field",
    "TAIL_EPS",
    "MAX_STATES",
    "BUSY_ACCEPT",
    "SIZE_ACCEPT",
    "MAX_ENTRIES",
    "Z_MAX",
]

#: Truncation: law of the I-queue compositions left at the largest size, and
#: tail mass of the queue lengths left out.
TAIL_EPS = 1e-13
#: Most compositions in one size level (the level reduction solves with a
#: matrix of this order per level): ``C(B + z, z)`` for ``B`` busy members.
MAX_STATES = 600
#: Where the busy-member bound is at its limit (:data:`MAX_STATES`), the
#: largest share of the busy members' law that may sit at the bound: the
#: solution keeps errors of about this order and reports the share
#: (``busy_remainder``).
BUSY_ACCEPT = 1e-8
#: Where the next, finer chain would pass :data:`MAX_ENTRIES`, the largest
#: share of the I-queue size law that may sit at the current size bound for
#: the current chain to be kept instead of the solve refused (reported as
#: ``iqueue_remainder``).
SIZE_ACCEPT = 1e-8
#: Most float64 entries the generator blocks of a chain may take (``up``,
#: ``local``, ``down`` and the level reduction's ``R``: about four times the
#: sum of squared compositions per size); 2.5e8 is 2 GB. A larger chain is
#: refused before it is built.
MAX_ENTRIES = 2.5e8
#: The largest ``z`` solved: the last whose chain holds two busy members per I-queue
#: within :data:`MAX_STATES` compositions of one size (``C(z + 2, 2) <= 600``). Past it
#: only one fits, so the solve is refused at any ratio that is not tiny, and only after
#: ``z + 1`` chain solves per Newton Jacobian on chains with ``z + 1`` counts per state
#: (measured, load 0.9, r = 10, one BLAS thread: z = 3 to 33 refused in 2 to 5 s,
#: z = 100 in 36 s; building the chain alone grows as z^2): refused up front instead.
Z_MAX = 33
#: Compositions per size level of the first, coarse chain (found cheaply, it
#: sizes the next one, or shows that the limit cannot be met).
_FIRST_STATES = 150
#: The coarse chain's law, extrapolated to the limit, above which the solve is
#: refused at once: 100 times BUSY_ACCEPT, as the extrapolation overestimates
#: (by 2 to 4 times over 6 members, up to 65 times over 18, in the solves of
#: ``benchmarks/threshold_solve.py``).
_HOPELESS = 1e-6


def _bounded_tuples(length: int, total: int):
    """The tuples of ``length`` counts >= 0 summing to at most ``total``, in
    lexicographic order (that of ``itertools.product`` filtered by the sum,
    without visiting the ``(total + 1) ** length`` candidates)."""
    t = [0] * length
    while True:
        yield tuple(t)
        # the next one: raise the rightmost count that may grow, zero those after it
        head = sum(t)
        for i in range(length - 1, -1, -1):
            head -= t[i]  # the sum before position i
            if head + t[i] + 1 <= total:
                t[i] += 1
                t[i + 1 :] = [0] * (length - i - 1)
                break
        else:
            return


class _Chain:
    """The composition chain of one I-queue by size level: sizes ``0..J``, and
    at most ``B`` busy members (holding ``1..z`` tasks), ``J`` and ``B`` grown
    until less than :data:`TAIL_EPS` of the law sits at either bound."""

    def __init__(self, z: int, size_max: int, busy_max: int):
        self.z, self.size_max, self.busy_max = z, size_max, min(busy_max, size_max)
        if math.comb(self.busy_max + z, z) > MAX_STATES:
            raise ValueError(
                f"busy_max={busy_max} is out of range: at most {_busy_limit(z)} for z={z}"
            )
        busy = sorted(_bounded_tuples(z, self.busy_max), key=sum)
        self.levels = [
            np.array([(m - sum(b),) + b for b in busy if sum(b) <= m], np.int64).reshape(-1, z + 1)
            for m in range(size_max + 1)
        ]
        self.index = [{tuple(n): i for i, n in enumerate(lv)} for lv in self.levels]

    def laws(self, pis) -> tuple[np.ndarray, np.ndarray]:
        """The law of the size ``0..J`` and of the busy members ``0..B``."""
        sizes = np.array([p.sum() for p in pis])
        busy = np.zeros(self.busy_max + 1)
        for p, lv in zip(pis, self.levels):
            np.add.at(busy, lv[:, 1:].sum(1), p)
        return sizes, busy

    def _moves(self, m: int) -> dict:
        """The moves out of the compositions of size ``m``, as index arrays by kind:
        ``(from, to, k, n_k)`` (``n_k``: members with ``k`` tasks before the move).
        A move past either bound is left out (the bounds' mass is kept negligible)."""
        z, out = self.z, {kind: [] for kind in ("join", "pick", "task", "delete", "done")}

        def add(kind, i, level, t, k, count):
            j = self.index[level].get(tuple(t)) if 0 <= level <= self.size_max else None
            if j is not None:
                out[kind].append((i, j, k, count))

        for i, n in enumerate(self.levels[m]):
            for k in range(z + 1):
                t = list(n)
                t[k] += 1
                add("join", i, m + 1, t, k, n[k])
                if n[k] == 0:
                    continue
                t = list(n)
                t[k] -= 1
                add("pick", i, m - 1, t, k, n[k])
                if k < z:
                    t2 = list(t)
                    t2[k + 1] += 1
                    add("task", i, m, t2, k, n[k])
                else:  # a task takes a member with z past z: deleted
                    add("delete", i, m - 1, t, k, n[k])
                if k >= 1:
                    t2 = list(t)
                    t2[k - 1] += 1
                    add("done", i, m, t2, k, n[k])
        return {kind: np.array(v, np.int64).reshape(-1, 4).T for kind, v in out.items()}

    def blocks(self, lam_r: float, f: float, a: np.ndarray):
        """``(up, local, down)`` generator blocks by size (``down[0]``, ``up[J]`` unused)."""
        if not hasattr(self, "_cached"):
            self._cached = [self._moves(m) for m in range(self.size_max + 1)]
        up, local, down = [], [], []
        for m, mv in enumerate(self._cached):
            size = len(self.levels[m])
            u = np.zeros((size, len(self.levels[m + 1]) if m < self.size_max else 0))
            loc = np.zeros((size, size))
            dn = np.zeros((size, len(self.levels[m - 1]) if m > 0 else 0))
            i, j, k, _ = mv["join"]
            np.add.at(u, (i, j), a[k])
            i, j, _, c = mv["pick"]
            np.add.at(dn, (i, j), lam_r * c / max(m, 1))
            i, j, _, c = mv["delete"]
            np.add.at(dn, (i, j), f * c)
            i, j, _, c = mv["task"]
            np.add.at(loc, (i, j), f * c)
            i, j, _, c = mv["done"]
            np.add.at(loc, (i, j), c.astype(np.float64))
            out = u.sum(1) + loc.sum(1) + dn.sum(1)
            loc[np.arange(size), np.arange(size)] -= out
            up.append(u)
            local.append(loc)
            down.append(dn)
        return up, local, down

    def stationary(self, lam_r: float, f: float, a: np.ndarray) -> list[np.ndarray]:
        """The stationary law by size level (level reduction: ``pi_{m+1} = pi_m R_m``)."""
        up, local, down = self.blocks(lam_r, f, a)
        top = self.size_max
        r_mats = [None] * top
        inner = local[top]
        for m in range(top - 1, -1, -1):
            # R_m = U_m (-inner)^-1, solved rather than inverted
            r_mats[m] = np.linalg.solve(-inner.T, up[m].T).T
            inner = local[m] + r_mats[m] @ down[m + 1]
        pis = [np.ones(1)]
        for m in range(top):
            pis.append(pis[-1] @ r_mats[m])
        total = sum(p.sum() for p in pis)
        return [np.maximum(p, 0.0) / total for p in pis]


def _entries(z: int, size_max: int, busy_max: int) -> float:
    """About how many float64 entries the blocks of ``_Chain(z, size_max, busy_max)`` take."""
    busy_max = min(busy_max, size_max)
    full = math.comb(busy_max + z, z) ** 2 * (size_max - busy_max)
    return 4.0 * (full + sum(math.comb(m + z, z) ** 2 for m in range(busy_max)))


def _busy_limit(z: int, states: int = MAX_STATES) -> int:
    """The most busy members a chain may hold: at most ``states``
    compositions of one size."""
    if z == 0:
        return 0  # every member is idle
    b = 0
    while math.comb(b + 1 + z, z) <= states:
        b += 1
    return b


def _decay(law: np.ndarray) -> float:
    """The geometric decay of ``law`` at its top."""
    decay = law[-2] / law[-3] if law.size > 2 and law[-3] > 0 else 0.5
    return min(max(decay, 1e-3), 1.0 - 1e-6)


def _beyond(law: np.ndarray, bound: int) -> int:
    """A bound past which ``law`` (truncated at ``bound``) holds less than
    :data:`TAIL_EPS`, from its decay at the top."""
    extra = math.log(TAIL_EPS / law[-1]) / math.log(_decay(law))
    return max(bound + 8, int(bound + 1.1 * extra) + 4)


def _evaluate(chain: _Chain, lam: float, ratio: float, x: np.ndarray):
    """Residuals of the fixed point at ``x = (p0, a_1..a_z)`` (``z = 0``: ``(p0, a_0)``)."""
    z = chain.z
    p0, f = x[0], lam * x[0]
    a = np.zeros(z + 1)
    if z == 0:
        a[0] = x[1]
    else:
        a[1:] = x[1:]
    pis = chain.stationary(lam * ratio, f, a)
    mean = sum(p @ lv for p, lv in zip(pis, chain.levels))  # E[n_k] per I-queue
    pick_share = sum(p @ (lv / m) for m, (p, lv) in enumerate(zip(pis, chain.levels)) if m > 0)
    picks = lam * ratio * pick_share  # picks of members with k tasks, per I-queue
    unlisted_flux = picks[z] + f * mean[z]  # servers leaving with z + 1 tasks, per I-queue
    res = [pis[0][0] - p0]
    res += [a[k] - picks[k - 1] for k in range(1, z)]
    res.append(mean.sum() / ratio + unlisted_flux / ratio / (1.0 - f) - 1.0)
    info = dict(pis=pis, mean=mean, pick_share=pick_share, unlisted_flux=unlisted_flux, f=f, a=a)
    return np.array(res), info


def _jacobian(chain: _Chain, lam: float, ratio: float, x: np.ndarray, res: np.ndarray):
    jac = np.empty((x.size, x.size))
    for i in range(x.size):
        h = 1e-7 * max(1.0, abs(x[i]))
        xp = x.copy()
        xp[i] += h
        jac[:, i] = (_evaluate(chain, lam, ratio, xp)[0] - res) / h
    return jac


def _newton(
    chain: _Chain,
    lam: float,
    ratio: float,
    x: np.ndarray,
    jac=None,
    tol=1e-13,
    iterations=60,
):
    """Newton's method with a finite-difference Jacobian, kept (also from a
    previous, smaller chain: ``jac``) while each step at least halves the
    residual.

    Returns ``(x, res, info, jac, status)``: the last iterate and its
    residuals, and ``Status.CONVERGED`` where the residual is below ``tol``
    (or, after ``iterations`` steps, below ``max(tol, 1e-10)``), else
    ``Status.MAX_ITERATIONS`` (a coarse chain may have no fixed point).
    """
    res, info = _evaluate(chain, lam, ratio, x)
    for _ in range(iterations):
        err = np.max(np.abs(res))
        if err < tol:
            return x, res, info, jac, Status.CONVERGED
        if jac is None:
            jac = _jacobian(chain, lam, ratio, x, res)
        step = np.linalg.solve(jac, -res)
        t = 1.0
        while True:
            xn = x + t * step
            if 0.0 < xn[0] < 1.0 and np.all(xn[1:] > 0.0):
                rn, info_n = _evaluate(chain, lam, ratio, xn)
                if np.max(np.abs(rn)) < err or t < 1e-4:
                    break
            t /= 2.0
        if np.max(np.abs(rn)) > 0.5 * err:
            jac = None  # slow progress: a fresh Jacobian at the new point
        x, res, info = xn, rn, info_n
    done = np.max(np.abs(res)) < max(tol, 1e-10)
    return x, res, info, jac, Status.CONVERGED if done else Status.MAX_ITERATIONS


def jiq_threshold_mean_field(
    policy, load: float, ratio: float, levels: int | None = None, with_quantiles: bool = True
) -> MeanFieldResult:
    """The mean field of JIQ-Threshold(z) (docs/theory-derivations.md).

    Args:
        policy: a :class:`~jaxqueue.policies.per_server.JIQThreshold`.
        load: ``lambda`` in ``(0, 1)``.
        ratio: ``r = N / M > 0``.
        levels: the largest queue length represented (``None``: the fewest
            with less than :data:`TAIL_EPS` of tail mass left out).

    Returns:
        A :class:`~jaxqueue.theory.result.MeanFieldResult` with
        ``iqueue_distribution`` (the law of an I-queue's size), and
        diagnostics ``busy_fraction_error`` (``|s_1 - lambda|``),
        ``little_error`` (relative gap of the two mean response times),
        ``residual`` (of the fixed point), ``join_law`` (the law of the queue
        length at a join, ``k = 0..z``), ``listed_occupancy`` (the fraction of
        servers listed with ``k`` tasks: all of them for ``k <= z``),
        ``iqueue_sizes`` and ``busy_members`` (the largest I-queue size and
        number of busy members represented) and ``busy_remainder`` (the law
        of the busy members at that bound: below :data:`TAIL_EPS`, or below
        :data:`BUSY_ACCEPT` where the bound is at its limit).

    Raises:
        RuntimeError: where more than :data:`BUSY_ACCEPT` of the law would
            sit at the largest busy bound :data:`MAX_STATES` allows, and at once
            for ``z`` past :data:`Z_MAX`.
    """
    lam = float(load)
    if ratio is None or not float(ratio) > 0 or not math.isfinite(float(ratio)):
        raise ValueError(f"ratio={ratio!r} is out of range: {policy.name!r} needs ratio > 0")
    if not 0 <= int(policy.z) <= Z_MAX:  # a refusal, like the others: the simulation goes on
        raise RuntimeError(
            f"z={policy.z} is out of range for the JIQ-Threshold mean field: need 0 <= z <= "
            f"{Z_MAX} (past it an I-queue's chain holds at most one busy member within "
            f"{MAX_STATES} compositions of one size: the solve would be refused, and only "
            "after z + 1 chain solves per Newton Jacobian)"
        )
    try:
        return _solve(policy, lam, float(ratio), levels, with_quantiles)
    except np.linalg.LinAlgError as err:  # Newton led the chain where it has no stationary law
        raise RuntimeError(
            f"the JIQ-Threshold mean field with z={policy.z} at load={lam}, ratio={ratio} "
            f"failed: Newton's method met a singular system ({err}); its composition chain "
            "has no fixed point within the busy members it can hold; use a smaller z or ratio"
        ) from None


def _solve(policy, lam: float, ratio: float, levels, with_quantiles: bool) -> MeanFieldResult:
    """:func:`jiq_threshold_mean_field` with its arguments checked."""
    z = int(policy.z)
    chain, x, jac = _truncated_chain(z, lam, ratio)
    x, res, info, jac, status = _newton(chain, lam, ratio, x, jac, 1e-13)
    if status != Status.CONVERGED:
        raise RuntimeError(
            f"the JIQ-Threshold mean field did not converge (residual {np.max(np.abs(res)):.3g})"
        )
    return _result(policy, chain, lam, ratio, x, res, info, levels, with_quantiles)


def _built(z: int, lam: float, ratio: float, size_max: int, busy_max: int) -> _Chain:
    """The chain ``_Chain(z, size_max, busy_max)``, refused where it would pass
    :data:`MAX_ENTRIES`."""
    entries = _entries(z, size_max, busy_max)
    if entries > MAX_ENTRIES:
        raise RuntimeError(
            f"the JIQ-Threshold mean field with z={z} at load={lam}, ratio={ratio} needs "
            f"I-queue sizes up to {size_max} with up to {min(busy_max, size_max)} busy "
            f"members: about {entries * 8 / 2**30:.1f} GiB of generator blocks, more than "
            f"the {MAX_ENTRIES * 8 / 2**30:.1f} GiB allowed; use a smaller ratio (r = N / M)"
        )
    return _Chain(z, size_max, busy_max)


def _refuse(z: int, lam: float, ratio: float, mass: float, estimated: bool):
    """Refuse the solve: ``mass`` of the busy members' law at the limit :data:`MAX_STATES` allows."""
    how = "by the coarse first chain's decay, about" if estimated else "solved there,"
    raise RuntimeError(
        f"the JIQ-Threshold mean field with z={z} needs more than {_busy_limit(z)} busy members "
        f"per I-queue at load={lam}, ratio={ratio} (more than {MAX_STATES} compositions of one "
        f"size): {how} {mass:.2g} of the law sits at that bound, more than {BUSY_ACCEPT:g}; "
        "use a smaller z or ratio"
    )


def _truncated_chain(z: int, lam: float, ratio: float):
    """The chain whose bounds hold less than :data:`TAIL_EPS` (or what the limits
    accept), with a loose solution on it: ``(chain, x, jac)``.

    Each chain is solved loosely; both laws fall off about geometrically (a
    little faster further up), so the next chain's bounds jump to where each
    is below :data:`TAIL_EPS`.
    """
    size_max = max(24, int(4 * ratio) + 16)
    # start: JIQ-like p0, joins spread over the queue lengths a join can have
    x = np.array([0.5, lam * ratio]) if z == 0 else np.array([0.5] + [lam * ratio / z] * z)
    # the busy members of an I-queue (about lambda r at most), first in a
    # coarse chain of at most _FIRST_STATES compositions per size
    limit = _busy_limit(z)
    busy_max = min(int(lam * ratio) + 8, _busy_limit(z, _FIRST_STATES))
    chain, jac = _built(z, lam, ratio, size_max, busy_max), None
    while True:
        x, _, info, jac, _ = _newton(chain, lam, ratio, x, jac, 1e-9, iterations=12)
        sizes, busy = chain.laws(info["pis"])
        busy_left = z > 0 and busy[-1] >= TAIL_EPS and busy_max < size_max
        if busy_left and busy_max >= limit:
            if busy[-1] >= BUSY_ACCEPT:
                _refuse(z, lam, ratio, busy[-1], estimated=False)
            busy_left = False  # kept, and reported as busy_remainder
        if sizes[-1] < TAIL_EPS and not busy_left:
            return chain, x, jac
        if sizes[-1] >= TAIL_EPS:
            size_max = _beyond(sizes, size_max)
        if busy_left:
            want = _beyond(busy, busy_max)
            if want > limit:
                at_limit = busy[-1] * _decay(busy) ** (limit - busy_max)
                if at_limit >= _HOPELESS:
                    _refuse(z, lam, ratio, at_limit, estimated=True)
            busy_max = min(want, limit)
        if (
            _entries(z, size_max, busy_max) > MAX_ENTRIES
            and sizes[-1] < SIZE_ACCEPT
            and (not busy_left or busy[-1] < BUSY_ACCEPT)
        ):
            return chain, x, jac  # the next chain would pass the memory bound: this one is kept
        chain = _built(z, lam, ratio, size_max, busy_max)


def _occupancy(z: int, mean: np.ndarray, u: float, f: float, ratio: float, levels):
    """The occupancy ``k = 0..levels`` and the mass left out past it.

    Listed servers hold ``k <= z`` (``mean / ratio``); unlisted ones, a
    fraction ``u f^(k - z - 1)`` with ``k > z`` tasks. ``levels`` None: the
    fewest with less than :data:`TAIL_EPS` left out.
    """
    if levels is None:
        extra = (
            1
            if u <= 0 or f <= 0
            else max(1, int(math.ceil(math.log(TAIL_EPS / u) / math.log(f))) + 1)
        )
        n_levels = z + 1 + extra
    else:
        n_levels = int(levels)
    # the occupancy up to z + 1 at least, cut at n_levels; left_out: the mass past it
    full = np.zeros(max(n_levels, z + 1) + 1)
    full[: z + 1] = mean / ratio
    k = np.arange(z + 1, full.size)
    full[z + 1 :] = u * f ** (k - z - 1)
    left_out = float(full[n_levels + 1 :].sum()) + u * f ** (full.size - 1 - z) / (1.0 - f)
    return full[: n_levels + 1].copy(), left_out


def _result(policy, chain, lam, ratio, x, res, info, levels, with_quantiles) -> MeanFieldResult:
    """The mean-field result at the fixed point ``x`` of ``chain``."""
    z = chain.z
    f, mean, a = info["f"], info["mean"], info["a"]
    # unlisted servers: fraction u f^(k - z - 1) with k > z tasks
    u = info["unlisted_flux"] / ratio
    occupancy, left_out = _occupancy(z, mean, u, f, ratio, levels)
    n_levels = occupancy.size - 1
    upto = min(z, n_levels)
    listed = np.zeros(n_levels + 1)
    listed[: upto + 1] = occupancy[: upto + 1]
    tail = np.cumsum(occupancy[::-1])[::-1] + left_out
    p0 = float(x[0])
    seen = p0 * occupancy
    seen[: upto + 1] += info["pick_share"][: upto + 1]
    seen = seen / seen.sum()
    sizes = np.array([p.sum() for p in info["pis"]])
    joins = float(a.sum())
    solution = PerServerSolution(
        tail=tail,
        occupancy=occupancy,
        seen=seen,
        p0=p0,
        iqueue_distribution=sizes,
        join_rate=joins / ratio,
        delete_rate=f * float(mean[z]) / ratio,
        probe_rate=0.0,
        tail_remainder=left_out,
        iqueue_remainder=sizes[-1],
        residual=np.max(np.abs(res)),
        join_law=a / joins,
        listed_occupancy=listed,
    )
    result = per_server_result(
        policy, solution, load=lam, ratio=ratio, d=1, with_quantiles=with_quantiles
    )
    busy_remainder = float(chain.laws(info["pis"])[1][-1]) if z > 0 else 0.0
    result.diagnostics.update(
        iqueue_sizes=int(chain.size_max),
        busy_members=int(chain.busy_max),
        busy_remainder=busy_remainder,
    )
    return result
