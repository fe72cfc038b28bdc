"""The mean field by class as results: its fixed point, transient and MeanFieldResult.

:func:`summarize` turns a solved state into a :class:`FixedPoint`;
:func:`as_result` a fixed point (or a periodic regime's averages) into a
:class:`~jaxqueue.theory.result.MeanFieldResult`, pool metrics included.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from jaxqueue.core.service import PhaseType
from jaxqueue.core.status import Status
from jaxqueue.policies import make
from jaxqueue.results.pools import pool_metrics, result_fields
from jaxqueue.results.response import (
    ph_mixture_quantiles,
    ph_response_mean,
    ph_response_quantiles,
)
from jaxqueue.results.schema import QUANTILES
from jaxqueue.theory.generic.byclass import tail_of
from jaxqueue.theory.generic.classes import ServerClasses
from jaxqueue.theory.generic.exponential import Rates
from jaxqueue.theory.generic.meanfield_result import fixed_point_result
from jaxqueue.theory.result import MeanFieldResult

__all__ = ["FixedPoint", "Transient", "summarize", "as_result", "pool_response"]


class FixedPoint(NamedTuple):
    """The phase-type mean-field fixed point and its metrics (host values, float64).

    Attributes:
        tail: ``(L + 1,)`` ``s_0..s_L``: the fraction of servers with at least ``k`` tasks.
        phase_counts: ``(L + 1, P)``: ``x[k, p]``, servers with exactly ``k``
            tasks whose task in service is in phase ``p`` (row 0 is zero: the
            idle fraction is ``1 - tail[1]``).
        iq_tail: ``(J + 1,)`` ``Q_0..Q_J`` for the JIQ family with many
            dispatchers, else None.
        mean_queue_length: ``sum_k k * P(k tasks) = sum_{k >= 1} s_k``.
        mean_response_time: Little's law, ``mean_queue_length / (lambda (1 - blocking))``,
            in the law's time unit (mean service times for a mean-1 law).
        p0: the probability that an arrival's dispatcher has an empty I-queue
            (JIQ family: ``1 - Q_1``, or with one dispatcher 1.0 if no server
            is idle else 0.0), else None.
        blocking_probability: ``level[L]`` with a finite buffer, else 0.0.
        status: a :class:`~jaxqueue.core.status.Status` (``CONVERGED``,
            ``MAX_ITERATIONS`` or ``NON_FINITE``), as the exponential fixed point.
        residual: max-norm of the residual (drift, with the conservation law) there.
        iterations: Newton iterations (residual evaluations) at the final level count.
        truncated: ``(s_L, Q_J)`` (``s_L`` with infinite buffers, else 0.0;
            ``Q_J`` 0.0 without I-queues): the mass at the bounds.
        levels: ``L``, the largest queue length represented.
        rates: the :class:`~jaxqueue.theory.generic.meanfield.Rates` at the fixed point.
        service: the :class:`~jaxqueue.core.service.PhaseType` law (None with pools).
        pools: the :class:`ServerClasses` with pools, else None. Then the
            classes are pool and phase (``phase_counts`` has a column per
            class: pool ``i``'s phases from ``pools.base[i]``).
        seen_phase, seen_idle: where accepted arrivals find their servers,
            when it is not what ``phase_counts`` and ``rates`` give at a fixed
            point (averages over a periodic regime,
            :mod:`jaxqueue.theory.profiles.periodic`; a fixed point on a full level,
            where arrivals sent just below it join what completions leave,
            :func:`sliding`): ``seen_phase[k - 1, c]`` the
            fraction that join a server with ``k`` tasks (``k = 1..L-1``)
            whose task in service is of class ``c``, ``seen_idle[i]`` the
            fraction that join an idle server of pool ``i``. None: at a fixed
            point, from the state (the class in service is that of a uniformly
            chosen server of the level; an idle server's pool that of a
            uniformly chosen idle server). With them, :func:`as_result`'s
            mean response time is the mean of the response-time law they
            give (Little's law with the mean load holds over whole periods
            only).
    """

    tail: np.ndarray
    phase_counts: np.ndarray
    iq_tail: np.ndarray | None
    mean_queue_length: float
    mean_response_time: float
    p0: float | None
    blocking_probability: float
    status: Status
    residual: float
    iterations: int
    truncated: tuple
    levels: int
    rates: Rates
    service: PhaseType | None
    pools: ServerClasses | None = None
    seen_phase: np.ndarray | None = None
    seen_idle: np.ndarray | None = None


class Transient(NamedTuple):
    """The phase-type mean-field ODE at given times (host float64 arrays).

    Attributes:
        times: ``(T,)`` as given.
        tails: ``(T, L + 1)``: ``s_0..s_L`` at each time.
        phase_counts: ``(T, L + 1, P)``: ``x[k, p]`` at each time (row 0 zero).
        iq_tails: ``(T, J + 1)``: ``Q_0..Q_J`` (JIQ family with many
            dispatchers), else None.
    """

    times: np.ndarray
    tails: np.ndarray
    phase_counts: np.ndarray
    iq_tails: np.ndarray | None


def summarize(
    pol, lam, classes: ServerClasses, system, x, rt, status, res, it, seen=(None, None)
) -> FixedPoint:
    """The :class:`FixedPoint` of the state ``x`` (``[x[1..L, :], Q_1..Q_J]``, flat) on
    ``system``'s bounds, its rates ``rt``, the solve's ``status``, residual ``res``
    and iterations ``it``, and where arrivals found their servers (``seen``)."""
    L, J, buffer = system.levels, system.iqueue_levels, system.buffer
    x = np.asarray(x, np.float64)
    X, q = x[: L * classes.n_classes].reshape(L, -1), x[L * classes.n_classes :]
    tail = tail_of(X)
    counts = np.concatenate([np.zeros((1, X.shape[1])), X], axis=0)
    iq_tail = np.concatenate([[1.0], q]) if J else None
    blocked = float(rt.level[L]) if buffer is not None else 0.0
    mql = float(tail[1:].sum())
    accepted = lam * (1.0 - blocked)
    mrt = mql / accepted if accepted > 0 else math.inf
    if J:
        p0 = float(1.0 - q[0])
    elif pol.uses_iqueues:  # one dispatcher: its I-queue is empty iff no server is idle,
        p0 = float(1.0 - rt.level[0])  # so p0 is the share of arrivals that join none
    else:
        p0 = None
    truncated = (float(tail[L]) if buffer is None else 0.0, float(q[-1]) if J else 0.0)
    return FixedPoint(
        tail,
        counts,
        iq_tail,
        mql,
        mrt,
        p0,
        blocked,
        Status(status),
        float(res),
        int(it),
        truncated,
        L,
        rt,
        classes.laws[0] if not classes.given else None,
        classes if classes.given else None,
        *seen,
    )


def as_result(
    fp: FixedPoint, policy, load: float, ratio: float | None, *, buffer: int | None = None
) -> MeanFieldResult:
    """A :class:`~jaxqueue.theory.result.MeanFieldResult` from a phase-type fixed point.

    ``arrival_seen[k]`` is the law of the tasks an accepted arrival finds. The
    server it joins, given ``k >= 1``, is in phase ``p`` with probability
    ``x[k, p] / sum_p x[k, p]``, which gives the joint law of ``(k, p)`` and
    so the whole response-time law (the residual of the phase in service,
    ``k - 1`` services, its own; :func:`jaxqueue.results.response.ph_response_terms`)
    and its quantiles. The mean is Little's; the settings record the law.
    The diagnostic ``phase_occupancy`` is ``x`` itself, ``(L + 1, P)``: the
    fraction of servers with ``k`` tasks whose task is in phase ``p`` (a
    simulation's mean-field start splits each level's servers by it).

    With pools, ``phase_occupancy`` has a column per class (pool and phase),
    the response law is the mixture over the pools (each with its law at its
    speed), the settings record ``pools`` as ``{"fraction", "speed",
    "service"}`` (``service``: the law the pool's servers follow, at speed
    1), and the pools' metrics are filled in
    (:func:`jaxqueue.results.pools.pool_metrics`): ``pool_occupancy``,
    ``(pools, L + 1)``, the fraction of each pool's servers with exactly
    ``k`` tasks, and each pool's share of the arrivals, utilization, mean
    queue length, mean response time, waiting probability and response-time
    quantiles.
    """
    pol = make(policy)
    law, rt = fp.service, fp.rates
    s = np.asarray(fp.tail, np.float64)
    L = s.size - 1
    level = np.asarray(rt.level, np.float64)
    seen = level[:L] / level[:L].sum()
    counts = np.asarray(fp.phase_counts, np.float64)
    if fp.seen_phase is None:
        x = counts[1:L]  # k = 1..L-1
        share = np.divide(
            x,
            x.sum(axis=1, keepdims=True),
            out=np.zeros_like(x),
            where=x.sum(axis=1, keepdims=True) > 0,
        )
        seen_phase = seen[1:, None] * share
    else:
        seen_phase = np.asarray(fp.seen_phase, np.float64)
    if fp.pools is None:
        quantiles = ph_response_quantiles(law, seen, seen_phase, QUANTILES)
    else:
        quantiles, by_pool = pool_response(fp.pools, seen, seen_phase, counts, fp.seen_idle)
    mean_response = fp.mean_response_time
    if fp.seen_phase is not None:  # averages over a window's arrivals: the mixture's mean
        if fp.pools is None:
            mean_response = float(ph_response_mean(law, seen, seen_phase))
        else:
            share = np.asarray(by_pool["pool_arrival_share"], np.float64)
            times = np.asarray(by_pool["pool_mean_response_time"], np.float64)
            mean_response = float(np.sum(np.where(share > 0, share * times, 0.0)))
    accepted = load * (1.0 - fp.blocking_probability)
    join = accepted * seen[0] if pol.uses_iqueues else 0.0  # servers that become idle
    result = fixed_point_result(
        fp,
        pol,
        load,
        ratio,
        buffer,
        seen=np.append(seen, 0.0),
        join=join,
        p0=fp.p0,
        blocked=fp.blocking_probability,
        response_time=mean_response,
        quantiles=quantiles,
    )
    # x[k, c]: the joint law of (queue length, class in service), what a simulation starts from
    result.diagnostics["phase_occupancy"] = counts.tolist()
    if fp.pools is None:
        result.settings["service"] = law.to_dict()
    else:
        result.settings["pools"] = [
            {"fraction": f, "speed": v, "service": lw.scaled(lw.mean * v).to_dict()}
            for f, v, lw in zip(fp.pools.fractions, fp.pools.speeds, fp.pools.laws)
        ]
        result = dataclasses.replace(result, **result_fields(by_pool))
    return result


def pool_response(pools: ServerClasses, seen, seen_phase, counts, seen_idle=None):
    """Response-time quantiles with pools, and each pool's metrics.

    An accepted arrival that finds ``k >= 1`` tasks joins class ``c`` with
    probability ``seen[k] * x[k, c] / n_k`` (``seen_phase``); one that finds
    none joins an idle server of pool ``i`` with probability ``seen[0] *
    idle_i / idle`` (or ``seen_idle[i]`` where given). Each pool's part is the
    response law of its own law at its speed
    (:func:`jaxqueue.results.response.ph_mixture_quantiles`).

    Returns:
        ``(quantiles, metrics)``: the pools' metrics
        (:func:`jaxqueue.results.pools.pool_metrics`); ``pool_occupancy``
        ``(pools, L + 1)``, row ``i`` the fraction of pool ``i``'s servers
        with exactly ``k`` tasks.
    """
    fracs = np.asarray(pools.fractions)
    busy = np.array(
        [counts[1:, b : b + lw.n_phases].sum(axis=1) for b, lw in zip(pools.base, pools.laws)]
    )  # (I, L) fractions of all servers
    idle = np.maximum(fracs - busy.sum(axis=1), 0.0)
    occupancy = np.concatenate([idle[:, None], busy], axis=1) / fracs[:, None]
    components = []
    for i, (b, lw) in enumerate(zip(pools.base, pools.laws)):
        if seen_idle is not None:
            first = float(seen_idle[i])
        else:
            first = seen[0] * idle[i] / idle.sum() if idle.sum() > 0 else 0.0
        phase = seen_phase[:, b : b + lw.n_phases]  # (L - 1, P_i): k = 1..L-1
        found = np.concatenate([[first], phase.sum(axis=1)])
        components.append((float(found.sum()), lw, found, phase))
    total = sum(c[0] for c in components)
    components = [(w / total, lw, f, p) for w, lw, f, p in components]
    return ph_mixture_quantiles(components, QUANTILES), pool_metrics(components, occupancy)
