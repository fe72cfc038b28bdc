"""Server classes: phase-type service and pools of servers in the occupancy simulator.

A server's *class* is its pool and the phase of the task it serves. With a
phase-type law ``PH(alpha, S)`` (:mod:`jaxqueue.core.service`) and pools of
servers of their own speeds and laws (:class:`~jaxqueue.core.service.Pool`),
a replica's state adds ``classes[k, c]``: the servers holding exactly ``k``
tasks that are of class ``c`` (pool ``i`` owns the classes ``base_i ..
base_i + P_i - 1``, one per phase of its law; an idle server counts in row 0
at its pool's first class). The policies still see queue lengths only (the
occupancy tails are kept as before), so a step is the exponential one
(:func:`jaxqueue.sim.step.occupancy_step`) with two additions:

* Uniformization at ``gamma``, the largest total rate of a class (a pool's
  speed times the total rate of a phase). A step is an arrival with
  probability ``lambda / (lambda + gamma)``; otherwise a uniformly random
  server is drawn, and if it is busy in class ``c`` (pool ``i`` of speed
  ``v``, phase ``p``) its task completes with probability ``v s_p / gamma``
  (``s = -S 1``), moves to phase ``q`` with probability ``v S[p][q] /
  gamma``, and nothing happens otherwise. A task that starts service (at an
  idle server, or the next in line after a completion) draws its phase from
  the pool's ``alpha``.
* The class of a server chosen by its queue length. Servers are ordered by
  queue length, so the uniform index that picks a departing server, minus
  the servers above its level, is uniform over the servers of that level: it
  falls in class ``c`` with probability ``classes[k, c] / (servers at k)``.
  An arrival's server is chosen by queue length only, uniformly among the
  servers of its length (every exchangeable policy breaks ties uniformly), so
  its class is drawn the same way from one more uniform index. Both are exact.

Decisions on the laws use static uint32 thresholds (probabilities rounded to
``2**-33``) compared with one random word each. Four words per step are
added (:data:`jaxqueue.sim.state.PHASE_WORDS`): two for the arrival's index
within its level, one for the service outcome, one for a new phase.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxqueue.core.rng import uniform_index
from jaxqueue.core.service import Pool, exponential
from jaxqueue.core.system import System
from jaxqueue.policies.base import level_of

__all__ = [
    "Classes",
    "class_table",
    "service_outcome",
    "classes_after",
    "split_classes",
    "wait_ranks",
    "shortest_expected_wait",
    "thresholds",
    "count_at_least",
    "select",
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


def _class_at(row, offset):
    """The class of the ``offset``-th server of a level whose class counts are ``row``."""
    return jnp.sum(jnp.cumsum(row) <= offset, dtype=jnp.int32)


def _above(tail, k, levels):
    """Servers holding more than ``k`` tasks (0 past the top level)."""
    return jnp.where(k < levels, tail[jnp.minimum(k + 1, levels)], 0)


def service_outcome(classes, tail, words, system: System):
    """The service event a departure step would be (one replica).

    ``words[1:3]`` drew the departing server's index (as in the occupancy
    step). Returns ``(level, class, outcome)``: the server's queue length,
    its class, and ``0`` (completes), ``1 + q`` (moves to phase ``q`` of its
    pool) or ``P + 1`` (nothing; also for an idle server).
    """
    table = class_table(system)
    u = uniform_index(words[1], words[2], system.n_servers)
    k = level_of(tail, u)
    c = _class_at(classes[k], u - _above(tail, k, system.levels))
    outcome = select(c, tuple(count_at_least(words[-2], b) for b in table.outcome))
    return k, c, outcome


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


def classes_after(
    classes, tail, words, is_arrival, up, service, system: System, arrival_class=None
):
    """The class counts after a step (one replica).

    Args:
        classes: int32 ``(levels + 1, C)``, before the step.
        tail: int32 ``(levels + 1,)``, the tails before the step.
        words: the step's words (the last four: the arrival's index within
            its level, the outcome word, the new phase word).
        is_arrival: bool, the step is an arrival.
        up: int32, the level that gained a server (an accepted arrival's
            queue length after it; past ``levels``: none), from the occupancy step.
        service: :func:`service_outcome` of the step.
        system: static.
        arrival_class: the class of the server the arrival joins, when the
            policy chose it (``jsew``); ``None``: a uniform server of its level.

    Returns:
        ``(classes, found)``: the counts after the step, and what the step
        found, which the blocks count (``Stats.by_class``): for an accepted
        arrival, ``k * C + c`` for ``k`` tasks at its server of class ``c``
        (an idle server is in its pool's first class; the response-time law,
        :mod:`jaxqueue.results.response`); for a real service candidate, ``(levels +
        1) * C + k * C + c`` for the server it drew, before the step (the
        candidates are a Poisson process independent of the state, so these
        are a time-uniform sample of the servers' levels and classes: each
        pool's occupancy); ``2 (levels + 1) * C`` for neither.
    """
    table = class_table(system)
    levels, n_cls = system.levels, table.n_classes
    k_dep, c_dep, outcome = service
    n_ph = select(c_dep, tuple(jnp.int32(table.pools[i].law.n_phases) for i in table.pool_of))
    busy = ~is_arrival & (k_dep >= 1)
    completes = busy & (outcome == 0)
    moves = busy & (outcome >= 1) & (outcome <= n_ph)

    # the server an accepted arrival joins: a uniform one of its level
    joins = is_arrival & (up <= levels)
    k = jnp.clip(up - 1, 0, levels)
    size = tail[k] - _above(tail, k, levels)
    if arrival_class is None:
        c_arr = _class_at(classes[k], uniform_index(words[-4], words[-3], jnp.maximum(size, 1)))
    else:
        c_arr = arrival_class

    # the pool of the server whose task starts or ends, and a new phase in it
    c_pool = jnp.where(is_arrival, c_arr, c_dep)
    pool = select(c_pool, tuple(jnp.int32(i) for i in table.pool_of))
    base = select(pool, tuple(jnp.int32(b) for b in table.base))
    start = base + select(pool, tuple(count_at_least(words[-1], a) for a in table.alpha))

    # one count leaves a (level, class) and one enters another; past the end: none
    nowhere = (levels + 1) * n_cls
    flat = lambda lv, c: lv * n_cls + c  # noqa: E731
    leave = jnp.where(
        joins, flat(k, c_arr), jnp.where(completes | moves, flat(k_dep, c_dep), nowhere)
    )
    enter = jnp.where(
        joins,
        flat(k + 1, jnp.where(k == 0, start, c_arr)),
        jnp.where(
            moves,
            flat(k_dep, base + outcome - 1),
            jnp.where(completes, flat(k_dep - 1, jnp.where(k_dep >= 2, start, base)), nowhere),
        ),
    )
    out = classes.reshape(-1).at[leave].add(-1, mode="drop").at[enter].add(1, mode="drop")
    # a real candidate: not an arrival, and not thinned out by the source (outcome -1)
    candidate = ~is_arrival & (outcome >= 0)
    found = jnp.where(
        joins, flat(k, c_arr), jnp.where(candidate, nowhere + flat(k_dep, c_dep), 2 * nowhere)
    )
    return out.reshape(classes.shape), found


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
