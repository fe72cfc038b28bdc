"""Small numeric helpers shared by the theory's array functions.

The float type the array functions compute in, the conversion of their
inputs to strong-typed arrays of it, and the check of a probe count ``d``.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["MAX_D", "float_dtype", "as_float_arrays", "check_d"]

#: Largest ``d`` of the mean field (N -> infinity: no bound but
#: :data:`jaxqueue.core.system.MAX_SERVERS`, as the generic mean field checks).
MAX_D = 2**31 - 1


def float_dtype():
    """JAX's default float type: float64 with x64 enabled, float32 otherwise."""
    return jnp.result_type(float)


def as_float_arrays(*xs):
    """The inputs as strong-typed arrays of :func:`float_dtype`, broadcast to one shape."""
    dtype = float_dtype()
    return jnp.broadcast_arrays(*(jnp.asarray(x, dtype) for x in xs))


def check_d(d) -> int:
    """``d`` as an int in ``1..MAX_D``.

    Raises:
        ValueError: for a bool, a non-integer or a value out of range.
    """
    if isinstance(d, bool) or int(d) != d or not 1 <= int(d) <= MAX_D:
        raise ValueError(f"d={d!r} is out of range: need 1 <= d <= {MAX_D}")
    return int(d)
