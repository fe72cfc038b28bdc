"""The suite's own tools: ``--compile-times`` (tests/conftest.py) and the coverage
counts' bounds (tests/agreement.py)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from agreement import binomial_lower, binomial_upper, coverage_acceptance, coverage_bounds
from scipy.stats import binom

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


@pytest.mark.parametrize(
    ("n", "p", "alpha"), [(40, 0.95, 1e-3), (347, 0.95, 5e-4), (372, 0.9, 1e-2)]
)
def test_the_coverage_bounds_are_the_binomial_quantiles(n, p, alpha):
    """The bounds against SciPy's binomial law: each side's false-alarm rate is
    at most its share, and one more count on either side would pass it."""
    lower, upper = binomial_lower(n, p, alpha), binomial_upper(n, p, alpha)
    assert binom.cdf(lower - 1, n, p) <= alpha < binom.cdf(lower, n, p)
    if upper < n:
        assert binom.sf(upper, n, p) <= alpha < binom.sf(upper - 1, n, p)
    else:  # even all n covering is likelier than alpha: no count is too high
        assert binom.pmf(n, n, p) > alpha
    assert coverage_bounds(n, p, 2 * alpha) == (lower, upper)


def test_forty_runs_cannot_fail_a_wide_interval_and_347_can():
    """40 runs: every count up to 40 passes (a too-wide interval cannot fail) and
    an 85% interval passes 86% of the time; 347 runs reject both."""
    assert coverage_bounds(40, 0.95, 1e-3)[1] == 40
    assert coverage_acceptance(40, 0.95, 1e-3, 0.85) > 0.85
    assert coverage_bounds(347, 0.95, 1e-3) == (315, 341)
    assert coverage_acceptance(347, 0.95, 1e-3, 0.85) < 1e-3
    assert coverage_acceptance(347, 0.95, 1e-3, 0.9993) < 1e-6
    assert coverage_acceptance(347, 0.95, 1e-3, 0.95) > 1 - 1e-3


def test_the_mutation_scores_interval_is_the_exact_binomial_one():
    """benchmarks/mutation.py's Clopper-Pearson interval at its closed-form ends:
    ``k = n`` has the lower end ``0.025**(1/n)``, ``k = 0`` the upper ``1 - 0.025**(1/n)``,
    and the interval of ``k`` of ``n`` mirrors that of ``n - k`` (the scores the
    docs quote: 143 of 143 from 97.5%)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "mutation.py"
    spec = importlib.util.spec_from_file_location("mutation_bench", path)
    mutation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutation)
    cp = mutation.clopper_pearson
    for n in (33, 143):
        assert cp(n, n) == pytest.approx((0.025 ** (1 / n), 1.0), rel=1e-12)
        assert cp(0, n) == pytest.approx((0.0, 1 - 0.025 ** (1 / n)), rel=1e-12)
    lo, hi = cp(66, 67)
    lo2, hi2 = cp(1, 67)
    assert (lo, hi) == pytest.approx((1 - hi2, 1 - lo2), rel=1e-12)
    assert round(cp(143, 143)[0], 3) == 0.975 and lo < 66 / 67 < hi
