"""State and step kernel of the lockstep uniformized simulator.

One replica's state is its occupancy tails (exchangeable form):

* ``tail[k]`` (k = 0..levels): servers holding at least ``k`` tasks; ``tail[0] = N``;
* ``iq_tail[j]`` (j = 0..iqueue_levels): dispatchers listing at least ``j``
  idle servers (JIQ family with ``M > 1``; shape ``(1,)`` otherwise), and
  ``iq_listed[j]``: idle servers listed in I-queues of size at least ``j``
  (derivable from ``iq_tail`` by a suffix sum, kept so that a delete request
  finds its I-queue without a scan).

so one event costs O(levels + iqueue_levels), whatever ``N`` and ``M`` are.

Uniformization: the total event rate is bounded by ``N * (lambda + 1)``. Each
step is an arrival with probability ``lambda / (lambda + 1)``, otherwise a
potential departure from a uniformly random server (a no-op if it is idle).
The embedded chain has the CTMC's stationary law, so time averages are step
averages, and one unit of time is ``N * (lambda + 1)`` steps. Every replica
takes the same steps, so replicas advance together as batched array updates.

Estimators are accumulated on the device: exact int32 sums inside a block of
:data:`~jaxqueue.rng.BLOCK` steps, then Kahan-compensated float32 sums across
blocks, so time averages stay accurate over 10^9 steps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.config import System
from jaxqueue.listed import N_WORDS, Lists, init_lists, step_event, step_listed
from jaxqueue.policies import Policy, View, level_of
from jaxqueue.rng import BLOCK, bernoulli, block_keys, step_words, uniform_index

__all__ = ["Core", "Stats", "State", "init", "step", "run_blocks", "n_words", "iq_width"]


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


def step(core: Core, words: jax.Array, load: jax.Array, system: System, policy: Policy):
    """One uniformized step of one replica.

    Args:
        core: the replica's Markov state.
        words: uint32 ``(n_words(system, policy),)`` random words.
        load: float32 scalar, ``lambda``.
        system, policy: static.

    Returns:
        ``(new_core, event)`` where ``event`` is a dict of int32 scalars: the
        levels gaining and losing a server (``up``, ``down``), the level an
        accepted arrival found (``seen``; ``levels + 1`` for none), and the
        event counts, consumed by :func:`run_blocks`.
    """
    if policy.per_server:
        tail, iq_tail, lists, event = step_listed(
            core.tail, core.iq_tail, core.lists, words, load, system,
            policy.threshold, deletes=policy.name == "jiq-threshold",
        )  # fmt: skip
        return Core(tail, iq_tail, core.iq_listed, lists), event
    n = system.n_servers
    levels = system.levels
    tail, iq_tail, iq_listed, _ = core
    idle = jnp.int32(n) - tail[1]
    view = View(tail, iq_tail, iq_listed, idle)
    is_arrival = bernoulli(words[0], load / (1.0 + load))

    # Departure branch: a uniformly random server completes a task if busy.
    k_dep = level_of(tail, uniform_index(words[1], words[2], n))
    departs = ~is_arrival & (k_dep >= 1)
    to_idle = departs & (k_dep == 1)

    # Arrival branch.
    route = policy.route(view, words[1:], system)
    k = route.level
    full = k >= levels
    accepted = is_arrival & ~full

    # Changes as scatter-adds at one index each (O(1), not a pass over the
    # levels); an index past the end (``levels + 1``) is dropped.
    nowhere = levels + 1
    up = jnp.where(accepted, k + 1, nowhere)
    down = jnp.where(departs, k_dep, nowhere)
    new_tail = tail.at[up].add(1, mode="drop").at[down].add(-1, mode="drop")

    joins = jnp.int32(0)
    iq_up = iq_down = jnp.int32(iq_tail.shape[0])  # nowhere
    probes = jnp.where(is_arrival, route.probes, 0)
    iq_overflow = jnp.bool_(False)
    new_iq, new_listed = iq_tail, iq_listed
    if policy.uses_iqueues:
        join_size, join_probes = policy.on_idle(view, words[3:], system)
        joins = to_idle.astype(jnp.int32)
        probes = probes + jnp.where(to_idle, join_probes, 0)
        if system.n_dispatchers > 1:
            top = system.iqueue_levels
            iq_overflow = to_idle & (join_size >= top)
            leave = is_arrival & (route.iq_remove >= 1)
            join = to_idle & ~iq_overflow
            s_out, s_in = route.iq_remove, join_size + 1  # sizes before / after the change
            iq_up = jnp.where(join, s_in, top + 1)
            iq_down = jnp.where(leave, s_out, top + 1)
            new_iq = iq_tail.at[iq_up].add(1, mode="drop").at[iq_down].add(-1, mode="drop")
            jdx = jnp.arange(top + 1, dtype=jnp.int32)
            # An I-queue of size s holds s listed servers, counted in iq_listed[0..s].
            new_listed = (
                iq_listed
                - jnp.where(leave, jnp.where(jdx == s_out, s_out, jdx < s_out), 0)
                + jnp.where(join, jnp.where(jdx == s_in, s_in, jdx < s_in), 0)
            )

    event = step_event(
        system, up=up, down=down, iq_up=iq_up, iq_down=iq_down, accepted=accepted, level=k,
        is_arrival=is_arrival, full=full, iq_overflow=iq_overflow, joins=joins,
        deletes=jnp.where(is_arrival, route.deletes, 0), probes=probes, stale=jnp.int32(0),
    )  # fmt: skip
    return Core(new_tail, new_iq, new_listed), event


def _iq_view(core: Core, system: System, policy: Policy) -> jax.Array:
    """The I-queue tail that is time-averaged (``[1, idle > 0]`` when ``M = 1``)."""
    if not policy.uses_iqueues or policy.per_server:
        return core.iq_tail
    if system.n_dispatchers == 1:
        idle = jnp.int32(system.n_servers) - core.tail[1]
        return jnp.stack([jnp.int32(1), (idle > 0).astype(jnp.int32)])
    return core.iq_tail


def _kahan(total, comp, x):
    y = x - comp
    t = total + y
    return t, (t - total) - y


def _block(state: State, key, replica, block, load, system: System, policy: Policy) -> State:
    """Run one block of BLOCK steps for one replica."""
    bkey = block_keys(key, replica, block)
    nw = n_words(system, policy)
    iq0 = _iq_view(state.core, system, policy)
    counters = (
        "arrivals", "blocked", "overflow", "iq_overflow", "joins", "deletes", "probes", "stale",
    )  # fmt: skip

    # Time sums over the block by changes: a server moving at step t counts in
    # the BLOCK - t post-step states left, so sum_t tail_t = BLOCK * tail_0 +
    # sum of (BLOCK - t) * (+1 at up, -1 at down): O(1) per step.
    by_changes = policy.per_server or (policy.uses_iqueues and system.n_dispatchers > 1)

    def body(carry, t):
        core, acc_tail, acc_iq, seen, cnt = carry
        core, ev = step(core, step_words(bkey, t, nw), load, system, policy)
        cnt = tuple(c + ev[name] for c, name in zip(cnt, counters))
        left = BLOCK - t
        acc_tail = acc_tail.at[ev["up"]].add(left, mode="drop")
        acc_tail = acc_tail.at[ev["down"]].add(-left, mode="drop")
        if by_changes:
            acc_iq = acc_iq.at[ev["iq_up"]].add(left, mode="drop")
            acc_iq = acc_iq.at[ev["iq_down"]].add(-left, mode="drop")
        else:
            acc_iq = acc_iq + _iq_view(core, system, policy)
        seen = seen.at[ev["seen"]].add(1, mode="drop")
        return (core, acc_tail, acc_iq, seen, cnt), None

    zeros = tuple(jnp.int32(0) for _ in counters)
    acc_iq0 = BLOCK * iq0 if by_changes else jnp.zeros_like(iq0)
    carry0 = (state.core, BLOCK * state.core.tail, acc_iq0,
              jnp.zeros_like(state.stats.seen), zeros)  # fmt: skip
    (core, acc_tail, acc_iq, seen, cnt), _ = jax.lax.scan(
        body, carry0, jnp.arange(BLOCK, dtype=jnp.int32)
    )
    s = state.stats
    tail_sum, tail_comp = _kahan(
        s.tail_sum, s.tail_comp, acc_tail.astype(jnp.float32) / system.n_servers
    )
    iq_norm = system.n_dispatchers
    iq_sum, iq_comp = _kahan(s.iq_sum, s.iq_comp, acc_iq.astype(jnp.float32) / iq_norm)
    updates = {name: getattr(s, name) + c for name, c in zip(counters, cnt)}
    stats = Stats(
        tail_sum=tail_sum, tail_comp=tail_comp, iq_sum=iq_sum, iq_comp=iq_comp,
        seen=s.seen + seen, steps=s.steps + BLOCK, **updates,
    )  # fmt: skip
    return State(core, stats)


def run_blocks(
    state: State,
    key: jax.Array,
    replicas: jax.Array,
    first_block: jax.Array,
    n_blocks: jax.Array,
    load: jax.Array,
    system: System,
    policy: Policy,
) -> State:
    """Advance a batch of replicas by ``n_blocks`` blocks of BLOCK steps.

    Args:
        state: batched State (leading replica axis ``R``).
        key: typed PRNG key of the run.
        replicas: int32 ``(R,)`` global replica indices (keys by position).
        first_block: int32 scalar, index of the first block to run.
        n_blocks: int32 scalar (traced: any count without recompiling).
        load: float32 ``(R,)``, each replica's ``lambda``.
        system, policy: static.

    Returns:
        The advanced batched State.
    """

    def one(state, replica, load, block):
        return _block(state, key, replica, block, load, system, policy)

    batched = jax.vmap(one, in_axes=(0, 0, 0, None))

    def body(i, state):
        return batched(state, replicas, load, first_block + i)

    return jax.lax.fori_loop(0, n_blocks, body, state)
