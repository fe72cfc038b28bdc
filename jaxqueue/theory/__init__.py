"""Mean-field theory of the JIQ family, Pod(d), JSQ and the other exchangeable policies.

The model is that of Wang, Feng and Cheng, "Distributed Join-the-Idle-Queue
for Low Latency Cloud Services", arXiv:1709.10119: the limit ``N, M -> inf``
with ``r = N / M`` fixed. Background and derivations: docs/theory.md.

Sub-packages, one idea each (a module depends only on those listed before it):

* :mod:`~jaxqueue.theory.closed` -- the closed forms, in JAX and differentiable:
  the ``p0`` equation of JIQ-Pod(d) (:func:`solve_p0`, :func:`p0_grid`,
  :func:`iqueue_distribution`), the tails and response times a policy
  declares (:func:`tail`, :func:`mean_response_time`) and the inverse design
  on them (:func:`max_load_for_target`);
* :mod:`~jaxqueue.theory.generic` -- the generic mean field: its solver core
  (``generic.solvers``: Newton, settling an ODE, the adaptive level count),
  its two models behind one interface (``generic.models``: identical
  exponential servers, ``generic.exponential``, and server classes of
  phase-type service and pools, ``generic.byclass``), and their fixed points
  and transients (``meanfield.fixed_point``, ``phases.fixed_point``, their
  ``transient``; the by-class solves and the periodic regime take the system
  as one value, :class:`Limit`);
* :mod:`~jaxqueue.theory.profiles` -- the periodic regime of either model
  under a rate profile (``profiles.periodic.periodic_orbit``);
* :mod:`~jaxqueue.theory.per_server` -- the mean fields that follow one server
  (JIQ-Original, ``per_server.tagged_server``) or one I-queue
  (JIQ-Threshold, ``per_server.threshold``);
* :mod:`~jaxqueue.theory.finite_n` -- the 1/N-refined mean field (Gast and Van
  Houdt): :func:`refined_mean_field`, ``refined.refined_grid``;
* :mod:`~jaxqueue.theory.baselines` -- references beside the mean field: Lu et
  al.'s approximation of JIQ (:func:`lu_approximation`, :func:`lu_result`),
  the M/M/N queue (``baselines.erlang``) and the Halfin-Whitt diffusion limit
  (``baselines.diffusion``);
* :mod:`~jaxqueue.theory.solve` -- :func:`fixed_point` and :func:`transient`
  of the generic mean field, either model, one signature;
* :mod:`~jaxqueue.theory.result` -- :class:`MeanFieldResult`, the
  :class:`~jaxqueue.results.schema.Result` of the mean field, and
  :mod:`~jaxqueue.theory.dispatch` -- :func:`mean_field`, which picks the
  closed form, the generic fixed point or a per-server policy's solver from
  the policy's declarations.

Everything is in units of the mean service time
(:data:`jaxqueue.core.system.SERVICE_RATE` is 1). Status codes are
:class:`~jaxqueue.core.status.Status` members (re-exported here).

Example:
    >>> from jaxqueue import theory
    >>> sol = theory.solve_p0(0.9, 10.0)  # JIQ at lambda = 0.9, r = 10
    >>> theory.Status(int(sol.status)).name
    'CONVERGED'
    >>> mf = theory.mean_field("jiq-pod", 0.98, 10.0, d=2)
    >>> round(mf.mean_response_time, 2)
    2.54
    >>> import jax
    >>> dT = jax.grad(lambda lam: theory.mean_response_time("jiq", lam, 10.0))(0.9)
"""

from jaxqueue.core.status import Status
from jaxqueue.theory.baselines.lu import LuResult, lu_approximation, lu_result
from jaxqueue.theory.closed.closed_forms import mean_response_time, tail
from jaxqueue.theory.closed.design import MaxLoadResult, max_load_for_target
from jaxqueue.theory.closed.p0 import P0Solution, iqueue_distribution, p0_grid, solve_p0
from jaxqueue.theory.dispatch import mean_field
from jaxqueue.theory.finite_n import refined
from jaxqueue.theory.finite_n.refined import RefinedMeanField, refined_mean_field
from jaxqueue.theory.generic import meanfield, phases
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.generic.settings import LevelGrowth, Newton, Settle, Solver
from jaxqueue.theory.result import MeanFieldResult
from jaxqueue.theory.solve import fixed_point, transient

__all__ = [
    "solve_p0",
    "p0_grid",
    "iqueue_distribution",
    "P0Solution",
    "tail",
    "mean_response_time",
    "mean_field",
    "fixed_point",
    "transient",
    "Solver",
    "Newton",
    "Settle",
    "LevelGrowth",
    "Limit",
    "MeanFieldResult",
    "max_load_for_target",
    "MaxLoadResult",
    "Status",
    "meanfield",
    "phases",
    "refined",
    "refined_mean_field",
    "RefinedMeanField",
    "lu_approximation",
    "lu_result",
    "LuResult",
]
