"""The record of one uniformized step, shared by the occupancy and per-server steps."""

from __future__ import annotations

import jax.numpy as jnp

from jaxqueue.core.system import System

__all__ = ["step_event"]


def step_event(system: System, *, up, down, iq_up, iq_down, accepted, level, is_arrival, full,
               iq_overflow, joins, deletes, probes, stale) -> dict:  # fmt: skip
    """The record of one step that the block accumulators consume (int32 scalars).

    ``up``/``down``: levels gaining and losing a server; ``iq_up``/``iq_down``:
    I-queue sizes gaining and losing a dispatcher; ``seen``: the level an
    accepted arrival found. Indices past the end mean "none".
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
