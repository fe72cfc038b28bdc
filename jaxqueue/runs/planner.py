"""Plan a run: check its arguments and fix its static configuration (nothing compiles).

:func:`plan` turns the arguments of a run (those of :func:`jaxqueue.simulate`)
into a :class:`~jaxqueue.sim.runner.Plan`: the checks (:mod:`jaxqueue.runs.arguments`),
the level bounds (:mod:`jaxqueue.runs.sizing`), the start, the backend and the
devices. The simulator runs a plan without importing any theory.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np

from jaxqueue.core.arrivals import Trace, as_arrivals
from jaxqueue.core.config import Bounds, Model, RunOptions, split_keywords
from jaxqueue.core.host import host_device
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.system import (
    DEFAULT_WARMUP_TIME,
    MAX_SEED,
    MAX_SERVERS,
    MAX_STEPS,
    System,
    as_int,
    check_int,
    check_load,
)
from jaxqueue.policies.base import PER_SERVER_MEAN_FIELDS, Policy
from jaxqueue.policies.registry import make
from jaxqueue.runs.arguments import (
    DEFAULT_STEPS,
    check_interval,
    check_metrics,
    check_sized,
    check_streams,
    load_buffers,
    load_sizes,
    per_load,
    run_steps,
    server_pools,
    service_law,
    size_key,
    sized_lengths,
)
from jaxqueue.runs.bounds import limit_ratio
from jaxqueue.runs.estimates import RunSizeWarning, estimate_run, size_note, state_array_bytes
from jaxqueue.runs.initial import initial_state, mean_field_of
from jaxqueue.runs.sizing import bound_load, size_system, trough_load
from jaxqueue.sim.classes import class_table
from jaxqueue.sim.kernel import AUTO_MAX_VALUES, step_values
from jaxqueue.sim.registers import unsupported
from jaxqueue.sim.runner import BACKENDS, MAX_EXTENSIONS, Plan
from jaxqueue.sim.source import check_source
from jaxqueue.theory.generic import meanfield

__all__ = [
    "plan",
    "plan_model",
    "BackendWarning",
    "StartWarning",
    "WindowWarning",
    "RunSizeWarning",
    "WINDOW_TOLERANCE",
    "AUTO_MEAN_FIELD_SERVERS",
    "HOST_AUTO_STEPS",
    "DEFAULT_STEPS",
    "bound_load",
    "trough_load",
    "size_key",
]

#: ``init="auto"`` starts at the mean field from this many servers on; smaller
#: systems fill in a few units of time, and the mean field is a poor guide there.
AUTO_MEAN_FIELD_SERVERS = 100


class BackendWarning(UserWarning):
    """The backend asked for cannot run this configuration; the run goes on ``"xla"``."""


class StartWarning(UserWarning):
    """``init="auto"``: the mean field cannot be solved here, so the run starts empty."""


class WindowWarning(UserWarning):
    """``time=``: whole blocks of :data:`~jaxqueue.core.rng.BLOCK` steps make the
    measured window longer than asked, by more than :data:`WINDOW_TOLERANCE`."""


#: ``time=``: a :class:`WindowWarning` when the whole blocks simulate more than
#: this fraction beyond the time asked for (at the largest load; the window
#: simulated is ``settings["time_measured"]``).
WINDOW_TOLERANCE = 0.1


def _start_or_empty(pol, attempt) -> str:
    """``"mean-field"`` if ``attempt()`` (the host-side check or solve of the
    start's mean field) passes, else ``"empty"`` with a :class:`StartWarning`
    that says why."""
    try:
        attempt()
    except (RuntimeError, ValueError) as err:
        warnings.warn(
            f"init='auto' starts {pol.label()} empty: its mean field is not available here ({err})",
            StartWarning,
            stacklevel=6,
        )
        return "empty"
    return "mean-field"


def _solvable_start(pol, loads, system) -> str:
    """Whether the host-side mean field of a per-server policy (or one with
    pools, or a finite buffer) solves at every load (JIQ-Threshold's solve is
    refused past a size, for ``z >= 2`` at larger ratios; with pools, a load
    the mean field does not cover; a buffer too large for the dense solve of
    its overload). The solutions are cached for the start itself."""
    return _start_or_empty(pol, lambda: [mean_field_of(pol, float(lam), system) for lam in loads])


def _sized_start(pol, system) -> str:
    """Whether the generic mean field a start follows fits its working-memory
    bound (:func:`jaxqueue.theory.generic.meanfield.check_work`: an estimate, nothing
    solved or compiled; the JIQ family's outcome grid grows as ``(N / M)^2``:
    JIQ-SQ with few dispatchers)."""
    ratio = limit_ratio(pol, system.n_servers, system.n_dispatchers)
    return _start_or_empty(pol, lambda: meanfield.check_work(pol, ratio, buffer=system.buffer))


def plan(
    policy: str | Policy | Model,
    loads: Sequence[float],
    n_servers: int | Sequence[int] | None = None,
    n_dispatchers: int | Sequence[int] = 1,
    *,
    run: RunOptions | None = None,
    bounds: Bounds | None = None,
    streams: Sequence[int] | None = None,
    **keywords,
) -> Plan:
    """Check the arguments of a run and fix its static configuration (nothing compiles).

    Arguments as in :func:`jaxqueue.simulate`: a :class:`~jaxqueue.core.config.Model`
    (or a policy with ``n_servers``, ``n_dispatchers`` and the model's
    keywords), the loads, and :class:`~jaxqueue.core.config.RunOptions` and
    :class:`~jaxqueue.core.config.Bounds` (or their keywords); see
    :func:`plan_model`. ``streams``: one stream word per load (grid points;
    :attr:`~jaxqueue.sim.runner.Plan.streams`).
    """
    model, opts, bound = split_keywords(
        policy, n_servers, n_dispatchers, keywords, run, bounds, where="plan"
    )
    return plan_model(model, loads, opts, bound, streams=streams)


def plan_model(
    model: Model,
    loads: Sequence[float],
    run: RunOptions = RunOptions(),
    bounds: Bounds = Bounds(),
    *,
    streams: Sequence[int] | None = None,
) -> Plan:
    """The :class:`~jaxqueue.sim.runner.Plan` of ``model`` at ``loads``, run as
    ``run`` within ``bounds``: every value checked (a ``ValueError`` names the
    parameter and its valid range), run lengths in steps, the level bounds,
    the start, the backend and the devices fixed. Nothing compiles. A run of its
    own (no ``streams``: not a grid's batch, which ``sweep --plan`` estimates) estimated
    past ten minutes on 2 CPU cores or 1 GiB of replica state says so first, in a
    :class:`RunSizeWarning` (:mod:`jaxqueue.runs.estimates`), before the start's mean field
    is solved and anything compiles for the simulator."""
    if not isinstance(model, Model):
        raise TypeError(f"plan_model() takes a Model, got {type(model).__name__}")
    pol = make(model.policy, d=model.d, z=model.z, order=model.order)
    # counts from NumPy arrays as Python ints (they reach the settings and the JSON)
    replicas, steps, warmup, seed, levels, iqueue_levels, batches = (
        as_int(v)
        for v in (
            run.replicas,
            run.steps,
            run.warmup,
            run.seed,
            bounds.levels,
            bounds.iqueue_levels,
            run.batches,
        )
    )
    srv = _servers(model, loads, pol, replicas)
    loads = srv.loads
    lengths = _lengths(srv, pol, run, steps, warmup)
    shortest = min(m for _, m in lengths.windows) if lengths.windows else lengths.measure_blocks
    interval = check_interval(run.interval, batches, replicas, shortest)
    check_int("seed", seed, 0, MAX_SEED)
    # every argument first: the level bounds below may solve (and compile) the mean field
    _check_init(run.init)
    metrics = check_metrics(run.metrics, pol, run.backend)
    if run.backend not in BACKENDS:
        raise ValueError(f"backend={run.backend!r} is not valid: use one of {', '.join(BACKENDS)}")
    system = size_system(
        pol, loads, srv.sizes, srv.bare, srv.n_dispatchers, srv.buffer, levels, iqueue_levels
    )
    metrics = check_metrics(metrics, pol, run.backend, system)
    if lengths.time is not None:
        _warn_window(lengths.time, lengths, system, max(loads))
    _check_memory(system, pol, replicas * len(loads))
    devices = run.devices
    devs = tuple(devices) if devices is not None else tuple(jax.devices())
    stepped = len(loads) * replicas * lengths.total_blocks * BLOCK
    devs, host_note = _small_on_host(devs, devices is None and run.backend == "auto", stepped)
    if streams is None:  # a run of its own (a grid's batches: sweep --plan estimates them)
        _warn_size(system, pol, replicas * len(loads), lengths, devs[0].platform == "cpu")
    streams = check_streams(streams, len(loads))
    start = _start(run.init, pol, system, loads)  # (may solve the mean field: after the estimate)
    sized = srv.sizes is not None
    used, note = ("xla", None) if metrics else _backend(run.backend, system, pol, devs, sized)
    return Plan(
        pol,
        system,
        tuple(loads),
        replicas,
        lengths.warm_blocks,
        lengths.measure_blocks,
        int(seed),
        start,
        run.on_overflow,
        devs,
        streams,
        min(batches, lengths.measure_blocks),
        interval,
        lengths.auto_warmup,
        lengths.extensions,
        used,
        host_note or note,
        lengths.windows,
        None if srv.sizes is None else tuple(srv.sizes),
        initial_state,
        metrics,
    )


class _Servers(NamedTuple):
    """A run's servers and loads, checked (:func:`_servers`)."""

    bare: System  # the largest N, the servers' laws and the arrivals, without level bounds
    n_dispatchers: int  # the largest M
    buffer: int | None  # the largest buffer
    sizes: list | None  # one (N, M) or (N, M, buffer) per load where they differ, else None
    loads: list


def _servers(model: Model, loads, pol: Policy, replicas) -> _Servers:
    """Check the model's sizes, buffers, service law, pools and arrivals, and the loads."""
    n_servers, n_dispatchers = model.n_servers, model.n_dispatchers
    n_loads = np.size(np.asarray(loads, dtype=object))
    sizes = load_sizes(n_servers, n_dispatchers, n_loads)
    if sizes is not None:  # the System holds the largest; each load its own
        n_servers, n_dispatchers = max(n for n, _ in sizes), max(m for _, m in sizes)
    buffer, buffers = load_buffers(model.buffer, n_loads)
    if buffers is not None:  # each load's own buffer below the System's (the largest)
        sizes = [
            (n, m, b) for (n, m), b in zip(sizes or [(n_servers, n_dispatchers)] * n_loads, buffers)
        ]
    if sizes is not None:
        sizes = None if len(set(sizes)) == 1 else sizes
    n_servers = check_int("n_servers", n_servers, 1, MAX_SERVERS)
    n_dispatchers = check_int("n_dispatchers", n_dispatchers, 1, n_servers)
    law = service_law(model.service, pol)
    pool_set = server_pools(model.pools, n_servers, pol)
    source = as_arrivals(model.arrivals)
    if isinstance(source, Trace) and (law is not None or pool_set is not None):
        raise ValueError(
            "arrivals: a trace-driven run estimates the response time from the queue length an "
            "arrival finds, which needs identical exponential servers; use service=None and "
            "pools=None (or a rate profile or an MMPP, which take both)"
        )
    # the servers, their laws and the arrivals, without level bounds (these come later)
    bare = System(n_servers, levels=1, service=law, pools=pool_set, arrivals=source)
    loads = [
        check_load(x, buffer, bare.capacity) for x in np.atleast_1d(np.asarray(loads, dtype=object))
    ]
    if not loads:
        raise ValueError("loads is empty: give at least one load")
    if source is not None:  # the clock must hold the profile's segments (before any compile)
        check_source(bare, loads)
    if buffer is not None:
        check_int("buffer", buffer, 1, 10**6)
    check_int("replicas", replicas, 1, 10**8)
    return _Servers(bare, n_dispatchers, buffer, sizes, loads)


class _Lengths(NamedTuple):
    """A run's lengths in blocks (:func:`_lengths`)."""

    steps: int  # measured steps per replica, as asked (the longest load's)
    warm_blocks: int
    measure_blocks: int
    windows: tuple | None  # one (warm-up, measured) in blocks per load where they differ
    auto_warmup: bool
    extensions: int
    time: float | None  # the measured window asked for in time units at the largest load

    @property
    def total_blocks(self) -> int:
        """Blocks a replica steps at most (every warm-up extension included)."""
        return self.warm_blocks + self.measure_blocks * (1 + self.extensions)


def _lengths(srv: _Servers, pol: Policy, run: RunOptions, steps, warmup) -> _Lengths:
    """The warm-up and the measured window in blocks (each load's own where
    they differ), from steps or time units (at the largest load, or at each
    load's own size and load)."""
    bare, loads, sizes = srv.bare, srv.loads, srv.sizes
    time, warmup_time = run.time, run.warmup_time
    per_unit = bare.n_servers * bare.step_rate(max(loads))  # (a thinned source: its peak rate)
    if sizes is not None:  # time units at each load's own N and load
        check_sized(pol, sizes, bare, srv.buffer)
        _check_sized_start(run.init, sizes)
        steps, time, warmup, warmup_time = sized_lengths(
            sizes, loads, bare, steps, time, warmup, warmup_time
        )
    steps_each = per_load("steps", steps, len(loads), 1, time)
    warmup_each = per_load("warmup", warmup, len(loads), 0, warmup_time)
    if steps_each is not None:
        steps = max(steps_each)
    if warmup_each is not None:
        warmup = max(warmup_each)
    steps = run_steps("steps", steps, "time", time, per_unit, DEFAULT_STEPS)
    check_int("steps", steps, 1, MAX_STEPS)
    if run.on_overflow not in ("raise", "report"):
        raise ValueError(f"on_overflow={run.on_overflow!r} is not valid: use 'raise' or 'report'")
    auto_warmup = isinstance(warmup, str)
    if auto_warmup and warmup != "auto":
        raise ValueError(f"warmup={warmup!r} is not valid: use a number of steps, None or 'auto'")
    if auto_warmup and warmup_time is not None:
        raise ValueError(
            "warmup='auto' starts from the default warm-up and extends it: "
            "give warmup_time=None with it"
        )
    default = int(math.ceil(DEFAULT_WARMUP_TIME * per_unit))
    given = None if auto_warmup else warmup
    warmup = run_steps("warmup", given, "warmup_time", warmup_time, per_unit, default, least=0)
    check_int("warmup", warmup, 0, MAX_STEPS)
    measure_blocks, warm_blocks, windows, extensions = _blocks(
        steps, warmup, steps_each, warmup_each, auto_warmup, len(loads)
    )
    return _Lengths(steps, warm_blocks, measure_blocks, windows, auto_warmup, extensions, time)


def _blocks(steps, warmup, steps_each, warmup_each, auto_warmup, n_loads) -> tuple:
    """Run lengths in steps as whole blocks: ``(measure_blocks, warm_blocks,
    windows, extensions)``, ``windows`` each load's own where they differ."""
    measure_blocks = -(-steps // BLOCK)
    warm_blocks = -(-warmup // BLOCK)
    windows = None
    if steps_each is not None or warmup_each is not None:  # each load its own timeline
        windows = tuple(
            zip(
                [-(-w // BLOCK) for w in warmup_each or [warmup] * n_loads],
                [-(-m // BLOCK) for m in steps_each or [steps] * n_loads],
            )
        )
        if len(set(windows)) == 1:  # all alike: the plan of one timeline
            windows = None
    extensions = MAX_EXTENSIONS if auto_warmup else 0
    if (measure_blocks * (1 + extensions) + warm_blocks) * BLOCK > MAX_STEPS:
        raise ValueError(
            f"steps + warmup = {steps + warmup} (with warm-up extensions) is out of range: "
            f"need at most {MAX_STEPS} per replica"
        )
    return measure_blocks, warm_blocks, windows, extensions


def _check_sized_start(init, sizes) -> None:
    """Refuse ``init="auto"`` for loads of sizes on both sides of :data:`AUTO_MEAN_FIELD_SERVERS`
    (they would start otherwise together than alone)."""
    if (
        isinstance(init, str)
        and init == "auto"
        and len({s[0] >= AUTO_MEAN_FIELD_SERVERS for s in sizes}) > 1
    ):
        raise ValueError(
            f"init='auto' starts N < {AUTO_MEAN_FIELD_SERVERS} empty and larger N at the mean "
            "field, so loads of these sizes would start otherwise together than alone: give "
            "init='empty' or 'mean-field', or sizes on one side of "
            f"{AUTO_MEAN_FIELD_SERVERS}"
        )


def _check_init(init) -> None:
    """Refuse an ``init`` that is neither a start's name nor a 1-D occupancy."""
    if isinstance(init, str) and init not in ("auto", "empty", "mean-field"):
        raise ValueError(
            f"init={init!r} is not valid: use 'auto', 'empty', 'mean-field' or an array"
        )
    if not isinstance(init, str) and np.ndim(init) != 1:
        raise ValueError("init must be a 1-D occupancy (fractions of servers with k tasks)")


def _start(init, pol: Policy, system: System, loads) -> str | tuple:
    """The plan's ``init``: ``"auto"`` resolved to ``"mean-field"`` (where the
    policy has a mean field, ``N`` is at least :data:`AUTO_MEAN_FIELD_SERVERS`
    and it can be solved) or ``"empty"``; an occupancy as a tuple of floats."""
    if not isinstance(init, str):
        return tuple(float(x) for x in np.asarray(init, np.float64).ravel())
    if init == "mean-field" and system.pools is not None and pol.routes_by_speed:
        raise ValueError(
            f"init='mean-field' needs a mean field, and there is none for {pol.name!r} "
            "with server pools (it routes by expected wait); use init='empty' or an "
            "occupancy array"
        )
    if init != "auto":
        return init
    kind, buffer = pol.mean_field_kind(), system.buffer
    has = kind in ("closed-form", "generic") or (kind in PER_SERVER_MEAN_FIELDS and buffer is None)
    # (the per-server policies take no pools; jsew routes by speed, which the
    # mean field of queue lengths does not cover)
    has = has and not (system.pools is not None and pol.routes_by_speed)
    if not has or system.n_servers < AUTO_MEAN_FIELD_SERVERS:
        return "empty"
    if kind in PER_SERVER_MEAN_FIELDS or buffer is not None or system.pools is not None:
        return _solvable_start(pol, loads, system)
    if kind == "generic" or system.service is not None:
        return _sized_start(pol, system)  # (a closed form needs no grid)
    return "mean-field"


def _warn_window(time, lengths: _Lengths, system: System, lmax: float) -> None:
    """A :class:`WindowWarning` where whole blocks simulate more than
    :data:`WINDOW_TOLERANCE` beyond ``time`` at the largest load."""
    per_unit = system.n_servers * system.step_rate(lmax)
    simulated = lengths.measure_blocks * BLOCK / per_unit
    if simulated > float(time) * (1 + WINDOW_TOLERANCE):
        warnings.warn(
            f"time={time:g} is {lengths.steps} steps per replica at N={system.n_servers} and "
            f"load {lmax:g}, run as whole blocks of {BLOCK} steps: "
            f"{lengths.measure_blocks * BLOCK} steps, {simulated:.4g} time units simulated "
            "(settings['time_measured'])",
            WindowWarning,
            stacklevel=4,
        )


def host_memory() -> int | None:
    """The host's physical memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover (not POSIX)
        return None


def state_bytes(system: System, pol: Policy, replicas: int) -> int:
    """About how many bytes of host memory ``replicas`` replicas take: each one's
    state (:func:`~jaxqueue.runs.estimates.state_array_bytes`) and its window sums
    (int64 per level, twice: the totals and the last batch's mark), as built on the host."""
    levels, iq = system.levels + 1, system.iqueue_levels + 1
    classes = class_table(system).n_classes if system.classes else 1
    state = state_array_bytes(system, pol)
    sums = 2 * 8 * (2 * levels * classes + iq + 16)
    return replicas * (2 * state + sums)  # (the state twice: per load, then stacked)


def _warn_size(system: System, pol: Policy, replicas: int, lengths: _Lengths, on_cpu) -> None:
    """A :class:`~jaxqueue.runs.estimates.RunSizeWarning` for a run estimated past
    :data:`~jaxqueue.runs.estimates.NOTE_SECONDS` on 2 CPU cores (``on_cpu``: where it
    runs) or :data:`~jaxqueue.runs.estimates.NOTE_BYTES` of state; nothing for a smaller one."""
    windows = lengths.windows or [(lengths.warm_blocks, lengths.measure_blocks)]
    steps = max(w + m for w, m in windows) * BLOCK
    note = size_note(estimate_run(system, pol, replicas, steps), on_cpu)
    if note is not None:
        warnings.warn(note, RunSizeWarning, stacklevel=5)  # (the caller of jq.simulate)


def _check_memory(system: System, pol: Policy, replicas: int) -> None:
    """Refuse a run whose replicas would not fit in the host's memory, before any
    allocation (1e8 replicas were killed by the system's out-of-memory killer)."""
    need, have = state_bytes(system, pol, replicas), host_memory()
    if have is not None and need > 0.8 * have:
        raise ValueError(
            f"{replicas} replicas (all loads) need about {need / 2**30:.3g} GiB of "
            f"host memory for their state and sums, more than 80% of this "
            f"machine's {have / 2**30:.3g} GiB: run fewer replicas at a time "
            "(several runs with other seeds)"
        )


#: ``backend="auto"`` on a GPU runs a run of fewer replica-steps than this on
#: the host's CPU instead: compiling the GPU kernel took 3 to 15 s for Pod(2)
#: and 9 to 44 s for JIQ on an H200, while two CPU cores step small batches
#: at 2e7 to 1e8 replica-steps a second, so below this the CPU is done first
#: (the main job's batches are 6.3e7 each).
HOST_AUTO_STEPS = 2e8


def _small_on_host(devices: tuple, auto: bool, stepped: int) -> tuple[tuple, str | None]:
    """The devices of a run: the host's CPU instead of JAX's default GPUs for
    a small run under ``backend="auto"`` with no devices given (one process),
    and why (or None)."""
    if (
        not auto
        or devices[0].platform != "gpu"
        or stepped >= HOST_AUTO_STEPS
        or jax.process_count() > 1
    ):
        return devices, None
    return (host_device(),), (
        f"backend='auto' runs on the host's CPU: {stepped:.3g} replica-steps are fewer than "
        f"{HOST_AUTO_STEPS:.0e}, below which compiling the GPU kernel takes longer than the "
        "CPU's stepping; pass devices=jax.devices() (or backend='pallas') for the GPU"
    )


def _backend(backend, system, pol, devices, sized=False) -> tuple[str, str | None]:
    """The backend that runs the plan, and why the one asked for is not it (or None);
    ``sized``: each replica carries its own ``N`` and ``M`` (the plan's ``sizes``)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid: use one of {', '.join(BACKENDS)}")
    if backend == "xla":
        return "xla", None
    reason = unsupported(system, pol, kernel=backend != "registers", sized=sized)
    if backend == "auto":
        if devices[0].platform != "gpu" or reason is not None:
            return "xla", None
        values = step_values(system, pol)
        if values > AUTO_MAX_VALUES:  # the compiled step would spill: the engine is faster
            return "xla", (
                f"backend='auto' runs 'xla': the kernel's step would carry {values} "
                f"values a replica (more than {AUTO_MAX_VALUES}, past which it spills "
                "registers and runs slower than the engine); fewer levels or "
                "iqueue_levels bring it back, backend='pallas' forces it"
            )
        return "pallas", None
    if reason is not None:
        note = f"backend={backend!r} does not cover this run ({reason}); it runs on 'xla'"
        warnings.warn(note, BackendWarning, stacklevel=3)
        return "xla", note
    return backend, None
