"""The theory runs on the host's CPU in float64, whatever JAX's default device is.

On a GPU machine the default device is the GPU, where LAPACK-only operations
(Schur, eigendecompositions) have no lowering; every float64 solve enters
:func:`jaxqueue.core.host.host_float64`, which places it on the CPU. The
suite's second CPU device stands in for the GPU here.
"""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np

import jaxqueue
from jaxqueue.core.host import host_device, host_float64


def test_host_float64_runs_on_the_cpu_in_float64_whatever_the_default_device():
    other = jax.devices()[1]  # conftest: two CPU devices; stands in for a GPU default
    assert other != host_device()
    with jax.default_device(other):
        assert jnp.zeros(3).devices() == {other}
        with host_float64():
            x = jnp.linspace(0.0, 1.0, 5)
            assert x.devices() == {host_device()} and x.dtype == jnp.float64
            # a jitted solve with uncommitted inputs compiles for and runs on the host
            y = jax.jit(lambda v: jnp.linalg.eigvals(jnp.diag(v)))(x)
            assert y.devices() == {host_device()}
        assert jnp.zeros(3).dtype == jnp.float32  # x64 is off again


def test_every_float64_solve_goes_through_host_float64():
    """No module switches x64 on by itself: each does it through host_float64,
    which also places the work on the host (the GPU has no Schur)."""
    root = pathlib.Path(jaxqueue.__file__).parent
    code = re.compile(r"^\s*(with|@).*enable_x64", re.M)
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "host.py" and code.search(p.read_text())
    ]
    assert offenders == []
    users = [p for p in root.rglob("*.py") if "with host_float64():" in p.read_text()]
    assert (
        len(users) >= 8
    )  # theory (p0, meanfield, phases, periodic, refined, design), bounds, headline


def test_a_theory_solve_under_another_default_device_gives_the_same_numbers():
    """The generic mean field (I1F) solves to the same numbers, bit for bit,
    under another default device (its work is placed on the host either way)."""
    from jaxqueue import theory

    here = theory.mean_field("i1f", 0.9)
    with jax.default_device(jax.devices()[1]):
        there = theory.mean_field("i1f", 0.9)
    assert there.mean_response_time == here.mean_response_time
    np.testing.assert_array_equal(np.asarray(there.tail), np.asarray(here.tail))
