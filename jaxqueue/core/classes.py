"""Server classes (pool and phase of the task in service): the static tables the
simulator, the policies and the exact solver share, and a start's class counts.

The simulator's use of them is described in :mod:`jaxqueue.sim.classes`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxqueue.core.rng import uniform_index
from jaxqueue.core.service import Pool, exponential
from jaxqueue.core.system import System

__all__ = [
    "Classes",
    "WAIT_TIE",
    "class_table",
    "count_at_least",
    "select",
    "shortest_expected_wait",
    "split_classes",
    "thresholds",
    "wait_ranks",
]

_SCALE = 2**32


class Classes(NamedTuple):
    """The static class table of a system (:func:`class_table`)."""

    pools: tuple  # Pool per pool (law filled in)
    base: tuple  # first class of each pool
    pool_of: tuple  # pool of each class
    rate: float  # gamma
    outcome: tuple  # per class: thresholds B_0..B_P (see _outcome)
    alpha: tuple  # per pool: thresholds of the initial phase
    n_classes: int


def thresholds(cum) -> tuple:
    """Cumulative probabilities as integer thresholds in ``[0, 2**32]``."""
    return tuple(int(min(_SCALE, max(0, round(float(c) * _SCALE)))) for c in cum)


@functools.lru_cache(maxsize=64)
def class_table(system: System) -> Classes:
    """The classes of ``system`` (one pool of the system's law when it has no pools).

    ``outcome[c]`` holds thresholds ``B_0 <= ... <= B_P`` over the pool's
    ``P`` phases: a word ``w < B_0`` completes the task, ``B_q <= w <
    B_{q+1}`` moves it to phase ``q``, ``w >= B_P`` does nothing.
    ``alpha[i]``: the initial phase of pool ``i`` is ``#{j: w >= A_j}``.
    """
    law0 = system.service if system.service is not None else exponential()
    pools = system.pools or (Pool(system.n_servers, 1.0, law0),)
    pools = tuple(Pool(p.count, p.speed, p.law or law0) for p in pools)
    gamma = max(p.speed * p.law.rate for p in pools)
    base, pool_of, outcome, alpha = [], [], [], []
    at = 0
    for i, pool in enumerate(pools):
        law, v = pool.law, pool.speed
        base.append(at)
        s = law.matrix
        for p in range(law.n_phases):
            pool_of.append(i)
            probs = [v * law.exit_rates[p] / gamma]
            probs += [0.0 if q == p else v * s[p, q] / gamma for q in range(law.n_phases)]
            outcome.append(thresholds(np.cumsum(probs)))
        alpha.append(thresholds(np.cumsum(law.alpha)[:-1]))
        at += law.n_phases
    return Classes(pools, tuple(base), tuple(pool_of), gamma, tuple(outcome), tuple(alpha), at)


def count_at_least(w, bounds):
    """``#{j: w >= bounds[j]}`` for static bounds in ``[0, 2**32]`` (int32)."""
    total = jnp.int32(0)
    for b in bounds:
        if b <= 0:
            total = total + 1
        elif b < _SCALE:
            total = total + (w >= jnp.uint32(b)).astype(jnp.int32)
    return total


def select(index, values):
    """``values[index]`` for a static tuple of int32 scalars (a where per entry)."""
    out = values[0]
    for j in range(1, len(values)):
        out = jnp.where(index == j, values[j], out)
    return out


#: Relative tolerance under which two expected waits are equal (``jsew`` ties);
#: the exact solver groups them the same way.
WAIT_TIE = 1e-9


@functools.lru_cache(maxsize=64)
def wait_ranks(system: System) -> np.ndarray:
    """int32 ``(levels + 1, C)``: the rank of ``(k + 1) * mean / speed`` of a
    server of class ``c`` holding ``k`` tasks among all such values (equal
    within :data:`WAIT_TIE`: equal ranks), for ``jsew``."""
    table = class_table(system)
    per = np.array([table.pools[i].law.mean / table.pools[i].speed for i in table.pool_of])
    waits = ((np.arange(system.levels + 1)[:, None] + 1.0) * per[None, :]).ravel()
    order = np.argsort(waits, kind="stable")
    ranked = waits[order]
    rank = np.empty(waits.size, np.int64)
    rank[order] = np.concatenate([[0], np.cumsum(np.diff(ranked) > WAIT_TIE * ranked[1:])])
    return rank.reshape(system.levels + 1, -1).astype(np.int32)


def shortest_expected_wait(classes, words, system: System):
    """``jsew``'s server: the level and class of a uniform server among those
    of least expected wait (with a finite buffer, among those with room;
    none: the top level, so the arrival is blocked). Two words."""
    levels = system.levels
    rank = jnp.asarray(wait_ranks(system))
    big = jnp.int32(np.iinfo(np.int32).max)
    room = classes > 0
    if system.buffer is not None:
        room = room & (jnp.arange(levels + 1)[:, None] < levels)
    ranked = jnp.where(room, rank, big)
    tied = jnp.where(ranked == ranked.min(), classes, 0).reshape(-1)
    total = tied.sum()
    pick = uniform_index(words[0], words[1], jnp.maximum(total, 1))
    flat = jnp.sum(jnp.cumsum(tied) <= pick, dtype=jnp.int32)
    n_cls = classes.shape[1]
    level = jnp.where(total > 0, flat // n_cls, levels)
    return level, jnp.where(total > 0, flat % n_cls, 0)


def split_classes(
    counts: np.ndarray, system: System, phase_share=None, pool_share=None
) -> np.ndarray:
    """Class counts of a start (host side): each pool gets its share of every
    level (largest remainders, the pools' counts kept exact), and a pool's
    busy servers are split over its phases by the law's in-service mix.

    Args:
        phase_share: ``(rows, C)``, the weight of each class (pool and phase)
            at queue length ``k`` (the mean field's joint law), used for the
            levels where a pool's classes have weight instead of the
            in-service mix.
        pool_share: ``(rows, pools)``, the weight of each pool at queue
            length ``k`` (the mean field's), used for the levels ``k >= 1``
            where it has weight instead of the pools' sizes (as far as the
            pools have servers left; level 0 takes what is left).
    """
    table = class_table(system)
    counts = np.asarray(counts, np.int64)
    sizes = np.array([p.count for p in table.pools], np.int64)
    # servers of each pool at each level: fill the levels from the top, pool
    # by pool in proportion to what each has left (or to the given shares)
    per_pool = np.zeros((counts.size, sizes.size), np.int64)
    left = sizes.copy()
    for k in range(counts.size - 1, -1, -1):
        c = int(counts[k])
        if k > 0 and pool_share is not None and k < len(pool_share) and np.sum(pool_share[k]) > 0:
            take = np.minimum(_largest_remainders(pool_share[k], c), left)
            if take.sum() < c:  # a pool out of servers: the rest by what is left
                take += _largest_remainders(left - take, c - int(take.sum()))
        else:
            take = _largest_remainders(left, c)
        per_pool[k] = take
        left -= take
    out = np.zeros((counts.size, table.n_classes), np.int64)
    for i, pool in enumerate(table.pools):
        b = table.base[i]
        out[0, b] = per_pool[0, i]
        mix = pool.law.in_service_mix()
        for k in range(1, counts.size):
            weights = mix
            if phase_share is not None and k < len(phase_share):
                row = np.asarray(phase_share[k], np.float64)[b : b + mix.size]
                if row.size == mix.size and row.sum() > 0:
                    weights = row
            out[k, b : b + mix.size] = _largest_remainders(weights, int(per_pool[k, i]))
    return out


def _largest_remainders(weights, total: int) -> np.ndarray:
    """Integers summing to ``total`` in proportion to ``weights`` (never above
    an integer weight when the weights are counts that sum to at least ``total``)."""
    w = np.asarray(weights, np.float64)
    if total == 0 or w.sum() == 0:
        return np.zeros(w.size, np.int64)
    raw = w / w.sum() * total
    row = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - row), kind="stable")
    row[order[: total - row.sum()]] += 1
    return row
