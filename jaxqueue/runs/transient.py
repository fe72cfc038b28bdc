"""Transient estimates: plan the ensemble, start it, and weigh its steps.

:func:`transient` is the entry: it plans the replicas' run (a load step
first runs ``warmup_time`` at ``start_load``), starts them from ``init`` and
hands them to :func:`jaxqueue.sim.transient.weighted_sums`, whose Poisson
weights make every estimate exact in time (see that module).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from jaxqueue.core.config import (
    BOUND_KEYS,
    MODEL_OPTIONS,
    Bounds,
    Model,
    RunOptions,
    check_options,
    split_keywords,
    takes_options,
)
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.system import DEFAULT_WARMUP_TIME, check_load
from jaxqueue.core.versions import versions
from jaxqueue.policies.base import Policy
from jaxqueue.policies.registry import make
from jaxqueue.results.estimates import estimate
from jaxqueue.runs.bounds import horizon_levels
from jaxqueue.runs.planner import plan
from jaxqueue.sim.runner import Run
from jaxqueue.sim.transient import MAX_TIMES, TransientResult, weighted_sums

__all__ = ["transient", "TransientResult", "MAX_TIMES"]

#: The run options a transient takes as a simulation does (its ``init`` defaults to
#: ``"empty"`` and its ``warmup_time`` is the time at ``start_load``: its own).
TRANSIENT_RUN = ("replicas", "seed", "devices")


@takes_options(*(k for k in MODEL_OPTIONS if k != "arrivals"), *BOUND_KEYS, *TRANSIENT_RUN)
def transient(
    policy: str | Policy | Model,
    load: float,
    n_servers: int | None = None,
    n_dispatchers: int = 1,
    *,
    times: Sequence[float],
    start_load: float | None = None,
    warmup_time: float = DEFAULT_WARMUP_TIME,
    init="empty",
    bounds: Bounds | None = None,
    **options,
) -> TransientResult:
    """Ensemble estimates of the occupancy (and ``p0``) at given times.

    Args:
        policy, load, n_servers, n_dispatchers: as for :func:`jaxqueue.simulate`
            (a :class:`~jaxqueue.core.config.Model` as ``policy`` holds the
            sizes, the options, the buffer, the service law and the pools;
            Poisson arrivals); ``load`` is the load from time 0 on.
        times: the times (``>= 0``, at most :data:`MAX_TIMES`) at which to estimate.
        init: the state at the start: ``"empty"`` (default), ``"mean-field"``
            or an occupancy array (as for :func:`jaxqueue.simulate`), taken at
            ``start_load`` when given.
        start_load: a load step: the replicas first run ``warmup_time`` units
            of time at ``start_load`` from ``init`` (not measured), and time 0
            is the moment the load changes to ``load``.
        warmup_time: see ``start_load``.
        bounds: a :class:`~jaxqueue.core.config.Bounds` instead of ``levels``
            and ``iqueue_levels``.
        <options>
            In a transient run ``replicas`` (``>= 2``) are the estimates'
            sample, and ``levels`` is by default for the larger of the
            two loads; for idle-first with ``d = 1`` started from ``init``
            (no ``start_load``), no buffer, service law or pools, the bound of
            the horizon ``max(times)`` from the start instead
            (:func:`jaxqueue.runs.bounds.horizon_levels`).

    Returns:
        :class:`TransientResult`.

    Raises:
        ValueError: a parameter out of range (before anything compiles).
        LevelOverflowError: a queue or I-queue passed its bound.
    """
    check_options("transient", options, transient)
    run = RunOptions(**{k: options.pop(k) for k in TRANSIENT_RUN if k in options})
    t = _check_times(times, run.replicas)
    model, bound = _model(policy, n_servers, n_dispatchers, options, bounds)
    common = dict(replicas=run.replicas, seed=run.seed, devices=run.devices, backend="xla")
    if start_load is not None:
        check_load(start_load, model.buffer, np.inf)  # a number > 0; the plans check stability
        if not (
            isinstance(warmup_time, (int, float))
            and math.isfinite(warmup_time)
            and warmup_time >= 0
        ):
            raise ValueError(f"warmup_time={warmup_time!r} is out of range: need a number >= 0")
        bound = _shared_bounds(model, bound, load, start_load, common)
        p = plan(model, [load], steps=BLOCK, warmup=0, init="empty", bounds=bound, **common)
        core, first = _warmed_up(p, model, bound, start_load, warmup_time, init, common)
    else:
        p, core = _started(model, bound, load, float(np.max(t)), init, common)
        first = 0
    acc, acc_p0, acc_pool, steps, rate = weighted_sums(p, core, first, t)
    settings = _settings(p, model, load, start_load, warmup_time, init, run.replicas, run.seed)
    settings.update(steps=steps, steps_per_time_unit=rate)
    by_pool = {}
    if p.system.pools is not None:
        by_pool = {
            "pool_utilization": estimate(acc_pool[:, :, 0]),
            "pool_mean_queue_length": estimate(acc_pool[:, :, 1]),
        }
    return TransientResult(
        times=t,
        tail=estimate(acc),
        idle_fraction=estimate(1.0 - acc[:, :, 1]),
        mean_queue_length=estimate(acc[:, :, 1:].sum(axis=2)),
        p0=estimate(acc_p0) if p.policy.uses_iqueues else None,
        settings=settings,
        **by_pool,
    )


def _check_times(times, replicas) -> np.ndarray:
    """The times as a float array, checked, and the replicas checked."""
    t = np.asarray(times, np.float64).ravel()
    if t.size == 0 or t.size > MAX_TIMES or not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError(f"times must be 1 to {MAX_TIMES} finite values >= 0, got {times!r}")
    if not isinstance(replicas, (int, np.integer)) or isinstance(replicas, bool) or replicas < 2:
        raise ValueError(
            f"replicas={replicas!r} is out of range: the estimates are across "
            "replicas, so need an integer >= 2"
        )
    return t


def _model(policy, n_servers, n_dispatchers, given: dict, bounds) -> tuple[Model, Bounds]:
    """The model and the bounds of a transient (Poisson arrivals)."""
    given = {k: v for k, v in given.items() if v is not None}
    model, _, bound = split_keywords(
        policy, n_servers, n_dispatchers, given, None, bounds, where="transient", run_keys=()
    )
    if model.arrivals is not None:
        raise ValueError(
            "transient: the model has arrivals, and a transient runs under "
            "Poisson arrivals; use arrivals=None"
        )
    return model, bound


def _horizon_bound(model: Model, bound: Bounds, load, horizon: float, start_top: int) -> Bounds:
    """``bound`` with the queue bound of ``horizon`` time units from a start whose
    longest queue is ``start_top`` (:func:`jaxqueue.runs.bounds.horizon_levels`)
    where no ``levels`` is given and that bound covers the run (idle-first with
    ``d = 1``, infinite buffers, exponential servers of rate 1); else ``bound``."""
    if bound.levels is not None or any(
        x is not None for x in (model.buffer, model.service, model.pools)
    ):
        return bound
    pol = make(model.policy, d=model.d, z=model.z, order=model.order)
    levels = horizon_levels(pol, model.n_servers, load, horizon, start_top)
    return bound if levels is None else Bounds(levels, bound.iqueue_levels)


def _init_top(init) -> int:
    """The longest queue a start is taken to hold: none when empty, one task for the
    mean field (idle-first with ``d = 1`` has no server past one task below
    capacity; :func:`_started` checks it), an occupancy's highest level held."""
    if isinstance(init, str):
        return 0 if init == "empty" else 1
    held = np.flatnonzero(np.asarray(init, np.float64).ravel() > 0)
    return int(held[-1]) if held.size else 0


def _core_top(core) -> int:
    """The longest queue of any replica of a batched ``Core``."""
    return int(np.max(np.sum(np.asarray(core.tail)[:, 1:] > 0, axis=1)))


def _started(model: Model, bound: Bounds, load, horizon: float, init, common: dict):
    """``(plan, core)`` of a transient from ``init`` (no load step), with the
    horizon's queue bound where it applies (:func:`_horizon_bound`); where the
    start holds a longer queue than :func:`_init_top` took, planned again from it.
    A queue that passes the bound fails the run (the overflow detector)."""
    top = _init_top(init)
    for _ in range(2):
        used = _horizon_bound(model, bound, load, horizon, top)
        p = plan(model, [load], steps=BLOCK, warmup=0, init=init, bounds=used, **common)
        core = Run.start(p).core
        if used is bound or _core_top(core) <= top:
            break
        top = _core_top(core)
    return p, core


def _shared_bounds(model: Model, bound: Bounds, load, start_load, common: dict) -> Bounds:
    """Bounds of one System for both loads of a load step (from both)."""
    both = plan(
        model,
        [load, start_load],
        steps=BLOCK,
        warmup=0,
        init="empty",
        bounds=Bounds(bound.levels, bound.iqueue_levels),
        **common,
    ).system
    levels = None if model.buffer is not None else both.levels
    return Bounds(levels, both.iqueue_levels or None)


def _warmed_up(p, model: Model, bound: Bounds, start_load, warmup_time, init, common: dict):
    """``(core, first block)``: the replicas after ``warmup_time`` at ``start_load`` from ``init``."""
    per = model.n_servers * (start_load + p.system.service_rate)
    warm = max(BLOCK, int(math.ceil(warmup_time * per)))
    wp = plan(
        model,
        [start_load],
        steps=warm,
        warmup=0,
        init=init,
        interval="replicas",
        bounds=bound,
        **common,
    )
    if wp.system != p.system:
        raise AssertionError("the warm-up and the transient run must share one System")
    r = Run.start(wp)
    r.advance()  # raises on an overflow during the warm-up
    return r.core, wp.total_blocks


def _settings(p, model: Model, load, start_load, warmup_time, init, replicas, seed) -> dict:
    """What produced a transient (its steps and rate are added by the caller)."""
    system, pol = p.system, p.policy
    return {
        "policy": pol.name,
        "policy_label": pol.label(),
        "options": pol.options(),
        "n_servers": model.n_servers,
        "n_dispatchers": model.n_dispatchers,
        "load": float(load),
        "start_load": start_load,
        "warmup_time": warmup_time if start_load is not None else None,
        "init": init if isinstance(init, str) else "array",
        "buffer": model.buffer,
        "levels": system.levels,
        "iqueue_levels": system.iqueue_levels,
        "replicas": replicas,
        "seed": seed,
        "steps": None,
        "steps_per_time_unit": None,
        "service": "exp" if system.service is None else system.service.to_dict(),
        "pools": None
        if system.pools is None
        else [  # as a simulation's settings record them
            {
                "servers": q.count,
                "speed": q.speed,
                "service": None if q.law is None else q.law.to_dict(),
            }
            for q in system.pools
        ],
        "devices": len(p.devices),
        "platform": p.devices[0].platform,
        "versions": versions(),
    }
