"""jaxqueue: batched, jit-compiled simulation and mean-field theory of load balancing.

N FIFO servers with exponential service, Poisson arrivals of rate ``lambda * N``,
M dispatchers, and the policies of the papers: Random, JSQ, Pod(d), I1F, JIQ
(with delete requests), JIQ-Pod(d), JIQ-SQ(d), the single-dispatcher
idle-first-else-JSQ(d) scheme, JIQ-Original and JIQ-Threshold(z).

Subpackages: :mod:`jaxqueue.policies` (the rules and their registry),
:mod:`jaxqueue.sim` (the simulator), :mod:`jaxqueue.theory` (mean fields),
:mod:`jaxqueue.exact` (exact solutions of small systems),
:mod:`jaxqueue.results` (estimates and the result schema),
:mod:`jaxqueue.studies` (comparisons and paper figures).
"""

from jaxqueue.core.versions import __version__
from jaxqueue.core.system import (
    SERVICE_RATE, System, halfin_whitt_load, heavy_traffic_load, steps_per_time_unit,
)  # fmt: skip
from jaxqueue.policies import Policy, available, make, register
from jaxqueue.results import Estimate, Result, SimulationResult, tolerance
from jaxqueue.sim.runner import LevelOverflowError
from jaxqueue.api import simulate, sweep

__all__ = [
    "__version__",
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
    "simulate",
    "sweep",
]
