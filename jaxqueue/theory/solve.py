"""One front door to the generic mean field's two models: :func:`fixed_point` and
:func:`transient`.

Both take the policy, the load and the ratio with the model's options as
keywords (as :func:`jaxqueue.theory.mean_field`), the level bounds as a
:class:`~jaxqueue.core.config.Bounds` and the solver's settings as a
:class:`~jaxqueue.theory.Solver`, and choose the model from the service law and
the pools: identical exponential servers
(:mod:`jaxqueue.theory.generic.meanfield`, which the closed forms are checked
against bit for bit) or server classes of phase-type service and pools
(:mod:`jaxqueue.theory.generic.phases`). The transient is the ODE by class for
both (exponential service is one class), so it has one result type.
"""

from __future__ import annotations

from jaxqueue.core.config import Bounds, check_options, takes_options
from jaxqueue.theory.generic import meanfield, phases
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.generic.meanfield import TRANSIENT_TOL
from jaxqueue.theory.generic.settings import LevelGrowth, Newton, Settle, Solver

__all__ = ["fixed_point", "transient"]


@takes_options("d", "buffer", "service", "pools")
def fixed_point(
    policy,
    load: float,
    ratio: float | None = None,
    *,
    bounds: Bounds | None = None,
    solver: Solver | Newton | Settle | LevelGrowth | None = None,
    **options,
):
    """The generic mean field's fixed point of either model (float64, host side).

    Args:
        policy: a policy with the generic mean field (a name or a Policy).
        load: ``lambda`` (below the capacity with infinite buffers).
        ratio: ``r = N / M`` for the JIQ family; ``None``: one dispatcher.
        bounds: the levels represented (``Bounds(levels, iqueue_levels)``);
            ``None`` or a bound left at ``None``: the adaptive count (or the
            buffer), as :func:`jaxqueue.theory.generic.meanfield.fixed_point`.
        solver: the solve's settings (:class:`~jaxqueue.theory.Solver` or one
            of its parts).
        <options>

    Returns:
        The model's fixed point: a
        :class:`jaxqueue.theory.generic.meanfield.FixedPoint` for identical
        exponential servers, a :class:`jaxqueue.theory.generic.phases.FixedPoint`
        with a service law or pools. Both hold ``tail``, ``iq_tail``,
        ``rates``, ``residual``, ``status``, ``iterations`` and ``truncated``;
        a solve that did not converge says so in ``status`` (it does not raise).
    """
    check_options("fixed_point", options, fixed_point)
    limit = Limit(policy, ratio, **options)  # the options are the Limit's fields
    if limit.by_class():
        return phases.fixed_point(limit, load, bounds=bounds, solver=solver)
    b = Bounds() if bounds is None else bounds
    return meanfield.fixed_point(
        policy,
        load,
        ratio,
        d=limit.d,
        buffer=limit.buffer,
        levels=b.levels,
        iqueue_levels=b.iqueue_levels,
        solver=solver,
    )


@takes_options("d", "buffer", "service", "pools")
def transient(
    policy,
    load: float,
    ratio: float | None = None,
    *,
    times,
    start=None,
    bounds: Bounds | None = None,
    tol: float | None = TRANSIENT_TOL,
    **options,
) -> phases.Transient:
    """The generic mean field's ODE recorded at ``times``, for either model.

    Args:
        policy, load, ratio, bounds: as for :func:`fixed_point` (no adaptive
            level count here: ``levels`` by default is the buffer, else the
            first count of the fixed point's search, or the start's).
        times: non-decreasing times ``>= 0``; the states are at exactly these.
        start: ``None`` (the empty system), a fixed point of the same setting
            by class (:func:`fixed_point` with a service law or pools), or the
            flat state by class.
        tol: the error per step allowed (Dormand-Prince 5(4)); ``None``:
            fixed RK4 steps.
        <options>

    Returns:
        A :class:`jaxqueue.theory.generic.phases.Transient` (``times``,
        ``tails``, ``phase_counts``, ``iq_tails``).
    """
    check_options("transient", options, transient)
    return phases.transient(
        Limit(policy, ratio, **options),
        load,
        times=times,
        start=start,
        bounds=bounds,
        tol=tol,
    )
