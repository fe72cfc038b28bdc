"""jaxqueue: batched, jit-compiled simulation and mean-field theory of load balancing.

N FIFO servers with exp(1) service, Poisson arrivals of rate ``lambda * N``,
M dispatchers, and the policies of the papers: Random, JSQ, Pod(d), I1F, JIQ
(with delete requests), JIQ-Pod(d), JIQ-SQ(d), the single-dispatcher
idle-first-else-JSQ(d) scheme, JIQ-Original and JIQ-Threshold(z).
"""

__version__ = "0.1.0"

from jaxqueue.config import System, halfin_whitt_load, heavy_traffic_load
from jaxqueue.estimators import Estimate, SimulationResult
from jaxqueue.policies import Policy, available, make, register
from jaxqueue.driver import LevelOverflowError, simulate, steps_per_time_unit, sweep

__all__ = [
    "__version__",
    "System",
    "heavy_traffic_load",
    "halfin_whitt_load",
    "Estimate",
    "SimulationResult",
    "Policy",
    "available",
    "make",
    "register",
    "LevelOverflowError",
    "simulate",
    "sweep",
    "steps_per_time_unit",
]
