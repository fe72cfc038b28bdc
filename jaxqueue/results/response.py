"""Response-time laws as Erlang mixtures, and with phase-type service (host side, numpy, float64).

An arrival that finds ``k`` tasks at its exponential FIFO server stays an
Erlang(``k + 1``, 1) time; the response time is the mixture over
``arrival_seen``, evaluated on the Poisson side in log space
(docs/simulation.md, "Response times without tagged tasks").
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
    "ph_response_mean",
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


def _sf_cdf_pdf(
    p: np.ndarray, t: np.ndarray, sums=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
        sums: ``(W, C)`` of ``p``, where the caller has them (:func:`_cumulative`).

    Returns:
        ``(sf, cdf, pdf)``, each of shape ``[..., Q]``.
    """
    k_max = p.shape[-1] - 1
    extra = int(10 * np.sqrt(k_max + 1.0)) + 40
    tail, head = _cumulative(p) if sums is None else sums
    pmf = _poisson_pmf(t, k_max + extra)
    low = pmf[..., : k_max + 1]
    sf = np.sum(low * tail, axis=-1)
    pdf = np.sum(low * p, axis=-1)  # the Erlang(k+1) density at t is pois(k; t)
    cdf_direct = np.sum(pmf[..., 1 : k_max + 1] * head[..., :-1], axis=-1) + np.sum(
        pmf[..., k_max + 1 :], axis=-1
    )
    cdf = np.where(sf > 0.5, cdf_direct, 1.0 - sf)
    return sf, cdf, pdf


def _cumulative(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``W_j = sum_{k >= j} p_k`` and ``C_j = sum_{k <= j} p_k`` along the last axis."""
    return np.cumsum(p[..., ::-1], axis=-1)[..., ::-1], np.cumsum(p, axis=-1)


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
    ``q = 0`` gives 0 and ``q = 1`` gives ``inf``. Each iteration evaluates
    only the problems (row, level) still open, so the cost is that of a few
    evaluations of every row, whatever the slowest one needs (2^17 replicas'
    histograms in about a second).

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
    rows = p.reshape(-1, p.shape[-1])  # (R, K + 1)
    n_rows, n_levels = rows.shape[0], levels.size
    # one problem a (row, level), flat; only the open ones are evaluated
    row = np.repeat(np.arange(n_rows), n_levels)
    level = np.tile(levels, n_rows)
    bad = np.isnan(rows[row, 0])
    out = np.where(level >= 1, np.inf, 0.0)
    out[bad] = np.nan
    open_ = np.flatnonzero((level > 0) & (level < 1) & ~bad)
    if open_.size:
        out[open_] = _solve_quantiles(rows, row[open_], level[open_])
    out = out.reshape(shape)
    return out[..., 0] if scalar else out


def _false_position(lo, hi, g_lo, g_hi):
    """The false-position point of brackets ``[lo, hi]`` with values ``g_lo >
    0 > g_hi`` at their ends, kept a tenth of the bracket away from each end
    (so that a bracket shrinks by at least a tenth a step); the midpoint
    where an end's value is not finite."""
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = g_lo / (g_lo - g_hi)
    frac = np.where(np.isfinite(frac), np.clip(frac, 0.1, 0.9), 0.5)
    return lo + frac * (hi - lo)


def _solve_quantiles(rows: np.ndarray, row: np.ndarray, level: np.ndarray) -> np.ndarray:
    """The quantiles at ``level`` (in (0, 1)) of the mixtures ``rows[row]``
    (flat problems), by a doubling bracket from the mean and Newton's method
    safeguarded by bisection, evaluating the open problems only."""
    tail, head = _cumulative(rows)
    upper = level >= 0.5  # solve on the survival side, else on the cdf side
    target = np.where(upper, 1.0 - level, level)
    log_target = np.log(target)

    def below_and_logratio(i, t):
        """Problems ``i`` at ``t``: below the quantile, log(side / target), its t-derivative.

        The survival side needs the Poisson terms up to ``K`` only; the
        distribution function side (levels below 1/2) the full sum."""
        r, up = row[i], upper[i]
        pmf = _poisson_pmf(t, rows.shape[-1] - 1)
        sf = np.einsum("ij,ij->i", pmf, tail[r])
        pdf = np.einsum("ij,ij->i", pmf, rows[r])
        side = sf
        if not up.all():
            low = np.flatnonzero(~up)
            rl = r[low]
            cdf = _sf_cdf_pdf(rows[rl, None], t[low, None], (tail[rl, None], head[rl, None]))[1]
            side = sf.copy()
            side[low] = cdf[:, 0]
        below = np.where(up, side > target[i], side < target[i])
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.log(side) - log_target[i]
            dg = np.where(up, -pdf, pdf) / side
        return below, g, dg

    mean = rows @ np.arange(1.0, rows.shape[-1] + 1.0)
    hi = mean[row].copy()
    lo = np.zeros_like(hi)
    # log(side / target) at the bracket's ends (side = sf: 1 at t = 0; cdf: 0, -inf)
    g_lo = np.where(upper, -log_target, -np.inf)
    g_hi = np.full_like(hi, np.nan)
    # Grow the upper end until it is at or above the quantile.
    grow = np.arange(row.size)
    for _ in range(_MAX_ITER):
        below, g, _ = below_and_logratio(grow, hi[grow])
        g_hi[grow] = g
        grow = grow[below]
        if not grow.size:
            break
        lo[grow], g_lo[grow] = hi[grow], g_hi[grow]
        hi[grow] = 2.0 * hi[grow]
    else:  # pragma: no cover - needs weights beyond any realistic K
        raise RuntimeError("could not bracket the quantile")

    # Newton from the bracket's false-position point; a step that leaves the
    # bracket is replaced by false position (bisection where an end's value is
    # not finite), which converges fast where the root is near an end
    t = _false_position(lo, hi, g_lo, g_hi)
    todo = np.arange(row.size)
    for _ in range(_MAX_ITER):
        tt = t[todo]
        below, g, dg = below_and_logratio(todo, tt)
        lo_i = np.where(below, tt, lo[todo])
        hi_i = np.where(below, hi[todo], tt)
        glo_i = np.where(below, g, g_lo[todo])
        ghi_i = np.where(below, g_hi[todo], g)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_new = tt - g / dg
        inside = np.isfinite(t_new) & (t_new > lo_i) & (t_new < hi_i)
        t_new = np.where(inside, t_new, _false_position(lo_i, hi_i, glo_i, ghi_i))
        converged = (np.abs(t_new - tt) <= _REL_TOL * t_new) | (hi_i - lo_i <= _REL_TOL * hi_i)
        lo[todo], hi[todo], t[todo] = lo_i, hi_i, t_new
        g_lo[todo], g_hi[todo] = glo_i, ghi_i
        todo = todo[~converged]
        if not todo.size:
            break
    else:  # pragma: no cover
        raise RuntimeError("quantile iteration did not converge")
    return t


# ---- phase-type service -------------------------------------------------------


#: Most Poisson weights one bisection step of :func:`ph_mixture_quantiles` holds at once.
_CHUNK = 1 << 22


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
        seen: ``(..., cap)``, the law (or counts) of the tasks found (``k =
            0..cap-1``; only ``k = 0`` is read); leading axes are samples.
        seen_phase: ``(..., cap - 1, P)``, the joint law of ``k >= 1`` and the phase.
        eps: stop when every ``a_n < eps`` (the error this leaves in ``P(T > t)``).

    Returns:
        ``(gamma, a)``: the rate and the float64 array ``a_0 = 1 >= a_1 >=
        ...`` (``(..., n)`` with sample axes; a sample of no weight has ``a = 0``).
    """
    alpha = np.asarray(law.alpha)
    gamma = law.rate
    step = np.eye(law.n_phases) + law.matrix / gamma
    out = law.exit_rates / gamma
    seen = np.asarray(seen, np.float64)
    seen_phase = np.asarray(seen_phase, np.float64)
    batch = seen.shape[:-1]
    v = np.zeros(batch + (seen.shape[-1], law.n_phases))
    v[..., 0, :] = seen[..., :1] * alpha
    v[..., 1:, :] = seen_phase
    total = v.sum(axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(total[..., None, None] > 0, v / total[..., None, None], 0.0)
    terms = [v.sum(axis=(-2, -1))]
    while np.max(terms[-1], initial=0.0) > eps and len(terms) < max_steps:
        ex = v @ out
        v = v @ step
        v[..., :-1, :] += ex[..., 1:, None] * alpha
        terms.append(v.sum(axis=(-2, -1)))
    return gamma, np.stack(terms, axis=-1)


def ph_response_quantiles(law, seen, seen_phase, levels):
    """Quantiles of the response time with phase-type service (:func:`ph_response_terms`),
    by bisection on its survival function to ``1e-13`` relative."""
    return ph_mixture_quantiles([(1.0, law, seen, seen_phase)], levels)


def ph_mixture_quantiles(components, levels):
    """Quantiles of a mixture of the response-time laws of :func:`ph_response_terms`.

    ``components``: ``(weight, law, seen, seen_phase)`` each (weights sum to
    1; with pools one per pool: the share of accepted arrivals that go to the
    pool, the pool's law at its speed, and what they find there). The
    weights and the laws found may have leading sample axes (the weights
    ``(...,)``, ``seen`` ``(..., cap)``, ``seen_phase`` ``(..., cap - 1,
    P)``): one mixture per sample, all solved together; a sample of no weight
    gives NaN. The survival function is the weighted sum of the components'
    (each uniformized at its own rate); the quantiles are found by bisection
    on it to ``1e-13`` relative.

    Returns:
        float64 ``(..., Q)`` for the ``Q`` levels.
    """
    levels = np.asarray(levels, np.float64)
    parts = []
    for w, law, seen, seen_phase in components:
        w = np.asarray(w, np.float64)
        if not np.any(w > 0.0):
            continue
        gamma, a = ph_response_terms(law, seen, seen_phase)
        parts.append((w, gamma, a))
    batch = np.broadcast_shapes(*(np.shape(w) for w, _, _ in parts)) if parts else ()
    flat = [
        (
            np.broadcast_to(w, batch).reshape(-1),
            g,
            np.broadcast_to(a, batch + a.shape[-1:]).reshape(-1, a.shape[-1]),
        )
        for w, g, a in parts
    ]
    rows = int(np.prod(batch, dtype=np.int64))
    # bisect a chunk of samples at a time: the Poisson weights are (rows, Q, terms)
    per = max(1, _CHUNK // max(1, levels.size * max((a.shape[-1] for _, _, a in flat), default=1)))
    out = [
        _bisect(
            [(w[i : i + per], g, a[i : i + per]) for w, g, a in flat], levels, min(per, rows - i)
        )
        for i in range(0, rows, per)
    ]
    return (
        np.concatenate(out).reshape(batch + levels.shape)
        if out
        else np.full(batch + levels.shape, np.nan)
    )


def _bisect(parts, levels, rows):
    """The quantiles at ``levels`` of ``rows`` mixtures ``sum_i w_i (gamma_i, a_i)``
    (:func:`ph_mixture_quantiles`), ``(rows, Q)``; NaN for a row of no weight."""

    def sf(t):  # t: (rows, Q)
        total = np.zeros(t.shape)
        for w, gamma, a in parts:
            n = np.arange(a.shape[-1])
            x = gamma * t[..., None]
            log_x = np.log(np.where(x > 0.0, x, 1.0))
            pmf = np.exp(n * log_x - x - _log_factorials(a.shape[-1] - 1))
            pmf = np.where(x > 0.0, pmf, (n == 0).astype(np.float64))  # x = 0: all mass at n = 0
            total += w[:, None] * np.einsum("rqn,rn->rq", pmf, a)
        return total

    mean = sum(w * a.sum(axis=-1) / gamma for w, gamma, a in parts) + np.zeros(rows)
    target = np.broadcast_to(1.0 - levels, (rows, levels.size))
    lo = np.zeros(target.shape)
    hi = np.broadcast_to(mean[:, None], target.shape).copy()
    empty = ~(hi > 0.0)  # no weight
    hi[empty] = 1.0
    while True:
        low = (sf(hi) > target) & ~empty
        if not low.any():
            break
        lo, hi = np.where(low, hi, lo), np.where(low, 2.0 * hi, hi)
    while True:
        wide = (hi - lo > 1e-13 * hi) & ~empty
        if not wide.any():
            break
        mid = 0.5 * (lo + hi)
        above = sf(mid) > target
        lo = np.where(wide & above, mid, lo)
        hi = np.where(wide & ~above, mid, hi)
    return np.where(empty, np.nan, 0.5 * (lo + hi))


def ph_response_mean(law, seen, seen_phase) -> np.ndarray:
    """Mean response time of the arrivals a law of what they find describes
    (:func:`ph_response_terms`'s arguments; need not be normalised).

    A task that finds the server empty stays one service (``mean``); one that
    finds ``k >= 1`` tasks with the one in service in phase ``p`` stays the
    residual from ``p`` (``((-S)^-1 1)_p``), ``k - 1`` services and its own:
    ``r_p + k mean``.

    Returns:
        float64 of the sample shape ``(...)``; NaN for a sample of no weight.
    """
    seen = np.asarray(seen, np.float64)
    seen_phase = np.asarray(seen_phase, np.float64)
    residual = np.linalg.solve(-np.asarray(law.matrix, np.float64), np.ones(law.n_phases))
    k = np.arange(1, seen_phase.shape[-2] + 1, dtype=np.float64)[:, None]
    total = seen[..., 0] + seen_phase.sum(axis=(-2, -1))
    busy = np.sum(seen_phase * (residual[None, :] + k * law.mean), axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (seen[..., 0] * law.mean + busy) / total, np.nan)
