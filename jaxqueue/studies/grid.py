"""Grid experiments: run a spec's points in batches that share a compiled shape, into a store.

Points that share a policy, its options, the buffer and the service law
share a compiled program (these fix the shapes; N, M, the load and the run
length are per-replica numbers or traced counts, except that N and M fix
the shapes of the per-server policies and of runs with server classes or
arrival sources). They run as batches of a fixed number of points, all
replicas of a batch stepping together, so a grid of many loads and sizes
compiles once a policy. Points of other run lengths (run lengths in time units differ by load)
share a batch: each keeps its own warm-up and window
(:attr:`jaxqueue.sim.runner.Plan.windows`), the batch steps to the longest,
and a group's points are taken shortest first so that a batch's lengths are
close. Each point's replicas draw from streams derived from the point itself
(:meth:`~jaxqueue.studies.spec.Point.seed_word`), and the level bounds are
fixed per group of points of one shape over the whole spec, so a point's
result does not depend on the other points of its batch or on the order of
the grid. Each batch is written to the store (:mod:`jaxqueue.studies.store`)
in one transaction when it finishes (the SQLite write runs on one writer
thread while the next batch simulates; theory values and rows are computed
on the calling thread, since JAX is only ever driven from one thread here,
and theory is cached: a mean field does not depend on N, so a grid over N solves each
load once); rerunning the same spec on the same store skips what is there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
import warnings
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxqueue.core.arrivals import Profile
from jaxqueue.core.config import Bounds, Model, RunOptions
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.service import pool_shares, realized_pools
from jaxqueue.core.versions import versions
from jaxqueue.exact import solve_exact
from jaxqueue.policies.base import PER_SERVER_MEAN_FIELDS
from jaxqueue.policies.registry import make
from jaxqueue.results.schema import pool_row_value, split_pool_row_metric
from jaxqueue.runs import planner
from jaxqueue.runs.bounds import (
    default_iqueue_levels,
    default_levels,
    limit_ratio,
    phase_levels,
    source_levels,
)
from jaxqueue.sim import runner
from jaxqueue.sim.registers import unsupported
from jaxqueue.sim.source import check_source
from jaxqueue.studies.spec import GridSpec, Point
from jaxqueue.studies.store import Store, StoreMismatchError, writer_lock
from jaxqueue.theory import mean_field, periodic
from jaxqueue.theory.result import fill_quantiles

__all__ = ["run_grid", "plan_grid", "shape_groups", "window_overruns", "DEFAULT_BATCH_POINTS"]

#: Points per batch (the replicas of this many points step together).
DEFAULT_BATCH_POINTS = 32


def _shape_key(point: Point, init: str = "empty"):
    """What fixes a point's compiled program: the policy, its options, whether
    the buffer is finite, the service law, the pools and the arrivals; N, M
    and the buffer too where the step cannot read them as numbers
    (:func:`~jaxqueue.runs.planner.size_key`), and under ``init = "auto"``
    which side of the empty start's size bound N is."""
    pol = make(point.policy, **dict(point.options))
    key = planner.size_key(pol, point.servers, point.dispatchers, point.buffer, point.system())
    size = (point.servers, point.dispatchers, point.buffer) if key is None else key
    if key is not None and init == "auto":
        size += (point.servers >= planner.AUTO_MEAN_FIELD_SERVERS,)
    return (
        point.policy,
        point.options,
        size,
        point.buffer is None,
        point.service,
        point.pools,
        point.arrivals,
    )


def shape_groups(spec: GridSpec) -> OrderedDict[tuple, list[Point]]:
    """The spec's points grouped by compiled program (policy, options, an infinite buffer
    or finite ones, service law, pools, arrivals; N, M and the buffer where the program
    depends on them), in order."""
    groups: OrderedDict[tuple, list[Point]] = OrderedDict()
    for point in spec.points:
        groups.setdefault(_shape_key(point, spec.run.init), []).append(point)
    return groups


def _length(point: Point, spec: GridSpec) -> int:
    """A point's steps from its start to the end of its window (warm-up included)."""
    return spec.run.steps_for(point) + spec.run.warmup_for(point)


def window_overruns(spec: GridSpec) -> list[tuple[Point, float, float]]:
    """Points whose measured window, run as whole blocks of ``BLOCK`` steps,
    is longer than the spec's ``time`` by more than
    :data:`~jaxqueue.runs.planner.WINDOW_TOLERANCE`: ``(point, time, simulated)``
    each, in time units (none when the spec gives ``steps``)."""
    if spec.run.steps is not None:
        return []
    out = []
    for point in spec.points:
        units = spec.run.time_units("time", point)
        blocks = -(-spec.run.steps_for(point) // BLOCK)
        simulated = blocks * BLOCK / point.steps_per_time_unit()
        if simulated > units * (1 + planner.WINDOW_TOLERANCE):
            out.append((point, units, simulated))
    return out


def _warn_overruns(spec: GridSpec) -> None:
    """One :class:`~jaxqueue.runs.planner.WindowWarning` for the points of
    :func:`window_overruns`, naming the worst."""
    over = window_overruns(spec)
    if not over:
        return
    point, units, simulated = max(over, key=lambda o: o[2] / o[1])
    asked = spec.run.time if isinstance(spec.run.time, str) else f"{spec.run.time:g}"
    warnings.warn(
        f"time={asked} is run as whole blocks of {BLOCK} steps, which simulate more "
        f"than {planner.WINDOW_TOLERANCE:.0%} past it at {len(over)} of {len(spec.points)} "
        f"points; most at {point.label()}: {simulated:.4g} time units for {units:.4g} "
        "(the rows' settings record the steps run)",
        planner.WindowWarning,
        stacklevel=3,
    )


#: Points of other run lengths share a batch while the longest is at most this
#: many times the shortest (on a CPU, where the steps a shorter point's
#: replicas take past its window cost as much as any; a GPU steps the extra
#: replicas of a fuller batch nearly for free, so there every point of a shape
#: group may share: :func:`merge_ratio`).
CPU_MERGE_RATIO = 1.25

#: Replicas below which a batch's step takes about as long as with this many:
#: on 2 CPU cores a step of 16 to 64 replicas takes the same time (Pod(2), N =
#: 1000: 9.6e6, 2.2e7 and 3.6e7 replica-steps/s at 16, 32 and 64 replicas,
#: 7.6e7 at 256); a GPU wants 2^15 threads in flight.
LATENCY_REPLICAS = {"cpu": 128, "gpu": 2**15}


def _platform(devices=None) -> str:
    return (devices[0] if devices else jax.devices()[0]).platform


def merge_ratio(devices=None) -> float:
    """How much longer than the shortest a batch's longest point may run:
    :data:`CPU_MERGE_RATIO` on a CPU, no limit on a GPU."""
    return math.inf if _platform(devices) == "gpu" else CPU_MERGE_RATIO


def _batches(
    points: list[Point],
    spec: GridSpec,
    batch_points: int,
    todo=None,
    ratio: float = CPU_MERGE_RATIO,
    latency: int = LATENCY_REPLICAS["cpu"],
):
    """``(size, batches)`` of one shape group: at most ``size`` points a batch.

    The points are taken shortest first; a batch takes the next ones while
    the longest stays within ``ratio`` times its shortest (each point keeps
    its own window; the batch steps to the longest) and it holds fewer than
    ``size``. ``size`` (every batch is padded to it, one compiled shape) is
    the one of ``1 .. batch_points`` that makes the group quickest, a batch
    taking its longest point's steps times its replicas, or ``latency``
    replicas if fewer (below it a step costs about the same); it is chosen
    for the whole group, so a resumed sweep compiles the same shapes.
    ``todo(point)`` says whether a point still has to run (default: all do).
    """

    def pack(chosen, most):
        batches = []
        for p in sorted(chosen, key=lambda p: _length(p, spec)):
            last = batches[-1] if batches else None
            if last and len(last) < most and _length(p, spec) <= ratio * _length(last[0], spec):
                last.append(p)
            else:
                batches.append([p])
        return batches

    def cost(most):
        batches = pack(points, most)
        width = most * spec.run.replicas
        steps = sum(max(_length(p, spec) for p in b) for b in batches)
        return steps * max(width, latency), steps * width, len(batches)

    size = min(range(1, min(batch_points, len(points)) + 1), key=cost)
    return size, pack([p for p in points if todo is None or todo(p)], size)


#: What the GPU time estimate of :func:`plan_grid` assumes, measured on one
#: H200 (JAX 0.11.2, N = 1000, load 0.9, docs/simulation.md): the Pallas
#: kernel's replica-steps a second once the device is full (2^17 replicas;
#: Pod(2) 3.5e10 at 32 levels, JIQ with r = 10 2.1e10) and per replica below
#: 2^15 of them (Pod(2) at 2^12: 6.5e9, 1.6e6 a replica); the XLA engine's
#: (2.2e9 for JIQ at 2^17 replicas) for what the kernel does not cover
#: (per-server lists, server classes, arrival sources); and a compile of each
#: program (3 to 44 s measured).
GPU_RATES = {
    "kernel": 3.5e10,
    "kernel_iqueues": 2.1e10,
    "engine": 2.2e9,
    "per_replica": 1.3e6,
    "compile_s": 20.0,
}


def gpu_seconds(
    points: list[Point], spec: GridSpec, batches: list[list[Point]], size: int
) -> float:
    """Estimated seconds of one shape group's batches on one H200 (see
    :data:`GPU_RATES`): each batch takes its longest point's steps at the
    rate of one replica, or its replica-steps at the device's full rate,
    whichever is longer, plus one compile for the group."""
    first = points[0]
    pol = make(first.policy, **dict(first.options))
    system = dataclasses.replace(
        first.system(),
        n_dispatchers=first.dispatchers,
        levels=32,
        buffer=None,
        iqueue_levels=32 if first.dispatchers > 1 else 0,
    )
    kernel = unsupported(system, pol) is None
    full = (
        GPU_RATES["engine"]
        if not kernel
        else (
            GPU_RATES["kernel_iqueues"]
            if pol.uses_iqueues and first.dispatchers > 1
            else GPU_RATES["kernel"]
        )
    )
    width = size * spec.run.replicas
    seconds = sum(
        max(_length(p, spec) for p in b) * max(1 / GPU_RATES["per_replica"], width / full)
        for b in batches
    )
    return seconds + GPU_RATES["compile_s"]


#: ``plan_grid`` warns past this many points, and past this many replica-steps
#: (a day on 2 CPU cores at :data:`CPU_REFERENCE_RATE`, Pod(2)'s rate there).
LARGE_POINTS = 100_000
CPU_REFERENCE_RATE = 1e8
LARGE_REPLICA_STEPS = 86_400 * CPU_REFERENCE_RATE


def plan_grid(
    spec: GridSpec, *, batch_points: int = DEFAULT_BATCH_POINTS, store_path=None, devices=None
) -> dict:
    """What :func:`run_grid` would run, without running or compiling anything.

    Args:
        spec: a validated spec.
        batch_points: points per batch, as for :func:`run_grid`.
        store_path: a store of this spec: its points are left out (a missing
            file is an empty store, and is not created; a store of another spec
            or versions is reported as ``store_error``, and nothing is left out).
        devices: the devices it would run on (default: JAX's); on a GPU a
            shape group's points of other lengths share batches (:func:`merge_ratio`).

    Returns:
        A dict: ``points`` (in the spec), ``done`` (already stored), ``shapes``
        (compiled programs), ``batches``, ``replica_steps`` (the steps the
        devices take: warm-up, padding replicas, and the steps a shorter
        point's replicas take past its window in a batch of longer ones) and
        per shape group ``groups``: policy label, servers, dispatchers,
        buffer, points, batches, replica_steps, gpu_seconds;
        ``store_error`` (None, or why a run into ``store_path`` would be refused);
        ``window_overruns``, the points whose whole blocks run more than
        10% past the spec's ``time`` (:func:`window_overruns`); and
        ``gpu_seconds``, an estimate of the time on one H200 (per group too;
        :func:`gpu_seconds`), batched as on a GPU; ``warnings``: lines about a
        grid past :data:`LARGE_POINTS` points or :data:`LARGE_REPLICA_STEPS`
        replica-steps.
    """
    if batch_points < 1:
        raise ValueError(f"batch_points={batch_points} is out of range: need >= 1")
    done, store_error = set(), None
    if store_path is not None and os.path.exists(store_path):
        try:
            with Store(store_path, spec.spec_hash(), spec.name, versions()) as store:
                done = store.done()
        except StoreMismatchError as err:  # a plan still says what would run
            store_error = str(err)
    elif store_path is not None:  # a new store: its folder must take it
        folder = os.path.dirname(os.path.abspath(store_path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            store_error = (
                f"{store_path} cannot be created: its folder {folder} does not exist "
                "or cannot be written"
            )
    run = spec.run
    groups, total_steps, total_batches, n_done = [], 0, 0, 0
    for points in shape_groups(spec).values():
        ids = {p: p.point_id() for p in points}
        n_done += sum(ids[p] in done for p in points)
        todo = lambda p, ids=ids: ids[p] not in done  # noqa: E731
        size, batches = _batches(
            points,
            spec,
            batch_points,
            todo,
            merge_ratio(devices),
            LATENCY_REPLICAS.get(_platform(devices), 1),
        )
        steps = sum(size * run.replicas * max(_length(p, spec) for p in b) for b in batches)
        gpu_size, gpu_batches = _batches(
            points, spec, batch_points, todo, math.inf, LATENCY_REPLICAS["gpu"]
        )
        gpu = gpu_seconds(points, spec, gpu_batches, gpu_size) if gpu_batches else 0.0
        first = points[0]
        servers = sorted({p.servers for p in points})
        buffers = sorted({p.buffer for p in points}, key=lambda b: -1 if b is None else b)
        dispatchers = sorted({p.dispatchers for p in points})
        groups.append(
            {
                "policy": make(first.policy, **dict(first.options)).label(),
                "servers": servers[0] if len(servers) == 1 else servers,
                "dispatchers": dispatchers[0] if len(dispatchers) == 1 else dispatchers,
                "buffer": buffers[0] if len(buffers) == 1 else buffers,
                "points": len(points),
                "batches": len(batches),
                "replica_steps": steps,
                "gpu_seconds": gpu,
            }
        )
        total_steps += steps
        total_batches += len(batches)
    gpu_total = sum(g["gpu_seconds"] for g in groups)
    warnings_ = []
    if len(spec.points) > LARGE_POINTS:
        warnings_.append(
            f"{len(spec.points)} points (more than {LARGE_POINTS}): check the "
            "spec's axes; each point is a batch member and a set of store rows"
        )
    if total_steps > LARGE_REPLICA_STEPS:
        warnings_.append(
            f"{total_steps:.3g} replica-steps: about "
            f"{total_steps / CPU_REFERENCE_RATE / 3600:.3g} hours on 2 CPU cores (at "
            f"{CPU_REFERENCE_RATE:.0e} a second) and {gpu_total / 3600:.3g} on one "
            "H200 by the estimate"
        )
    return {
        "spec": spec.name,
        "points": len(spec.points),
        "done": n_done,
        "shapes": len(groups),
        "batches": total_batches,
        "replica_steps": total_steps,
        "groups": groups,
        "store_error": store_error,
        "window_overruns": len(window_overruns(spec)),
        "gpu_seconds": gpu_total,
        "warnings": warnings_,
    }


def _bounds(points: list[Point]) -> tuple[int | None, int | None]:
    """Level bounds of a shape group: the largest of its sizes' (:func:`_size_bounds`)."""
    sizes = OrderedDict()
    for p in points:
        sizes.setdefault((p.servers, p.dispatchers), []).append(p)
    bounds = [_size_bounds(same) for same in sizes.values()]
    levels, iq = (
        None if any(b[i] is None for b in bounds) else max(b[i] for b in bounds) for i in range(2)
    )
    return levels, iq


def _size_bounds(points: list[Point]) -> tuple[int | None, int | None]:
    """Level bounds of points of one size: for their largest load (queues) and smallest (I-queues),
    sized as the runner sizes them for an arrival source (queues: those the source's stress
    path builds in the mean field, :func:`~jaxqueue.runs.bounds.source_levels`, or else at a
    load moved towards the capacity; I-queues: at the source's trough)."""
    first = points[0]
    pol = make(first.policy, **dict(first.options))
    n, m = first.servers, first.dispatchers
    system = first.system()
    top = planner.bound_load(max(p.load for p in points), system.arrivals, system.capacity)
    low = planner.trough_load(min(p.load for p in points), system.arrivals)
    levels = None
    if first.buffer is None and system.arrivals is not None:  # as the runner sizes them
        levels = source_levels(
            pol, n, m, max(p.load for p in points), system.arrivals, first.law(), first.pool_set()
        )
    if levels is None and first.buffer is None and (first.service or first.pools):
        levels = phase_levels(pol, n, m, top, first.law(), first.pool_set())
    elif levels is None and first.buffer is None:
        levels = default_levels(pol, n, m, top)
    iq = None
    if pol.uses_iqueues and (m > 1 or pol.per_server):
        iq = default_iqueue_levels(pol, n, m, low)
    return levels, iq


def _limit_ratio(point: Point) -> float | None:
    """The ratio the point's mean field is solved at (None: one dispatcher's limit)."""
    return limit_ratio(make(point.policy, **dict(point.options)), point.servers, point.dispatchers)


def _theory_key(point: Point, kind: str) -> tuple:
    """What a theory value depends on: a mean field not on N (nor M beyond ``r``), but
    on the fractions of N's whole servers that its pools hold (``Point.pool_set``, as simulated)."""
    if kind == "mean-field":
        return (
            kind,
            point.policy,
            point.options,
            point.load,
            _limit_ratio(point),
            point.buffer,
            point.service,
            pool_shares(point.pool_set()),
            point.arrivals,
        )
    return (
        kind,
        point.policy,
        point.options,
        point.load,
        point.servers,
        point.dispatchers,
        point.buffer,
        point.service,
        point.pools,
        point.arrivals,
    )


def _theory(points: list[Point], kind: str, cache: dict, results=None, sources=None) -> list:
    """The theory of each point (``kind``: "none", "mean-field" or "exact"), or None each.

    ``cache`` holds results by :func:`_theory_key`. Mean fields are solved
    without their response-time quantiles, which are then computed for the
    whole batch in one vectorised call (:func:`~jaxqueue.theory.result.fill_quantiles`).
    A point with a rate profile (``sources(point.arrivals)`` is a
    :class:`~jaxqueue.core.arrivals.Profile`) gets the periodic mean field
    averaged over its simulation's measured window (``results``, in the
    order of ``points``), with its service law and pools where that mean
    field covers them (:func:`jaxqueue.theory.periodic.refusal`); other
    arrival sources have none: the mean field and the exact chain are
    written for Poisson arrivals. With pools the mean field is solved at the
    fractions of the point's whole servers (``Point.pool_set``, as simulated).
    """
    if kind == "none":
        return [None] * len(points)
    keys, windows = [], []
    for i, point in enumerate(points):
        key, window = _theory_key(point, kind), None
        if (
            point.arrivals is not None
            and kind == "mean-field"
            and sources is not None
            and results is not None
            and isinstance(sources(point.arrivals), Profile)
        ):
            s = results[i].settings
            window = (float(s["time_warmup"]), float(s["time_measured"]))
            key += (window,)
        keys.append(key)
        windows.append(window)
    new = {}
    for point, key, window in zip(points, keys, windows):
        if key in cache or key in new:
            continue
        opts = dict(point.options)
        plain = point.service is None and point.pools is None
        if point.arrivals is not None:
            new[key] = None
            pol = make(point.policy, **opts)
            if (
                window is not None
                and periodic.refusal(
                    pol,
                    point.load,
                    sources(point.arrivals),
                    _limit_ratio(point),
                    buffer=point.buffer,
                    service=point.service,
                    pools=point.pool_set(),
                )
                is None
            ):
                new[key] = mean_field(
                    pol,
                    point.load,
                    _limit_ratio(point),
                    buffer=point.buffer,
                    with_quantiles=False,
                    arrivals=sources(point.arrivals),
                    window=window,
                    service=point.service,
                    pools=point.pool_set(),
                )
        elif kind == "mean-field":
            pol = make(point.policy, **opts)
            new[key] = None
            per_server = PER_SERVER_MEAN_FIELDS if point.buffer is None else ()  # infinite buffers
            if not (point.pools is not None and pol.routes_by_speed) and pol.mean_field_kind() in (
                ("generic", "closed-form") + (per_server if plain else ())
            ):
                new[key] = mean_field(
                    pol,
                    point.load,
                    _limit_ratio(point),
                    buffer=point.buffer,
                    with_quantiles=False,
                    service=point.service,
                    pools=point.pool_set(),
                )
        else:
            new[key] = solve_exact(
                Model(
                    point.policy,
                    point.servers,
                    point.dispatchers,
                    buffer=point.buffer,
                    service=point.service,
                    pools=point.pools,
                    **opts,
                ),
                point.load,
            )
    cache.update(zip(new, fill_quantiles(list(new.values()))))
    return [cache[key] for key in keys]


def _refined(points: list[Point], cache: dict) -> list:
    """The 1/N-refined mean field of each point at its N (a MeanFieldResult), or None.

    None where the policy has no generic mean field (JIQ-Original, JIQ-Threshold)
    or the refinement is undefined there (JSQ-like routing, where the drift is
    not differentiable at the fixed point).
    """
    from jaxqueue.theory.refined import refined_mean_field

    out = []
    for point in points:
        # the correction V does not depend on N: one solve per load, ratio and buffer
        key = ("refined",) + _theory_key(point, "mean-field")[1:]
        if key not in cache:
            pol = make(point.policy, **dict(point.options))
            value = None
            plain = point.service is None and point.pools is None and point.arrivals is None
            if plain and pol.mean_field_kind() in (
                "generic",
                "closed-form",
            ):  # (r unused with one queue)
                value = refined_mean_field(
                    pol,
                    point.load,
                    _limit_ratio(point),
                    buffer=point.buffer,
                    n_servers=point.servers,
                )
            cache[key] = value
        out.append(None if cache[key] is None else cache[key].at(point.servers))
    return out


def _theory_value(result, metric: str, index):
    if result is None:
        return None
    if split_pool_row_metric(metric) is not None:  # pool0_occupancy, pool1_response_quantile
        return pool_row_value(result, metric, index)
    if metric == "response_quantile":
        value = result.response_quantiles.get(index)
        return None if value is None else float(value)
    value = getattr(result, metric, None)
    if value is None:
        return None
    if index is None:
        return float(value)
    index = int(index)
    return float(value[index]) if index < len(value) else 0.0


def _rows(point: Point, point_id: str, spec: GridSpec, res, theory, refined=None) -> list[dict]:
    params = point.params()
    base = {
        k: params.get(k)
        for k in (
            "policy",
            "servers",
            "dispatchers",
            "ratio",
            "load",
            "alpha",
            "beta",
            "d",
            "z",
            "order",
            "buffer",
            "service",
            "pools",
            "arrivals",
        )
    }
    run = {
        "replicas": spec.run.replicas,
        "steps": res.settings["steps"],
        "warmup": res.settings["warmup"],
        "seed": spec.run.seed,
    }
    rows = []
    for rec in res.records():
        metric, index = rec["metric"], rec["index"]
        rows.append(
            {
                "point_id": point_id,
                **base,
                "metric": metric,
                "idx": index,
                "mean": rec["mean"],
                "ci95": rec["ci95"],
                "theory": _theory_value(theory, metric, index),
                "refined": _theory_value(refined, metric, index),
                **run,
            }
        )
    return rows


def run_grid(
    spec: GridSpec,
    store_path,
    *,
    batch_points: int = DEFAULT_BATCH_POINTS,
    progress: bool = False,
    devices=None,
    log=sys.stderr,
) -> int:
    """Run every point of ``spec`` not yet in the store at ``store_path``; returns points run.

    Args:
        spec: a validated :class:`~jaxqueue.studies.spec.GridSpec`.
        store_path: the SQLite file (created, or resumed if it holds this spec).
        batch_points: points per batch; a shape group with fewer points uses
            its size, and the last batch of a group is padded to the same
            size (padding replicas are run and dropped), so one group compiles once.
        progress: report progress on ``log``: points done, replica-steps per
            second and time left; a bar with the ``progress`` extra (tqdm), else
            one line per batch.
        devices: devices to spread replicas over (default: all; with
            ``jax.distributed``, every device of every process).
        log: where progress goes (stderr by default; never stdout).

    One sweep writes a store at a time: a second one into the same store
    stops before anything runs with :class:`~jaxqueue.studies.store.StoreBusyError`
    (:func:`~jaxqueue.studies.store.writer_lock`).

    With several processes (``jax.distributed``) every process calls this
    with the same spec and store path: each batch's replicas are spread over
    every device of every process, the first process alone opens, reads and
    writes the store (the others learn from it what is done), and the
    batch's checkpoint must be on a file system every process sees. Every
    process returns the same count.
    """
    if batch_points < 1:
        raise ValueError(f"batch_points={batch_points} is out of range: need >= 1")
    run = spec.run
    lead = jax.process_index() == 0  # with jax.distributed: the process that owns the store
    # JAX's devices: a sweep compiles a program once for many batches, so a small
    # batch does not go to the host's CPU as a small run of its own would
    devices = tuple(devices) if devices is not None else tuple(jax.devices())
    groups = shape_groups(spec)
    for points in groups.values():  # before anything runs
        pol = make(points[0].policy, **dict(points[0].options))
        if run.init == "mean-field" and pol.mean_field_kind() == "none":
            raise ValueError(
                f"init='mean-field' needs a mean field, and {pol.name!r} has none "
                f'({pol.no_mean_field}); use init = "empty" for this spec'
            )
        if points[0].source is not None:  # a profile's segments against the step rate
            check_source(points[0].system(), [p.load for p in points])
    rounded = {(p.servers, p.pools) for p in spec.points if p.pools is not None}
    for n, pools in sorted(rounded):  # fractions that are not whole servers: said once each
        realized_pools(pools, n, stacklevel=2)
    _warn_overruns(spec)
    ids = {p: p.point_id() for p in spec.points}  # a hash each: computed once
    with contextlib.ExitStack() as stack:
        store = writer = None
        if lead:  # one writer per store: a second sweep into it stops here
            stack.enter_context(writer_lock(store_path))
            store = stack.enter_context(
                Store(store_path, spec.spec_hash(), spec.name, versions(), spec.source_text)
            )
            writer = stack.enter_context(
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxqueue-store")
            )
        done = _done(spec, ids, store)
        total = len(spec.points)
        finished = sum(ids[p] in done for p in spec.points)
        ran, events, t0 = 0, 0, time.perf_counter()
        batch_index = store.next_batch() if lead else 0
        bar = _Progress(spec.name, total, finished, log) if progress and lead else None
        pending, cache = None, {}
        for points in groups.values():
            levels, iq = _bounds(points)  # over the whole group: shapes and starts fixed
            size, batches = _batches(
                points,
                spec,
                batch_points,
                lambda p: ids[p] not in done,
                merge_ratio(devices),
                LATENCY_REPLICAS.get(_platform(devices), 1),
            )
            for batch in batches:
                pad = [batch[-1]] * (size - len(batch))
                first = batch[0]
                t_batch = time.perf_counter()
                everyone = batch + pad
                model = spec.model(first).replace(
                    n_servers=[p.servers for p in everyone],
                    n_dispatchers=[p.dispatchers for p in everyone],
                    buffer=None if first.buffer is None else [p.buffer for p in everyone],
                )
                options = RunOptions(
                    replicas=run.replicas,
                    steps=[run.steps_for(p) for p in everyone],
                    warmup=[run.warmup_for(p) for p in everyone],
                    seed=run.seed,
                    init=run.init,
                    interval="replicas",
                    devices=devices,
                )
                plan = planner.plan_model(
                    model,
                    [p.load for p in everyone],
                    options,
                    Bounds(levels, iq),
                    streams=[p.seed_word(run.seed) for p in batch] + [0] * len(pad),
                )
                results = _run_batch(plan, f"{store_path}.running.npz")[: len(batch)]
                wall = time.perf_counter() - t_batch
                ran += len(batch)
                events += plan.n_replicas * plan.total_blocks * BLOCK
                if not lead:  # the other processes step their replicas; the first writes
                    continue
                # JAX runs on this thread only: theory and rows here, SQLite on the writer.
                rows, committed = [], []
                kind = "mean-field" if run.theory == "refined" else run.theory
                refined = _refined(batch, cache) if run.theory == "refined" else [None] * len(batch)
                theories = _theory(
                    batch, kind, cache, results, lambda text: spec.arrivals_file(text).source
                )
                for p, res, th, rf in zip(batch, results, theories, refined):
                    rows += _rows(p, ids[p], spec, res, th, rf)
                    committed.append((ids[p], p.params(), wall / len(batch)))
                if pending is not None:
                    pending.result()  # the previous batch is committed (or its error raised)
                pending = writer.submit(store.commit_batch, batch_index, committed, rows)
                batch_index += 1
                if bar is not None:
                    bar.update(len(batch), events / max(time.perf_counter() - t0, 1e-9))
        if pending is not None:
            pending.result()
        if bar is not None:
            bar.close()
    return ran


def _done(spec: GridSpec, ids: dict, store: Store | None) -> set:
    """The ids of the points the store holds; with several processes, the first
    process's store read, the same in every process (a collective)."""
    if jax.process_count() == 1:
        return store.done()
    held = store.done() if store is not None else set()
    flags = np.asarray([ids[p] in held for p in spec.points], np.int32)
    flags = multihost_utils.broadcast_one_to_all(flags)
    return {ids[p] for p, f in zip(spec.points, np.asarray(flags)) if f}


def _sync(what: str) -> None:
    """Wait for every process (several processes; nothing with one)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(what)


#: Seconds of running between checkpoints of a sweep's batch.
CHECKPOINT_EVERY = 300.0


def _run_batch(plan, checkpoint: str):
    """Run one batch, saved to ``checkpoint`` every few minutes: a sweep stopped in a
    long batch resumes inside it. A checkpoint of another batch is replaced."""
    try:
        results = runner.run(plan, checkpoint=checkpoint, checkpoint_every=CHECKPOINT_EVERY)
    except runner.CheckpointMismatch:
        _remove(checkpoint)
        results = runner.run(plan, checkpoint=checkpoint, checkpoint_every=CHECKPOINT_EVERY)
    _remove(checkpoint)
    return results


def _remove(checkpoint: str) -> None:
    """Remove a batch's checkpoint (the first process; the others wait for it,
    so that none sees it at the next batch's start)."""
    _sync("jaxqueue sweep: before the checkpoint is removed")
    if jax.process_index() == 0:
        os.remove(checkpoint)
    _sync("jaxqueue sweep: checkpoint removed")


class _Progress:
    """Points done, replica-steps per second and time left: a tqdm bar, else a line a batch."""

    def __init__(self, name: str, total: int, done: int, log):
        self.name, self.total, self.done, self.log = name, total, done, log
        self.t0, self.ran = time.perf_counter(), 0
        try:
            from tqdm.auto import tqdm
        except ModuleNotFoundError:
            self.bar = None
            print(
                f"[jaxqueue] {name}: a progress bar needs the progress extra (pip install "
                "'jaxqueue[progress]'); reporting a line per batch",
                file=log,
                flush=True,
            )
        else:
            self.bar = tqdm(
                total=total, initial=done, desc=name, unit="pt", file=log, dynamic_ncols=True
            )

    def update(self, n: int, rate: float) -> None:
        self.done += n
        self.ran += n
        if self.bar is not None:
            self.bar.set_postfix_str(f"{rate:.3g} replica-steps/s", refresh=False)
            self.bar.update(n)
            return
        elapsed = time.perf_counter() - self.t0
        left = elapsed / self.ran * (self.total - self.done)
        print(
            f"[jaxqueue] {self.name}: {self.done}/{self.total} points, {rate:.3g} "
            f"replica-steps/s, about {left:.0f} s left",
            file=self.log,
            flush=True,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
