"""Per-server state for the JIQ variants whose I-queues can list busy servers.

JIQ-Original and JIQ-Threshold(z): every server's queue length and the
I-queues as arrays with constant-time membership, unordered or FIFO rings
(docs/simulation.md, "State").
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.rng import bernoulli, step_words, uniform_index
from jaxqueue.core.system import System, arrival_probability
from jaxqueue.sim.events import move, step_event

__all__ = ["Lists", "even_sizes", "init_lists", "step_listed", "N_WORDS"]

#: Words per step: type, server (2), dispatcher (2), list slot (2), rejoin dispatcher (2).
#: A join to the shortest of ``d >= 2`` I-queues happens on a departure, which
#: decides on words 0..2 only: it draws from words 3..8, or from a stream keyed
#: by words 3 and 4 when it needs more than six (:func:`_shortest_of`).
N_WORDS = 9


class Lists(NamedTuple):
    """Per-server queue lengths and I-queue lists of one replica (int32)."""

    q: jax.Array  # (N,)
    slots: jax.Array  # (M, C + 1): column C holds the FIFO heads
    sizes: jax.Array  # (M,)
    where: jax.Array  # (N,)


def even_sizes(listed: int, system: System) -> np.ndarray:
    """I-queue sizes, one per dispatcher, holding ``listed`` servers as evenly as
    possible (the first ``listed % M`` one larger; host side).

    Raises:
        ValueError: if ``iqueue_levels`` cannot hold them.
    """
    m, cap = system.n_dispatchers, system.iqueue_levels
    if listed > m * cap:
        raise ValueError(
            f"iqueue_levels={cap} is too small for the initial state: {listed} listed "
            f"servers over {m} I-queues need at least {-(-listed // m)}"
        )
    return np.full(m, listed // m, np.int64) + (np.arange(m) < listed % m)


def init_lists(
    counts: np.ndarray,
    system: System,
    listed_max: int,
    by_length: np.ndarray | None = None,
    by_size: np.ndarray | None = None,
) -> Lists:
    """Servers with the given occupancy counts, longest first, and their I-queues (host side).

    Args:
        counts: servers with exactly k tasks, ``k = 0..levels``.
        listed_max: with ``by_length=None``, every server with at most this
            many tasks is listed.
        by_length: how many servers with exactly k tasks are listed (at most
            ``counts[k]``).
        by_size: how many dispatchers list exactly j servers (summing to
            ``M``, and ``sum_j j by_size[j]`` to the listed servers), or
            ``None``: as evenly as possible.

    The listed servers, longest queue first, are dealt out a place at a time
    over the I-queues that have room. The lists start in order of listing,
    heads at place 0 (valid for either order: with FIFO I-queues the busy
    servers, listed longest ago, are picked first).
    """
    n, m, cap = system.n_servers, system.n_dispatchers, system.iqueue_levels
    counts = np.asarray(counts, np.int64)
    q = np.repeat(np.arange(counts.size), counts)[::-1].astype(np.int64)
    if by_length is None:
        listed = np.nonzero(q <= listed_max)[0]
    else:
        by_length = np.asarray(by_length, np.int64)
        if by_length.shape != counts.shape or np.any(by_length < 0) or np.any(by_length > counts):
            raise ValueError("by_length must give, per level k, 0 to counts[k] listed servers")
        first = n - np.cumsum(counts)  # level k's servers start here in q (longest first)
        listed = np.concatenate(
            [first[k] + np.arange(by_length[k]) for k in range(counts.size - 1, -1, -1)]
        ).astype(np.int64)
    if by_size is None:
        room = even_sizes(listed.size, system)
    else:
        by_size = np.asarray(by_size, np.int64)
        room = np.repeat(np.arange(by_size.size), by_size)[::-1]
        if room.size != m or room.sum() != listed.size or (room.size and room.max() > cap):
            raise ValueError(
                f"by_size must split the {listed.size} listed servers over the {m} I-queues, "
                f"at most iqueue_levels={cap} each"
            )
    slots = np.zeros((m, cap + 1), np.int64)  # column cap: the FIFO heads
    where = np.full(n, -1, np.int64)
    rank = 0
    for place in range(int(room.max())):
        for disp in np.nonzero(room > place)[0]:
            slots[disp, place] = listed[rank]
            where[listed[rank]] = disp * cap + place
            rank += 1
    sizes = room.astype(np.int64)
    as32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    return Lists(as32(q), as32(slots), as32(sizes), as32(where))


def _distinct(words: jax.Array, n, d: int) -> jax.Array:
    """A uniformly random ``d``-subset of ``[0, n)`` (Floyd's algorithm, ``2d`` words).

    For ``j = n-d, ..., n-1``: draw ``t`` uniform on ``[0, j]`` and add ``t``,
    or ``j`` if ``t`` was already chosen. ``n >= d`` is required.
    """

    def body(i, chosen):
        j = n - d + i
        t = uniform_index(words[2 * i], words[2 * i + 1], j + 1)
        return chosen.at[i].set(jnp.where(jnp.any(chosen == t), j, t))

    chosen = jnp.full((d,), -1, jnp.int32)
    if d <= 8:  # unrolled
        for i in range(d):
            chosen = body(i, chosen)
        return chosen
    return jax.lax.fori_loop(0, d, body, chosen)


def _shortest_of(words: jax.Array, sizes: jax.Array, m: int, d: int) -> jax.Array:
    """The dispatcher a join goes to: the shortest of ``d`` distinct uniform I-queues,
    ties uniform (``2d + 2`` words: Floyd's ``2d``, then two for the tie).

    Takes the step's words 3..8 (six, enough for ``d = 2``); for ``d >= 3`` the
    words come from a stream keyed by words 3 and 4 (a counter hash, as every
    step's words are).
    """
    need = 2 * d + 2
    w = words[3:9] if need <= 6 else step_words(words[3:5], jnp.int32(0), need)
    chosen = _distinct(w, m, d)
    size = sizes[chosen]
    ties = size == jnp.min(size)
    rank = uniform_index(w[2 * d], w[2 * d + 1], jnp.sum(ties, dtype=jnp.int32))
    # the rank-th (from 0) of the tied entries
    first = jnp.argmax(ties & (jnp.cumsum(ties, dtype=jnp.int32) == rank + 1))
    return chosen[first]


def step_listed(
    tail,
    iq_tail,
    lists: Lists,
    words,
    load,
    system: System,
    z: int,
    deletes: bool,
    fifo: bool = False,
    join_d: int = 1,
    p_arrival=None,
    serves=None,
):
    """One uniformized step of JIQ-Original (``deletes=False``: no delete
    requests; an unlisted server joins when a completion leaves it with at most
    ``z`` tasks) or JIQ-Threshold(z) (``deletes=True``: listed exactly while
    holding at most ``z`` tasks). See the policies' docstrings for the rules.

    ``fifo``: a dispatcher picks the head of its I-queue (ring buffers; needs
    ``deletes=False``), else a uniformly random listed server. ``join_d``: a
    join goes to the shortest of ``join_d`` distinct uniform I-queues (ties
    uniform), sending ``join_d`` probes when ``join_d >= 2``. The defaults
    consume the step's words exactly as before these options existed.
    ``p_arrival`` and ``serves`` come from an arrival source
    (:mod:`jaxqueue.sim.source`): the step's arrival probability, and whether
    a service candidate is real.

    All reads of the per-server arrays come first, stacked into one array
    behind an optimization barrier, and each array is then written by one
    scatter whose colliding writes are resolved here. Otherwise XLA re-reads
    the arrays inside fusions that run after a write, and copies them at every
    step (measured: O(N) per event).

    Returns:
        ``(tail, iq_tail, lists, event)`` with the exchangeable engine's event keys
        plus ``stale``.
    """
    if fifo and deletes:
        raise ValueError("FIFO I-queues need deletes=False (a delete request removes from inside)")
    n, m, levels = system.n_servers, system.n_dispatchers, system.levels
    is_arrival = bernoulli(words[0], arrival_probability(load) if p_arrival is None else p_arrival)
    server = uniform_index(words[1], words[2], n)
    dsp = uniform_index(words[3], words[4], m)
    rejoin_to = uniform_index(words[7], words[8], m)
    # a join on a departure: a uniform I-queue (words 3, 4), or the shortest of join_d
    to_dep = dsp if join_d == 1 else _shortest_of(words, lists.sizes, m, join_d)
    join_to = jnp.where(is_arrival, rejoin_to, to_dep)
    r = _read(lists, words, server, dsp, join_to, system, fifo, join_d)
    e = _decide(r, is_arrival, server, serves, system, z, deletes, fifo)
    lists = _write(lists, r, e, is_arrival, system, fifo)

    nowhere = levels + 1
    up = jnp.where(e.accepted, r.k_arr + 1, nowhere)
    down = jnp.where(e.departs, r.k_dep, nowhere)
    tail = move(tail, up, down)
    cap = system.iqueue_levels
    iq_up = jnp.where(e.ok, e.in_size + 1, cap + 1)
    iq_down = jnp.where(e.leave, r.out_size, cap + 1)
    iq_tail = iq_tail.at[iq_up].add(1, mode="drop").at[iq_down].add(-1, mode="drop")
    probes = jnp.where(e.join, join_d, 0).astype(jnp.int32) if join_d >= 2 else jnp.int32(0)
    event = step_event(
        system,
        up=up,
        down=down,
        iq_up=iq_up,
        iq_down=iq_down,
        accepted=e.accepted,
        level=r.k_arr,
        is_arrival=is_arrival,
        full=e.full,
        iq_overflow=e.iq_over,
        joins=e.ok.astype(jnp.int32),
        deletes=e.deleted.astype(jnp.int32),
        probes=probes,
        stale=e.stale.astype(jnp.int32),
    )
    return tail, iq_tail, lists, event


class _Reads(NamedTuple):
    """What a step reads of the per-server arrays (:func:`_read`)."""

    size: jax.Array  # the picking I-queue's size
    target: jax.Array  # the server an arrival goes to (picked, or uniform if none listed)
    k_arr: jax.Array  # its tasks
    w_target: jax.Array  # its place in the lists (-1: unlisted)
    k_dep: jax.Array  # the service candidate's tasks
    w_server: jax.Array  # its place
    out_size: jax.Array  # the size of the I-queue listing the target
    last: jax.Array  # that I-queue's last entry
    in_size: jax.Array  # the joined I-queue's size
    join_to: jax.Array  # the joined I-queue
    head: jax.Array | None  # the picking I-queue's head (FIFO)
    in_head: jax.Array  # the joined I-queue's head (FIFO; else 0)


def _read(lists: Lists, words, server, dsp, join_to, system: System, fifo, join_d) -> _Reads:
    """All reads of a step, before any write, stacked into one array behind an
    optimization barrier (see :func:`step_listed`)."""
    m, cap = system.n_dispatchers, system.iqueue_levels
    q, slots, sizes, where = lists
    size = sizes[dsp]
    head = None
    if fifo:  # the head of the ring
        head = slots[dsp, cap]
        picked = slots[dsp, head]
    else:
        slot = uniform_index(words[5], words[6], size)
        picked = slots[dsp, jnp.minimum(slot, cap - 1)]
    target = jnp.where(size > 0, picked, server)
    w_target = where[target]
    d_safe = jnp.clip(w_target // cap, 0, m - 1)
    out_size = sizes[d_safe]
    reads = [
        size,
        target,
        q[target],
        w_target,
        q[server],
        where[server],
        out_size,
        slots[d_safe, jnp.clip(out_size - 1, 0, cap - 1)],
        sizes[join_to],
    ]
    if join_d > 1:  # the shortest of join_d was read from sizes
        reads.append(join_to)
    if fifo:  # the heads of the picking and of the joined I-queue
        reads += [head, slots[join_to, cap]]
    reads = jax.lax.optimization_barrier(jnp.stack(reads))
    size, target, k_arr, w_target, k_dep, w_server, out_size, last, in_size = (
        reads[i] for i in range(9)
    )
    if join_d > 1:
        join_to = reads[9]
    in_head = jnp.int32(0)
    if fifo:
        head, in_head = reads[-2], reads[-1]
    return _Reads(
        size,
        target,
        k_arr,
        w_target,
        k_dep,
        w_server,
        out_size,
        last,
        in_size,
        join_to,
        head,
        in_head,
    )


class _Events(NamedTuple):
    """What a step does (:func:`_decide`)."""

    d_out: jax.Array  # the I-queue listing the target, and its place there
    c_out: jax.Array
    full: jax.Array  # an arrival finds the target at the level bound
    accepted: jax.Array
    stale: jax.Array  # an arrival picks a busy listed server
    deleted: jax.Array  # a delete request (JIQ-Threshold)
    leave: jax.Array  # the target leaves its I-queue
    departs: jax.Array
    join: jax.Array  # a server joins an I-queue
    who: jax.Array  # the server whose queue changes
    in_size: jax.Array  # the joined I-queue's size after a leave from it
    ok: jax.Array  # the join fits
    iq_over: jax.Array
    in_place: jax.Array  # the place a join takes


def _decide(r: _Reads, is_arrival, server, serves, system: System, z, deletes, fifo) -> _Events:
    """A step's events from its reads (the rules of JIQ-Original and JIQ-Threshold)."""
    cap, levels = system.iqueue_levels, system.levels
    has = r.size > 0
    d_out, c_out = r.w_target // cap, r.w_target % cap

    full = r.k_arr >= levels
    accepted = is_arrival & ~full
    stale = is_arrival & has & (r.k_arr > 0)
    after = r.k_arr + accepted.astype(jnp.int32)
    deleted = (is_arrival & ~has & (r.w_target >= 0) & (after > z)) if deletes else jnp.bool_(False)
    leave = (is_arrival & has) | deleted
    departs = ~is_arrival & (r.k_dep >= 1)
    if serves is not None:
        departs = departs & serves
    # JIQ-Threshold: listed exactly while <= z, so only a drop to z finds it unlisted
    low = (r.k_dep - 1 == z) if deletes else (r.k_dep - 1 <= z)
    joins_dep = departs & low & (r.w_server < 0)
    rejoin = (is_arrival & has & (after <= z)) if deletes else jnp.bool_(False)
    join = rejoin | joins_dep
    who = jnp.where(is_arrival, r.target, server)
    in_size = r.in_size - (leave & (r.join_to == d_out)).astype(jnp.int32)
    ok = join & (in_size < cap)
    iq_over = join & ~ok
    # the place a join takes: the end of the list, or of the ring
    in_place = (r.in_head + in_size) % cap if fifo else in_size
    return _Events(
        d_out,
        c_out,
        full,
        accepted,
        stale,
        deleted,
        leave,
        departs,
        join,
        who,
        in_size,
        ok,
        iq_over,
        in_place,
    )


def _write(lists: Lists, r: _Reads, e: _Events, is_arrival, system: System, fifo) -> Lists:
    """A step's writes: one scatter per array (an index past the end is dropped)."""
    n, m, cap = system.n_servers, system.n_dispatchers, system.iqueue_levels
    q, slots, sizes, where = lists
    join_to, leave, ok, who = r.join_to, e.leave, e.ok, e.who
    delta = jnp.where(is_arrival, e.accepted.astype(jnp.int32), -e.departs.astype(jnp.int32))
    q = q.at[who].add(delta)
    if fifo:  # a pick advances the head; nothing moves
        slots = slots.at[
            jnp.stack([jnp.where(leave, e.d_out, m), jnp.where(ok, join_to, m)]),
            jnp.stack([jnp.int32(cap), e.in_place]),
        ].set(jnp.stack([(r.head + 1) % cap, who]), mode="drop")
        moved = jnp.bool_(False)
    else:  # the last entry fills the hole
        slots = slots.at[
            jnp.stack([jnp.where(leave, e.d_out, m), jnp.where(ok, join_to, m)]),
            jnp.stack([e.c_out, e.in_place]),
        ].set(jnp.stack([r.last, who]), mode="drop")
        moved = leave & (r.last != r.target)
    cleared = leave & ~(ok & (who == r.target))
    where = where.at[
        jnp.stack(
            [jnp.where(moved, r.last, n), jnp.where(cleared, r.target, n), jnp.where(ok, who, n)]
        )
    ].set(jnp.stack([r.w_target, jnp.int32(-1), join_to * cap + e.in_place]), mode="drop")
    sizes = sizes.at[jnp.stack([jnp.where(leave, e.d_out, m), jnp.where(ok, join_to, m)])].add(
        jnp.stack([jnp.int32(-1), jnp.int32(1)]), mode="drop"
    )
    return Lists(q, slots, sizes, where)
