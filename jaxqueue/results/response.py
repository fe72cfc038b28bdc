"""Response-time laws as Erlang mixtures, and with phase-type service (host side, numpy, float64).

Service is exp(1) and FIFO, so a task that finds ``k`` tasks at its server
leaves after an Erlang(``k + 1``, 1) time (its own service plus the ``k`` ahead
of it; see docs/simulation.md, "Response times without tagged tasks"). The
response time of a random arrival is then the mixture

    F(t) = sum_k w_k * P(Erlang(k + 1, 1) <= t),

where ``w_k`` is the probability that an arrival finds ``k`` tasks (the
``arrival_seen`` distribution of every result, simulated, mean-field or
exact). Times here are in units of the mean service time. Everything here works on the Poisson
side of the Erlang-Poisson duality,

    P(Erlang(k + 1, 1) > t) = P(Poisson(t) <= k),

so the survival function is ``sum_j pois(j; t) * W_j`` with ``W_j = sum_{k>=j} w_k``:
a sum of non-negative terms with each Poisson probability taken in log space,
which stays accurate for ``k`` up to thousands and survival levels far below
``1e-4``.

Shapes: ``weights`` is ``[..., K + 1]`` (leading batch axes, e.g. one row per
replica); weights need not be normalised (counts are fine). A time or level
argument that is a scalar gives results of the batch shape ``[...]``; a 1-D
array of length ``Q`` gives ``[..., Q]``. A row whose weights sum to zero gives
NaN for that row (for instance a replica that saw no arrivals).

With phase-type service the residual of the task in service depends on its
phase: :func:`ph_response_terms` builds the response law from the joint law
of the tasks found and the phase in service (the exact solver and the
phase-type mean field know it), and :func:`ph_mixture_quantiles` inverts it.

Example:
    >>> import numpy as np
    >>> rho = 0.5
    >>> w = (1 - rho) * rho ** np.arange(60)  # M/M/1: response ~ Exp(1 - rho)
    >>> t = float(erlang_mixture_quantile(w, 0.5))
    >>> bool(abs(t - np.log(2) / (1 - rho)) < 1e-10)
    True
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = [
    "erlang_mixture_mean",
    "erlang_mixture_pdf",
    "erlang_mixture_cdf",
    "erlang_mixture_sf",
    "erlang_mixture_quantile",
    "ph_response_terms",
    "ph_response_quantiles",
    "ph_mixture_quantiles",
]

_REL_TOL = 1e-12
_MAX_ITER = 200


def _normalise(weights) -> np.ndarray:
    """Float64 weights ``[..., K + 1]`` divided by their row sums (NaN rows where the sum is 0)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim == 0 or w.shape[-1] == 0:
        raise ValueError(
            f"weights must have a last axis over k = 0..K (at least one entry); got shape {w.shape}"
        )
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and non-negative")
    total = w.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = w / total
    # Trailing k with zero weight in every row add nothing: drop them.
    nz = np.nonzero(np.any(w > 0, axis=tuple(range(w.ndim - 1))))[0]
    k_max = int(nz[-1]) if nz.size else 0
    return p[..., : k_max + 1]


def _points(x, name: str) -> tuple[np.ndarray, bool]:
    """``x`` as a float64 1-D array and whether it was a scalar."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim > 1:
        raise ValueError(f"{name} must be a scalar or a 1-D array; got shape {arr.shape}")
    return np.atleast_1d(arr), arr.ndim == 0


@functools.lru_cache(maxsize=16)
def _log_factorials(k_max: int) -> np.ndarray:
    """``log(j!)`` for ``j = 0..k_max`` (each to about one ulp; read-only, cached)."""
    out = np.array([math.lgamma(j + 1.0) for j in range(k_max + 1)], dtype=np.float64)
    out.flags.writeable = False
    return out


def _poisson_pmf(t: np.ndarray, k_max: int) -> np.ndarray:
    """Poisson probabilities ``pois(j; t)``, shape ``t.shape + (k_max + 1,)``, in log space."""
    j = np.arange(k_max + 1, dtype=np.float64)
    t = t[..., None]
    positive = t > 0
    log_t = np.log(np.where(positive, t, 1.0))
    log_pmf = j * log_t - np.where(positive, t, 0.0) - _log_factorials(k_max)
    pmf = np.exp(log_pmf)
    # t = 0: all mass at j = 0.
    return np.where(positive, pmf, (j == 0).astype(np.float64))


def _sf_cdf_pdf(p: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Survival, distribution function and density of the mixture.

    The survival is ``sum_j pois(j; t) W_j`` with ``W_j = sum_{k >= j} p_k``. Where
    the survival exceeds 1/2 the distribution function is summed directly,
    ``sum_{j >= 1} pois(j; t) C_{j-1}`` with ``C_j = sum_{k <= j} p_k`` (``= 1``
    past ``K``), so that small lower-tail probabilities keep their relative
    accuracy; there ``t`` is at most the median of Erlang(``K + 1``), below
    ``K + 1``, and the Poisson terms past ``K + 10 sqrt(K + 1) + 40`` are
    negligible.

    Args:
        p: normalised weights ``[..., 1, K + 1]`` (a singleton axis for the points).
        t: finite times ``[..., Q]`` (broadcastable against ``p[..., 0]``), ``t >= 0``.

    Returns:
        ``(sf, cdf, pdf)``, each of shape ``[..., Q]``.
    """
    k_max = p.shape[-1] - 1
    extra = int(10 * np.sqrt(k_max + 1.0)) + 40
    tail = np.cumsum(p[..., ::-1], axis=-1)[..., ::-1]  # W_j = sum_{k >= j} p_k
    head = np.cumsum(p, axis=-1)  # C_j = sum_{k <= j} p_k
    pmf = _poisson_pmf(t, k_max + extra)
    low = pmf[..., : k_max + 1]
    sf = np.sum(low * tail, axis=-1)
    pdf = np.sum(low * p, axis=-1)  # the Erlang(k+1) density at t is pois(k; t)
    cdf_direct = np.sum(pmf[..., 1 : k_max + 1] * head[..., :-1], axis=-1) + np.sum(
        pmf[..., k_max + 1 :], axis=-1
    )
    cdf = np.where(sf > 0.5, cdf_direct, 1.0 - sf)
    return sf, cdf, pdf


def _evaluate(weights, t, which: str) -> np.ndarray:
    p = _normalise(weights)
    pts, scalar = _points(t, "t")
    if np.any(pts < 0) or np.any(np.isnan(pts)):
        raise ValueError("times must be non-negative")
    finite = np.isfinite(pts)
    sf, cdf, pdf = _sf_cdf_pdf(p[..., None, :], np.where(finite, pts, 0.0))
    out = {
        "sf": np.where(finite, sf, 0.0),
        "cdf": np.where(finite, cdf, 1.0),
        "pdf": np.where(finite, pdf, 0.0),
    }[which]
    return out[..., 0] if scalar else out


def erlang_mixture_mean(weights) -> np.ndarray:
    """Mean response time ``sum_k w_k (k + 1)`` of the mixture.

    Args:
        weights: ``[..., K + 1]`` non-negative (unnormalised) weights of ``k = 0..K``.

    Returns:
        ``[...]`` float64 means (NaN for an all-zero row).
    """
    p = _normalise(weights)
    k = np.arange(p.shape[-1], dtype=np.float64)
    return np.sum(p * (k + 1.0), axis=-1)


def erlang_mixture_pdf(weights, t) -> np.ndarray:
    """Density of the mixture: ``sum_k w_k t**k e**-t / k!``.

    Args:
        weights: ``[..., K + 1]`` non-negative weights.
        t: scalar or 1-D ``[Q]`` non-negative times.

    Returns:
        ``[...]`` for scalar ``t``, else ``[..., Q]``.
    """
    return _evaluate(weights, t, "pdf")


def erlang_mixture_sf(weights, t) -> np.ndarray:
    """Survival ``P(T > t)`` of the mixture, accurate in relative terms in the upper tail.

    Args:
        weights: ``[..., K + 1]`` non-negative weights.
        t: scalar or 1-D ``[Q]`` non-negative times.

    Returns:
        ``[...]`` for scalar ``t``, else ``[..., Q]``.
    """
    return _evaluate(weights, t, "sf")


def erlang_mixture_cdf(weights, t) -> np.ndarray:
    """Distribution function ``P(T <= t)`` of the mixture.

    Summed directly below the median (relative accuracy in the lower tail) and
    as ``1 - sf`` above it; use :func:`erlang_mixture_sf` for small upper-tail
    probabilities.

    Args:
        weights: ``[..., K + 1]`` non-negative weights.
        t: scalar or 1-D ``[Q]`` non-negative times.

    Returns:
        ``[...]`` for scalar ``t``, else ``[..., Q]``.
    """
    return _evaluate(weights, t, "cdf")


def erlang_mixture_quantile(weights, q) -> np.ndarray:
    """Quantiles of the mixture: the ``t`` with ``P(T <= t) = q``.

    Solved per row and level by Newton's method on ``log sf(t) = log(1 - q)``
    (``log cdf(t) = log q`` for ``q < 1/2``) inside a bisection bracket grown by
    doubling from the mean, until the step is below ``1e-12`` relative.
    ``q = 0`` gives 0 and ``q = 1`` gives ``inf``.

    Args:
        weights: ``[..., K + 1]`` non-negative weights.
        q: scalar or 1-D ``[Q]`` levels in ``[0, 1]``.

    Returns:
        ``[...]`` for scalar ``q``, else ``[..., Q]`` (NaN for an all-zero row).

    Raises:
        ValueError: for levels outside ``[0, 1]`` or invalid weights.
    """
    p = _normalise(weights)
    levels, scalar = _points(q, "q")
    if np.any(~(levels >= 0) | ~(levels <= 1)):
        raise ValueError(f"quantile levels must lie in [0, 1]; got {q!r}")
    batch = p.shape[:-1]
    shape = batch + levels.shape
    pq = p[..., None, :]
    level = np.broadcast_to(levels, shape)
    upper = level >= 0.5  # solve on the survival side, else on the cdf side
    target = np.where(upper, 1.0 - level, level)
    bad_row = np.broadcast_to(np.isnan(p[..., :1]), shape)
    active = (level > 0) & (level < 1) & ~bad_row
    with np.errstate(divide="ignore"):
        log_target = np.log(target)

    def below_and_logratio(t):
        """Whether ``t`` is below the quantile, and log(side / target) with its t-derivative."""
        sf, cdf, pdf = _sf_cdf_pdf(pq, t)
        below = np.where(upper, sf > target, cdf < target)
        side = np.where(upper, sf, cdf)
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.log(side) - log_target
            dg = np.where(upper, -pdf, pdf) / side
        return below, g, dg

    mean = np.sum(p * np.arange(1.0, p.shape[-1] + 1.0), axis=-1)
    hi = np.broadcast_to(np.where(np.isnan(mean), 1.0, mean)[..., None], shape).copy()
    lo = np.zeros(shape)
    # Grow the upper end until it is at or above the quantile.
    for _ in range(_MAX_ITER):
        below, _, _ = below_and_logratio(hi)
        grow = active & below
        if not grow.any():
            break
        lo = np.where(grow, hi, lo)
        hi = np.where(grow, 2.0 * hi, hi)
    else:  # pragma: no cover - needs weights beyond any realistic K
        raise RuntimeError("could not bracket the quantile")

    t = 0.5 * (lo + hi)
    done = ~active
    for _ in range(_MAX_ITER):
        below, g, dg = below_and_logratio(t)
        lo = np.where(active & below, t, lo)
        hi = np.where(active & ~below, t, hi)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_new = t - g / dg
        inside = np.isfinite(t_new) & (t_new > lo) & (t_new < hi)
        t_new = np.where(inside, t_new, 0.5 * (lo + hi))
        converged = (np.abs(t_new - t) <= _REL_TOL * t_new) | (hi - lo <= _REL_TOL * hi)
        t = np.where(done, t, t_new)
        done = done | converged
        if done.all():
            break
    else:  # pragma: no cover
        raise RuntimeError("quantile iteration did not converge")

    out = np.where(level >= 1, np.inf, np.where(level <= 0, 0.0, t))
    out = np.where(bad_row, np.nan, out)
    return out[..., 0] if scalar else out


# ---- phase-type service -------------------------------------------------------


def ph_response_terms(law, seen, seen_phase, eps=1e-14, max_steps=5_000_000):
    """The response time of an accepted arrival with phase-type service, uniformized.

    The response time is the absorption time of a chain on ``(j, p)``: ``j``
    services left (the task in service, those waiting ahead, its own), the one
    in service in phase ``p``; within ``j`` the phase moves by ``S``, a
    completion (rate ``s_p``) goes to ``j - 1`` with the next task in phase
    ``a`` with probability ``alpha[a]``, or is absorbed from ``j = 1``. An
    arrival that finds the server empty starts at ``(1, alpha)``; one that
    finds ``k >= 1`` tasks, the one in service in phase ``p``, at ``(k + 1, p)``
    (the residual service from ``p``, then ``k - 1`` full services, then its
    own: a mixture of convolutions of phase-type laws). Uniformized at
    ``gamma = max_p -S[p][p]``:
    ``P(T > t) = sum_n Poisson(gamma t; n) a_n`` with ``a_n`` the probability
    that the uniformized chain is not absorbed after ``n`` steps.

    Args:
        law: the :class:`PhaseType` service law.
        seen: ``(cap,)``, the law of the tasks found (``k = 0..cap-1``).
        seen_phase: ``(cap - 1, P)``, the joint law of ``k >= 1`` and the phase.
        eps: stop when ``a_n < eps`` (the error this leaves in ``P(T > t)``).

    Returns:
        ``(gamma, a)``: the rate and the float64 array ``a_0 = 1 >= a_1 >= ...``.
    """
    alpha = np.asarray(law.alpha)
    gamma = law.rate
    step = np.eye(law.n_phases) + law.matrix / gamma
    out = law.exit_rates / gamma
    v = np.zeros((len(seen), law.n_phases))
    v[0] = seen[0] * alpha
    v[1:] = seen_phase
    v /= v.sum()
    terms = [1.0]
    while terms[-1] > eps and len(terms) < max_steps:
        ex = v @ out
        v = v @ step
        v[:-1] += ex[1:, None] * alpha[None, :]
        terms.append(float(v.sum()))
    return gamma, np.asarray(terms)


def ph_response_quantiles(law, seen, seen_phase, levels):
    """Quantiles of the response time with phase-type service (:func:`ph_response_terms`),
    by bisection on its survival function to ``1e-13`` relative."""
    return ph_mixture_quantiles([(1.0, law, seen, seen_phase)], levels)


def ph_mixture_quantiles(components, levels):
    """Quantiles of a mixture of the response-time laws of :func:`ph_response_terms`.

    ``components``: ``(weight, law, seen, seen_phase)`` each (weights sum to
    1; with pools one per pool: the share of accepted arrivals that go to the
    pool, the pool's law at its speed, and what they find there). The survival
    function is the weighted sum of the components' (each uniformized at its
    own rate); the quantiles are found by bisection on it to ``1e-13`` relative.
    """
    parts = []
    for w, law, seen, seen_phase in components:
        if w <= 0.0:
            continue
        gamma, a = ph_response_terms(law, seen, seen_phase)
        log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, len(a))))])
        parts.append((w, gamma, a, np.arange(len(a)), log_fact))

    def sf(t):
        total = 0.0
        for w, gamma, a, n, log_fact in parts:
            x = gamma * t
            if x <= 0.0:
                total += w
            else:
                total += w * float(np.exp(n * math.log(x) - x - log_fact) @ a)
        return total

    mean = sum(w * float(a.sum()) / gamma for w, gamma, a, _, _ in parts)
    out = []
    for q in levels:
        target = 1.0 - q
        lo, hi = 0.0, mean
        while sf(hi) > target:
            lo, hi = hi, 2.0 * hi
        while hi - lo > 1e-13 * hi:
            mid = 0.5 * (lo + hi)
            if sf(mid) > target:
                lo = mid
            else:
                hi = mid
        out.append(0.5 * (lo + hi))
    return np.asarray(out)
