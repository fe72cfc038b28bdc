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


def _one_device_per_core() -> None:
    """Expose one CPU device per core, unless the user chose a count.

    XLA runs each CPU device on its own thread, and the simulator spreads
    replicas over the devices, so this is what puts every core to work. It must
    happen before JAX starts its backends, hence here, before anything of
    jaxqueue (or JAX) computes. A count the user set (``XLA_FLAGS`` with
    ``--xla_force_host_platform_device_count``, or ``jax_num_cpu_devices``) is
    kept; so are the devices of a JAX that has already run an operation
    before jaxqueue was imported (they can no longer change).
    """
    import os

    import jax

    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    if jax.config.jax_num_cpu_devices != -1:
        return
    try:
        jax.config.update("jax_num_cpu_devices", os.cpu_count() or 1)
    except RuntimeError:  # JAX already runs: its device count is fixed
        pass


_one_device_per_core()

from jaxqueue.api import simulate, sweep  # noqa: E402
from jaxqueue.core.config import Bounds, Model, RunOptions  # noqa: E402
from jaxqueue.core.service import PoolRoundingWarning  # noqa: E402
from jaxqueue.core.system import (  # noqa: E402
    SERVICE_RATE,
    System,
    halfin_whitt_load,
    heavy_traffic_load,
    steps_per_time_unit,
)
from jaxqueue.core.versions import __version__  # noqa: E402
from jaxqueue.policies import Policy, available, make, register  # noqa: E402
from jaxqueue.results import Estimate, Result, SimulationResult, tolerance  # noqa: E402
from jaxqueue.results.warmup import WarmupWarning  # noqa: E402
from jaxqueue.runs.planner import BackendWarning, StartWarning, WindowWarning  # noqa: E402
from jaxqueue.runs.transient import TransientResult, transient  # noqa: E402
from jaxqueue.sim.runner import CheckpointMismatch, LevelOverflowError  # noqa: E402

__all__ = [
    "__version__",
    "Model",
    "RunOptions",
    "Bounds",
    "System",
    "SERVICE_RATE",
    "heavy_traffic_load",
    "halfin_whitt_load",
    "steps_per_time_unit",
    "Estimate",
    "Result",
    "SimulationResult",
    "tolerance",
    "Policy",
    "available",
    "make",
    "register",
    "LevelOverflowError",
    "CheckpointMismatch",
    "WarmupWarning",
    "BackendWarning",
    "StartWarning",
    "WindowWarning",
    "PoolRoundingWarning",
    "simulate",
    "sweep",
    "transient",
    "TransientResult",
]
