"""A replica's state: its Markov state (occupancy tails, per-server lists) and running sums.

One replica's Markov state is its occupancy tails (exchangeable form):

* ``tail[k]`` (k = 0..levels): servers holding at least ``k`` tasks; ``tail[0] = N``;
* ``iq_tail[j]`` (j = 0..iqueue_levels): dispatchers listing at least ``j``
  idle servers (JIQ family with ``M > 1``; shape ``(1,)`` otherwise), and
  ``iq_listed[j]``: idle servers listed in I-queues of size at least ``j``
  (derivable from ``iq_tail`` by a suffix sum, kept so that a delete request
  finds its I-queue without a scan);
* for the per-server policies, their :class:`~jaxqueue.sim.per_server.Lists`.

The running sums (:class:`Stats`) are what the estimators read.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.system import System
from jaxqueue.policies.base import Policy
from jaxqueue.sim.per_server import N_WORDS, Lists, init_lists

__all__ = ["Core", "Stats", "State", "init", "zero_stats", "core_from_counts", "n_words", "iq_width"]


class Core(NamedTuple):
    """The Markov state of one replica (int32 arrays)."""

    tail: jax.Array  # (levels + 1,)
    iq_tail: jax.Array  # (iqueue_levels + 1,) or (1,)
    iq_listed: jax.Array  # (iqueue_levels + 1,) or (1,): listed servers in I-queues of size >= j
    lists: Lists | None = None  # per-server state (JIQ-Original, JIQ-Threshold)


class Stats(NamedTuple):
    """Running sums of one replica's measurements since the last reset.

    Time averages (``tail_sum / steps`` etc.) are sums of the per-step
    fractions ``tail / N`` and ``iq_tail / M`` (Kahan pairs ``*_sum``,
    ``*_comp``). ``seen[k]`` counts accepted arrivals that found ``k`` tasks.
    """

    tail_sum: jax.Array  # float32 (levels + 1,)
    tail_comp: jax.Array
    iq_sum: jax.Array  # float32 (iq_width,)
    iq_comp: jax.Array
    seen: jax.Array  # int32 (levels + 1,)
    arrivals: jax.Array  # int32 scalars from here on
    blocked: jax.Array
    overflow: jax.Array
    iq_overflow: jax.Array
    joins: jax.Array
    deletes: jax.Array
    probes: jax.Array
    stale: jax.Array
    steps: jax.Array


class State(NamedTuple):
    """A replica: its Markov state and its running sums."""

    core: Core
    stats: Stats


def iq_width(system: System, policy: Policy) -> int:
    """Length of the accumulated I-queue tail: ``iqueue_levels + 1``, or 2 for ``M = 1``."""
    if not policy.uses_iqueues:
        return 1
    if system.n_dispatchers == 1 and not policy.per_server:
        return 2
    return system.iqueue_levels + 1


def n_words(system: System, policy: Policy) -> int:
    """Random words one step consumes: event type, then the larger of the branches."""
    if policy.per_server:
        return N_WORDS
    departure = 2 + policy.idle_words(system)
    return 1 + max(departure, policy.route_words(system))


def zero_stats(system: System, policy: Policy) -> Stats:
    """Running sums set to zero (single replica)."""
    f = lambda n: jnp.zeros((n,), jnp.float32)  # noqa: E731
    i = jnp.int32(0)
    w = iq_width(system, policy)
    return Stats(
        f(system.levels + 1), f(system.levels + 1), f(w), f(w),
        jnp.zeros((system.levels + 1,), jnp.int32), i, i, i, i, i, i, i, i, i,
    )  # fmt: skip


def core_from_counts(counts, iq_counts, system: System, policy: Policy) -> Core:
    """Build a Core from occupancy counts (host side, numpy).

    Args:
        counts: int ``(levels + 1,)``, servers with exactly k tasks (sums to N).
        iq_counts: int ``(iqueue_levels + 1,)``, dispatchers listing exactly j
            servers (sums to M, and ``sum j * iq_counts[j]`` equals the idle
            servers), or ``None`` when the policy has no I-queues or ``M = 1``.
    """
    counts = np.asarray(counts, np.int64)
    tail = np.cumsum(counts[::-1])[::-1]
    as32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    if policy.per_server:
        lists = init_lists(counts, system, policy.threshold)
        sizes = np.asarray(lists.sizes)
        iq_tail = (sizes[None, :] >= np.arange(system.iqueue_levels + 1)[:, None]).sum(axis=1)
        return Core(as32(tail), as32(iq_tail), as32([0]), lists)
    if policy.uses_iqueues and system.n_dispatchers > 1:
        iq_counts = np.asarray(iq_counts, np.int64)
        iq_tail = np.cumsum(iq_counts[::-1])[::-1]
        sizes = np.arange(iq_counts.size)
        iq_listed = np.cumsum((sizes * iq_counts)[::-1])[::-1]
    else:
        iq_tail = np.array([system.n_dispatchers])
        iq_listed = np.array([0])
    return Core(as32(tail), as32(iq_tail), as32(iq_listed))


def init(counts, iq_counts, system: System, policy: Policy) -> State:
    """A replica's State from occupancy counts, with zeroed running sums."""
    return State(core_from_counts(counts, iq_counts, system, policy), zero_stats(system, policy))
