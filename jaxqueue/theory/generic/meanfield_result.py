"""The exponential mean field's fixed point as a result: :class:`FixedPoint` and
:func:`as_result` (a :class:`~jaxqueue.theory.result.MeanFieldResult`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from jaxqueue.core.status import Status
from jaxqueue.policies import make
from jaxqueue.results.response import erlang_mixture_mean, erlang_mixture_quantile
from jaxqueue.results.schema import QUANTILES
from jaxqueue.theory.generic.exponential import Rates
from jaxqueue.theory.result import MeanFieldResult, Metrics, build

__all__ = ["FixedPoint", "as_result", "fixed_point_result"]


class FixedPoint(NamedTuple):
    """The generic mean-field fixed point and its metrics (host values).

    Attributes:
        tail: ``(L + 1,)`` ``s_0..s_L``.
        iq_tail: ``(J + 1,)`` ``Q_0..Q_J`` (``(1,)`` without I-queues).
        rates: the :class:`Rates` at the fixed point.
        residual: max-norm of the drift there.
        status: a :class:`~jaxqueue.core.status.Status`: ``CONVERGED``,
            ``MAX_ITERATIONS`` (Newton did not converge) or ``NON_FINITE`` (a
            non-finite Newton step); see the module notes.
        iterations: Newton steps taken.
        truncated: ``s_L`` (infinite buffers) and ``Q_J``: the mass at the bounds.
    """

    tail: np.ndarray
    iq_tail: np.ndarray
    rates: Rates
    residual: float
    status: Status
    iterations: int
    truncated: tuple


def as_result(
    fp: FixedPoint,
    policy,
    load: float,
    ratio: float | None,
    *,
    buffer: int | None = None,
    with_quantiles: bool = True,
) -> MeanFieldResult:
    """A :class:`~jaxqueue.theory.result.MeanFieldResult` from a generic fixed point.

    ``arrival_seen[k]`` is the law of the tasks an *accepted* arrival finds
    (0 at ``k = levels``: an arrival there is blocked, or left out of the
    truncated model); the response time is its Erlang(``k + 1``, 1) mixture,
    in units of the mean service time.

    Args:
        fp: the fixed point of ``policy`` at ``load`` and ``ratio``.
        policy: name or Policy, as given to :func:`fixed_point`.
        ratio: ``r`` as given (recorded in the settings).
        buffer: as given to :func:`fixed_point` (``None``: infinite buffers).
        with_quantiles: False leaves the response-time quantiles NaN, for
            :func:`jaxqueue.theory.result.fill_quantiles`.
    """
    pol = make(policy)
    s, q, rt = fp.tail, fp.iq_tail, fp.rates
    L = s.size - 1
    blocked = float(rt.level[L]) if buffer is not None else 0.0
    seen = rt.level[:L] / max(1e-300, 1.0 - blocked) if buffer is not None else rt.level[:L]
    seen = np.append(seen / seen.sum(), 0.0)
    quantiles = (
        erlang_mixture_quantile(seen, np.array(QUANTILES))
        if with_quantiles
        else [math.nan] * len(QUANTILES)
    )
    idle_rate = float(s[1] - (s[2] if L >= 2 else 0.0))
    join = idle_rate if pol.uses_iqueues else 0.0
    if q.size > 1:
        p0 = float(1.0 - q[1])
    elif pol.uses_iqueues:  # one dispatcher: its I-queue is empty iff no server is idle,
        # so p0 is the share of arrivals that join no idle server (on a full level s_1 = 1 the
        # servers a completion leaves idle are refilled: 1 - level[0] there, not 1)
        p0 = float(1.0 - rt.level[0])
    else:
        p0 = None
    return fixed_point_result(
        fp,
        pol,
        load,
        ratio,
        buffer,
        seen=seen,
        join=join,
        p0=p0,
        blocked=blocked,
        response_time=erlang_mixture_mean(seen),
        quantiles=quantiles,
    )


def fixed_point_result(
    fp, pol, load, ratio, buffer, *, seen, join, p0, blocked, response_time, quantiles
) -> MeanFieldResult:
    """The result of a fixed point, this module's or by class
    (:class:`jaxqueue.theory.generic.phases.FixedPoint`): its tail, occupancy,
    I-queue sizes, message rates and diagnostics from the fixed point, the
    other metrics as given (``seen``: the law an accepted arrival finds;
    ``join``: the joins per server per unit time; ``response_time``: the mean)."""
    s, q, rt = np.asarray(fp.tail, np.float64), fp.iq_tail, fp.rates
    metrics = Metrics(
        tail=s,
        occupancy=s - np.concatenate([s[1:], [0.0]]),
        arrival_seen=seen,
        mean_queue_length=float(s[1:].sum()),
        mean_response_time=response_time,
        waiting_probability=1.0 - seen[0],
        blocking_probability=blocked,
        p0=p0,
        iqueue_distribution=None if q is None or q.size < 2 else q - np.append(q[1:], 0.0),
        join_rate=join,
        delete_rate=load * rt.deletes,
        probe_rate=load * rt.probes + join * rt.join_probes,
        response_quantiles=quantiles,
    )
    return build(
        pol,
        metrics,
        load=load,
        ratio=ratio,
        buffer=buffer,
        status=fp.status,
        residual=fp.residual,
        tail_remainder=fp.truncated[0],
        iqueue_remainder=fp.truncated[1],
    )
