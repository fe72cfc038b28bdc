"""Test set-up: two CPU devices, so that sharded runs are exercised on any machine.

``--compile-times`` reports, per test module, the seconds its tests took and
the seconds JAX spent in them tracing, lowering and compiling (from JAX's own
monitoring events, gathered from every xdist worker): where the suite's time
goes, for keeping it short. A jit traced inside another's trace counts in both
trace columns; lowering and compiling count once. Compiles in the subprocesses
some tests start (the command line, two hosts) are not seen. A second table
lists the functions that took longest to compile, with how many times each
was compiled (once per new shape, dtype or static argument): the place to
look for compiles a test could share.
"""

import collections
import json
import os
import shutil
import tempfile

# One BLAS thread per process (before NumPy is imported): the xdist workers
# already use every core, and OpenBLAS's threads spin-wait for each other,
# so a host-side solve sharing the cores with another worker's compile took
# 10-50 times its time alone. A count already set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# One compilation cache for the run, shared by the xdist workers and by the
# subprocesses some tests start (the command line, two hosts): a program one
# process has compiled is loaded by the others, not compiled again. pytest's
# own process makes it before it starts its workers (they inherit the
# variable) and removes it at the end; a JAX_COMPILATION_CACHE_DIR already
# set is used as it is. It must be set before JAX is imported.
_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="jaxqueue-tests-jit-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)


def pytest_addoption(parser):
    parser.addoption(
        "--all-specs",
        action="store_true",
        help="run every sweeps/ spec's whole quick mode, not a slice of it (tests/studies/test_sweeps.py)",
    )
    parser.addoption(
        "--compile-times",
        action="store_true",
        help="report per test module the seconds spent tracing, lowering and compiling",
    )


#: The modules that take longest, longest first. pytest-xdist hands whole
#: modules to its workers in collection order (``--dist loadscope
#: --no-loadscope-reorder``), so these go first and the workers end together.
#: The order is that of the ``tests`` column of ``--compile-times``; a slow
#: module left off this list runs last and leaves one worker finishing alone.
LONGEST_FIRST = (
    "test_sweeps",
    "test_refined",
    "test_kernel",
    "test_vs_exact",
    "test_periodic_classes",
    "test_sliding",
    "test_phases",
    "test_periodic",
    "test_threshold",
    "test_theory",
    "test_grid",
    "test_transient",
    "test_meanfield_pools",
    "test_arrivals",
    "test_api",
    "test_engine",
    "test_large_d",
    "test_meanfield_jiqsq_large_r",
    "test_jiq_original",
    "test_meanfield",
    "test_vs_mean_field",
    "test_distributed",
    "test_windows",
    "test_diffusion",
    "test_meanfield_phases",
    "test_sensitivity_params",
    "test_references",
    "test_long_runs",
    "test_tagged_server",
    "test_sensitivity",
    "test_initial",
    "test_overflow",
    "test_listed",
    "test_design_sim",
    "test_paired",
    "test_lu",
    "test_jsew",
    "test_suite_tools",
    "test_cli_polish",
    "test_source_bounds",
    "test_grid_sensitivity",
)


def _rank(item) -> int:
    module = item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the order inside a module is kept


@pytest.fixture
def no_chain_work(monkeypatch):
    """The exact solver fails if it starts building a chain: for tests that
    validation comes before any work."""
    from jaxqueue.exact import solver

    def no_work(*args, **kwargs):
        raise AssertionError("validation must come before any work")

    monkeypatch.setattr(solver, "enumerate_states", no_work)


# -- --compile-times ------------------------------------------------------------------------

#: JAX's monitoring events of one compilation, by the column they add to.
_COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
_COLUMNS = ("trace", "lower", "compile")
_TOP_FUNCTIONS = 25


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


class _CompileTimes:
    """Seconds of each compile event per module, and compiles and their seconds
    per compiled function (by name), in this process."""

    def __init__(self):
        self.current = "(collection)"
        self.seconds = collections.defaultdict(lambda: dict.fromkeys(_COLUMNS, 0.0))
        self.functions = collections.defaultdict(lambda: [0, 0.0])
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        column = _COMPILE_EVENTS.get(event)
        if column is not None:
            self.seconds[self.current][column] += duration
        if column == "compile":
            entry = self.functions[str(kwargs.get("fun_name", "?"))]
            entry[0] += 1
            entry[1] += duration

    def pytest_runtest_logstart(self, nodeid, location):
        self.current = _module(nodeid)

    def pytest_sessionfinish(self, session):
        if hasattr(session.config, "workerinput"):  # an xdist worker: to the controller
            session.config.workeroutput["compile_times"] = json.dumps(self.seconds)
            session.config.workeroutput["compiled_functions"] = json.dumps(self.functions)


class _CompileReport:
    """The controller's side: the tests' durations and every process's compile times."""

    def __init__(self, local):
        self.local = local  # None under xdist: the workers send theirs
        self.tests = collections.Counter()
        self.seconds = collections.defaultdict(lambda: dict.fromkeys(_COLUMNS, 0.0))
        self.functions = collections.defaultdict(lambda: [0, 0.0])

    def _add(self, seconds, functions):
        for module, cols in seconds.items():
            for column, value in cols.items():
                self.seconds[module][column] += value
        for name, (count, secs) in functions.items():
            self.functions[name][0] += count
            self.functions[name][1] += secs

    def pytest_runtest_logreport(self, report):
        self.tests[_module(report.nodeid)] += report.duration

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        out = getattr(node, "workeroutput", {})
        self._add(
            json.loads(out.get("compile_times", "{}")),
            json.loads(out.get("compiled_functions", "{}")),
        )

    def pytest_terminal_summary(self, terminalreporter):
        if self.local is not None:
            self._add(self.local.seconds, self.local.functions)
        tr = terminalreporter
        tr.section("compile times (seconds; tests = setup + call + teardown)")
        if not any(sum(c.values()) for c in self.seconds.values()):
            tr.write_line("no compile events seen: JAX's monitoring event names may have changed")
            return
        tr.write_line(f"{'tests':>8} {'trace':>7} {'lower':>7} {'compile':>8} {'share':>6}  module")
        modules = sorted(set(self.tests) | set(self.seconds), key=lambda m: -self.tests[m])
        rows = [(m, self.tests[m], [self.seconds[m][c] for c in _COLUMNS]) for m in modules]
        total = [sum(r[2][i] for r in rows) for i in range(len(_COLUMNS))]
        for module, t, cols in rows + [("all", sum(r[1] for r in rows), total)]:
            share = f"{sum(cols) / t:6.0%}" if t > 0 else " " * 6
            tr.write_line(
                f"{t:8.1f} {cols[0]:7.1f} {cols[1]:7.1f} {cols[2]:8.1f} {share}  {module}"
            )
        tr.write_line("")
        tr.write_line(
            f"the {_TOP_FUNCTIONS} functions that took longest to compile, in all processes:"
        )
        tr.write_line(f"{'compile':>8} {'times':>6}  function")
        top = sorted(self.functions.items(), key=lambda kv: -kv[1][1])[:_TOP_FUNCTIONS]
        for name, (count, secs) in top:
            tr.write_line(f"{secs:8.1f} {count:6d}  {name}")


def pytest_configure(config):
    if not config.getoption("--compile-times"):
        return
    worker = hasattr(config, "workerinput")
    uses_workers = getattr(config.option, "numprocesses", None) not in (None, 0)
    local = _CompileTimes() if worker or not uses_workers else None
    if local is not None:
        config.pluginmanager.register(local, "jaxqueue-compile-times")
    if not worker:
        config.pluginmanager.register(_CompileReport(local), "jaxqueue-compile-report")


def pytest_unconfigure(config):
    if _CACHE is not None:
        shutil.rmtree(_CACHE, ignore_errors=True)
