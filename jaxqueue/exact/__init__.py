"""Exact stationary solutions of small load-balancing systems (the simulator's test oracle).

The continuous-time Markov chain of the whole system is written down with a
per-server state, enumerated, and ``pi Q = 0`` is solved; nothing here shares
code with the simulator (:mod:`jaxqueue.sim`), so the two check each other.
Background: docs/theory.md and docs/policies.md.

* :mod:`~jaxqueue.exact.chain`: the per-server chains, one rule per policy
  (:data:`RULES`), their symmetry lumping and state enumeration;
* :mod:`~jaxqueue.exact.linalg`: irreducibility check, GMRES and the
  stationary solve (sparse LU / GMRES with scipy, dense numpy without);
* :mod:`~jaxqueue.exact.solver`: :func:`solve_exact`, input validation and
  the adaptive truncation of infinite buffers;
* :mod:`~jaxqueue.exact.result`: :class:`ExactResult`, the package's result
  schema with ``source == "exact"``.

Example:
    >>> from jaxqueue.exact import solve_exact
    >>> res = solve_exact("jiq", 0.6, 4, 2, queue_bound=10)
    >>> res.settings["rule"], res.n_states, round(res.p0, 4)
    ('jiq', 1068, 0.4648)
"""

from jaxqueue.exact.chain import RULES
from jaxqueue.exact.linalg import DENSE_STATE_LIMIT
from jaxqueue.exact.result import ExactResult
from jaxqueue.exact.solver import solve_exact

__all__ = ["solve_exact", "ExactResult", "RULES", "DENSE_STATE_LIMIT"]
