"""Results: estimates with confidence intervals, the one result schema, response-time laws.

* :mod:`~jaxqueue.results.student`: Student-t quantiles;
* :mod:`~jaxqueue.results.stats`: the tolerance helper;
* :mod:`~jaxqueue.results.estimates`: :class:`Estimate` across replicas;
* :mod:`~jaxqueue.results.schema`: :class:`Result`, the metric names shared by
  simulation, mean field and exact solutions;
* :mod:`~jaxqueue.results.simulation`: :class:`SimulationResult`;
* :mod:`~jaxqueue.results.sweep`: :class:`SweepResult`, a sweep's results as one table;
* :mod:`~jaxqueue.results.display`: a result's short table (its repr and HTML);
* :mod:`~jaxqueue.results.response`: Erlang-mixture response-time laws.
"""

from jaxqueue.results.estimates import Estimate, estimate
from jaxqueue.results.schema import METRICS, QUANTILES, SCALAR_METRICS, VECTOR_METRICS, Result
from jaxqueue.results.simulation import SimulationResult
from jaxqueue.results.stats import student_t_quantile, tolerance, within
from jaxqueue.results.sweep import SweepResult

__all__ = [
    "Estimate",
    "estimate",
    "Result",
    "SimulationResult",
    "SweepResult",
    "METRICS",
    "SCALAR_METRICS",
    "VECTOR_METRICS",
    "QUANTILES",
    "student_t_quantile",
    "tolerance",
    "within",
]
