"""Blocks of uniformized steps for a batch of replicas, with on-device accumulation.

Estimators are accumulated on the device in exact 32-bit integer arithmetic:
a chunk of blocks returns its sums (:class:`~jaxqueue.sim.state.Stats`), and
the runner adds them into exact 64-bit totals on the host
(:mod:`jaxqueue.sim.totals`). Nothing is rounded or wraps, whatever ``N``
(up to ``2**31 - 1``) and however long the run; user metrics
(:mod:`jaxqueue.core.user_metrics`) alone are float sums (docs/metrics.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from jaxqueue.core.arrivals import Trace
from jaxqueue.core.rng import BLOCK, block_keys, step_word_rows
from jaxqueue.core.system import System
from jaxqueue.core.user_metrics import MetricState, evaluate
from jaxqueue.policies.base import Policy
from jaxqueue.sim.events import move
from jaxqueue.sim.state import COUNTERS, Core, Stats, n_words, zero_stats
from jaxqueue.sim.step import step

__all__ = [
    "run_blocks",
    "advance_blocks",
    "spread",
    "zero_rows",
    "add64",
    "max_chunk_blocks",
    "max_per_step",
    "block_words",
    "time_sum_scale",
    "PACK",
    "unpack",
]


def _iq_view(core: Core, system: System, policy: Policy) -> jax.Array:
    """The I-queue tail that is time-averaged (``[1, idle > 0]`` when ``M = 1``)."""
    if not policy.uses_iqueues or policy.per_server:
        return core.iq_tail
    if system.n_dispatchers == 1:
        idle = servers_of(core, system) - core.tail[1]
        return jnp.stack([jnp.int32(1), (idle > 0).astype(jnp.int32)])
    return core.iq_tail


def servers_of(core: Core, system: System):
    """``N`` of one replica (int32): its own where the batch's sizes differ, else the System's."""
    return jnp.int32(system.n_servers) if core.sizes is None else core.sizes[0]


def metric_state(core: Core, load, system: System, policy: Policy) -> MetricState:
    """What the user metrics see of one replica (:class:`~jaxqueue.core.user_metrics.MetricState`)."""
    n = servers_of(core, system).astype(jnp.float32)
    m = jnp.float32(system.n_dispatchers) if core.sizes is None else core.sizes[1]
    m = jnp.asarray(m, jnp.float32)
    s = core.tail.astype(jnp.float32) / n
    # q from the integer counts: exactly 0 where no server holds k tasks (a
    # difference of float32 fractions can leave 1e-8, and log(q[0]) finite)
    exact = core.tail - jnp.concatenate([core.tail[1:], jnp.zeros_like(core.tail[:1])])
    q = exact.astype(jnp.float32) / n
    iq = None
    if policy.uses_iqueues:
        view = _iq_view(core, system, policy).astype(jnp.float32)
        iq = view if system.n_dispatchers == 1 and not policy.per_server else view / m
    return MetricState(s, q, n, m, jnp.asarray(load, jnp.float32), iq)


def _kahan(total, comp, x):
    """Compensated float32 addition of ``x`` to ``total`` (``comp``: the lost low part)."""
    y = x - comp
    new = total + y
    return new, (new - total) - y


def add64(lo: jax.Array, hi: jax.Array, x: jax.Array):
    """Add a non-negative int32 ``x`` to the 64-bit sum ``(hi, lo)`` of uint32 words."""
    xu = x.astype(jnp.uint32)
    lo = lo + xu
    return lo, hi + (lo < xu).astype(jnp.uint32)


def block_words(block: int) -> np.ndarray:
    """A block index (a Python int below ``2**64``) as uint32 ``[low, high]`` words."""
    if not 0 <= block < 2**64:
        raise ValueError(f"block={block} is out of range: need 0 <= block < 2**64")
    return np.array([block & 0xFFFFFFFF, block >> 32], np.uint32)


def max_per_step(policy: Policy) -> int:
    """A bound on what one step adds to any counter (probes: ``d`` to route, ``d`` to join)."""
    opts = [v for v in policy.options().values() if isinstance(v, int) and not isinstance(v, bool)]
    return 2 + 2 * max(opts + [1])


def max_chunk_blocks(system: System, policy: Policy) -> int:
    """The most blocks one call may run without any int32 chunk sum wrapping.

    A block adds at most ``BLOCK * (BLOCK + 1) / 2`` to an entry of
    ``tail_delta`` or ``iq_delta`` and ``BLOCK * max_per_step`` to a counter.
    """
    by_delta = (2**31 - 1) // (BLOCK * (BLOCK + 1) // 2)
    return min(by_delta, (2**31 - 1) // (BLOCK * max_per_step(policy)))


#: What an accepted arrival adds to the time sums of its ``up`` level inside a
#: block, besides its time weight, so that one scatter-add a step records both
#: (:func:`unpack`). A block's time weights sum to at most ``BLOCK * (BLOCK + 1)
#: / 2 < PACK / 2`` in absolute value at any level, and ``BLOCK * PACK`` fits in
#: int32 with room to spare.
PACK_BITS = 17
PACK = 1 << PACK_BITS


def unpack(packed: jax.Array):
    """A block's packed time sums as ``(time sums, accepted arrivals)`` by level:
    ``packed = PACK * arrivals + sums`` with ``|sums| < PACK / 2``."""
    arrivals = (packed + PACK // 2) >> PACK_BITS
    return packed - arrivals * PACK, arrivals


def _block(core: Core, stats: Stats, key, lo, hi, load, system: System, policy: Policy, metrics=()):
    """Run one block of BLOCK steps for one replica (``key`` its key data, ``lo`` and
    ``hi`` the block index's words); add its sums to ``stats`` (and the user
    ``metrics``' sums, :func:`_user_step` and :func:`_user_sums`)."""
    bkey = block_keys(key, lo, hi)
    nw = n_words(system, policy)
    iq0 = _iq_view(core, system, policy)

    # Time sums over the block by changes: a server moving at step t counts in
    # the BLOCK - t post-step states left, so sum_t tail_t = BLOCK * tail_0 +
    # sum of (BLOCK - t) * (+1 at up, -1 at down): O(1) per step.
    by_changes = policy.per_server or (policy.uses_iqueues and system.n_dispatchers > 1)
    # A trace's steps are not evenly spread in time, but its service candidates
    # are a Poisson process: the states they find (before the step) are a
    # time-uniform sample. Over the W candidates of a block, sum_t w_t
    # tail_pre_t = W * tail_end - sum_s C_s * change_s, with C_s the candidates
    # up to step s; the block adds W * tail_end to the 64-bit sum (which its
    # totals then multiply by 1, not BLOCK: :func:`time_sum_scale`) and counts
    # W as its steps.
    trace = isinstance(system.arrivals, Trace)

    # the idle servers, carried from step to step for the exchangeable step
    # (occupancy_step's ``idle``: read afresh from ``tail`` by the next step's
    # draws, it made XLA copy ``tail`` twice a step)
    carry_idle = not policy.per_server

    def idle_of(core):
        return servers_of(core, system) - core.tail[1] if carry_idle else jnp.int32(0)

    def body(carry, t):
        core, acc_tail, acc_iq, cnt, cands, idle, by_class, user = carry
        # the words as separate scalars (not one array of nw): vmapped, each is a
        # vector over the replicas, which XLA vectorizes; an (R, nw) array it
        # would loop over nw innermost, twice as slow for a whole Pod(2) step
        words = step_word_rows(bkey[0], bkey[1], t, nw)
        if policy.per_server:
            words = jnp.stack(words)
        before = core
        core, ev = step(core, words, load, system, policy, idle=idle if carry_idle else None)
        cnt = tuple(c + ev[name] for c, name in zip(cnt, COUNTERS))
        if trace:
            candidate = ev["arrivals"] == 0
            cands = cands + candidate.astype(jnp.int32)
            left = -cands
        else:
            left = BLOCK - t
        # an accepted arrival, found at ev["up"] - 1, also counts PACK there (seen)
        acc_tail = move(acc_tail, ev["up"], ev["down"], left, up_value=left + PACK)
        if by_changes and not policy.per_server:
            acc_iq = move(acc_iq, ev["iq_up"], ev["iq_down"], left)
        elif by_changes:  # a per-server JIQ-Threshold step may both drop and relist a server
            acc_iq = acc_iq.at[ev["iq_up"]].add(left, mode="drop")
            acc_iq = acc_iq.at[ev["iq_down"]].add(-left, mode="drop")
        elif trace:
            acc_iq = acc_iq + jnp.where(candidate, _iq_view(before, system, policy), 0)
        else:
            acc_iq = acc_iq + _iq_view(core, system, policy)
        if by_class is not None:  # what the arrival or service candidate found: (level, class)
            by_class = by_class.at[ev["by_class"]].add(1, mode="drop")
        if metrics:
            when = candidate if trace else None
            user = _user_step(user, before, ev, when, load, system, policy, metrics)
        return (core, acc_tail, acc_iq, cnt, cands, idle_of(core), by_class, user), None

    zeros = tuple(jnp.int32(0) for _ in COUNTERS)
    carry0 = (
        core,
        jnp.zeros_like(core.tail),
        jnp.zeros_like(iq0),
        zeros,
        jnp.int32(0),
        idle_of(core),
        stats.by_class,
        None if stats.user is None else jnp.zeros_like(stats.user),
    )
    (new_core, packed, acc_iq, cnt, cands, _, by_class, user), _ = jax.lax.scan(
        body, carry0, jnp.arange(BLOCK, dtype=jnp.int32)
    )
    acc_tail, arrived = unpack(packed)
    # accepted arrivals find at most levels - 1 tasks (up <= levels): seen[levels] stays 0
    seen = jnp.concatenate([arrived[1:], jnp.zeros_like(arrived[:1])])
    if trace:  # W * the end state (at most BLOCK * N: the plan bounds N)
        tail_lo, tail_hi = add64(stats.tail_lo, stats.tail_hi, cands * new_core.tail)
    else:
        tail_lo, tail_hi = add64(stats.tail_lo, stats.tail_hi, core.tail)
    iq_lo, iq_hi = stats.iq_lo, stats.iq_hi
    if by_changes:
        iq_add = cands * _iq_view(new_core, system, policy) if trace else iq0
        iq_lo, iq_hi = add64(iq_lo, iq_hi, iq_add)
    updates = {name: getattr(stats, name) + c for name, c in zip(COUNTERS, cnt)}
    if metrics:
        updates.update(
            _user_sums(stats, user, core, new_core, load, system, policy, metrics, trace)
        )
    return new_core, Stats(
        tail_lo=tail_lo,
        tail_hi=tail_hi,
        tail_delta=stats.tail_delta + acc_tail,
        iq_lo=iq_lo,
        iq_hi=iq_hi,
        iq_delta=stats.iq_delta + acc_iq,
        seen=stats.seen + seen,
        steps=stats.steps + (cands if trace else BLOCK),
        **updates,
        by_class=by_class,
    )


def _user_step(user, before: Core, ev: dict, candidate, load, system, policy, metrics):
    """``user`` plus the metrics at the state before a step: a time sample (where
    ``candidate``, with a trace; every step without) and what an accepted arrival found."""
    value = evaluate(metrics, metric_state(before, load, system, policy))
    at_time = value if candidate is None else jnp.where(candidate, value, 0.0)
    accepted = (ev["arrivals"] - ev["blocked"] - ev["overflow"]) > 0
    return user + jnp.stack([at_time, jnp.where(accepted, value, 0.0)])


def _user_sums(stats, user, core, new_core, load, system, policy, metrics, trace) -> dict:
    """The chunk's user-metric sums with this block's added (compensated).

    The block summed each metric over the states before its steps; the time sum
    counts the states after them, as the tail's (:class:`~jaxqueue.sim.state.Stats`):
    the block's first state out, its last in. A trace's time sum weights the states
    its service candidates found, as they are.
    """
    if not trace:
        first = evaluate(metrics, metric_state(core, load, system, policy))
        last = evaluate(metrics, metric_state(new_core, load, system, policy))
        user = user.at[0].add(last - first)
    total, comp = _kahan(stats.user, stats.user_comp, user)
    return {"user": total, "user_comp": comp}


def time_sum_scale(system: System) -> int:
    """What the 64-bit part of a chunk's time sums is multiplied by
    (:class:`~jaxqueue.sim.totals.Totals`): ``BLOCK`` (a block adds its first
    state), or 1 for a trace (a block adds its candidates times its last state)."""
    return 1 if isinstance(system.arrivals, Trace) else BLOCK


def zero_rows(system: System, policy: Policy, replicas: int, n_user: int = 0) -> Stats:
    """Zero chunk sums of ``replicas`` replicas, batched (leading replica axis)."""
    zero = zero_stats(system, policy, n_user)
    return jax.tree.map(lambda x: jnp.zeros((replicas,) + x.shape, x.dtype), zero)


def advance_blocks(
    core: Core,
    keys: jax.Array,
    first_block: jax.Array,
    n_blocks: jax.Array,
    load: jax.Array,
    system: System,
    policy: Policy,
    metrics: tuple = (),
):
    """Advance a batch of replicas by ``n_blocks`` blocks of BLOCK steps.

    Args:
        core: batched Core (leading replica axis ``R``).
        keys: uint32 ``(R, 2)``, each replica's key data
            (:func:`jaxqueue.core.rng.replica_keys`; keys by position).
        first_block: uint32 ``(2,)``, the low and high words of the index of
            the first block to run (a run has no ceiling on its length).
        n_blocks: int32 scalar (traced: any count without recompiling), at
            most :func:`max_chunk_blocks`.
        load: float32 ``(R,)``, each replica's ``lambda``.
        system, policy: static.
        metrics: static, the user metrics (:class:`~jaxqueue.core.user_metrics.UserMetric`).

    Returns:
        ``(core, stats)``: the advanced batched Core and the batched
        :class:`~jaxqueue.sim.state.Stats` of these blocks.
    """
    stats = zero_rows(system, policy, load.shape[0], len(metrics))
    batched = jax.vmap(
        lambda c, s, k, lam, lo, hi: _block(c, s, k, lo, hi, lam, system, policy, metrics),
        in_axes=(0, 0, 0, 0, None, None),
    )
    lo0, hi0 = first_block[0], first_block[1]

    def body(i, carry):
        lo = lo0 + i.astype(jnp.uint32)
        hi = hi0 + (lo < lo0).astype(jnp.uint32)
        return batched(*carry, keys, load, lo, hi)

    return jax.lax.fori_loop(0, n_blocks, body, (core, stats))


@functools.partial(
    jax.jit, static_argnames=("system", "policy", "mesh", "metrics"), donate_argnames=("core",)
)
def run_blocks(core, keys, first_block, n_blocks, load, *, system, policy, mesh=None, metrics=()):
    """:func:`advance_blocks`, jit-compiled and spread over a mesh.

    With a ``mesh`` (axis ``"replica"``), each device advances its own shard
    of replicas (``shard_map``; no communication). On a CPU, XLA runs each
    device on its own thread, so this is what puts every core to work. The
    block count is traced: runs of any length reuse one compiled program.
    """
    run = functools.partial(advance_blocks, system=system, policy=policy, metrics=metrics)
    return spread(run, mesh, core, keys, first_block, n_blocks, load)


def spread(run, mesh, core, keys, first_block, n_blocks, load, *shared):
    """``run(core, keys, first_block, n_blocks, load, *shared)`` with each device
    of ``mesh`` (axis ``"replica"``) on its own shard of replicas
    (``shard_map``; no communication; ``shared`` arrays are replicated), or
    directly without a mesh of several devices. Every backend's chunk
    function is spread by it."""
    if mesh is None or mesh.size == 1:
        return run(core, keys, first_block, n_blocks, load, *shared)
    spec, rep = PartitionSpec("replica"), PartitionSpec()
    return jax.shard_map(
        run,
        mesh=mesh,
        in_specs=(spec, spec, rep, rep, spec) + (rep,) * len(shared),
        out_specs=spec,
        check_vma=False,
    )(core, keys, first_block, n_blocks, load, *shared)
