"""The mean-field result: one :class:`~jaxqueue.results.schema.Result` for every policy.

Closed forms (:mod:`jaxqueue.theory.closed.closed_forms`) and the generic fixed
point (:mod:`jaxqueue.theory.generic.meanfield`) both build their result here, so the
two paths report the same fields in the same types: metrics as Python floats
and float64 arrays, ``None`` where a metric does not apply.

Units: the mean field is in units of the mean service time ``1 / mu`` with
``mu`` = :data:`jaxqueue.core.system.SERVICE_RATE` (= 1), like the simulator:
loads are ``lambda / mu`` per server, times (mean response time, quantiles of
the Erlang(``k + 1``, ``mu``) mixture) are in mean service times and rates
(joins, deletes, probes) are per server per mean service time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, NamedTuple

import numpy as np

from jaxqueue.core.status import Status
from jaxqueue.core.versions import versions
from jaxqueue.policies import Policy
from jaxqueue.results.response import erlang_mixture_quantile
from jaxqueue.results.schema import QUANTILES, Result

__all__ = [
    "MeanFieldResult",
    "Metrics",
    "build",
    "PerServerSolution",
    "per_server_result",
    "fill_quantiles",
    "TRUNCATION_LIMIT",
]

#: Most tail mass a mean field with infinite buffers may leave at or past its
#: bound when ``levels`` is given: more is refused (the truncated model's
#: metrics are not the mean field's); the automatic counts leave far less.
TRUNCATION_LIMIT = 1e-6


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeanFieldResult(Result):
    """Mean-field metrics of one policy at one point (host floats and float64 arrays).

    The metric fields are those of :class:`~jaxqueue.results.schema.Result`;
    vector metrics are indexed by queue length ``k = 0..levels``
    (``levels + 1`` entries). ``p0`` and ``iqueue_distribution`` are ``None``
    for policies without I-queues (``iqueue_distribution`` also with one
    dispatcher); ``stale_fraction`` is ``None`` except for JIQ without delete
    requests (:mod:`jaxqueue.theory.per_server.tagged_server`), the only mean field with
    stale picks; ``blocking_probability`` is 0.0 with infinite buffers.

    Settings (also readable as attributes, e.g. ``mf.d``):
        policy: the registry name; policy_label: e.g. ``pod(d=2)``; options:
        the policy's options; load: ``lambda``; ratio: ``r = N / M`` as given
        (``None``: not given; unused by policies without I-queues); d: the
        effective probe count (1 for random, jsq, jiq and i1f); buffer: places
        per server or ``None``; levels: the largest queue length represented,
        ``len(tail) - 1``; versions: of jaxqueue, JAX, jaxlib, NumPy and
        Python (:func:`jaxqueue.core.versions.versions`).

    Diagnostics (also readable as attributes, e.g. ``mf.status``):
        status: a :class:`~jaxqueue.core.status.Status` (``CONVERGED`` for a
        returned result, unless ``throw=False`` asked for the others);
        tail_remainder: the tail mass the arrays leave out
        (closed forms: ``sum_{i > levels} s_i``, below ``1e-15`` with the
        automatic level count unless that would pass 100000 levels; generic
        fixed point with infinite buffers: ``s_levels``, the mass at the
        bound); iqueue_remainder: the I-queue mass past the returned sizes (0
        without I-queues); residual: only for a solve that did not converge
        (returned by ``mean_field(..., throw=False)``), the max-norm of the
        drift where it stopped.
    """

    source: ClassVar[str] = "mean-field"


def _array(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


class Metrics(NamedTuple):
    """A mean field's metrics, as its solve gives them (what :func:`build` checks and types).

    The fields of :class:`~jaxqueue.results.schema.Result` of the same names;
    ``response_quantiles`` is a sequence of values for :data:`QUANTILES` in
    order, or a ``{q: value}`` dict with exactly those keys.
    """

    tail: Any
    occupancy: Any
    arrival_seen: Any
    mean_queue_length: float
    mean_response_time: float
    waiting_probability: float
    blocking_probability: float
    p0: float | None
    iqueue_distribution: Any
    join_rate: float
    delete_rate: float
    probe_rate: float
    response_quantiles: Any
    stale_fraction: float | None = None


def build(
    policy: Policy,
    m: Metrics,
    *,
    load: float,
    ratio: float | None,
    buffer: int | None,
    d: int | None = None,
    status: Status = Status.CONVERGED,
    tail_remainder: float = 0.0,
    iqueue_remainder: float = 0.0,
    residual: float | None = None,
) -> MeanFieldResult:
    """A :class:`MeanFieldResult` of the metrics ``m``, every value in its documented type.

    ``d``: the effective probe count (``None``: the policy's ``d``, 1 without
    one). ``residual``: where a solver that did not converge stopped (kept in
    the diagnostics only then).
    """
    tail, occupancy, arrival_seen = _array(m.tail), _array(m.occupancy), _array(m.arrival_seen)
    if not (tail.ndim == 1 and tail.shape == occupancy.shape == arrival_seen.shape):
        raise ValueError(
            f"tail, occupancy and arrival_seen must be 1-D of one length; got {tail.shape}, "
            f"{occupancy.shape}, {arrival_seen.shape}"
        )
    if isinstance(m.response_quantiles, dict):
        if set(m.response_quantiles) != set(QUANTILES):
            raise ValueError(f"response_quantiles must have the keys {QUANTILES}")
        quantiles = {q: float(m.response_quantiles[q]) for q in QUANTILES}
    else:
        quantiles = dict(zip(QUANTILES, map(float, m.response_quantiles), strict=True))
    if m.p0 is not None and math.isnan(m.p0):
        raise ValueError("p0 is None where it does not apply, never NaN")
    settings = {
        "policy": policy.name,
        "policy_label": policy.label(),
        "options": policy.options(),
        "load": float(load),
        "ratio": None if ratio is None else float(ratio),
        "d": int(policy.options().get("d", 1) if d is None else d),
        "buffer": buffer,
        "levels": int(tail.size - 1),
        "versions": versions(),
    }
    diagnostics = {
        "status": Status(status),
        "tail_remainder": float(tail_remainder),
        "iqueue_remainder": float(iqueue_remainder),
    }
    if Status(status) != Status.CONVERGED and residual is not None:
        diagnostics["residual"] = float(residual)
    iq = m.iqueue_distribution
    return MeanFieldResult(
        tail=tail,
        occupancy=occupancy,
        arrival_seen=arrival_seen,
        iqueue_distribution=None if iq is None else _array(iq),
        mean_queue_length=float(m.mean_queue_length),
        mean_response_time=float(m.mean_response_time),
        waiting_probability=float(m.waiting_probability),
        blocking_probability=_optional(m.blocking_probability),  # None where it does not apply
        p0=_optional(m.p0),
        join_rate=_optional(m.join_rate),
        delete_rate=_optional(m.delete_rate),
        probe_rate=float(m.probe_rate),
        stale_fraction=_optional(m.stale_fraction),
        response_quantiles=quantiles,
        settings=settings,
        diagnostics=diagnostics,
    )


def _optional(value) -> float | None:
    """A metric's value as a float, or None where it does not apply (a result built
    from another's metrics, the refined mean field's, keeps its Nones)."""
    return None if value is None else float(value)


class PerServerSolution(NamedTuple):
    """A host-side mean field of a per-server policy, solved (:func:`per_server_result`'s input).

    ``seen``: the law of the queue length an arrival finds; ``residual``,
    ``join_law`` (the law of the I-queue position a join takes) and
    ``listed_occupancy`` (the occupancy of the servers in an I-queue) are
    recorded in the diagnostics; the other fields are the metrics and
    diagnostics of :class:`MeanFieldResult` of the same names.
    """

    tail: np.ndarray
    occupancy: np.ndarray
    seen: np.ndarray
    p0: float
    iqueue_distribution: np.ndarray
    join_rate: float
    delete_rate: float
    probe_rate: float
    tail_remainder: float
    iqueue_remainder: float
    residual: float
    join_law: np.ndarray
    listed_occupancy: np.ndarray
    stale_fraction: float | None = None


def per_server_result(
    policy: Policy, x: PerServerSolution, *, load: float, ratio: float, d: int, with_quantiles: bool
) -> MeanFieldResult:
    """The result of a host-side mean field of a per-server policy
    (:mod:`~jaxqueue.theory.per_server.tagged_server`, :mod:`~jaxqueue.theory.per_server.threshold`).

    From the occupancy and the law ``seen`` of the queue length an arrival
    finds: the mean queue length, Little's mean response time, the waiting
    probability and the Erlang-mixture quantiles (NaN without
    ``with_quantiles``). The diagnostics add the two checks of such a
    solution, ``busy_fraction_error`` (``|s_1 - lambda|``) and
    ``little_error`` (the relative gap of Little's mean and the mixture's),
    and ``residual``, ``join_law`` and ``listed_occupancy``.
    """
    occupancy, seen = x.occupancy, x.seen
    mean_q = float(np.arange(occupancy.size) @ occupancy)
    t_little = mean_q / load
    t_seen = float((np.arange(seen.size) + 1) @ seen)
    quantiles = (
        erlang_mixture_quantile(seen, np.array(QUANTILES))
        if with_quantiles
        else [math.nan] * len(QUANTILES)
    )
    metrics = Metrics(
        x.tail,
        occupancy,
        seen,
        mean_q,
        t_little,
        float(1.0 - seen[0]),
        0.0,
        x.p0,
        x.iqueue_distribution,
        x.join_rate,
        x.delete_rate,
        x.probe_rate,
        quantiles,
        x.stale_fraction,
    )
    result = build(
        policy,
        metrics,
        load=load,
        ratio=ratio,
        d=d,
        buffer=None,
        tail_remainder=float(x.tail_remainder),
        iqueue_remainder=float(x.iqueue_remainder),
    )
    result.diagnostics.update(
        busy_fraction_error=abs(float(x.tail[1]) - load),
        little_error=abs(t_seen - t_little) / t_little,
        residual=float(x.residual),
        join_law=[float(v) for v in x.join_law],
        listed_occupancy=[float(v) for v in x.listed_occupancy],
    )
    return result


def fill_quantiles(results: list) -> list:
    """The results with their NaN response-time quantiles computed, a few calls for all.

    Results made with ``with_quantiles=False`` (:func:`jaxqueue.theory.mean_field`)
    have NaN quantiles where each would need its own root-finder; this solves
    them for all such results of one ``arrival_seen`` length in one vectorised
    call, so each value is bit for bit what the result would hold had it been
    made with its quantiles, whatever else is in the list. Other results, and
    ``None`` entries, are returned as they are.
    """
    out = list(results)
    widths: dict[int, list[int]] = {}
    for i, r in enumerate(results):
        if r is not None and any(math.isnan(v) for v in r.response_quantiles.values()):
            widths.setdefault(r.arrival_seen.size, []).append(i)
    for todo in widths.values():
        seen = np.stack([results[i].arrival_seen for i in todo])
        values = erlang_mixture_quantile(seen, np.array(QUANTILES))  # (points, Q)
        for row, i in enumerate(todo):
            quantiles = {q: float(v) for q, v in zip(QUANTILES, values[row], strict=True)}
            out[i] = dataclasses.replace(results[i], response_quantiles=quantiles)
    return out
