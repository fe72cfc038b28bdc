"""The suite's own tools (tests/conftest.py): ``--compile-times``."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TINY = """
import jax
import jax.numpy as jnp


def chain(x):  # 1000 operations: tenths of seconds to show, not a rounding error
    for i in range(500):
        x = jnp.sin(x) + i
    return x


def test_compiles_once():
    assert jax.jit(chain)(jnp.float32(0.5)) > 0
"""


@pytest.mark.slow
def test_compile_times_counts_a_compile_in_its_module(tmp_path):
    """On a tiny suite of one jitted function, in one process and under two xdist
    workers: the table names the module with compile seconds above zero (it
    fails if JAX's monitoring event names change)."""
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_tiny.py").write_text(TINY)
    # each run with a compilation cache of its own: a program loaded from the
    # suite's cache is not compiled, and the second run would find the first's
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    for workers in ("0", "2"):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--compile-times",
                "-n",
                workers,
                "-o",
                "addopts=",
                "test_tiny.py",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        ).stdout
        assert "1 passed" in out, out
        row = next(line for line in out.splitlines() if line.endswith("  test_tiny.py"))
        tests, trace, lower, compiled = (float(x) for x in row.split()[:4])
        assert tests >= compiled > 0 and trace + lower > 0, row
