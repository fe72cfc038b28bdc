"""Test set-up: two CPU devices, so that sharded runs are exercised on any machine."""

import jax
import pytest

jax.config.update("jax_num_cpu_devices", 2)


@pytest.fixture
def no_chain_work(monkeypatch):
    """The exact solver fails if it starts building a chain: for tests that
    validation comes before any work."""
    from jaxqueue.exact import solver

    def no_work(*args, **kwargs):
        raise AssertionError("validation must come before any work")

    monkeypatch.setattr(solver, "enumerate_states", no_work)
