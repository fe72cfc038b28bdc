"""The periodic regime as results: the orbit, its averages and its MeanFieldResult."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from jaxqueue.core.arrivals import Profile, as_arrivals
from jaxqueue.core.status import Status
from jaxqueue.theory.generic import meanfield, phases
from jaxqueue.theory.generic.meanfield import FixedPoint, Rates
from jaxqueue.theory.profiles.periodic_flow import AT_J, AT_L, BELOW_J, BELOW_L

__all__ = ["PeriodicOrbit", "as_profile", "tail_decay", "averages", "orbit_curve", "as_result"]


class PeriodicOrbit(NamedTuple):
    """The periodic regime of the mean-field ODE under a rate profile (host values).

    Attributes:
        start: the orbit's state at phase 0 of the profile, ``[s_1..s_L, Q_1..Q_J]``.
        averages: a :class:`~jaxqueue.theory.generic.meanfield.FixedPoint` of the
            averages (``tail``, ``iq_tail``: time averages; ``rates.level``
            and the per-arrival rates: averages weighted by ``lambda(t)``;
            ``rates.join_probes``: weighted by the join rate);
            ``truncated`` holds the orbit's largest mass at each bound. By
            class, a :class:`jaxqueue.theory.generic.phases.FixedPoint` of the same
            averages, with ``seen_phase`` and ``seen_idle``.
        p0: the time average of ``p0`` (``None`` without I-queues).
        window: ``(start, length)`` the averages are over.
        curve: the orbit over one period at the start of each RK4 step:
            ``{"time", "load", "mean_queue_length", "waiting_probability",
            "mean_response_time", "p0"}`` (arrays; ``p0`` only with I-queues),
            and with pools ``"pool_utilization"``, ``(steps, pools)``: each
            pool's busy fraction.
        status: ``CONVERGED``, or ``MAX_ITERATIONS`` if the period map did
            not settle within the iterations allowed.
        residual: ``max |Phi(start) - start|``.
        newton_iterations, periods: Newton steps and forward periods taken.
        system: the limit :class:`~jaxqueue.core.system.System` solved on
            (its ``levels`` and ``iqueue_levels`` are the bounds used).
    """

    start: np.ndarray
    averages: FixedPoint
    p0: float | None
    window: tuple
    curve: dict
    status: Status
    residual: float
    newton_iterations: int
    periods: int
    system: object


def as_profile(arrivals) -> Profile:
    src = as_arrivals(arrivals)
    if isinstance(src, Profile):
        return src
    if src is None:
        raise ValueError(
            "arrivals is None: give a rate profile (use meanfield.fixed_point "
            "for Poisson arrivals at a constant rate)"
        )
    raise NotImplementedError(
        f"no mean field for {src.kind} arrivals: the periodic mean field takes a rate "
        "profile (an MMPP modulates the whole system's rate at random, so its limit is a "
        "random ODE, and a trace is one sample path); simulate instead"
    )


def tail_decay(seen) -> tuple:
    """``s_L / s_{L-1}`` and ``Q_J / Q_{J-1}`` where the orbit's mass at each
    bound peaks (NaN where that level is empty)."""
    out = []
    for at, below in ((AT_L, BELOW_L), (AT_J, BELOW_J)):
        i = int(np.argmax(seen[:, at]))
        out.append(float(seen[i, at] / seen[i, below]) if seen[i, below] > 0 else math.nan)
    return tuple(out)


def averages(pol, system, load, mean, seen, status, residual, it, classes=None) -> tuple:
    """The window's averages (``mean``, the flow integrals over its length) and the
    time average of ``p0`` (``None`` without I-queues).

    The averages are a FixedPoint whose rates give, through
    :func:`jaxqueue.theory.generic.meanfield.as_result` (which multiplies per-arrival
    rates by ``load``), the window's averages per unit time; by class (``classes``
    given), a :class:`jaxqueue.theory.generic.phases.FixedPoint` whose ``seen_phase``
    and ``seen_idle`` hold where the accepted arrivals found their servers
    (weighted by ``lambda(t)``), for :func:`jaxqueue.theory.generic.phases.as_result`.
    ``status``, ``residual`` and ``it``: the period map's solve.
    """
    L, J = system.levels, system.iqueue_levels
    C = 1 if classes is None else classes.n_classes
    parts = [L * C + J, L + 1] + ([] if classes is None else [(L - 1) * C, len(classes.laws)])
    x_avg, level, *by_class, rest = np.split(mean, np.cumsum(parts))
    deletes, probes, join_probes, join, p0, lam = rest
    rates = Rates(
        level=level / lam,  # the law of the level an arrival joins (level[L]: blocked)
        iq_remove=np.zeros(J + 1),
        join=np.zeros(J + 1),
        deletes=deletes / load,
        probes=probes / load,
        join_probes=join_probes / join if join > 0 else 0.0,
    )
    truncated = (
        float(seen[:, AT_L].max()) if system.buffer is None else 0.0,
        float(seen[:, AT_J].max()) if J else 0.0,
    )
    p0 = float(p0) if pol.uses_iqueues else None
    if classes is None:
        s, q = meanfield.split_state(np.asarray(x_avg), system)
        return FixedPoint(s, q, rates, residual, status, it, truncated), p0
    joint, idle = by_class
    accepted = rates.level[:L].sum()
    fp = phases.summarize(pol, load, classes, system, x_avg, rates, status, residual, it)
    seen_phase, seen_idle = joint.reshape(L - 1, C) / lam / accepted, idle / lam / accepted
    return fp._replace(p0=p0, truncated=truncated, seen_phase=seen_phase, seen_idle=seen_idle), p0


def orbit_curve(pol, classes, times, loads, seen) -> dict:
    """:attr:`PeriodicOrbit.curve` from the orbit's values at ``times``."""
    curve = {
        "time": times,
        "load": loads,
        "mean_queue_length": seen[:, 0],
        "waiting_probability": seen[:, 1],
        "mean_response_time": seen[:, 2],
    }
    if pol.uses_iqueues:
        curve["p0"] = seen[:, 3]
    if classes is not None and classes.given:
        curve["pool_utilization"] = seen[:, 8:]
    return curve


def as_result(
    orbit: PeriodicOrbit,
    policy,
    load: float,
    ratio: float | None,
    arrivals,
    *,
    buffer: int | None = None,
    with_quantiles: bool = True,
):
    """A :class:`~jaxqueue.theory.result.MeanFieldResult` of the orbit's averages.

    ``settings["arrivals"]`` records the profile and ``settings["window"]``
    the averaging window; ``diagnostics["orbit"]`` holds
    :attr:`PeriodicOrbit.curve`, with the solver's ``residual``, ``periods``
    and ``newton_iterations``. By class (a service law or pools) the result
    is :func:`jaxqueue.theory.generic.phases.as_result`'s, with its quantiles and
    pool metrics.
    """
    if isinstance(orbit.averages, phases.FixedPoint):
        res = phases.as_result(orbit.averages, policy, load, ratio, buffer=buffer)
    else:
        res = meanfield.as_result(
            orbit.averages, policy, load, ratio, buffer=buffer, with_quantiles=with_quantiles
        )
    settings = dict(
        res.settings, arrivals=as_profile(arrivals).to_dict(), window=list(orbit.window)
    )
    diagnostics = dict(
        res.diagnostics,
        orbit=orbit.curve,
        residual=orbit.residual,
        periods=orbit.periods,
        newton_iterations=orbit.newton_iterations,
    )
    return dataclasses.replace(res, p0=orbit.p0, settings=settings, diagnostics=diagnostics)
