"""Test set-up: two CPU devices, so that sharded runs are exercised on any machine."""

import jax
import pytest

jax.config.update("jax_num_cpu_devices", 2)


def pytest_addoption(parser):
    parser.addoption("--all-specs", action="store_true",
                     help="also run the sweeps/ specs that the suite leaves out (tests/test_sweeps.py)")  # fmt: skip


#: The modules that take longest, longest first. pytest-xdist hands whole
#: modules to its workers in collection order (``--dist loadscope
#: --no-loadscope-reorder``), so these go first and the workers end together.
LONGEST_FIRST = (
    "test_kernel", "test_refined", "test_vs_exact", "test_phases", "test_sweeps", "test_grid",
    "test_theory", "test_engine", "test_jiq_original", "test_arrivals", "test_vs_mean_field",
    "test_threshold", "test_transient", "test_long_runs", "test_api", "test_meanfield",
    "test_tagged_server", "test_listed", "test_meanfield_phases", "test_distributed",
)  # fmt: skip


def _rank(item) -> int:
    module = item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the order inside a module is kept
    if config.getoption("--all-specs"):
        return
    skip = pytest.mark.skip(reason="a spec whose features other specs cover: run with --all-specs")
    for item in items:
        if "all_specs" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_chain_work(monkeypatch):
    """The exact solver fails if it starts building a chain: for tests that
    validation comes before any work."""
    from jaxqueue.exact import solver

    def no_work(*args, **kwargs):
        raise AssertionError("validation must come before any work")

    monkeypatch.setattr(solver, "enumerate_states", no_work)
