"""Distinct probes: the shortest of ``d`` distinct uniformly random items, for every ``d``.

Floyd's algorithm draws the ``d`` probes one by one for ``d <= MAX_PROBES``;
past it the shortest is read off the occupancy tail by its inverse CDF,
``C(t_k, d) / C(n, d)``, from a table of every count or evaluated in float32
(derivation and accuracy: docs/policies.md, "Probes of many servers").
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.rng import uniform_index

__all__ = [
    "MAX_PROBES",
    "MAX_TAIL_ITEMS",
    "MAX_TABLE_ITEMS",
    "max_of_distinct",
    "log_choose_ratio",
    "choose_ratio_table",
    "draws_by_table",
    "open_uniform",
    "log_uniform",
    "shortest_by_tail",
    "distinct_tail",
]

#: Largest ``d`` whose distinct probes are drawn one by one (Floyd's algorithm,
#: O(d^2) per event); a larger ``d`` is drawn from the tail at O(levels).
MAX_PROBES = 64
#: Most items (servers, or dispatchers) the tail's draw takes: its counts are exact
#: float32 integers (``2**24 - 1``, the largest ``n`` its accuracy was measured at).
MAX_TAIL_ITEMS = 2**24 - 1
#: Most counts below ``n`` a table of ``P_k`` holds (float32, a constant of the
#: compiled step: 4 MiB); a larger ``n`` takes one where the counts below it
#: have ``P_k < 2**-64``. Else, or where ``n`` is traced, :func:`log_choose_ratio`.
MAX_TABLE_ITEMS = 2**20

_F32 = jnp.float32
#: ``lnGamma(k + 1) - k ln k + k`` for ``k = 0..7``; :func:`_stirling` past them.
_RHO = tuple(math.lgamma(k + 1) - (k * math.log(k) if k else 0.0) + k for k in range(8))
#: ``ln k`` for ``k = 1..7`` (0 at ``k = 0``, unused).
_LOG = tuple(math.log(k) if k else 0.0 for k in range(8))
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def max_of_distinct(words: jax.Array, n, d: int) -> jax.Array:
    """Largest element of a uniformly random ``d``-subset of ``[0, n)``.

    Floyd's algorithm: for ``j = n-d, ..., n-1`` draw ``t`` uniform on
    ``[0, j]`` and add ``t``, or ``j`` if ``t`` was already chosen. Uses ``2d``
    words. ``n >= d`` is required.
    """
    if d == 1:
        return uniform_index(words[0], words[1], n)
    if d <= 8:  # unrolled: d(d-1)/2 comparisons
        chosen = []
        for i in range(d):
            j = n - d + i
            t = uniform_index(words[2 * i], words[2 * i + 1], j + 1)
            dup = jnp.bool_(False)
            for c in chosen:
                dup = dup | (c == t)
            chosen.append(jnp.where(dup, j, t))
        return functools.reduce(jnp.maximum, chosen)
    chosen = jnp.full((d,), -1, jnp.int32)
    words = jnp.stack([words[k] for k in range(2 * d)])  # an array (the words may be a tuple)

    def body(i, chosen):
        j = n - d + i
        t = uniform_index(words[2 * i], words[2 * i + 1], j + 1)
        pick = jnp.where(jnp.any(chosen == t), j, t)
        return chosen.at[i].set(pick)

    chosen = jax.lax.fori_loop(0, d, body, chosen)
    return jnp.max(chosen)


def _stirling(x):
    """``lnGamma(x + 1) - (x + 1/2) ln x + x - ln(2 pi) / 2`` for ``x >= 8`` (error < 1e-9)."""
    y = 1.0 / (x * x)
    return (1.0 / 12.0 - y * (1.0 / 360.0 - y * (1.0 / 1260.0))) / x


def _log1p_pair(x):
    """``(log(1 + x), log(1 + x) - x)`` for ``x >= 0`` in float32.

    Below ``x = 1/2`` a series in ``u = x / (2 + x)`` (``log(1 + x) = 2
    atanh(u)``, ``u <= 1/5``), which keeps the second without cancellation
    and needs no logarithm (XLA's CPU ``log1p`` costs about three ``log``);
    above, ``log(1 + x)``.
    """
    u = x / (2.0 + x)
    v = u * u
    odd = 1.0 / 3.0 + v * (1.0 / 5.0 + v * (1.0 / 7.0 + v * (1.0 / 9.0 + v * (1.0 / 11.0))))
    tail = 2.0 * u * v * odd
    small = x < 0.5
    big = jnp.log(jnp.where(small, 1.5, 1.0 + x))
    return jnp.where(small, 2.0 * u + tail, big), jnp.where(
        small, tail - 2.0 * v / (1.0 - u), big - x
    )


def _small(k, values):
    """``values[k]`` for an integer array ``k`` (0 elsewhere): selects, no gather."""
    return sum(jnp.where(k == i, _F32(v), _F32(0.0)) for i, v in enumerate(values))


def log_choose_ratio(t, n, d, log_n=None) -> jax.Array:
    """``log(C(t, d) / C(n, d))`` in float32 (``-inf`` for ``t < d``), ``0 <= t <= n < 2**24``.

    With ``r = t - d``, ``g = n - t``, ``m = min(d, g)``, ``c = max(d, g)`` it is
    minus the mixed second difference of ``lnGamma(x + 1)`` at ``r`` with steps
    ``m`` and ``c``, split into ``x ln x`` terms (each a multiple of
    ``log(1 + y) - y`` or of ``log(1 + y)``) and Stirling remainders (exact
    constants below 8): every term is about as large as the result, so its
    error is a few float32 ulps of that (docs/policies.md has the figures).
    ``d``: an int (the simulator's) or an int array; ``log_n``: ``log(n)``,
    where the caller has it.
    """
    t = jnp.asarray(t, jnp.int32)
    n = jnp.asarray(n, jnp.int32)
    nf = n.astype(_F32)
    log_n = jnp.log(nf) if log_n is None else log_n
    r_int = jnp.maximum(t - d, 0)
    r = r_int.astype(_F32)
    g = (n - t).astype(_F32)
    df = jnp.asarray(d).astype(_F32)
    m = jnp.minimum(g, df)
    c = jnp.maximum(g, df)
    rc, rm = r + c, r + m
    rs = jnp.where(r_int > 0, r, 1.0)
    l1, lm1 = _log1p_pair(m / rc)
    l2, lm2 = _log1p_pair(m / rs)
    l3, _ = _log1p_pair(c / jnp.where(rm > 0, rm, 1.0))
    # x ln x at r + c + m, r + c, r + m, r (the linear parts cancel)
    main = rc * lm1 - jnp.where(r_int > 0, rs * lm2, -m) + m * l3
    # lnGamma(x + 1) - x ln x + x: (1/2) ln(2 pi x) + _stirling(x), or a constant below 8
    rest = 0.5 * l1 + _stirling(nf) - _stirling(rc)
    rm8 = jnp.maximum(rm, 8.0)
    # ln(r + m) from the logs at hand: ln r + l2, or ln n - l3 at r = 0 (n = c + m)
    log_rm = jnp.where(r_int > 0, _small(r_int, _LOG) + l2, log_n - l3)
    rho_rm = jnp.where(
        rm < 8.0, _small(rm.astype(jnp.int32), _RHO), _HALF_LOG_2PI + 0.5 * log_rm + _stirling(rm8)
    )
    lower = jnp.where(
        r_int >= 8,
        0.5 * l2 + _stirling(rm8) - _stirling(jnp.maximum(r, 8.0)),
        rho_rm - _small(r_int, _RHO),
    )
    out = -(main + rest - lower)
    return jnp.where(t >= d, out, -jnp.inf)


def open_uniform(hi: jax.Array, lo: jax.Array) -> jax.Array:
    """``u = (hi * 2**32 + lo) / 2**64`` in float32, at most ``1 - 2**-24`` (0 only at ``0, 0``).

    ``u`` is rounded to float32 (relative ``2**-24``) and kept below 1, so
    that a level every item reaches (``P = 1``) is always drawn; below
    ``2**-32`` the low word carries ``u``.
    """
    top = jnp.minimum(hi.astype(_F32) + lo.astype(_F32) * _F32(2.0**-32), _F32(2.0**32 - 256))
    return jnp.where(hi > 0, top * _F32(2.0**-32), lo.astype(_F32) * _F32(2.0**-64))


def log_uniform(hi: jax.Array, lo: jax.Array) -> jax.Array:
    """``log u`` in float32 for :func:`open_uniform`'s ``u``: below 0 (``-inf`` at 0)."""
    return jnp.log(open_uniform(hi, lo))


@functools.lru_cache(maxsize=8)
def choose_ratio_table(n: int, d: int) -> tuple[np.ndarray, int] | None:
    """``(table, first)``: ``table[j] = C(first + j, d) / C(n, d)`` for ``first + j = first..n``
    in float32 (0 below ``d``), read-only; None where no table serves.

    ``first = max(0, n - MAX_TABLE_ITEMS)``: a count below it reads
    ``table[0]``, which must then be below ``2**-64`` (drawn by no ``u`` but
    0), else None. The logarithm is summed in float64 from ``t = n`` down (a
    step ``log(C(t, d) / C(t - 1, d)) = log1p(d / (t - d))``), exponentiated
    and rounded once to float32: a relative error of ``2**-24``
    (docs/policies.md).
    """
    first = max(0, n - MAX_TABLE_ITEMS)
    low = max(first, d)  # the first count with P > 0
    steps = np.log1p(d / np.arange(low + 1 - d, n - d + 1, dtype=np.float64))  # t = low + 1 .. n
    log_p = np.full(n + 1 - first, -np.inf)
    log_p[low - first : n - first] = -np.cumsum(steps[::-1])[::-1]
    log_p[n - first] = 0.0
    if first > 0 and log_p[0] >= -64.0 * math.log(2.0):
        return None
    table = np.exp(log_p).astype(np.float32)
    table.flags.writeable = False
    return table, first


def draws_by_table(n, d: int) -> bool:
    """Whether :func:`shortest_by_tail` at ``n`` items reads a table (no logarithms):
    ``n`` a static int with :func:`choose_ratio_table`; a traced ``n`` (a batch of
    other sizes) takes the formula."""
    return isinstance(n, (int, np.integer)) and choose_ratio_table(int(n), int(d)) is not None


def _at(tail, k):
    """``tail[k]`` for a traced level ``k``: a gather, or in the register layout
    selects over the levels."""
    if isinstance(tail, tuple):
        return sum(jnp.where(k == j, t, 0) for j, t in enumerate(tail))
    return tail[k]


def shortest_by_tail(tail, n, d: int, words: jax.Array) -> jax.Array:
    """Length of the shortest of ``d`` distinct uniform items, from the tail (2 words).

    The shortest has at least ``k`` tasks with probability
    ``P_k = C(tail[k], d) / C(n, d)``, non-increasing in ``k``; with ``u``
    uniform the level is the largest ``k`` with ``P_k > u`` (``P_0 = 1``),
    the same law as Floyd's draw. For a static ``n`` with a table
    (:func:`choose_ratio_table`) it is the count of levels ``k >= 1`` with
    ``table[tail[k] - first] > u``: one read and compare a level; else (``n``
    traced, or no table) a bisection over the levels (``ceil(log2(levels +
    1))`` evaluations of :func:`log_choose_ratio`, against ``log u``).
    ``tail`` is one replica's array or the register layout's tuple of
    per-level vectors.
    """
    found = choose_ratio_table(int(n), int(d)) if isinstance(n, (int, np.integer)) else None
    if found is not None:
        table, first = jnp.asarray(found[0]), found[1]
        u = open_uniform(words[0], words[1])
        index = (lambda t: t) if first == 0 else (lambda t: jnp.maximum(t - first, 0))
        if isinstance(tail, tuple):
            return sum((table[index(t)] > u).astype(jnp.int32) for t in tail[1:])
        return jnp.sum(table[index(tail[1:])] > u, dtype=jnp.int32)
    log_u = log_uniform(words[0], words[1])
    log_n = jnp.log(jnp.asarray(n, jnp.int32).astype(_F32))
    levels = len(tail) - 1 if isinstance(tail, tuple) else tail.shape[0] - 1
    lo = jnp.zeros_like(log_u, jnp.int32)  # P_lo > u
    hi = lo + levels  # P_{hi + 1} <= u (P past the last level is 0)
    for _ in range(levels.bit_length()):
        mid = (lo + hi + 1) // 2
        inside = log_choose_ratio(_at(tail, mid), n, d, log_n) > log_u
        lo, hi = jnp.where(inside, mid, lo), jnp.where(inside, hi, mid - 1)
    return lo


def _log_falling(x, d: int):
    """``sum_{i<d} log(1 - i x)`` (``d`` static): the series
    ``-sum_k x^k S_k / k`` (``S_k = sum_{i<d} i^k``) where ``x d < 1e-4``,
    else ``d log x + lnGamma(1/x + 1) - lnGamma(1/x - d + 1)``."""
    s1 = d * (d - 1) / 2.0
    s2 = (d - 1) * d * (2 * d - 1) / 6.0
    s3 = s1 * s1
    s4 = s2 * (3.0 * d * d - 3.0 * d - 1.0) / 5.0
    small = x * d < 1e-4
    xs = jnp.where(small, x, 1.0)
    xd = jnp.where(small, 1.0, x)
    series = -xs * (s1 + xs * (s2 / 2.0 + xs * (s3 / 3.0 + xs * s4 / 4.0)))
    y = 1.0 / xd
    exact = (
        d * jnp.log(xd) + jax.lax.lgamma(y + 1.0) - jax.lax.lgamma(jnp.maximum(y - d, 0.0) + 1.0)
    )
    return jnp.where(small, series, exact)


def distinct_tail(p, d: int, inv):
    """``P(d distinct items drawn from a population of 1 / inv all lie in a fraction p)``.

    ``prod_{i<d} (p - i inv) / (1 - i inv)`` (sampling without replacement),
    which is ``p**d`` at ``inv = 0``: the product itself for ``d <= MAX_PROBES``;
    past it a closed form in ``lnGamma`` (0 where ``p / inv < d - 1`` or where
    ``p**d`` underflows), differentiable in ``inv`` at 0 (a series there).
    """
    if d <= MAX_PROBES:
        out = jnp.ones_like(p)
        for i in range(d):
            out = out * (p - i * inv) / (1.0 - i * inv)
        return out
    # below exp(-700 / d) the tail is 0 in float64 (p**d underflows): 0, and so are its
    # derivatives (inv / p would divide 0 by 0 there)
    positive = (p * 1.0 > (d - 1) * inv) & (p > math.exp(-700.0 / d))
    ps = jnp.where(positive, p, 1.0)
    log_p = d * jnp.log(ps) + _log_falling(inv / ps, d) - _log_falling(inv, d)
    return jnp.where(positive, jnp.exp(log_p), 0.0)
