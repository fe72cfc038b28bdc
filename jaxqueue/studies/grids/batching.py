"""How a grid runs, without running it: its points grouped by compiled shape, the
batches of each group, their level bounds, and the time a GPU would take.

Why points share a batch, and how their lengths are merged: docs/sweeps.md (Batches).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import OrderedDict

import jax

from jaxqueue.core.rng import BLOCK
from jaxqueue.policies.registry import make
from jaxqueue.runs import planner
from jaxqueue.runs.arguments import check_metrics
from jaxqueue.runs.bounds import (
    default_iqueue_levels,
    default_levels,
    phase_levels,
    source_levels,
)
from jaxqueue.runs.estimates import (
    CPU_RATES,
    LATENCY_REPLICAS,
    cpu_rate,
    cpu_time,
    state_array_bytes,
)
from jaxqueue.sim.registers import unsupported
from jaxqueue.studies.grids.spec import GridSpec, Point

__all__ = [
    "shape_key",
    "shape_groups",
    "run_length",
    "run_lengths",
    "window_overruns",
    "warn_overruns",
    "CPU_MERGE_RATIO",
    "LATENCY_REPLICAS",
    "platform",
    "merge_ratio",
    "batches",
    "device_batches",
    "GPU_RATES",
    "gpu_seconds",
    "CPU_RATES",
    "cpu_seconds",
    "plan_group",
    "group_bounds",
    "batch_state_bytes",
]


def shape_key(point: Point, init: str = "empty"):
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
    depends on them), in order; each group's user metrics checked against its policy (``iq``
    without I-queues is refused before any point runs, and by ``sweep --plan``)."""
    groups: OrderedDict[tuple, list[Point]] = OrderedDict()
    for point in spec.points:
        key = shape_key(point, spec.run.init) + (spec.point_metrics(point),)
        groups.setdefault(key, []).append(point)
    for key, points in groups.items():  # (what needs the level bounds: at each batch's plan)
        check_metrics(key[-1], make(points[0].policy, **dict(points[0].options)), "xla")
    return groups


def run_length(point: Point, spec: GridSpec) -> int:
    """A point's steps from its start to the end of its window (warm-up included)."""
    return spec.run.steps_for(point) + spec.run.warmup_for(point)


def run_lengths(points: list[Point], spec: GridSpec) -> dict:
    """:func:`run_length` of each point, computed once (batching compares them often:
    recomputed at each comparison, 10^5 points took a minute to plan)."""
    return {p: run_length(p, spec) for p in points}


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


def warn_overruns(spec: GridSpec) -> None:
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

# LATENCY_REPLICAS and CPU_RATES (jaxqueue.runs.estimates) are importable from here too:
# a single run's estimate (simulate) and a grid's (sweep --plan) share them.


def platform(devices=None) -> str:
    return (devices[0] if devices else jax.devices()[0]).platform


def merge_ratio(devices=None) -> float:
    """How much longer than the shortest a batch's longest point may run:
    :data:`CPU_MERGE_RATIO` on a CPU, no limit on a GPU."""
    return math.inf if platform(devices) == "gpu" else CPU_MERGE_RATIO


def batches(
    points: list[Point],
    spec: GridSpec,
    batch_points: int,
    todo=None,
    ratio: float = CPU_MERGE_RATIO,
    latency: int = LATENCY_REPLICAS["cpu"],
    lengths: dict | None = None,
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
    ``todo(point)`` says whether a point still has to run (default: all do);
    ``lengths``, the points' :func:`run_lengths` if already known.
    """

    lengths = run_lengths(points, spec) if lengths is None else lengths
    # once, sorted by length (pack keeps this order); a Point's hash is slow
    ordered = sorted(((lengths[p], p) for p in points), key=lambda lp: lp[0])

    def pack(chosen, most):
        batches, first = [], 0
        for length, p in chosen:
            if batches and len(batches[-1]) < most and length <= ratio * first:
                batches[-1].append(p)
            else:
                batches.append([p])
                first = length
        return batches

    def cost(most):
        packed = pack(indexed, most)
        steps = sum(lengths_of[b[-1]] for b in packed)  # (sorted: the last is the longest)
        width = most * spec.run.replicas
        return steps * max(width, latency), steps * width, len(packed)

    indexed = [(length, i) for i, (length, _) in enumerate(ordered)]
    lengths_of = [length for length, _ in ordered]
    size = min(range(1, min(batch_points, len(points)) + 1), key=cost)
    return size, pack([lp for lp in ordered if todo is None or todo(lp[1])], size)


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
    points: list[Point],
    spec: GridSpec,
    batches: list[list[Point]],
    size: int,
    lengths: dict | None = None,
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
    lengths = run_lengths(points, spec) if lengths is None else lengths
    seconds = sum(
        max(lengths[p] for p in b) * max(1 / GPU_RATES["per_replica"], width / full)
        for b in batches
    )
    return seconds + GPU_RATES["compile_s"]


def cpu_seconds(
    points: list[Point], spec: GridSpec, batches: list, size: int, lengths, levels: int
) -> float:
    """Estimated seconds of one shape group's batches on 2 CPU cores (see
    :data:`~jaxqueue.runs.estimates.CPU_RATES`, the rates ``simulate`` estimates a
    run by): each batch's replica-steps, at least ``LATENCY_REPLICAS["cpu"]``
    replicas wide, at the policy's rate at ``levels`` (the group's level bound),
    plus one compile."""
    first = points[0]
    pol = make(first.policy, **dict(first.options))
    classes = first.service is not None or first.pools is not None
    rate = cpu_rate(pol, first.dispatchers, levels, classes, first.arrivals is not None)
    steps = sum(max(lengths[p] for p in b) for b in batches)
    return cpu_time(steps, size * spec.run.replicas, rate)


def group_bounds(points: list[Point]) -> tuple[int | None, int | None]:
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
    return levels, _iqueue_levels(pol, n, m, low)


def _iqueue_levels(pol, n: int, m: int, low: float) -> int | None:
    """The I-queue bound of ``N = n``, ``M = m`` at the load ``low``, or None without I-queues."""
    if pol.uses_iqueues and (m > 1 or pol.per_server):
        return default_iqueue_levels(pol, n, m, low)
    return None


def batch_state_bytes(spec: GridSpec, points: list, size: int, levels: int) -> int:
    """Bytes of the replica state of one of a shape group's batches (``size`` points of
    ``spec.run.replicas`` replicas each; :func:`~jaxqueue.runs.estimates.state_array_bytes`)
    at the level bound ``levels``, its largest ``N`` and ``M`` and its I-queue bound
    (each size's at its smallest load, as the runner sizes it)."""
    big = max(points, key=lambda p: (p.servers, p.dispatchers))
    pol = make(big.policy, **dict(big.options))
    sizes = OrderedDict()
    for p in points:
        sizes.setdefault((p.servers, p.dispatchers), []).append(p.load)
    source = big.system().arrivals
    iq = max(
        _iqueue_levels(pol, n, m, planner.trough_load(min(loads), source)) or 0
        for (n, m), loads in sizes.items()
    )
    system = dataclasses.replace(
        big.system(),
        n_dispatchers=max(m for _, m in sizes),
        buffer=None,
        levels=max(levels, 1),
        iqueue_levels=iq,
    )
    return state_array_bytes(system, pol, size * spec.run.replicas)


def _cpu_levels(spec: GridSpec, points: list) -> int:
    """The level bound a CPU estimate scales by: the spec's, the largest finite buffer,
    or the mean field's sizing of exponential Poisson groups (cheap: a closed form or
    one solve a size). A service law, pools or an arrival source have rates measured
    at their own bounds (:data:`CPU_RATES`), and sizing them costs seconds: their
    reference bound is used."""
    first = points[0]
    if first.buffer is not None:
        return max(p.buffer for p in points)
    if spec.run.levels is not None:
        return spec.run.levels
    if first.service is not None or first.pools is not None or first.arrivals is not None:
        return CPU_RATES["levels"]
    return group_bounds(points)[0]


def device_batches(points, spec: GridSpec, batch_points: int, todo, devices, lengths=None):
    """:func:`batches` as ``devices`` run them: their platform's merge ratio and latency."""
    return batches(
        points,
        spec,
        batch_points,
        todo,
        merge_ratio(devices),
        LATENCY_REPLICAS.get(platform(devices), 1),
        lengths,
    )


def plan_group(spec: GridSpec, points: list, batch_points: int, done: set, devices=None):
    """``(group, stored)``: the plan of one shape group (a dict of :func:`plan_grid`'s
    ``groups``) and how many of its points ``done`` (the stored ids) holds."""
    run = spec.run
    ids = {p: p.point_id() for p in points}
    stored = sum(ids[p] in done for p in points)
    todo = lambda p, ids=ids: ids[p] not in done  # noqa: E731
    lengths = run_lengths(points, spec)
    size, chosen = device_batches(points, spec, batch_points, todo, devices, lengths)
    steps = sum(size * run.replicas * max(lengths[p] for p in b) for b in chosen)
    gpu_size, gpu_batches = batches(
        points, spec, batch_points, todo, math.inf, LATENCY_REPLICAS["gpu"], lengths
    )
    gpu = gpu_seconds(points, spec, gpu_batches, gpu_size, lengths) if gpu_batches else 0.0
    cpu_size, cpu_batches = batches(
        points, spec, batch_points, todo, CPU_MERGE_RATIO, LATENCY_REPLICAS["cpu"], lengths
    )
    levels = _cpu_levels(spec, points) if chosen or cpu_batches else None
    cpu = cpu_seconds(points, spec, cpu_batches, cpu_size, lengths, levels) if cpu_batches else 0.0
    memory = batch_state_bytes(spec, points, size, levels) if chosen else 0
    first = points[0]
    servers = sorted({p.servers for p in points})
    buffers = sorted({p.buffer for p in points}, key=lambda b: -1 if b is None else b)
    dispatchers = sorted({p.dispatchers for p in points})
    group = {
        "policy": make(first.policy, **dict(first.options)).label(),
        "n_servers": servers[0] if len(servers) == 1 else servers,
        "n_dispatchers": dispatchers[0] if len(dispatchers) == 1 else dispatchers,
        "buffer": buffers[0] if len(buffers) == 1 else buffers,
        "points": len(points),
        "batches": len(chosen),
        "replica_steps": steps,
        "gpu_seconds": gpu,
        "cpu_seconds": cpu,
        "batch_replicas": size * run.replicas if chosen else 0,
        "batch_state_bytes": memory,
    }
    return group, stored
