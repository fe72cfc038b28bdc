"""Where a run's replicas live: the device mesh, and the replica keys and loads
placed on it (as global arrays built in every process, with several processes)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.rng import replica_keys

__all__ = ["placement", "put_global"]


@functools.lru_cache(maxsize=8)
def placement(p):
    """The mesh, and the sharded replica keys and loads of a plan.

    With several processes, ``devices`` are global and the keys and loads
    global arrays (see :func:`put_global`).
    """
    mesh = jax.sharding.Mesh(np.asarray(p.devices), ("replica",))
    if len(p.devices) > 1:
        sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("replica"))
    else:  # what a one-device program returns: inputs and outputs alike, one compile
        sharded = _single_device(p.devices[0])
    index = np.arange(p.padded)
    if p.streams is None:
        keys = replica_keys(p.seed, index)
    else:
        group = np.minimum(index // p.replicas, len(p.loads) - 1)
        keys = replica_keys(p.seed, index - group * p.replicas, np.asarray(p.streams)[group])
    if jax.process_count() > 1:
        return (
            mesh,
            sharded,
            put_global(np.asarray(keys), sharded),
            put_global(p.load_vector(), sharded),
        )
    loads = jax.device_put(jnp.asarray(p.load_vector()), sharded)
    return mesh, sharded, jax.device_put(keys, sharded), loads


def _single_device(device):
    """The sharding of one device: ``make_single_device_sharding`` where JAX
    has it (the class itself is deprecated from JAX 0.12 on), else the class."""
    make = getattr(jax.sharding, "make_single_device_sharding", None)
    return make(device) if make is not None else jax.sharding.SingleDeviceSharding(device)


def put_global(tree, sharding):
    """A pytree of host arrays as global arrays of ``sharding`` (several processes).

    Every process holds the same full host values and builds the shards of
    its own devices from them (``jax.make_array_from_callback``): no
    communication, unlike ``jax.device_put``, which checks across processes
    that the values are equal.
    """

    def one(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(one, tree)
