"""Plan a run: check its arguments and fix its static configuration.

:func:`plan` turns the arguments of a run (those of :func:`jaxqueue.sweep`)
into a :class:`~jaxqueue.sim.runner.Plan`, before anything compiles: it
checks every value (a ``ValueError`` names the parameter and its valid
range), turns run lengths in time units into steps, sizes the level bounds
from the theory (:mod:`jaxqueue.runs.bounds`), chooses the start
(``init="auto"``: the mean field from :data:`AUTO_MEAN_FIELD_SERVERS` servers
on, where it can be solved) and gives the plan its start
(:func:`jaxqueue.runs.initial.initial_state`), and picks the backend and the
devices. This layer sits above the simulator (:mod:`jaxqueue.sim`) and the
theory (:mod:`jaxqueue.theory`): the simulator runs a plan without importing
any theory.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence

import jax
import numpy as np

from jaxqueue.core.arrivals import Trace, as_arrivals
from jaxqueue.core.config import Bounds, Model, RunOptions, split_keywords
from jaxqueue.core.host import host_device
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.service import PhaseType, as_law, make_pools
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
from jaxqueue.runs.bounds import (
    default_iqueue_levels,
    default_levels,
    limit_ratio,
    phase_levels,
    required_levels,
    source_levels,
)
from jaxqueue.runs.initial import initial_state
from jaxqueue.sim.classes import class_table
from jaxqueue.sim.registers import unsupported
from jaxqueue.sim.runner import BACKENDS, BATCH_MEANS_REPLICAS, MAX_EXTENSIONS, Plan
from jaxqueue.sim.source import check_source

__all__ = [
    "plan",
    "plan_model",
    "BackendWarning",
    "StartWarning",
    "WindowWarning",
    "WINDOW_TOLERANCE",
    "AUTO_MEAN_FIELD_SERVERS",
    "HOST_AUTO_STEPS",
    "DEFAULT_STEPS",
    "bound_load",
    "trough_load",
    "size_key",
]

#: Measured steps per replica when neither ``steps`` nor ``time`` is given.
DEFAULT_STEPS = 1_000_000

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
            stacklevel=5,
        )
        return "empty"
    return "mean-field"


def _solvable_start(pol, loads, system) -> str:
    """Whether the host-side mean field of a per-server policy (or one with
    pools, or a finite buffer) solves at every load (JIQ-Threshold's solve is
    refused past a size, for ``z >= 2`` at larger ratios; with pools, a load
    the mean field does not cover; a buffer too large for the dense solve of
    its overload). The solutions are cached for the start itself."""
    from jaxqueue.runs.initial import _mean_field

    return _start_or_empty(pol, lambda: [_mean_field(pol, float(lam), system) for lam in loads])


def _sized_start(pol, system) -> str:
    """Whether the generic mean field a start follows fits its working-memory
    bound (:func:`jaxqueue.theory.meanfield.check_work`: an estimate, nothing
    solved or compiled; the JIQ family's outcome grid grows as ``(N / M)^2``:
    JIQ-SQ with few dispatchers)."""
    from jaxqueue.theory import meanfield

    ratio = limit_ratio(pol, system.n_servers, system.n_dispatchers)
    return _start_or_empty(pol, lambda: meanfield.check_work(pol, ratio, buffer=system.buffer))


def _run_steps(
    name: str, steps, time_name: str, units, per_unit: float, default: int, *, least: int = 1
) -> int:
    """A run length in steps: ``steps`` as given, or ``ceil(units * per_unit)``
    (``units`` in time units, ``per_unit`` the uniformized steps per time unit
    at the largest load), or ``default``; both given is an error."""
    if units is None:
        return default if steps is None else steps
    if steps is not None:
        raise ValueError(
            f"give {name} or {time_name}, not both ({name}={steps!r}, {time_name}={units!r})"
        )
    bad = isinstance(units, bool) or not isinstance(units, (int, float, np.integer, np.floating))
    if bad or not math.isfinite(units) or units < 0 or (least and units <= 0):
        need = "> 0" if least else ">= 0"
        raise ValueError(
            f"{time_name}={units!r} is out of range: need a finite number {need} (time units)"
        )
    n = int(math.ceil(float(units) * per_unit))
    if n > MAX_STEPS:
        raise ValueError(
            f"{time_name}={units:g} is {n} steps per replica ({per_unit:g} a time "
            f"unit), out of range: need at most {MAX_STEPS}; run more replicas"
        )
    return max(n, least)


def _each_load(name: str, value, n_loads: int, noun: str = "values") -> list | None:
    """``value`` as one entry per load when it is a sequence (a list, tuple or
    array; NumPy integers as Python ints), else None."""
    if not isinstance(value, (list, tuple, np.ndarray)):
        return None
    values = [as_int(v) for v in np.asarray(value, dtype=object).ravel()]
    if len(values) != n_loads:
        raise ValueError(
            f"{name} gives {len(values)} {noun} for {n_loads} loads: give one "
            f"per load, or a single {name}"
        )
    return values


def _sizes(n_servers, n_dispatchers, n_loads: int) -> list[tuple[int, int]] | None:
    """``(N, M)`` of each load when ``n_servers`` or ``n_dispatchers`` is a
    sequence (one value per load; a single value applies to every load), else None."""
    servers = _each_load("n_servers", n_servers, n_loads)
    dispatchers = _each_load("n_dispatchers", n_dispatchers, n_loads)
    if servers is None and dispatchers is None:
        return None
    sizes = []
    for n, m in zip(servers or [n_servers] * n_loads, dispatchers or [n_dispatchers] * n_loads):
        n = check_int("n_servers", n, 1, MAX_SERVERS)
        sizes.append((n, check_int("n_dispatchers", m, 1, n)))
    return sizes


def _buffers(buffer, n_loads: int) -> tuple[int | None, list[int] | None]:
    """``(buffer, buffers)``: the System's buffer (the largest), and one per
    load where ``buffer`` is a sequence (all finite: an infinite buffer and a
    finite one count their overflows otherwise), else None."""
    each = _each_load("buffer", buffer, n_loads, "buffers")
    if each is None:
        return as_int(buffer), None
    if any(b is None for b in each):
        raise ValueError(
            "buffer per load: give finite buffers only (an infinite buffer and a "
            "finite one run as programs of their own)"
        )
    each = [check_int("buffer", b, 1, 10**6) for b in each]
    return max(each), each


def size_key(pol: Policy, n: int, m: int, buffer, bare: System) -> tuple | None:
    """What loads of other ``N`` and ``M`` must share to step in one compiled
    program, or None where the size fixes the program. The step reads ``N``
    and ``M`` as numbers for the exchangeable policies (the per-server lists
    hold N servers) with exponential servers and Poisson arrivals (``bare``:
    the servers' laws and the arrivals); one dispatcher and several have other
    states, and ``d = N`` is JSQ's exhaustive search, another draw."""
    if pol.per_server or bare.classes or bare.arrivals is not None:
        return None
    system = System(n, m, buffer, buffer or 1, 1 if m > 1 else 0)
    return (m == 1, tuple(pol.draws(system)), tuple(pol.join_draws(system)))


def _check_sized(pol, sizes, bare: System, buffer) -> None:
    """Refuse loads of other sizes that cannot share a program (:func:`size_key`)."""
    keys = {size_key(pol, n, m, buffer, bare) for n, m, *_ in sizes}
    why = None
    if pol.per_server:
        why = f"{pol.label()} keeps per-server lists, whose shapes are N"
    elif None in keys:
        why = "phase-type service, server pools and arrival sources fix their shapes by N"
    elif len({k[0] for k in keys}) > 1:
        why = "one dispatcher and several have other states"
    elif len(keys) > 1:
        why = f"{pol.label()} draws differently at these sizes (d = N is JSQ's exhaustive search)"
    if why is not None:
        raise ValueError(
            f"n_servers, n_dispatchers or buffer per load: {why}; run each size "
            "on its own (one n_servers, n_dispatchers and buffer)"
        )


def _sized_lengths(sizes, loads, bare: System, steps, time, warmup, warmup_time):
    """Run lengths per load for loads of other sizes: ``time`` and
    ``warmup_time`` (and the default warm-up) in time units at each load's own
    ``N`` and load, as ``(steps, time, warmup, warmup_time)`` for :func:`plan`."""
    rates = [size[0] * bare.step_rate(lam) for size, lam in zip(sizes, loads)]
    if time is not None and steps is None:
        steps = [_run_steps("steps", None, "time", time, r, DEFAULT_STEPS) for r in rates]
        time = None
    if warmup is None:
        units = DEFAULT_WARMUP_TIME if warmup_time is None else warmup_time
        warmup = [_run_steps("warmup", None, "warmup_time", units, r, 0, least=0) for r in rates]
        warmup_time = None
    return steps, time, warmup, warmup_time


def _per_load(name: str, value, n_loads: int, least: int, units) -> list[int] | None:
    """``value`` as one run length per load when it is a sequence, else None
    (a single value, checked later); a sequence with a run length in time
    units is an error."""
    values = _each_load(name, value, n_loads, "run lengths")
    if values is None:
        return None
    if units is not None:
        raise ValueError(f"give {name} (one per load) or a time in units, not both")
    return [check_int(name, v, least, MAX_STEPS) for v in values]


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

    Arguments as in :func:`jaxqueue.sweep`: a :class:`~jaxqueue.core.config.Model`
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
    the start, the backend and the devices fixed. Nothing compiles."""
    if not isinstance(model, Model):
        raise TypeError(f"plan_model() takes a Model, got {type(model).__name__}")
    policy, n_servers, n_dispatchers = model.policy, model.n_servers, model.n_dispatchers
    d, z, order, buffer = model.d, model.z, model.order, model.buffer
    service, pools, arrivals = model.service, model.pools, model.arrivals
    replicas, steps, time, warmup, warmup_time = (
        run.replicas,
        run.steps,
        run.time,
        run.warmup,
        run.warmup_time,
    )
    seed, init, interval, batches = run.seed, run.init, run.interval, run.batches
    backend, devices, on_overflow = run.backend, run.devices, run.on_overflow
    levels, iqueue_levels = bounds.levels, bounds.iqueue_levels
    pol = make(policy, d=d, z=z, order=order)
    # counts from NumPy arrays as Python ints (they reach the settings and the JSON)
    replicas, steps, warmup, seed, levels, iqueue_levels, batches = (
        as_int(v) for v in (replicas, steps, warmup, seed, levels, iqueue_levels, batches)
    )
    n_loads = np.size(np.asarray(loads, dtype=object))
    sizes = _sizes(n_servers, n_dispatchers, n_loads)
    if sizes is not None:  # the System holds the largest; each load its own
        n_servers, n_dispatchers = max(n for n, _ in sizes), max(m for _, m in sizes)
    buffer, buffers = _buffers(buffer, n_loads)
    if buffers is not None:  # each load's own buffer below the System's (the largest)
        sizes = [
            (n, m, b) for (n, m), b in zip(sizes or [(n_servers, n_dispatchers)] * n_loads, buffers)
        ]
    if sizes is not None:
        sizes = None if len(set(sizes)) == 1 else sizes
    n_servers = check_int("n_servers", n_servers, 1, MAX_SERVERS)
    n_dispatchers = check_int("n_dispatchers", n_dispatchers, 1, n_servers)
    law = _service(service, pol)
    pool_set = _pools(pools, n_servers, pol)
    source = as_arrivals(arrivals)
    if isinstance(source, Trace) and (law is not None or pool_set is not None):
        raise ValueError(
            "arrivals: a trace-driven run estimates the response time from the queue length an "
            "arrival finds, which needs identical exponential servers; use service=None and "
            "pools=None (or a rate profile or an MMPP, which take both)"
        )
    # the servers, their laws and the arrivals, without level bounds (these come below)
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
    lmax = max(loads)
    per_unit = n_servers * bare.step_rate(lmax)  # (a thinned source steps at its peak rate)
    if sizes is not None:  # time units at each load's own N and load
        _check_sized(pol, sizes, bare, buffer)
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
        steps, time, warmup, warmup_time = _sized_lengths(
            sizes, loads, bare, steps, time, warmup, warmup_time
        )
    steps_each = _per_load("steps", steps, len(loads), 1, time)
    warmup_each = _per_load("warmup", warmup, len(loads), 0, warmup_time)
    if steps_each is not None:
        steps = max(steps_each)
    if warmup_each is not None:
        warmup = max(warmup_each)
    steps = _run_steps("steps", steps, "time", time, per_unit, DEFAULT_STEPS)
    check_int("steps", steps, 1, MAX_STEPS)
    if on_overflow not in ("raise", "report"):
        raise ValueError(f"on_overflow={on_overflow!r} is not valid: use 'raise' or 'report'")
    auto_warmup = isinstance(warmup, str)
    if auto_warmup and warmup != "auto":
        raise ValueError(f"warmup={warmup!r} is not valid: use a number of steps, None or 'auto'")
    if auto_warmup and warmup_time is not None:
        raise ValueError(
            "warmup='auto' starts from the default warm-up and extends it: "
            "give warmup_time=None with it"
        )
    warmup = _run_steps(
        "warmup",
        None if auto_warmup else warmup,
        "warmup_time",
        warmup_time,
        per_unit,
        int(math.ceil(DEFAULT_WARMUP_TIME * per_unit)),
        least=0,
    )
    check_int("warmup", warmup, 0, MAX_STEPS)
    measure_blocks = -(-steps // BLOCK)
    warm_blocks = -(-warmup // BLOCK)
    windows = None
    if steps_each is not None or warmup_each is not None:  # each load its own timeline
        windows = tuple(
            zip(
                [-(-w // BLOCK) for w in warmup_each or [warmup] * len(loads)],
                [-(-m // BLOCK) for m in steps_each or [steps] * len(loads)],
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
    if interval not in ("auto", "replicas", "batch-means"):
        raise ValueError(
            f"interval={interval!r} is not valid: use 'auto', 'replicas' or 'batch-means'"
        )
    check_int("batches", batches, 1, 10**4)
    shortest = min(m for _, m in windows) if windows else measure_blocks
    n_batches = min(batches, shortest)
    if interval == "batch-means" and n_batches < 2 and replicas >= 2:
        # asked for by name: not replaced by replica intervals in silence
        why = (
            f"batches={batches}"
            if batches < 2
            else f"steps={shortest * BLOCK} is one block of {BLOCK} steps"
        )
        raise ValueError(
            f"interval='batch-means' needs at least 2 batches, and {why}: pass "
            f"2 <= batches <= 10000 with steps >= {2 * BLOCK}, or interval='replicas' "
            "(or 'auto') for intervals across the replicas"
        )
    if interval == "auto":
        interval = "batch-means" if replicas <= BATCH_MEANS_REPLICAS else "replicas"
    if interval == "batch-means" and n_batches < 2:
        if replicas < 2 and batches < 2:
            raise ValueError(
                f"batches={batches} is out of range for one replica: intervals from batch "
                f"means need 2 <= batches <= 10000 (or at least 2 replicas)"
            )
        if replicas < 2:
            raise ValueError(
                f"steps={shortest * BLOCK} is one block of {BLOCK} steps: an interval needs at "
                f"least 2 batches (steps >= {2 * BLOCK}) or at least 2 replicas"
            )
        interval = "replicas"
    check_int("seed", seed, 0, MAX_SEED)
    # every argument first: the level bounds below may solve (and compile) the mean field
    if isinstance(init, str) and init not in ("auto", "empty", "mean-field"):
        raise ValueError(
            f"init={init!r} is not valid: use 'auto', 'empty', 'mean-field' or an array"
        )
    if not isinstance(init, str) and np.ndim(init) != 1:
        raise ValueError("init must be a 1-D occupancy (fractions of servers with k tasks)")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid: use one of {', '.join(BACKENDS)}")
    pol.validate(System(n_servers, n_dispatchers, buffer, buffer or 1, 0))
    by_size = {}  # the loads of each size (one size without sizes); a buffer bounds its own
    for size, lam in zip(sizes or [(n_servers, n_dispatchers)] * len(loads), loads):
        by_size.setdefault(size[:2], []).append(lam)
    system = System(
        n_servers,
        n_dispatchers,
        buffer,
        max(
            _levels(
                pol,
                n,
                m,
                buffer,
                levels,
                bound_load(max(lams), source, bare.capacity),
                law,
                pool_set,
                source,
                max(lams),
            )
            for (n, m), lams in by_size.items()
        ),
        max(
            _iqueue_levels(pol, n, m, iqueue_levels, trough_load(min(lams), source))
            for (n, m), lams in (
                by_size.items() if iqueue_levels is None else [((n_servers, n_dispatchers), loads)]
            )
        ),
        law,
        pool_set,
        source,
    )
    pol.validate(system)
    if isinstance(init, str):
        if init not in ("auto", "empty", "mean-field"):
            raise ValueError(
                f"init={init!r} is not valid: use 'auto', 'empty', 'mean-field' or an array"
            )
        start = init
        if init == "auto":
            kind = pol.mean_field_kind()
            has = kind in ("closed-form", "generic") or (
                kind in PER_SERVER_MEAN_FIELDS and buffer is None
            )
            # (the per-server policies take no pools; jsew routes by speed, which the
            # mean field of queue lengths does not cover)
            has = has and not (system.pools is not None and pol.routes_by_speed)
            start = "mean-field" if has and n_servers >= AUTO_MEAN_FIELD_SERVERS else "empty"
            if start == "mean-field" and (
                kind in PER_SERVER_MEAN_FIELDS or buffer is not None or system.pools is not None
            ):
                start = _solvable_start(pol, loads, system)
            elif start == "mean-field" and (kind == "generic" or system.service is not None):
                start = _sized_start(pol, system)  # (a closed form needs no grid)
        elif init == "mean-field" and system.pools is not None and pol.routes_by_speed:
            raise ValueError(
                f"init='mean-field' needs a mean field, and there is none for {pol.name!r} "
                "with server pools (it routes by expected wait); use init='empty' or an "
                "occupancy array"
            )
    else:
        start = tuple(float(x) for x in np.asarray(init, np.float64).ravel())
        if np.ndim(init) != 1:
            raise ValueError("init must be a 1-D occupancy (fractions of servers with k tasks)")
    if streams is not None:
        streams = tuple(int(w) for w in streams)
        if len(streams) != len(loads) or any(not 0 <= w < 2**32 for w in streams):
            raise ValueError(
                f"streams must give one word in [0, 2**32) per load: {len(loads)} loads, "
                f"got {len(streams)} words"
            )
    if time is not None:
        simulated = measure_blocks * BLOCK / per_unit
        if simulated > float(time) * (1 + WINDOW_TOLERANCE):
            warnings.warn(
                f"time={time:g} is {steps} steps per replica at N={n_servers} and load "
                f"{lmax:g}, run as whole blocks of {BLOCK} steps: {measure_blocks * BLOCK} steps, "
                f"{simulated:.4g} time units simulated (settings['time_measured'])",
                WindowWarning,
                stacklevel=3,
            )
    _check_memory(system, pol, replicas * len(loads))
    devs = tuple(devices) if devices is not None else tuple(jax.devices())
    stepped = len(loads) * replicas * (warm_blocks + measure_blocks * (1 + extensions)) * BLOCK
    devs, host_note = _small_on_host(devs, devices is None and backend == "auto", stepped)
    used, note = _backend(backend, system, pol, devs)
    note = host_note or note
    return Plan(
        pol,
        system,
        tuple(loads),
        replicas,
        warm_blocks,
        measure_blocks,
        int(seed),
        start,
        on_overflow,
        devs,
        streams,
        min(batches, measure_blocks),
        interval,
        auto_warmup,
        extensions,
        used,
        note,
        windows,
        None if sizes is None else tuple(sizes),
        initial_state,
    )


def host_memory() -> int | None:
    """The host's physical memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover (not POSIX)
        return None


def state_bytes(system: System, pol: Policy, replicas: int) -> int:
    """About how many bytes of host memory ``replicas`` replicas take: each one's
    state (int32 per level and I-queue size, per server for per-server lists,
    per level and class with server classes) and its window sums (int64 per
    level, twice: the totals and the last batch's mark), as built on the host."""
    levels, iq = system.levels + 1, system.iqueue_levels + 1
    classes = class_table(system).n_classes if system.classes else 1
    state = 4 * (levels * classes + 2 * iq) + (16 * system.n_servers if pol.per_server else 0)
    sums = 2 * 8 * (2 * levels * classes + iq + 16)
    return replicas * (2 * state + sums)  # (the state twice: per load, then stacked)


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


def _backend(backend, system, pol, devices) -> tuple[str, str | None]:
    """The backend that runs the plan, and why the one asked for is not it (or None)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid: use one of {', '.join(BACKENDS)}")
    if backend == "xla":
        return "xla", None
    reason = unsupported(system, pol)
    if backend == "auto":
        if devices[0].platform != "gpu" or reason is not None:
            return "xla", None
        from jaxqueue.sim.kernel import AUTO_MAX_VALUES, step_values

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


def _service(service, pol) -> PhaseType | None:
    """The service law of a run (``None``: exponential), checked against the policy."""
    law = as_law(service)
    if law is None or law.is_unit_exponential:
        return None
    if pol.per_server:
        raise ValueError(
            f"service={law.label!r}: phase-type service covers the exchangeable policies "
            f"(random, jsq, pod, i1f, jiq, jiq-pod, jiq-sq, idle-first), not {pol.label()}, "
            "which steps on per-server lists; use service=None"
        )
    return law


def _pools(pools, n: int, pol) -> tuple | None:
    """The pools of a run (``None``: identical servers); see :func:`make_pools`."""
    if pools is not None and pol.per_server:
        raise ValueError(
            f"pools cover the exchangeable policies, not {pol.label()}, which steps on "
            "per-server lists; use pools=None"
        )
    return make_pools(pools, n)


def bound_load(lmax: float, source, cap: float) -> float:
    """The load the default level bounds are computed for where the mean
    field does not size them under a source (:func:`~jaxqueue.sim.bounds.source_levels`:
    fewer than 100 servers, the per-server policies, ``jsew`` with pools).

    With a time-varying or trace source: the peak load (a profile's or an
    MMPP's), but at most halfway from the mean load to the capacity, and a
    trace's that halfway load. Queues build up while the rate is above its
    mean; an arrival that still finds a queue at the bound is an overflow,
    reported with advice (never clipped).
    """
    if source is None or lmax >= cap:
        return lmax
    halfway = 0.5 * (lmax + cap)
    return halfway if isinstance(source, Trace) else max(lmax, min(lmax * source.peak, halfway))


def trough_load(lmin: float, source) -> float:
    """The load the default I-queue bounds are computed for (idle servers
    gather in I-queues at low load): a profile's or an MMPP's lowest rate, a
    trace's half the mean, at least 0.01."""
    if source is None:
        return lmin
    low = 0.5 * lmin if isinstance(source, Trace) else lmin * float(source.shape.min())
    return max(0.01, low)


def _phase_levels(pol, n, m, levels, lmax, law, pools) -> int:
    if levels is None:
        return phase_levels(pol, n, m, lmax, law, pools)
    check_int("levels", levels, 1, 10**6)
    return levels


def _levels(
    pol, n, m, buffer, levels, lmax, law=None, pools=None, source=None, mean_load=None
) -> int:
    """The level bound: ``buffer``; ``levels`` checked; or the default at
    ``lmax`` (:func:`bound_load`), and under a source where the mean field
    applies the queues its stress path builds (:func:`~jaxqueue.sim.bounds.source_levels`)."""
    if buffer is not None:
        if levels is not None and levels != buffer:
            raise ValueError(f"levels={levels} must equal buffer={buffer} (or be omitted)")
        return buffer
    if source is not None and levels is None:
        found = source_levels(pol, n, m, mean_load, source, law, pools)
        if found is not None:
            return found
    if law is not None or pools is not None:
        return _phase_levels(pol, n, m, levels, lmax, law, pools)
    need = required_levels(pol, n, m, lmax)
    if levels is None:
        return default_levels(pol, n, m, lmax)
    check_int("levels", levels, 1, 10**6)
    if levels < need:
        raise ValueError(
            f"levels={levels} is too small for load={lmax} under {pol.label()}: the "
            f"mean-field tail puts about one server at queue length {need} or more; "
            f"need levels >= {need} (default {default_levels(pol, n, m, lmax)})"
        )
    return levels


def _iqueue_levels(pol, n, m, iqueue_levels, lmin) -> int:
    if not (pol.uses_iqueues and (m > 1 or pol.per_server)):
        return 0
    iq = iqueue_levels if iqueue_levels is not None else default_iqueue_levels(pol, n, m, lmin)
    check_int("iqueue_levels", iq, 1, n)
    return iq
