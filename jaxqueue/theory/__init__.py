"""Mean-field theory of the JIQ family, Pod(d), JSQ and the other exchangeable policies.

The model is that of Wang, Feng and Cheng, "Distributed Join-the-Idle-Queue
for Low Latency Cloud Services", arXiv:1709.10119: the limit ``N, M -> inf``
with ``r = N / M`` fixed. Background and derivations: docs/theory.md.

Modules (each depends only on those above it):

* :mod:`~jaxqueue.theory.p0` -- the ``p0`` equation of JIQ-Pod(d) (``d = 1``:
  JIQ): :func:`solve_p0`, :func:`p0_grid`, :func:`iqueue_distribution`;
* :mod:`~jaxqueue.theory.result` -- :class:`MeanFieldResult`, the
  :class:`~jaxqueue.results.schema.Result` of the mean field;
* :mod:`~jaxqueue.theory.closed_forms` -- the closed forms a policy declares
  (Pod(d), JSQ, JIQ-Pod(d)): :func:`tail`, :func:`mean_response_time`;
* :mod:`~jaxqueue.theory.solvers` -- the solver core: Newton, settling an
  ODE, the adaptive level count, an error-controlled integrator;
* :mod:`~jaxqueue.theory.exponential` -- the generic mean field's model
  (state, routing laws derived from the policies' own rules, drift, the
  sliding flow of JSQ-like routing); :mod:`~jaxqueue.theory.jiqsq` -- JIQ-SQ's
  start;
* :mod:`~jaxqueue.theory.meanfield` -- its fixed point and transient:
  ``meanfield.fixed_point``, ``meanfield.transient``, ``meanfield.as_result``;
* :mod:`~jaxqueue.theory.classes`, :mod:`~jaxqueue.theory.byclass` -- the
  same model by server class (phase-type service and server pools,
  :mod:`jaxqueue.core.service`); :mod:`~jaxqueue.theory.phases` -- its
  ``phases.fixed_point``, ``phases.transient`` (JSQ-like routing past the
  capacity slides along a full level: ``phases.sliding``);
* :mod:`~jaxqueue.theory.periodic` -- the periodic regime of either model
  under a rate profile: ``periodic.periodic_orbit``
  (:mod:`~jaxqueue.theory.periodic_flow`, its compiled passes);
* :mod:`~jaxqueue.theory.tagged_server` -- JIQ-Original's mean field, one
  tagged server's listed and unlisted phases;
* :mod:`~jaxqueue.theory.threshold` -- JIQ-Threshold's mean field, the
  composition chain of one I-queue;
* :mod:`~jaxqueue.theory.dispatch` -- :func:`mean_field`, which picks the
  closed form, the generic fixed point or a per-server policy's solver from
  the policy's declarations;
* :mod:`~jaxqueue.theory.refined` -- the 1/N-refined mean field (Gast and Van
  Houdt): :func:`refined_mean_field`, ``refined.refined_grid``
  (:mod:`~jaxqueue.theory.expansion`, the expansion itself);
* :mod:`~jaxqueue.theory.design` -- :func:`max_load_for_target`;
* :mod:`~jaxqueue.theory.lu` -- Lu et al.'s approximation of JIQ, a baseline:
  :func:`lu_approximation` (vectorised), :func:`lu_result`;
* :mod:`~jaxqueue.theory.erlang` -- the M/M/N queue (Erlang C), the
  pooled-queue benchmark: ``erlang.erlang_c``, ``erlang.erlang_result``.

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
from jaxqueue.theory import meanfield, phases, refined
from jaxqueue.theory.closed_forms import mean_response_time, tail
from jaxqueue.theory.design import MaxLoadResult, max_load_for_target
from jaxqueue.theory.dispatch import mean_field
from jaxqueue.theory.lu import LuResult, lu_approximation, lu_result
from jaxqueue.theory.p0 import P0Solution, iqueue_distribution, p0_grid, solve_p0
from jaxqueue.theory.refined import RefinedMeanField, refined_mean_field
from jaxqueue.theory.result import MeanFieldResult

__all__ = [
    "solve_p0",
    "p0_grid",
    "iqueue_distribution",
    "P0Solution",
    "tail",
    "mean_response_time",
    "mean_field",
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
