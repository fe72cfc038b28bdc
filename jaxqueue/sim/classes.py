"""Server classes (pool and phase of the task in service) in the occupancy
simulator: a replica's ``classes[k, c]`` counts the servers holding ``k``
tasks of class ``c``, and a step is the exponential one uniformized at the
largest class rate (:func:`service_outcome`, :func:`classes_after`). The
static tables are :mod:`jaxqueue.core.classes`'.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxqueue.core.classes import (
    WAIT_TIE,
    Classes,
    class_table,
    count_at_least,
    select,
    shortest_expected_wait,
    split_classes,
    thresholds,
    wait_ranks,
)
from jaxqueue.core.rng import uniform_index
from jaxqueue.core.system import System
from jaxqueue.policies.base import level_of

__all__ = [
    "Classes",
    "WAIT_TIE",
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


def _class_at(row, offset):
    """The class of the ``offset``-th server of a level whose class counts are ``row``.

    Servers are ordered by queue length, so the uniform index that picks a
    server, minus the servers above its level, is uniform over the servers of
    that level: it falls in class ``c`` with probability ``classes[k, c] /
    (servers at k)``. An arrival's server is chosen by queue length only,
    uniformly among the servers of its length (every exchangeable policy breaks
    ties uniformly), so its class is drawn the same way from one more uniform
    index. Both are exact.
    """
    return jnp.sum(jnp.cumsum(row) <= offset, dtype=jnp.int32)


def _above(tail, k, levels):
    """Servers holding more than ``k`` tasks (0 past the top level)."""
    return jnp.where(k < levels, tail[jnp.minimum(k + 1, levels)], 0)


def service_outcome(classes, tail, words, system: System):
    """The service event a departure step would be (one replica).

    A replica's state adds ``classes[k, c]`` to the occupancy tails: the
    servers holding exactly ``k`` tasks that are of class ``c`` (pool ``i``
    owns the classes ``base_i .. base_i + P_i - 1``, one per phase of its law;
    an idle server counts in row 0 at its pool's first class). The policies
    still see queue lengths only, so a step is the exponential one
    (:func:`jaxqueue.sim.step.occupancy_step`), uniformized at ``gamma``, the
    largest total rate of a class (a pool's speed times the total rate of a
    phase): a step is an arrival with probability ``lambda / (lambda +
    gamma)``; otherwise a uniformly random server is drawn, and if it is busy
    in class ``c`` (pool of speed ``v``, phase ``p``) its task completes with
    probability ``v s_p / gamma`` (``s = -S 1``), moves to phase ``q`` with
    probability ``v S[p][q] / gamma``, and nothing happens otherwise. A task
    that starts service draws its phase from the pool's ``alpha``. Decisions
    on these laws compare one random word with static uint32 thresholds
    (probabilities rounded to ``2**-33``); a step adds four words
    (:data:`jaxqueue.sim.state.PHASE_WORDS`): two for the arrival's index
    within its level, one for the service outcome, one for a new phase.

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
