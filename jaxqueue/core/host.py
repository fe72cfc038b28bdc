"""Where the theory runs: the host's CPU, in float64.

The mean-field, refined, periodic and design solves are small dense problems
solved in float64, and some use LAPACK-only operations (Schur and
eigendecompositions) that have no GPU lowering. :func:`host_float64` runs a
block of JAX code on the host's CPU device with x64 on, whatever JAX's
default device is (a GPU, where the simulator runs); every float64 solve of
the package enters it, none switches x64 on by itself.
"""

from __future__ import annotations

import contextlib
import functools

import jax

__all__ = ["host_device", "host_float64"]


@functools.lru_cache(maxsize=1)
def host_device():
    """This process's first CPU device (present on every JAX platform)."""
    return jax.local_devices(backend="cpu")[0]


@contextlib.contextmanager
def host_float64():
    """Run the block on :func:`host_device` with x64 on (computations whose
    inputs are not placed on a device elsewhere run there)."""
    with jax.enable_x64(True), jax.default_device(host_device()):
        yield
