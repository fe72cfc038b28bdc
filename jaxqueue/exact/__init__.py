"""Exact stationary solutions of small load-balancing systems (the simulator's test oracle).

The Markov chain of the whole system is written down with a per-server state,
enumerated, and ``pi Q = 0`` is solved (:func:`solve_exact`); each policy
declares where an arrival goes (``Policy.exact_arrivals``). Design and
derivations: docs/exact.md.

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
