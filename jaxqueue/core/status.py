"""One status code for every solver of the package (per point, as data inside vmap).

The p0 solver, the generic mean-field fixed point, the refined mean field and
the inverse design all report a :class:`Status`; 0 always means success and each other value has one
meaning everywhere.
"""

from __future__ import annotations

import enum

__all__ = ["Status", "message"]


class Status(enum.IntEnum):
    """Outcome of a solve."""

    #: converged to the requested tolerance
    CONVERGED = 0
    #: no convergence within the iteration limit
    MAX_ITERATIONS = 1
    #: a non-finite value appeared during the iteration
    NON_FINITE = 2
    #: the input is outside the solver's domain (e.g. load >= 1, ratio <= 0)
    INVALID_INPUT = 3
    #: no point meets the target (inverse design)
    INFEASIBLE = 4
    #: every point of the domain meets the target (inverse design)
    UNBOUNDED = 5
    #: the drift is not differentiable at the fixed point (refined mean field)
    NOT_DIFFERENTIABLE = 6
    #: the level bound leaves more of the tail out than a result may (a grid's shared bound)
    TRUNCATED = 7


_MESSAGES = {
    Status.CONVERGED: "converged",
    Status.MAX_ITERATIONS: "no convergence within the iteration limit",
    Status.NON_FINITE: "non-finite value during the iteration",
    Status.INVALID_INPUT: "invalid input (outside the solver's domain)",
    Status.INFEASIBLE: "infeasible: no point meets the target",
    Status.UNBOUNDED: "every point of the domain meets the target",
    Status.NOT_DIFFERENTIABLE: "the drift is not differentiable at the fixed point",
    Status.TRUNCATED: "the level bound leaves more than 1e-6 of the tail out: give more levels",
}


def message(status) -> str:
    """A one-line description of a status code."""
    try:
        return _MESSAGES[Status(int(status))]
    except ValueError:
        return f"unknown status {status!r}"
