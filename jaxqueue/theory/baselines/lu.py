"""Lu et al.'s large-system approximation of JIQ, a baseline beside Wang et al.'s mean field.

Lu, Xie, Kliot, Geller, Larus and Greenberg ("Join-Idle-Queue", Performance
Evaluation 68(11), 2011): each I-queue is an M/M/1-like queue of idle servers,
and a server sees the fraction ``1 - rho`` of arrivals at random (a reduced
load). The equations here are reconstructed from these stated assumptions.
What was implemented, from which source, and how it was checked:
docs/theory.md ("Lu et al.'s approximation").
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import numpy as np

from jaxqueue.core.status import Status
from jaxqueue.core.system import check_load
from jaxqueue.core.versions import versions
from jaxqueue.policies import Policy, make
from jaxqueue.results.response import erlang_mixture_quantile
from jaxqueue.results.schema import QUANTILES, Result

__all__ = [
    "LuApproximation",
    "LuResult",
    "lu_approximation",
    "lu_result",
    "busy_iqueue_fraction",
    "join_probes",
    "lu_covers",
]

#: Bisection steps on ``log t`` (``rho = exp(-t)``) for JIQ-SQ(d): the bracket
#: ``[-745, 4]`` shrinks below ``1e-27``, far under float64's resolution.
_BISECTIONS = 100
_LOG_T = (-745.0, 4.0)  # exp(-745) is about the smallest positive float64
#: Most queue lengths represented by :func:`lu_result` with the automatic count.
_MAX_LEVELS = 100_000
#: Tail mass the automatic level count may leave out (as the closed forms).
_TAIL_LEFT = 1e-15


class LuApproximation(NamedTuple):
    """Lu et al.'s approximation at each point (float64 arrays, NaN out of the domain).

    Attributes:
        rho: the fraction of non-empty I-queues (``1 - rho`` is Wang et al.'s ``p0``).
        reduced_load: ``lambda (1 - rho)``, the rate of the tasks a server
            receives at random (from dispatchers with an empty I-queue).
        mean_response_time: ``1 / (1 - lambda (1 - rho))``.
        waiting_probability: ``(1 - rho) lambda``: only tasks sent at random wait.
        mean_queue_length: ``lambda / (1 - lambda (1 - rho))``.
    """

    rho: np.ndarray
    reduced_load: np.ndarray
    mean_response_time: np.ndarray
    waiting_probability: np.ndarray
    mean_queue_length: np.ndarray


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class LuResult(Result):
    """Lu et al.'s approximation at one point, in the one result schema.

    ``p0`` is ``1 - rho`` (the fraction of empty I-queues), ``join_rate`` the
    rate at which servers become idle and join; ``delete_rate``,
    ``probe_rate`` and ``stale_fraction`` are ``None`` (the approximation does
    not model them). ``diagnostics["rho"]`` and ``diagnostics["reduced_load"]``
    hold the two numbers it solves for; ``diagnostics["iqueue_remainder"]`` the
    fraction of I-queues past the sizes listed (below 1e-15, unless the law is
    cut at 100000 sizes).
    """

    source: ClassVar[str] = "lu"


def join_probes(policy: Policy) -> int:
    """The I-queues a joining server probes, for the policies Lu et al.'s analysis covers.

    JIQ (``jiq``, ``jiq-pod`` with ``d = 1``) joins a random I-queue (1);
    JIQ-SQ(d) (``jiq-sq``, and ``jiq-original`` with ``z = 0`` in either
    order, Lu et al.'s own scheme) the shortest of ``d``.

    Raises:
        NotImplementedError: for any other policy (with the reason).
    """
    name = policy.name
    if name == "jiq" or (name == "jiq-pod" and policy.d == 1):
        return 1
    if name == "jiq-sq" or (name == "jiq-original" and policy.z == 0):
        return int(policy.d)
    raise NotImplementedError(
        f"Lu et al.'s approximation covers JIQ with a random or shortest-of-d I-queue join "
        f"(jiq, jiq-sq, jiq-original with z=0), not {policy.label()!r}"
    )


def lu_covers(policy: Policy) -> bool:
    """Whether Lu et al.'s approximation covers ``policy`` (:func:`join_probes`)."""
    try:
        join_probes(policy)
    except NotImplementedError:
        return False
    return True


def _exponents(d: int, t_min: float) -> np.ndarray:
    """``(d**i - 1) / (d - 1)``, ``i = 1, 2, ...``, while ``exp(-e t_min)`` may matter."""
    out, e = [], 1.0
    while e * t_min < 60.0:
        out.append(e)
        e = 1.0 + d * e
    return np.array(out)


def busy_iqueue_fraction(mean_size, d: int = 1) -> np.ndarray:
    """``rho`` with ``sum_{i>=1} rho**((d**i - 1)/(d - 1)) = mean_size`` (``d = 1``: ``rho**i``).

    The fraction of non-empty I-queues whose mean size is ``mean_size``
    (``r (1 - lambda)``, the idle servers per dispatcher): geometric for
    ``d = 1``, ``rho = m / (1 + m)``; for ``d >= 2`` the supermarket law of
    the I-queues, solved by bisection on ``log(-log rho)``. Vectorised; NaN
    for a negative or non-finite size.
    """
    m = np.asarray(mean_size, np.float64)
    ok = np.isfinite(m) & (m >= 0)
    if d == 1:
        return np.where(ok, m / (1.0 + np.where(ok, m, 0.0)), np.nan)
    if not (isinstance(d, (int, np.integer)) and d >= 2):
        raise ValueError(f"d={d!r} must be an integer >= 1")
    mm = np.where(ok, m, 0.0)
    expo = _exponents(int(d), math.exp(_LOG_T[0]))
    lo, hi = np.full(m.shape, _LOG_T[0]), np.full(m.shape, _LOG_T[1])
    for _ in range(_BISECTIONS):  # sum_i exp(-e_i t) falls as log t rises
        mid = 0.5 * (lo + hi)
        with np.errstate(over="ignore"):  # e_i t past the float range: a zero term
            total = np.exp(-np.exp(mid)[..., None] * expo).sum(axis=-1)
        above = total > mm
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    t = np.exp(0.5 * (lo + hi))
    return np.where(ok, np.where(mm > 0, np.exp(-t), 0.0), np.nan)


def _empty_fraction(mean_size, d: int) -> np.ndarray:
    """``1 - rho`` without cancellation (for ``d = 1``, ``1 / (1 + m)``)."""
    m = np.asarray(mean_size, np.float64)
    if d == 1:
        return 1.0 / (1.0 + m)
    rho = busy_iqueue_fraction(m, d)
    # 1 - rho = -expm1(log rho): exact where rho is within an ulp of 1 (+ 0.0: not -0.0 at 1)
    with np.errstate(divide="ignore"):
        return np.where(rho > 0, -np.expm1(np.log(rho)) + 0.0, 1.0)


def lu_approximation(load, ratio, d: int = 1) -> LuApproximation:
    """Lu et al.'s approximation of JIQ (``d = 1``) or JIQ-SQ(d) at each ``(load, ratio)``,
    reconstructed from their stated assumptions.

    ``rho`` solves ``sum_{i>=1} rho**((d**i - 1)/(d - 1)) = r (1 - lambda)``
    (``d = 1``: ``rho / (1 - rho) = r (1 - lambda)``), and each server is an
    M/M/1 queue fed at random at the reduced rate ``lambda (1 - rho)`` and
    from an I-queue only while idle, so ``T = 1 / (1 - lambda (1 - rho))``;
    for ``d = 1``, ``T = (1 + r (1 - lambda)) / ((1 + r)(1 - lambda))``.
    Units of the mean service time. Broadcasts ``load`` and ``ratio``
    (NumPy, float64); NaN where ``load`` is not in ``(0, 1)`` or ``ratio``
    not positive and finite.

    Example:
        >>> from jaxqueue import theory
        >>> round(float(theory.lu_approximation(0.9, 10.0).mean_response_time), 4)
        1.8182
    """
    lam, r = np.broadcast_arrays(np.asarray(load, np.float64), np.asarray(ratio, np.float64))
    ok = (lam > 0) & (lam < 1) & np.isfinite(r) & (r > 0)
    lam, r = np.where(ok, lam, 0.5), np.where(ok, r, 1.0)
    m = r * (1.0 - lam)
    empty = _empty_fraction(m, d)
    a = lam * empty  # the reduced load
    nan = lambda x: np.where(ok, x, np.nan)  # noqa: E731
    return LuApproximation(
        rho=nan(busy_iqueue_fraction(m, d)),
        reduced_load=nan(a),
        mean_response_time=nan(1.0 / (1.0 - a)),
        waiting_probability=nan(a),
        mean_queue_length=nan(lam / (1.0 - a)),
    )


def _levels_for(load: float, a: float) -> int:
    """The fewest levels leaving less than ``1e-15`` of tail mass out (``s_{k+1} = lambda a**k``)."""
    if a <= 0.0:
        return 1
    need = math.log(_TAIL_LEFT / load) / math.log(a)
    return int(min(max(math.ceil(need), 1), _MAX_LEVELS))


def lu_result(
    policy,
    load: float,
    ratio: float,
    *,
    d: int | None = None,
    z: int | None = None,
    order: str | None = None,
    levels: int | None = None,
    with_quantiles: bool = True,
) -> LuResult:
    """Lu et al.'s approximation of a JIQ policy at one point, as a :class:`LuResult`.

    The policy is built as ``make(policy, d=d, z=z, order=order)`` and must be
    one the analysis covers (:func:`join_probes`). The server's queue length
    is that of the birth-death chain of the approximation: ``s_k = lambda
    a**(k-1)`` for ``k >= 1``, ``a = lambda (1 - rho)``. A task sent at random
    (fraction ``1 - rho``) finds that law, one taken from an I-queue an idle
    server, so the response time is the Erlang mixture over ``arrival_seen``.

    Args:
        policy: ``jiq``, ``jiq-sq``, ``jiq-original`` (``z = 0``), or such a
            :class:`~jaxqueue.policies.Policy`.
        load: ``lambda`` in ``(0, 1)``.
        ratio: ``r = N / M > 0`` (required: the approximation is for many dispatchers).
        d, z, order: the policy's options (``None``: its defaults).
        levels: the largest queue length represented (``None``: the fewest
            that leave less than ``1e-15`` of the tail out, at most 100000).
        with_quantiles: False leaves the response-time quantiles NaN.

    Raises:
        NotImplementedError: a policy the analysis does not cover.
        ValueError: an invalid load, ratio or levels.
    """
    pol = make(policy, d=d, z=z, **({} if order is None else {"order": order}))
    probes = join_probes(pol)
    lam = check_load(load, None)
    if ratio is None or not (float(ratio) > 0 and math.isfinite(float(ratio))):
        raise ValueError(f"ratio={ratio!r}: Lu et al.'s approximation needs a ratio r = N/M > 0")
    r = float(ratio)
    approx = lu_approximation(lam, r, probes)
    a = float(approx.reduced_load)
    levels = _levels_for(lam, a) if levels is None else int(levels)
    if levels < 1:
        raise ValueError(f"levels={levels} must be at least 1")
    k = np.arange(levels + 1)
    tail = np.where(k == 0, 1.0, lam * a ** np.maximum(k - 1, 0).astype(np.float64))
    occupancy = tail - np.append(tail[1:], 0.0)
    seen = (a / lam) * occupancy  # 1 - rho of the tasks see the stationary law (PASTA)
    seen[0] += 1.0 - a / lam  # the rest find an idle server
    quantiles = (
        erlang_mixture_quantile(seen, np.array(QUANTILES))
        if with_quantiles
        else [math.nan] * len(QUANTILES)
    )
    rho = float(approx.rho)
    sizes, sizes_left = _iqueue_law(rho, probes)
    return LuResult(
        tail=tail,
        occupancy=occupancy,
        arrival_seen=seen,
        iqueue_distribution=sizes,
        mean_queue_length=float(approx.mean_queue_length),
        mean_response_time=float(approx.mean_response_time),
        waiting_probability=float(approx.waiting_probability),
        blocking_probability=0.0,
        p0=1.0 - rho,
        join_rate=lam * (1.0 - a),
        delete_rate=None,
        probe_rate=None,
        response_quantiles=dict(zip(QUANTILES, map(float, quantiles), strict=True)),
        settings={
            "policy": pol.name,
            "policy_label": pol.label(),
            "options": pol.options(),
            "load": lam,
            "ratio": r,
            "d": probes,
            "buffer": None,
            "levels": levels,
            "model": "lu",
            "versions": versions(),
        },
        diagnostics={
            "status": Status.CONVERGED,
            "rho": rho,
            "reduced_load": a,
            "tail_remainder": lam * a**levels,
            "iqueue_remainder": sizes_left,
        },
    )


def _iqueue_law(rho: float, d: int) -> tuple[np.ndarray, float]:
    """The fraction of I-queues of each size ``0, 1, ...``: geometric (``d = 1``) or the
    supermarket law, ``rho**((d**j - 1)/(d - 1))`` of them with at least ``j`` servers;
    sizes up to where less than ``1e-15`` of them is left, or 100000 sizes. Also
    returns the fraction of I-queues past the sizes returned (the law's remainder)."""
    if rho <= 0.0:  # every I-queue empty (a ratio so small that r (1 - lambda) is 0)
        return np.array([1.0]), 0.0
    if rho >= 1.0:  # none empty, sizes past any listed (1 - rho below float64's resolution)
        return np.array([0.0]), 1.0
    count = math.ceil(math.log(_TAIL_LEFT) / math.log(rho)) if d == 1 else 64
    j = np.arange(min(count, _MAX_LEVELS) + 2, dtype=np.float64)
    with np.errstate(over="ignore"):
        expo = j if d == 1 else (np.float64(d) ** j - 1.0) / (d - 1)
        at_least = rho**expo
    below = np.flatnonzero(at_least < _TAIL_LEFT)
    # the last size kept: the first whose "at least" is below the cut, or the cap
    last = int(below[0]) if below.size else j.size - 2
    return at_least[: last + 1] - at_least[1 : last + 2], float(at_least[last + 1])
