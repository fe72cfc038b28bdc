"""Per-server state for the JIQ variants whose I-queues can list busy servers.

JIQ-Original (no delete requests) and JIQ-Threshold(z) break exchangeability:
a listed server's queue length matters, so occupancy counts are not enough.
Here a replica keeps every server's queue length and the I-queues as arrays
with constant-time membership:

* ``q[i]``: tasks at server ``i``;
* ``slots[m, c]``: the servers listed by dispatcher ``m`` (first ``sizes[m]``
  entries valid), ``C = iqueue_levels`` places each;
* ``where[i]``: ``m * C + c`` if server ``i`` is listed at ``slots[m, c]``,
  else ``-1``.

Removal swaps the last entry of the list into the hole, so every event costs
O(1) work at O(N + M C) memory per replica. The occupancy tails (``tail``,
``iq_tail``) are kept alongside, so the estimators are the exchangeable
engine's.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.rng import bernoulli, uniform_index
from jaxqueue.core.system import System, arrival_probability
from jaxqueue.sim.events import step_event

__all__ = ["Lists", "init_lists", "step_listed", "N_WORDS"]

#: Words per step: type, server (2), dispatcher (2), list slot (2), rejoin dispatcher (2).
N_WORDS = 9


class Lists(NamedTuple):
    """Per-server queue lengths and I-queue lists of one replica (int32)."""

    q: jax.Array  # (N,)
    slots: jax.Array  # (M, C)
    sizes: jax.Array  # (M,)
    where: jax.Array  # (N,)


def init_lists(counts: np.ndarray, system: System, listed_max: int) -> Lists:
    """Servers with the given occupancy counts, longest first; every server with
    at most ``listed_max`` tasks listed, round-robin over the dispatchers (host side)."""
    n, m, cap = system.n_servers, system.n_dispatchers, system.iqueue_levels
    q = np.repeat(np.arange(counts.size), counts)[::-1].astype(np.int64)
    listed = np.nonzero(q <= listed_max)[0]
    if -(-listed.size // m) > cap:
        raise ValueError(
            f"iqueue_levels={cap} is too small for the initial state: {listed.size} listed "
            f"servers over {m} I-queues need at least {-(-listed.size // m)}"
        )
    slots = np.zeros((m, cap), np.int64)
    sizes = np.zeros(m, np.int64)
    where = np.full(n, -1, np.int64)
    for rank, server in enumerate(listed):
        d = rank % m
        slots[d, sizes[d]] = server
        where[server] = d * cap + sizes[d]
        sizes[d] += 1
    as32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    return Lists(as32(q), as32(slots), as32(sizes), as32(where))


def _remove(lists: Lists, server, do, cap: int):
    """Swap-remove ``server`` from its list where ``do``; returns lists and the old list size."""
    q, slots, sizes, where = lists
    pos = jnp.where(do, where[server], 0)
    d, c = pos // cap, pos % cap
    size = sizes[d]
    last = slots[d, jnp.maximum(size - 1, 0)]
    slots = slots.at[d, c].set(jnp.where(do, last, slots[d, c]))
    where = where.at[last].set(jnp.where(do, pos, where[last]))
    where = where.at[server].set(jnp.where(do, -1, where[server]))
    sizes = sizes.at[d].add(jnp.where(do, -1, 0))
    return Lists(q, slots, sizes, where), size


def _add(lists: Lists, server, d, do, cap: int):
    """Append ``server`` to list ``d`` where ``do``; returns lists, the old size, overflow."""
    q, slots, sizes, where = lists
    size = sizes[d]
    ok = do & (size < cap)
    slots = slots.at[d, jnp.where(ok, size, cap)].set(server, mode="drop")
    where = where.at[server].set(jnp.where(ok, d * cap + size, where[server]))
    sizes = sizes.at[d].add(ok.astype(jnp.int32))
    return Lists(q, slots, sizes, where), size, do & ~ok


def step_listed(tail, iq_tail, lists: Lists, words, load, system: System, z: int, deletes: bool):
    """One uniformized step of JIQ-Original (``deletes=False``, listed while idle
    or stale) or JIQ-Threshold(z) (``deletes=True``: listed exactly while holding
    at most ``z`` tasks). See the policies' docstrings for the rules.

    All reads of the per-server arrays come first, stacked into one array
    behind an optimization barrier, and each array is then written by one
    scatter whose colliding writes are resolved here. Otherwise XLA re-reads
    the arrays inside fusions that run after a write, and copies them at every
    step (measured: O(N) per event).

    Returns:
        ``(tail, iq_tail, lists, event)`` with the exchangeable engine's event keys
        plus ``stale``.
    """
    n, m, cap, levels = system.n_servers, system.n_dispatchers, system.iqueue_levels, system.levels
    q, slots, sizes, where = lists
    is_arrival = bernoulli(words[0], arrival_probability(load))
    server = uniform_index(words[1], words[2], n)
    dsp = uniform_index(words[3], words[4], m)
    rejoin_to = uniform_index(words[7], words[8], m)
    join_to = jnp.where(is_arrival, rejoin_to, dsp)
    # -- reads, all before any write, stacked into one materialised array --------
    size = sizes[dsp]
    slot = uniform_index(words[5], words[6], size)
    picked = slots[dsp, jnp.minimum(slot, cap - 1)]
    target = jnp.where(size > 0, picked, server)
    w_target = where[target]
    d_safe = jnp.clip(w_target // cap, 0, m - 1)
    out_size = sizes[d_safe]
    reads = jnp.stack([
        size, target, q[target], w_target, q[server], where[server], out_size,
        slots[d_safe, jnp.clip(out_size - 1, 0, cap - 1)], sizes[join_to],
    ])  # fmt: skip
    reads = jax.lax.optimization_barrier(reads)
    size, target, k_arr, w_target, k_dep, w_server, out_size, last, in_size = (
        reads[i] for i in range(9)
    )
    has = size > 0
    d_out, c_out = w_target // cap, w_target % cap

    full = k_arr >= levels
    accepted = is_arrival & ~full
    stale = is_arrival & has & (k_arr > 0)
    after = k_arr + accepted.astype(jnp.int32)
    deleted = (is_arrival & ~has & (w_target >= 0) & (after > z)) if deletes else jnp.bool_(False)
    leave = (is_arrival & has) | deleted
    departs = ~is_arrival & (k_dep >= 1)
    joins_dep = departs & (k_dep - 1 == z) & (w_server < 0)
    rejoin = (is_arrival & has & (after <= z)) if deletes else jnp.bool_(False)
    join = rejoin | joins_dep
    who = jnp.where(is_arrival, target, server)
    in_size = in_size - (leave & (join_to == d_out)).astype(jnp.int32)
    ok = join & (in_size < cap)
    iq_over = join & ~ok

    # -- writes: one scatter per array (an index past the end is dropped) ---------
    delta = jnp.where(is_arrival, accepted.astype(jnp.int32), -departs.astype(jnp.int32))
    q = q.at[who].add(delta)
    slots = slots.at[
        jnp.stack([jnp.where(leave, d_out, m), jnp.where(ok, join_to, m)]),
        jnp.stack([c_out, in_size]),
    ].set(jnp.stack([last, who]), mode="drop")
    moved = leave & (last != target)
    cleared = leave & ~(ok & (who == target))
    where = where.at[
        jnp.stack([jnp.where(moved, last, n), jnp.where(cleared, target, n), jnp.where(ok, who, n)])
    ].set(jnp.stack([w_target, jnp.int32(-1), join_to * cap + in_size]), mode="drop")
    sizes = sizes.at[jnp.stack([jnp.where(leave, d_out, m), jnp.where(ok, join_to, m)])].add(
        jnp.stack([jnp.int32(-1), jnp.int32(1)]), mode="drop"
    )
    lists = Lists(q, slots, sizes, where)

    nowhere = levels + 1
    up = jnp.where(accepted, k_arr + 1, nowhere)
    down = jnp.where(departs, k_dep, nowhere)
    tail = tail.at[up].add(1, mode="drop").at[down].add(-1, mode="drop")
    iq_up = jnp.where(ok, in_size + 1, cap + 1)
    iq_down = jnp.where(leave, out_size, cap + 1)
    iq_tail = iq_tail.at[iq_up].add(1, mode="drop").at[iq_down].add(-1, mode="drop")
    event = step_event(
        system, up=up, down=down, iq_up=iq_up, iq_down=iq_down, accepted=accepted, level=k_arr,
        is_arrival=is_arrival, full=full, iq_overflow=iq_over,
        joins=ok.astype(jnp.int32), deletes=deleted.astype(jnp.int32),
        probes=jnp.int32(0), stale=stale.astype(jnp.int32),
    )  # fmt: skip
    return tail, iq_tail, lists, event
