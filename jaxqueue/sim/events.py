"""The record of one uniformized step, shared by the occupancy and per-server steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxqueue.core.system import System

__all__ = ["step_event", "move"]


def step_event(
    system: System,
    *,
    up,
    down,
    iq_up,
    iq_down,
    accepted,
    level,
    is_arrival,
    full,
    iq_overflow,
    joins,
    deletes,
    probes,
    stale,
) -> dict:
    """The record of one step that the block accumulators consume (int32 scalars).

    ``up``/``down``: levels gaining and losing a server; ``iq_up``/``iq_down``:
    I-queue sizes gaining and losing a dispatcher; ``seen``: the level an
    accepted arrival found, always ``up - 1`` (the engine's blocks count it
    from ``up``, :data:`jaxqueue.sim.blocks.PACK`; the register layout reads
    ``seen``). Indices past the end mean "none".
    """
    finite = system.buffer is not None
    blocked = (is_arrival & full).astype(jnp.int32)
    return dict(
        up=up,
        down=down,
        iq_up=iq_up,
        iq_down=iq_down,
        seen=jnp.where(accepted, level, system.levels + 1),
        arrivals=is_arrival.astype(jnp.int32),
        blocked=blocked if finite else jnp.int32(0),
        overflow=jnp.int32(0) if finite else blocked,
        iq_overflow=iq_overflow.astype(jnp.int32),
        joins=joins,
        deletes=deletes,
        probes=probes,
        stale=stale,
    )


def move(acc: jax.Array, up: jax.Array, down: jax.Array, value=1, up_value=None) -> jax.Array:
    """``acc`` plus ``value`` at ``up`` (``up_value`` if given) and minus ``value``
    at ``down``, when at most one of them is an index (the other past the end):
    one scatter-add, not two.

    A step moves at most one server between levels, and in the occupancy
    step at most one dispatcher between I-queue sizes, so the two never hold
    together; on a CPU a second scatter costs more than the selects."""
    some = up < acc.shape[0]
    plus = value if up_value is None else up_value
    return acc.at[jnp.where(some, up, down)].add(jnp.where(some, plus, -value), mode="drop")
