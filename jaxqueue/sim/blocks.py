"""Blocks of uniformized steps for a batch of replicas, with on-device accumulation.

Estimators are accumulated on the device: exact int32 sums inside a block of
:data:`~jaxqueue.core.rng.BLOCK` steps, then Kahan-compensated float32 sums
across blocks, so time averages stay accurate over 10^9 steps.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jaxqueue.core.rng import BLOCK, block_keys, step_words
from jaxqueue.core.system import System
from jaxqueue.policies.base import Policy
from jaxqueue.sim.state import Core, State, Stats, n_words
from jaxqueue.sim.step import step

__all__ = ["run_blocks", "advance_blocks"]


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


def _block(state: State, replica_key, block, load, system: System, policy: Policy) -> State:
    """Run one block of BLOCK steps for one replica."""
    bkey = block_keys(replica_key, block)
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


def advance_blocks(
    state: State,
    keys: jax.Array,
    first_block: jax.Array,
    n_blocks: jax.Array,
    load: jax.Array,
    system: System,
    policy: Policy,
) -> State:
    """Advance a batch of replicas by ``n_blocks`` blocks of BLOCK steps.

    Args:
        state: batched State (leading replica axis ``R``).
        keys: uint32 ``(R, 2)``, each replica's key data
            (:func:`jaxqueue.core.rng.replica_keys`; keys by position).
        first_block: int32 scalar, index of the first block to run.
        n_blocks: int32 scalar (traced: any count without recompiling).
        load: float32 ``(R,)``, each replica's ``lambda``.
        system, policy: static.

    Returns:
        The advanced batched State.
    """

    def one(state, replica_key, load, block):
        return _block(state, replica_key, block, load, system, policy)

    batched = jax.vmap(one, in_axes=(0, 0, 0, None))

    def body(i, state):
        return batched(state, keys, load, first_block + i)

    return jax.lax.fori_loop(0, n_blocks, body, state)


@functools.partial(jax.jit, static_argnames=("system", "policy", "mesh"), donate_argnames=("state",))
def run_blocks(state, keys, first_block, n_blocks, load, *, system, policy, mesh=None):
    """:func:`advance_blocks`, jit-compiled and spread over a mesh.

    With a ``mesh`` (axis ``"replica"``), each device advances its own shard
    of replicas (``shard_map``; no communication). On a CPU, XLA runs each
    device on its own thread, so this is what puts every core to work. The
    block count is traced: runs of any length reuse one compiled program.
    """
    run = functools.partial(advance_blocks, system=system, policy=policy)
    if mesh is None or mesh.size == 1:
        return run(state, keys, first_block, n_blocks, load)
    spec, rep = PartitionSpec("replica"), PartitionSpec()
    return jax.shard_map(
        run, mesh=mesh, in_specs=(spec, spec, rep, rep, spec), out_specs=spec, check_vma=False
    )(state, keys, first_block, n_blocks, load)
