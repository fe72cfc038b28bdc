"""A replica's state: its Markov state (occupancy tails, per-server lists) and running sums.

One replica's Markov state is its occupancy tails (exchangeable form):

* ``tail[k]`` (k = 0..levels): servers holding at least ``k`` tasks; ``tail[0] = N``;
* ``iq_tail[j]`` (j = 0..iqueue_levels): dispatchers listing at least ``j``
  idle servers (JIQ family with ``M > 1``; shape ``(1,)`` otherwise), and
  ``iq_listed[j]``: idle servers listed in I-queues of size at least ``j``
  (derivable from ``iq_tail`` by a suffix sum, kept so that a delete request
  finds its I-queue without a scan);
* for the per-server policies, their :class:`~jaxqueue.sim.per_server.Lists`;
* with phase-type service or pools of servers, ``classes[k, c]``: servers
  holding exactly ``k`` tasks of class ``c`` (pool and phase;
  :mod:`jaxqueue.sim.classes`);
* with a time-varying or trace-driven arrival source, its
  :class:`~jaxqueue.sim.source.Clock` (:mod:`jaxqueue.sim.source`).

A chunk of blocks returns its sums (:class:`Stats`); the runner adds them
into exact host totals (:mod:`jaxqueue.sim.totals`), which the estimators read.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.system import System
from jaxqueue.policies.base import Policy
from jaxqueue.sim.classes import class_table
from jaxqueue.sim.per_server import N_WORDS, Lists, init_lists
from jaxqueue.sim.source import SOURCE_WORDS, Clock

__all__ = [
    "Core",
    "Stats",
    "COUNTERS",
    "zero_stats",
    "core_from_counts",
    "n_words",
    "iq_width",
    "PHASE_WORDS",
]


class Core(NamedTuple):
    """The Markov state of one replica (int32 arrays)."""

    tail: jax.Array  # (levels + 1,)
    iq_tail: jax.Array  # (iqueue_levels + 1,) or (1,)
    iq_listed: jax.Array  # (iqueue_levels + 1,) or (1,): listed servers in I-queues of size >= j
    lists: Lists | None = None  # per-server state (JIQ-Original, JIQ-Threshold)
    classes: jax.Array | None = None  # (levels + 1, C): phase-type service or pools only
    clock: Clock | None = None  # arrival sources only (jaxqueue.sim.source)
    sizes: jax.Array | None = (
        None  # (2,) or (3,): this replica's N, M (and buffer), where they differ
    )


class Stats(NamedTuple):
    """One chunk's sums of one replica's measurements, exact in 32-bit arithmetic.

    A block of ``BLOCK`` steps adds ``sum_t tail_t = BLOCK * tail_0 + delta``
    to the time sums: ``tail_0`` (the tail at the block's start, up to ``N``)
    goes into a 64-bit sum kept as two uint32 words (``tail_lo``,
    ``tail_hi``), and ``delta`` (a signed sum of the steps left after each
    change, at most ``BLOCK * (BLOCK + 1) / 2`` a block) into the int32
    ``tail_delta``; likewise for the I-queue tail (``iq_*``). The counters are
    int32. The runner limits a chunk to :func:`jaxqueue.sim.blocks.max_chunk_blocks`
    blocks, so nothing wraps, and adds each chunk into exact 64-bit sums on
    the host (:mod:`jaxqueue.sim.totals`). ``seen[k]`` counts accepted
    arrivals that found ``k`` tasks; with server classes
    (:mod:`jaxqueue.sim.classes`), ``by_class[k * C + c]`` those that found
    ``k`` tasks at a server of class ``c`` (its pool and the phase of the
    task in service; an idle server is in its pool's first class), from
    which the response-time law follows, and ``by_class[(levels + 1) * C + k
    * C + c]`` the service candidates that drew such a server (a time-uniform
    sample, from which each pool's occupancy follows); ``None`` without classes.
    With user metrics (:mod:`jaxqueue.core.user_metrics`), ``user[0, i]`` and
    ``user[1, i]`` are float32 sums of metric ``i`` over the steps (the time sum)
    and over the accepted arrivals, each block's added with compensation (Kahan;
    ``user_comp`` the running compensation); ``None`` without.
    """

    tail_lo: jax.Array  # uint32 (levels + 1,)
    tail_hi: jax.Array
    tail_delta: jax.Array  # int32 (levels + 1,)
    iq_lo: jax.Array  # uint32 (iq_width,)
    iq_hi: jax.Array
    iq_delta: jax.Array  # int32 (iq_width,)
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
    by_class: jax.Array | None = None  # int32 (2 (levels + 1) C,): server classes only
    user: jax.Array | None = None  # float32 (2, K): user metrics only
    user_comp: jax.Array | None = None  # float32 (2, K): their compensation


#: The scalar counters of :class:`Stats`, in order.
COUNTERS = ("arrivals", "blocked", "overflow", "iq_overflow", "joins", "deletes", "probes", "stale")


def iq_width(system: System, policy: Policy) -> int:
    """Length of the accumulated I-queue tail: ``iqueue_levels + 1``, or 2 for ``M = 1``."""
    if not policy.uses_iqueues:
        return 1
    if system.n_dispatchers == 1 and not policy.per_server:
        return 2
    return system.iqueue_levels + 1


#: Extra words of a step with server classes (:mod:`jaxqueue.sim.classes`).
PHASE_WORDS = 4


def n_words(system: System, policy: Policy) -> int:
    """Random words one step consumes: event type, then the larger of the
    branches, then :data:`PHASE_WORDS` with server classes, then
    :data:`~jaxqueue.sim.source.SOURCE_WORDS` (the last) with an arrival source."""
    source = SOURCE_WORDS if system.arrivals is not None else 0
    if policy.per_server:
        return N_WORDS + source
    departure = 2 + policy.idle_words(system)
    base = 1 + max(departure, policy.route_words(system))
    return base + (PHASE_WORDS if system.classes else 0) + source


def zero_stats(system: System, policy: Policy, n_user: int = 0) -> Stats:
    """Chunk sums set to zero (single replica; ``n_user`` user metrics)."""
    u = lambda n: jnp.zeros((n,), jnp.uint32)  # noqa: E731
    i = lambda n: jnp.zeros((n,), jnp.int32)  # noqa: E731
    levels, w = system.levels + 1, iq_width(system, policy)
    c = jnp.int32(0)
    by_class = i(2 * levels * class_table(system).n_classes) if system.classes else None
    user = jnp.zeros((2, n_user), jnp.float32) if n_user else None
    return Stats(
        u(levels),
        u(levels),
        i(levels),
        u(w),
        u(w),
        i(w),
        i(levels),
        c,
        c,
        c,
        c,
        c,
        c,
        c,
        c,
        c,
        by_class,
        user,
        user,
    )


def core_from_counts(counts, iq_counts, system: System, policy: Policy, class_counts=None) -> Core:
    """Build a Core from occupancy counts (host side, numpy).

    Args:
        counts: int ``(levels + 1,)``, servers with exactly k tasks (sums to N).
        iq_counts: int ``(iqueue_levels + 1,)``, dispatchers listing exactly j
            servers (sums to M, and ``sum j * iq_counts[j]`` equals the idle
            servers), or ``None`` when the policy has no I-queues or ``M = 1``.
            Per-server policies: a :class:`~jaxqueue.runs.initial.ListedStart`
            (the listed servers by queue length, the dispatchers by I-queue
            size), or ``None``: every server with at most the policy's
            threshold listed, spread evenly.
        class_counts: int ``(levels + 1, C)`` with server classes
            (:mod:`jaxqueue.sim.classes`): the servers of each level by class
            (rows sum to ``counts``).
    """
    counts = np.asarray(counts, np.int64)
    tail = np.cumsum(counts[::-1])[::-1]
    as32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    if policy.per_server:
        listed = (None, None) if iq_counts is None else iq_counts  # a ListedStart
        lists = init_lists(counts, system, policy.threshold, *listed)
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
    classes = None
    if system.classes:
        classes = np.asarray(class_counts, np.int64)
        if (
            classes.ndim != 2
            or classes.shape[0] != counts.size
            or np.any(classes.sum(axis=1) != counts)
        ):
            raise ValueError("class_counts must split each level's servers over the classes")
        classes = as32(classes)
    return Core(as32(tail), as32(iq_tail), as32(iq_listed), None, classes)
