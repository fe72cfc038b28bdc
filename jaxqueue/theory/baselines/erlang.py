"""The M/M/N queue (Erlang C), the pooled-queue benchmark of load balancing.

N exp(1) servers share one FIFO queue fed at rate ``lambda N``: the law of the
number in system, the waiting probability (Erlang C), the mean wait and the
response time, exact and computed in log space, so stable for N up to 10^6
and ``lambda -> 1``. Derivations and the Halfin-Whitt limit: docs/theory.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from jaxqueue.core.versions import versions
from jaxqueue.results.schema import QUANTILES, Result

__all__ = [
    "ErlangResult",
    "erlang_b",
    "erlang_c",
    "mean_wait",
    "mean_waiting_number",
    "mean_response_time",
    "number_in_system_pmf",
    "number_in_system_tail",
    "response_time_sf",
    "response_time_quantile",
    "halfin_whitt_waiting",
    "erlang_result",
]

_MAX_SERVERS = 10**7


def _check(n_servers, load) -> tuple[int, float]:
    n = int(n_servers)
    if n != n_servers or not 1 <= n <= _MAX_SERVERS:
        raise ValueError(f"n_servers must be an integer in 1..{_MAX_SERVERS}, got {n_servers!r}")
    lam = float(load)
    if not 0.0 < lam < 1.0:
        raise ValueError(f"the M/M/N queue is stable for 0 < load < 1, got load={load!r}")
    return n, lam


def _log_ladder(n: int, lam: float) -> np.ndarray:
    """``log(pi_{N-j} / pi_N)`` for ``j = 0..N``: the product of ``(N - i) / (lambda N)``
    over ``i < j``, each factor near one, summed in log space."""
    i = np.arange(n, dtype=np.float64)
    steps = np.log((n - i) / (lam * n))
    return np.concatenate(([0.0], np.cumsum(steps)))


def _logsumexp(x: np.ndarray) -> float:
    top = float(np.max(x))
    return top + math.log(float(np.sum(np.exp(x - top))))


def _log_erlang_b(ladder: np.ndarray) -> float:
    return -_logsumexp(ladder)


def _log_erlang_c(lam: float, ladder: np.ndarray) -> float:
    """``log C``, finite where ``C`` itself underflows (a light load on many servers)."""
    log_b = _log_erlang_b(ladder)
    return log_b - math.log((1.0 - lam) + lam * math.exp(log_b))


def erlang_b(n_servers, load) -> float:
    """Erlang's loss formula B(N, a) at offered load ``a = load * N``: the blocking
    probability of the M/M/N/N loss system (``1 / B = sum_j N! / ((N - j)! a^j)``)."""
    n, lam = _check(n_servers, load)
    return math.exp(_log_erlang_b(_log_ladder(n, lam)))


def erlang_c(n_servers, load) -> float:
    """Erlang C: the probability that an arrival waits, ``B / (1 - lambda + lambda B)``."""
    n, lam = _check(n_servers, load)
    return math.exp(_log_erlang_c(lam, _log_ladder(n, lam)))


def mean_wait(n_servers, load) -> float:
    """The mean wait in queue, ``C / (N (1 - lambda))`` (a waiting task's wait is
    exponential at rate ``N (1 - lambda)``)."""
    n, lam = _check(n_servers, load)
    return erlang_c(n, lam) / (n * (1.0 - lam))


def mean_waiting_number(n_servers, load) -> float:
    """The mean number of tasks waiting, ``C lambda / (1 - lambda)`` (Little's law)."""
    n, lam = _check(n_servers, load)
    return erlang_c(n, lam) * lam / (1.0 - lam)


def mean_response_time(n_servers, load) -> float:
    """The mean response time, ``1 + E[W]``."""
    return 1.0 + mean_wait(n_servers, load)


def _log_pmf_to_n(n: int, lam: float) -> np.ndarray:
    """``log P(L = k)`` for ``k = 0..N``: ``P(L = N) = C (1 - lambda)``."""
    ladder = _log_ladder(n, lam)
    return _log_erlang_c(lam, ladder) + math.log1p(-lam) + ladder[::-1]


def number_in_system_pmf(n_servers, load, k) -> np.ndarray:
    """``P(L = k)`` of the number in system ``L`` (``k`` an integer array):
    Poisson-like below N, geometric with ratio ``lambda`` from N on."""
    n, lam = _check(n_servers, load)
    k = np.asarray(k, dtype=np.int64)
    low = _log_pmf_to_n(n, lam)
    above = low[n] + (np.maximum(k, n) - n) * math.log(lam)
    logp = np.where(k <= n, low[np.clip(k, 0, n)], above)
    return np.where(k < 0, 0.0, np.exp(logp))


def number_in_system_tail(n_servers, load, k) -> np.ndarray:
    """``P(L >= k)`` (``k`` an integer array): ``C lambda^(k - N)`` from N on; below N,
    ``C`` plus the masses of ``k..N-1``."""
    n, lam = _check(n_servers, load)
    k = np.asarray(k, dtype=np.int64)
    c = erlang_c(n, lam)
    pmf = np.exp(_log_pmf_to_n(n, lam))[:n]
    upper = c + np.concatenate((np.cumsum(pmf[::-1])[::-1], [0.0]))  # P(L >= j), j = 0..N
    above = c * np.exp((np.maximum(k, n) - n) * math.log(lam))
    out = np.where(k <= n, upper[np.clip(k, 0, n)], above)
    return np.minimum(np.where(k <= 0, 1.0, out), 1.0)


def _sf(t, c: float, nu: float) -> np.ndarray:
    if abs(nu - 1.0) < 1e-9:
        both = (1.0 + t) * np.exp(-t)
    else:  # the hypoexponential law of S + W
        both = (nu * np.exp(-t) - np.exp(-nu * t)) / (nu - 1.0)
    return (1.0 - c) * np.exp(-t) + c * both


def response_time_sf(n_servers, load, t) -> np.ndarray:
    """``P(T > t)`` of the response time ``T = S + W``: ``S`` exp(1), ``W`` 0 with
    probability ``1 - C``, else exponential at rate ``nu = N (1 - lambda)``."""
    n, lam = _check(n_servers, load)
    return _sf(np.asarray(t, dtype=np.float64), erlang_c(n, lam), n * (1.0 - lam))


def response_time_quantile(n_servers, load, q) -> np.ndarray:
    """The response time's quantiles at levels ``q`` (bisection to float64 precision)."""
    n, lam = _check(n_servers, load)
    c, nu = erlang_c(n, lam), n * (1.0 - lam)
    q = np.asarray(q, dtype=np.float64)
    lo, hi = np.zeros_like(q), np.ones_like(q)
    while np.any(_sf(hi, c, nu) > 1.0 - q):
        hi = np.where(_sf(hi, c, nu) > 1.0 - q, 2.0 * hi, hi)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        above = _sf(mid, c, nu) > 1.0 - q
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        if np.all(hi - lo <= 4e-16 * hi):
            break
    return 0.5 * (lo + hi)


def halfin_whitt_waiting(beta: float) -> float:
    """The Halfin-Whitt limit of Erlang C at ``lambda = 1 - beta / sqrt(N)``:
    ``1 / (1 + beta Phi(beta) / phi(beta))``."""
    beta = float(beta)
    if beta <= 0.0:
        raise ValueError(f"beta must be positive, got {beta!r}")
    cdf = 0.5 * math.erfc(-beta / math.sqrt(2.0))
    pdf = math.exp(-0.5 * beta * beta) / math.sqrt(2.0 * math.pi)
    return 1.0 / (1.0 + beta * cdf / pdf)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ErlangResult(Result):
    """The M/M/N queue's metrics in the result schema (per server, as elsewhere).

    ``mean_queue_length`` is the mean number in system over N,
    ``waiting_probability`` Erlang C, ``mean_response_time`` ``1 + E[W]``,
    ``blocking_probability`` None (an infinite queue); the per-server vectors
    (``tail``, ``occupancy``, ``arrival_seen``) do not apply to one shared
    queue and are ``None``: its number in system is
    :func:`number_in_system_tail`. Settings: ``policy`` ``"mmn"``,
    ``n_servers``, ``load``, ``mean_wait``, ``mean_waiting_number``, versions.
    """

    source: ClassVar[str] = "erlang"


def erlang_result(n_servers, load) -> ErlangResult:
    """The M/M/N queue with ``n_servers`` servers at ``load`` per server, as a result."""
    n, lam = _check(n_servers, load)
    c, w = erlang_c(n, lam), mean_wait(n, lam)
    quantiles = response_time_quantile(n, lam, np.array(QUANTILES))
    return ErlangResult(
        tail=None,
        occupancy=None,
        arrival_seen=None,
        mean_queue_length=lam + mean_waiting_number(n, lam) / n,
        mean_response_time=1.0 + w,
        waiting_probability=c,
        blocking_probability=None,
        join_rate=None,
        delete_rate=None,
        probe_rate=None,
        response_quantiles={q: float(v) for q, v in zip(QUANTILES, quantiles, strict=True)},
        settings={
            "policy": "mmn",
            "policy_label": f"M/M/{n}",
            "options": {},
            "n_servers": n,
            "load": lam,
            "buffer": None,
            "mean_wait": w,
            "mean_waiting_number": mean_waiting_number(n, lam),
            "versions": versions(),
        },
    )
