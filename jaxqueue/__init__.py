"""jaxqueue: batched, jit-compiled simulation and mean-field theory of load balancing.

N FIFO servers with exponential (or phase-type) service, in one pool or several
of their own speeds, Poisson arrivals of rate ``lambda * N``,
M dispatchers, and the policies of the papers: Random, JSQ, Pod(d), I1F, JIQ
(with delete requests), JIQ-Pod(d), JIQ-SQ(d), the single-dispatcher
idle-first-else-JSQ(d) scheme, JIQ-Original and JIQ-Threshold(z).

Subpackages: :mod:`jaxqueue.policies` (the rules and their registry),
:mod:`jaxqueue.sim` (the simulator), :mod:`jaxqueue.theory` (mean fields),
:mod:`jaxqueue.exact` (exact solutions of small systems),
:mod:`jaxqueue.results` (estimates and the result schema),
:mod:`jaxqueue.studies` (comparisons and paper figures).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys

#: Where each public name lives: imported on first use (PEP 562), so that
#: ``import jaxqueue`` (and the command line's ``--help``) need not import JAX.
_PUBLIC = {
    "__version__": "jaxqueue.core.versions",
    "Model": "jaxqueue.core.config",
    "RunOptions": "jaxqueue.core.config",
    "Bounds": "jaxqueue.core.config",
    "MetricState": "jaxqueue.core.user_metrics",
    "System": "jaxqueue.core.system",
    "SERVICE_RATE": "jaxqueue.core.system",
    "heavy_traffic_load": "jaxqueue.core.system",
    "halfin_whitt_load": "jaxqueue.core.system",
    "steps_per_time_unit": "jaxqueue.core.system",
    "Estimate": "jaxqueue.results",
    "Result": "jaxqueue.results",
    "SimulationResult": "jaxqueue.results",
    "tolerance": "jaxqueue.results",
    "Policy": "jaxqueue.policies",
    "available": "jaxqueue.policies",
    "make": "jaxqueue.policies",
    "register": "jaxqueue.policies",
    "LevelOverflowError": "jaxqueue.sim.runner",
    "CheckpointMismatch": "jaxqueue.sim.runner",
    "WarmupWarning": "jaxqueue.results.warmup",
    "BackendWarning": "jaxqueue.runs.planner",
    "StartWarning": "jaxqueue.runs.planner",
    "WindowWarning": "jaxqueue.runs.planner",
    "PoolRoundingWarning": "jaxqueue.core.service",
    "simulate": "jaxqueue.api",
    "sweep": "jaxqueue.api",
    "sensitivity": "jaxqueue.studies.crn.sensitivity",
    "paired": "jaxqueue.studies.crn.paired",
    "transient": "jaxqueue.runs.transient",
    "TransientResult": "jaxqueue.runs.transient",
}

__all__ = list(_PUBLIC)

#: Subpackages reached as attributes (``jaxqueue.theory.mean_field``), imported on first use.
_SUBPACKAGES = ("api", "core", "results", "policies", "theory", "sim", "exact", "runs", "studies")

_DEVICES_ENV = "JAX_NUM_CPU_DEVICES"


class _ForgetDeviceCount(importlib.abc.MetaPathFinder):
    """Removes the ``JAX_NUM_CPU_DEVICES`` jaxqueue set once JAX has read it (at its import),
    so that processes started later do not inherit a count nobody chose for them."""

    def find_spec(self, name, path=None, target=None):
        if name != "jax":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # by the finders after this one
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenForget(spec.loader)
        return spec


class _ThenForget(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        try:
            self._loader.exec_module(module)
        finally:
            os.environ.pop(_DEVICES_ENV, None)
            module.__loader__ = module.__spec__.loader = self._loader

    def __getattr__(self, name):  # resources and the rest: the real loader's
        return getattr(self._loader, name)


def _one_device_per_core() -> None:
    """Expose one CPU device per core, unless the user chose a count.

    XLA runs each CPU device on its own thread, and the simulator spreads
    replicas over the devices, so this is what puts every core to work. It must
    happen before JAX starts its backends: before JAX is imported, through
    ``JAX_NUM_CPU_DEVICES`` (JAX reads it at its import; it is removed again
    then), and through ``jax.config`` where JAX is already imported. A count
    the user set (``XLA_FLAGS`` with ``--xla_force_host_platform_device_count``,
    ``JAX_NUM_CPU_DEVICES`` or ``jax_num_cpu_devices``) is kept; so are the
    devices of a JAX that has already run an operation (they can no longer change).
    """
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    jax = sys.modules.get("jax")
    if jax is None:
        if _DEVICES_ENV not in os.environ:
            os.environ[_DEVICES_ENV] = str(os.cpu_count() or 1)
            sys.meta_path.insert(0, _ForgetDeviceCount())
        return
    if jax.config.jax_num_cpu_devices != -1:
        return
    try:
        jax.config.update("jax_num_cpu_devices", os.cpu_count() or 1)
    except RuntimeError:  # JAX already runs: its device count is fixed
        pass


_one_device_per_core()


def __getattr__(name: str):
    if name not in _PUBLIC and name not in _SUBPACKAGES:
        raise AttributeError(f"module 'jaxqueue' has no attribute {name!r}")
    # the first use imports what the public names need (JAX, the API, its subpackages),
    # then they are ordinary attributes
    for module in dict.fromkeys(_PUBLIC.values()):
        importlib.import_module(module)
    globals().update({key: getattr(sys.modules[m], key) for key, m in _PUBLIC.items()})
    if name in _SUBPACKAGES:
        return importlib.import_module(f"jaxqueue.{name}")
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
