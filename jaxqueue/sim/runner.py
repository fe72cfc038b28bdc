"""The simulation runner: plan, run, checkpoint, collect.

* :func:`plan` checks every argument (before anything compiles) and fixes the
  static configuration: the policy, the :class:`~jaxqueue.core.system.System`,
  the loads, the replicas, the warm-up and measured blocks, the batches of the
  measured window, the seed, the start;
* a :class:`Run` holds the replicas' Markov state (on the devices), the exact
  host totals of the measured window (:mod:`jaxqueue.sim.totals`), the batch
  records and the next block. It advances in chunks of about half a second
  (the chunk boundary is where progress, overflow checks and checkpoints
  live). Keys are by position (replica ``i`` block ``b`` draws from
  ``fold_in(fold_in(key, i), b)``; see :func:`jaxqueue.core.rng.replica_keys`
  for grid points) and every sum is an exact integer, so a run cut into any
  chunks, stopped and resumed from a checkpoint, or spread over any number
  of devices gives the same result, bit for bit;
* :meth:`Run.results` turns the totals into one result per load.

Several processes (``jax.distributed``, one per host; ``jax.process_count() >
1``): every process runs the same program on the global device list (the
default ``devices``), each stepping the replicas of its own devices. The
replica keys, loads and initial state are built as global arrays from the
same host values in every process (:func:`_put`, no communication); after
each chunk the statistics are gathered to every process
(``multihost_utils.process_allgather``), so every process keeps the same
totals and returns the same results; the chunk length and the decision to
save a checkpoint follow process 0's clock (:func:`_agree`), so every
process runs the same chunks. Checkpoints are gathered by every process and
written by process 0 only; the file must be on a file system every process
sees (all resume from it). With one process nothing of this runs.

The measured window is cut into ``batches`` batches (:class:`~jaxqueue.sim.windows.Window`;
each load keeps its own timeline, which may differ in length from the
other loads' of the batch: :attr:`Plan.windows`).
Each batch's mean queue length feeds the warm-up diagnostic
(:mod:`jaxqueue.results.warmup`); with few replicas (``interval="auto"``
and at most :data:`BATCH_MEANS_REPLICAS`) each batch's sums are kept and the
intervals come from batch means. With ``warmup="auto"``, a window whose
diagnostic fails becomes warm-up and a new window is measured, at most
``max_extensions`` times.

:func:`run` does it all; :func:`jaxqueue.simulate` and :func:`jaxqueue.sweep`
are built on it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
import warnings
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from jaxqueue.core.arrivals import Trace, as_arrivals
from jaxqueue.core.host import host_device
from jaxqueue.core.rng import BLOCK, replica_keys
from jaxqueue.core.service import PhaseType, as_law, make_pools, pool_laws
from jaxqueue.core.system import (
    DEFAULT_WARMUP_TIME, MAX_SEED, MAX_SERVERS, MAX_STEPS, System, as_int, check_int, check_load,
)  # fmt: skip
from jaxqueue.core.versions import __version__, versions
from jaxqueue.policies.base import PER_SERVER_MEAN_FIELDS, Policy
from jaxqueue.policies.registry import make
from jaxqueue.results.simulation import SimulationResult, from_stats
from jaxqueue.sim.blocks import block_words, max_chunk_blocks, run_blocks, time_sum_scale
from jaxqueue.sim.bounds import (default_iqueue_levels, default_levels, limit_ratio,
                                 phase_levels, required_levels, source_levels)
from jaxqueue.sim.classes import class_table
from jaxqueue.sim.initial import initial_classes, initial_counts
from jaxqueue.sim.per_server import Lists
from jaxqueue.sim.registers import run_registers, unsupported
from jaxqueue.sim.source import Clock, check_source, init_clock
from jaxqueue.sim.state import Core, core_from_counts, iq_width
from jaxqueue.sim.totals import Totals
from jaxqueue.sim.windows import Window

__all__ = [
    "Plan", "plan", "Run", "run", "placement", "LevelOverflowError", "CheckpointMismatch",
    "BATCHES", "BATCH_MEANS_REPLICAS", "MAX_EXTENSIONS", "BACKENDS", "BackendWarning", "StartWarning",
    "WindowWarning", "WINDOW_TOLERANCE",
]  # fmt: skip

#: The paths that step the replicas: ``"xla"`` (the vmapped engine,
#: :mod:`jaxqueue.sim.blocks`), ``"registers"`` (the register layout in plain
#: XLA, :mod:`jaxqueue.sim.registers`), ``"pallas"`` (the register layout as a
#: Pallas GPU kernel, :mod:`jaxqueue.sim.kernel`; interpreted off a GPU, for
#: checking) and ``"auto"`` (the kernel on a GPU where it covers the run, else
#: ``"xla"``). All give bit-identical results.
BACKENDS = ("auto", "xla", "registers", "pallas")

#: Batches of the measured window (fewer when the window has fewer blocks).
BATCHES = 20

#: ``interval="auto"`` takes batch means at this many replicas per load or fewer.
BATCH_MEANS_REPLICAS = 10

#: ``warmup="auto"``: the most measured windows that may be turned into warm-up.
MAX_EXTENSIONS = 4

#: ``init="auto"`` starts at the mean field from this many servers on; smaller
#: systems fill in a few units of time, and the mean field is a poor guide there.
AUTO_MEAN_FIELD_SERVERS = 100

#: Version of the checkpoint file layout (2: each load's window on its own).
CHECKPOINT_FORMAT = 2


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
        warnings.warn(f"init='auto' starts {pol.label()} empty: its mean field is not available "
                      f"here ({err})", StartWarning, stacklevel=5)  # fmt: skip
        return "empty"
    return "mean-field"


def _solvable_start(pol, loads, system) -> str:
    """Whether the host-side mean field of a per-server policy (or one with
    pools, or a finite buffer) solves at every load (JIQ-Threshold's solve is
    refused past a size, for ``z >= 2`` at larger ratios; with pools, a load
    the mean field does not cover; a buffer too large for the dense solve of
    its overload). The solutions are cached for the start itself."""
    from jaxqueue.sim.initial import _mean_field

    return _start_or_empty(pol, lambda: [_mean_field(pol, float(lam), system) for lam in loads])


def _sized_start(pol, system) -> str:
    """Whether the generic mean field a start follows fits its working-memory
    bound (:func:`jaxqueue.theory.meanfield.check_work`: an estimate, nothing
    solved or compiled; the JIQ family's outcome grid grows as ``(N / M)^2``:
    JIQ-SQ with few dispatchers)."""
    from jaxqueue.theory import meanfield

    ratio = limit_ratio(pol, system.n_servers, system.n_dispatchers)
    return _start_or_empty(pol, lambda: meanfield.check_work(pol, ratio, buffer=system.buffer))


class LevelOverflowError(RuntimeError):
    """A queue or an I-queue passed its tracked bound; the run is not valid."""


class CheckpointMismatch(ValueError):
    """A checkpoint file was written by a run with other settings or another version."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything static about a run (hashable; derived from validated arguments).

    Attributes:
        policy: the Policy.
        system: the System (N, M, buffer, level bounds).
        loads: the values of ``lambda``; ``replicas`` replicas run at each.
        replicas: replicas per load.
        warmup_blocks: discarded blocks of :data:`~jaxqueue.core.rng.BLOCK` steps.
        measure_blocks: measured blocks.
        seed: the run's integer seed.
        init: ``"empty"``, ``"mean-field"`` or an occupancy as a tuple of floats.
        on_overflow: ``"raise"`` or ``"report"``.
        devices: the devices replicas are spread over.
        streams: ``None``: replica ``i`` of load ``j`` draws from the stream of
            global replica ``j * replicas + i`` (keys by position); or one
            stream word per load: its replicas ``0 .. replicas - 1`` draw from
            ``fold_in(fold_in(key, word), i)``, which does not depend on the
            other loads of the batch or their order (grid points).
        batches: batches of the measured window (:meth:`load_windows`).
        interval: ``"replicas"`` (intervals across replicas) or
            ``"batch-means"``.
        warmup_auto: ``warmup="auto"``: a window whose warm-up diagnostic
            fails becomes warm-up, at most ``max_extensions`` times.
        max_extensions: see ``warmup_auto``.
        backend: the path that steps the replicas (:data:`BACKENDS`, resolved:
            never ``"auto"``); every path gives bit-identical results, so it
            is not part of :meth:`fingerprint`.
        backend_note: why the backend asked for was not used (or, on a GPU,
            why ``"auto"`` chose ``"xla"`` for a kernel-covered policy), or None.
        windows: ``None`` (every load has ``warmup_blocks`` and
            ``measure_blocks``), or one ``(warmup_blocks, measure_blocks)``
            per load: the loads of one batch step together to the longest
            timeline, each measuring its own window (a sweep's points of
            other run lengths in one lockstep batch); ``warmup_blocks`` and
            ``measure_blocks`` are then the largest.
        sizes: ``None`` (every load has the System's ``N`` and ``M``), or one
            ``(n_servers, n_dispatchers)`` per load: the loads of one batch
            differ in size (a sweep's points of other ``N`` in one compiled
            program); the System then holds the largest ``N`` and ``M`` and
            level bounds that cover every load.
    """

    policy: Policy
    system: System
    loads: tuple
    replicas: int
    warmup_blocks: int
    measure_blocks: int
    seed: int
    init: str | tuple = "empty"
    on_overflow: str = "raise"
    devices: tuple = ()
    streams: tuple | None = None
    batches: int = 1
    interval: str = "replicas"
    warmup_auto: bool = False
    max_extensions: int = 0
    backend: str = "xla"
    backend_note: str | None = None
    windows: tuple | None = None
    sizes: tuple | None = None

    def load_sizes(self) -> list[tuple[int, int]]:
        """Each load's ``(n_servers, n_dispatchers)``."""
        return list(self.sizes or [(self.system.n_servers, self.system.n_dispatchers)] * len(self.loads))

    def load_system(self, j: int) -> System:
        """Load ``j``'s System: the plan's, at that load's ``N`` and ``M``."""
        if self.sizes is None:
            return self.system
        n, m = self.sizes[j]
        return dataclasses.replace(self.system, n_servers=n, n_dispatchers=m)

    def load_windows(self) -> list[tuple[int, int, int]]:
        """Each load's ``(warmup_blocks, measure_blocks, batches)``: its own
        (:attr:`windows`) or the plan's; a window of fewer blocks than
        :attr:`batches` has one batch a block."""
        own = self.windows or [(self.warmup_blocks, self.measure_blocks)] * len(self.loads)
        return [(w, m, min(self.batches, m)) for w, m in own]

    @property
    def total_blocks(self) -> int:
        """Blocks from the start to the end of the run (without warm-up extensions)."""
        return self.warmup_blocks + self.measure_blocks

    def fingerprint(self) -> dict:
        """Everything that fixes the run's result (what a checkpoint must match)."""
        system = dataclasses.asdict(self.system)
        for name in ("service", "pools", "arrivals"):  # as before they existed: old checkpoints resume
            if system[name] is None:
                del system[name]
        if self.system.arrivals is not None:
            system["arrivals"] = self.system.arrivals.to_dict()
        return {
            "jaxqueue": __version__, "format": CHECKPOINT_FORMAT, "block": BLOCK,
            "policy": self.policy.name, "options": self.policy.options(), "system": system,
            "loads": [float(x).hex() for x in self.loads], "replicas": self.replicas,
            "warmup_blocks": self.warmup_blocks, "measure_blocks": self.measure_blocks,
            "seed": self.seed, "init": self.init if isinstance(self.init, str) else
            [float(x).hex() for x in self.init], "streams": list(self.streams or []) or None,
            "batches": self.batches, "interval": self.interval,
            "warmup_auto": self.warmup_auto, "max_extensions": self.max_extensions,
            **({"windows": [list(w) for w in self.windows]} if self.windows else {}),
            **({"sizes": [list(s) for s in self.sizes]} if self.sizes else {}),
        }  # fmt: skip

    @property
    def n_replicas(self) -> int:
        """Replicas of all loads (before padding to the device count)."""
        return self.replicas * len(self.loads)

    @property
    def padded(self) -> int:
        """Replicas of all loads, padded to a multiple of the device count."""
        n = len(self.devices)
        return -(-self.n_replicas // n) * n

    def load_vector(self) -> np.ndarray:
        """float32 ``(padded,)``: each replica's load (padding repeats the last)."""
        vec = np.repeat(np.asarray(self.loads, np.float32), self.replicas)
        return np.concatenate([vec, np.full(self.padded - vec.size, vec[-1], np.float32)])


#: Measured steps per replica when neither ``steps`` nor ``time`` is given.
DEFAULT_STEPS = 1_000_000


def _run_steps(name: str, steps, time_name: str, units, per_unit: float, default: int, *,
               least: int = 1) -> int:  # fmt: skip
    """A run length in steps: ``steps`` as given, or ``ceil(units * per_unit)``
    (``units`` in time units, ``per_unit`` the uniformized steps per time unit
    at the largest load), or ``default``; both given is an error."""
    if units is None:
        return default if steps is None else steps
    if steps is not None:
        raise ValueError(f"give {name} or {time_name}, not both ({name}={steps!r}, "
                         f"{time_name}={units!r})")  # fmt: skip
    bad = isinstance(units, bool) or not isinstance(units, (int, float, np.integer, np.floating))
    if bad or not math.isfinite(units) or units < 0 or (least and units <= 0):
        need = "> 0" if least else ">= 0"
        raise ValueError(f"{time_name}={units!r} is out of range: need a finite number {need} "
                         "(time units)")  # fmt: skip
    n = int(math.ceil(float(units) * per_unit))
    if n > MAX_STEPS:
        raise ValueError(f"{time_name}={units:g} is {n} steps per replica ({per_unit:g} a time "
                         f"unit), out of range: need at most {MAX_STEPS}; run more replicas")  # fmt: skip
    return max(n, least)


def _each_load(name: str, value, n_loads: int, noun: str = "values") -> list | None:
    """``value`` as one entry per load when it is a sequence (a list, tuple or
    array; NumPy integers as Python ints), else None."""
    if not isinstance(value, (list, tuple, np.ndarray)):
        return None
    values = [as_int(v) for v in np.asarray(value, dtype=object).ravel()]
    if len(values) != n_loads:
        raise ValueError(f"{name} gives {len(values)} {noun} for {n_loads} loads: give one "
                         f"per load, or a single {name}")  # fmt: skip
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
    keys = {size_key(pol, n, m, buffer, bare) for n, m in sizes}
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
        raise ValueError(f"n_servers and n_dispatchers per load: {why}; run each size on its "
                         "own (one n_servers and n_dispatchers)")  # fmt: skip


def _sized_lengths(sizes, loads, bare: System, steps, time, warmup, warmup_time):
    """Run lengths per load for loads of other sizes: ``time`` and
    ``warmup_time`` (and the default warm-up) in time units at each load's own
    ``N`` and load, as ``(steps, time, warmup, warmup_time)`` for :func:`plan`."""
    rates = [n * bare.step_rate(lam) for (n, _), lam in zip(sizes, loads)]
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
    policy: str | Policy,
    loads: Sequence[float],
    n_servers: int,
    n_dispatchers: int = 1,
    *,
    d: int | None = None,
    z: int | None = None,
    order: str | None = None,
    buffer: int | None = None,
    replicas: int = 32,
    steps: int | None = None,
    warmup: int | str | None = None,
    seed: int = 0,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    init="auto",
    on_overflow: str = "raise",
    devices: Sequence | None = None,
    streams: Sequence[int] | None = None,
    interval: str = "auto",
    batches: int = BATCHES,
    backend: str = "auto",
    service: str | PhaseType | None = None,
    pools=None,
    arrivals=None,
    time: float | None = None,
    warmup_time: float | None = None,
) -> Plan:
    """Check the arguments of a run and fix its static configuration (nothing compiles).

    Arguments as in :func:`jaxqueue.sweep`.
    """
    pol = make(policy, d=d, z=z, order=order)
    # counts from NumPy arrays as Python ints (they reach the settings and the JSON)
    buffer, replicas, steps, warmup, seed, levels, iqueue_levels, batches = (
        as_int(v) for v in (buffer, replicas, steps, warmup, seed, levels, iqueue_levels, batches))
    sizes = _sizes(n_servers, n_dispatchers, np.size(np.asarray(loads, dtype=object)))
    if sizes is not None:  # the System holds the largest; each load its own
        n_servers, n_dispatchers = max(n for n, _ in sizes), max(m for _, m in sizes)
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
    loads = [check_load(x, buffer, bare.capacity)
             for x in np.atleast_1d(np.asarray(loads, dtype=object))]  # fmt: skip
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
        if isinstance(init, str) and init == "auto" and \
                len({n >= AUTO_MEAN_FIELD_SERVERS for n, _ in sizes}) > 1:  # fmt: skip
            raise ValueError(
                f"init='auto' starts N < {AUTO_MEAN_FIELD_SERVERS} empty and larger N at the mean "
                "field, so loads of these sizes would start otherwise together than alone: give "
                "init='empty' or 'mean-field', or sizes on one side of "
                f"{AUTO_MEAN_FIELD_SERVERS}")  # fmt: skip
        steps, time, warmup, warmup_time = _sized_lengths(sizes, loads, bare, steps, time,
                                                          warmup, warmup_time)  # fmt: skip
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
        raise ValueError("warmup='auto' starts from the default warm-up and extends it: "
                         "give warmup_time=None with it")  # fmt: skip
    warmup = _run_steps("warmup", None if auto_warmup else warmup, "warmup_time", warmup_time,
                        per_unit, int(math.ceil(DEFAULT_WARMUP_TIME * per_unit)), least=0)  # fmt: skip
    check_int("warmup", warmup, 0, MAX_STEPS)
    measure_blocks = -(-steps // BLOCK)
    warm_blocks = -(-warmup // BLOCK)
    windows = None
    if steps_each is not None or warmup_each is not None:  # each load its own timeline
        windows = tuple(zip([-(-w // BLOCK) for w in warmup_each or [warmup] * len(loads)],
                            [-(-m // BLOCK) for m in steps_each or [steps] * len(loads)]))  # fmt: skip
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
        why = (f"batches={batches}" if batches < 2 else
               f"steps={shortest * BLOCK} is one block of {BLOCK} steps")  # fmt: skip
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
        raise ValueError(f"init={init!r} is not valid: use 'auto', 'empty', 'mean-field' or an array")
    if not isinstance(init, str) and np.ndim(init) != 1:
        raise ValueError("init must be a 1-D occupancy (fractions of servers with k tasks)")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid: use one of {', '.join(BACKENDS)}")
    pol.validate(System(n_servers, n_dispatchers, buffer, buffer or 1, 0))
    by_size = {}  # the loads of each size (one size without sizes)
    for size, lam in zip(sizes or [(n_servers, n_dispatchers)] * len(loads), loads):
        by_size.setdefault(size, []).append(lam)
    system = System(n_servers, n_dispatchers, buffer,
                    max(_levels(pol, n, m, buffer, levels,
                                bound_load(max(lams), source, bare.capacity),
                                law, pool_set, source, max(lams))
                        for (n, m), lams in by_size.items()),
                    max(_iqueue_levels(pol, n, m, iqueue_levels, trough_load(min(lams), source))
                        for (n, m), lams in (by_size.items() if iqueue_levels is None else
                                             [((n_servers, n_dispatchers), loads)])),
                    law, pool_set, source)  # fmt: skip
    pol.validate(system)
    if isinstance(init, str):
        if init not in ("auto", "empty", "mean-field"):
            raise ValueError(
                f"init={init!r} is not valid: use 'auto', 'empty', 'mean-field' or an array"
            )
        start = init
        if init == "auto":
            kind = pol.mean_field_kind()
            has = kind in ("closed-form", "generic") or (kind in PER_SERVER_MEAN_FIELDS
                                                          and buffer is None)
            # (the per-server policies take no pools; jsew routes by speed, which the
            # mean field of queue lengths does not cover)
            has = has and not (system.pools is not None and pol.routes_by_speed)
            start = "mean-field" if has and n_servers >= AUTO_MEAN_FIELD_SERVERS else "empty"
            if start == "mean-field" and (kind in PER_SERVER_MEAN_FIELDS or buffer is not None
                                          or system.pools is not None):  # fmt: skip
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
                WindowWarning, stacklevel=3)  # fmt: skip
    devs = tuple(devices) if devices is not None else tuple(jax.devices())
    stepped = len(loads) * replicas * (warm_blocks + measure_blocks * (1 + extensions)) * BLOCK
    devs, host_note = _small_on_host(devs, devices is None and backend == "auto", stepped)
    used, note = _backend(backend, system, pol, devs)
    note = host_note or note
    return Plan(pol, system, tuple(loads), replicas, warm_blocks, measure_blocks, int(seed),
                start, on_overflow, devs, streams, min(batches, measure_blocks), interval,
                auto_warmup, extensions, used, note, windows,
                None if sizes is None else tuple(sizes))  # fmt: skip


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
    if not auto or devices[0].platform != "gpu" or stepped >= HOST_AUTO_STEPS \
            or jax.process_count() > 1:  # fmt: skip
        return devices, None
    return (host_device(),), (
        f"backend='auto' runs on the host's CPU: {stepped:.3g} replica-steps are fewer than "
        f"{HOST_AUTO_STEPS:.0e}, below which compiling the GPU kernel takes longer than the "
        "CPU's stepping; pass devices=jax.devices() (or backend='pallas') for the GPU")


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
            return "xla", (f"backend='auto' runs 'xla': the kernel's step would carry {values} "
                           f"values a replica (more than {AUTO_MAX_VALUES}, past which it spills "
                           "registers and runs slower than the engine); fewer levels or "
                           "iqueue_levels bring it back, backend='pallas' forces it")  # fmt: skip
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


def _levels(pol, n, m, buffer, levels, lmax, law=None, pools=None, source=None,
            mean_load=None) -> int:  # fmt: skip
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


@functools.lru_cache(maxsize=8)
def placement(p: Plan):
    """The mesh, and the sharded replica keys and loads of a plan.

    With several processes, ``devices`` are global and the keys and loads
    global arrays (see :func:`_put`).
    """
    mesh = jax.sharding.Mesh(np.asarray(p.devices), ("replica",))
    if len(p.devices) > 1:
        sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("replica"))
    else:  # what a one-device program returns: inputs and outputs alike, one compile
        sharded = jax.sharding.SingleDeviceSharding(p.devices[0])
    index = np.arange(p.padded)
    if p.streams is None:
        keys = replica_keys(p.seed, index)
    else:
        group = np.minimum(index // p.replicas, len(p.loads) - 1)
        keys = replica_keys(p.seed, index - group * p.replicas, np.asarray(p.streams)[group])
    if jax.process_count() > 1:
        return mesh, sharded, _put(np.asarray(keys), sharded), _put(p.load_vector(), sharded)
    loads = jax.device_put(jnp.asarray(p.load_vector()), sharded)
    return mesh, sharded, jax.device_put(keys, sharded), loads


def _put(tree, sharding):
    """A pytree of host arrays as global arrays of ``sharding`` (several processes).

    Every process holds the same full host values and builds the shards of
    its own devices from them (``jax.make_array_from_callback``): no
    communication, unlike ``jax.device_put``, which checks across processes
    that the values are equal.
    """
    def one(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(one, tree)


def _agree(*values: int) -> tuple:
    """Process 0's integers in every process (several processes; a collective).

    The values must be int32: without ``jax_enable_x64`` an int64 array would
    travel as int32 and larger values wrap.
    """
    out = multihost_utils.broadcast_one_to_all(np.asarray(values, np.int32))
    return tuple(int(v) for v in out)


def _stepper(p: Plan):
    """The jitted chunk function of the plan's backend (same signature as ``run_blocks``)."""
    if p.backend == "registers":
        return run_registers
    if p.backend == "pallas":
        from jaxqueue.sim.kernel import run_kernel  # imports Pallas only when asked for

        return functools.partial(run_kernel, interpret=p.devices[0].platform != "gpu")
    return run_blocks


def _initial_core(p: Plan) -> Core:
    """The batched Core of every replica (leading axis ``padded``), on the host.

    Each load's replicas start from that load's initial state.
    """
    starts = []
    for j, lam in enumerate(p.loads):
        init_arg = p.init if isinstance(p.init, str) else np.asarray(p.init)
        system = p.load_system(j)
        counts = initial_counts(init_arg, system, p.policy, lam)
        classes = initial_classes(init_arg, system, p.policy, lam, counts[0])
        starts.append(core_from_counts(*counts, system, p.policy, classes))
    group = np.minimum(np.arange(p.padded) // p.replicas, len(p.loads) - 1)
    core = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs])[group], *starts)
    if p.sizes is not None:  # each replica's N and M (read by the step as numbers)
        core = core._replace(sizes=np.asarray(p.sizes, np.int32)[group])
    if p.system.arrivals is None:
        return core
    # each load's replicas start their arrival clocks alike (padding repeats the last)
    clocks = [init_clock(p.system, np.full(p.replicas, lam, np.float64)) for lam in p.loads]
    clock = jax.tree.map(lambda *xs: np.concatenate(xs), *clocks)
    pick = np.minimum(np.arange(p.padded), p.n_replicas - 1)
    return core._replace(clock=jax.tree.map(lambda x: x[pick], clock))


class Run:
    """A run in progress: the replicas' state, the exact totals of the window, the next block.

    Create one with :meth:`start` or :meth:`resume`, advance it with
    :meth:`advance` (saving it with :meth:`save`), read it with :meth:`results`.
    Each load follows its own timeline (:class:`~jaxqueue.sim.windows.Window`):
    its warm-up, its measured window and its batches, which may differ in
    length from the other loads' (:attr:`Plan.windows`); the run ends when
    every load's window has.
    """

    def __init__(self, p: Plan, core: Core):
        self.plan = p
        sharded = placement(p)[1]
        put = _put if jax.process_count() > 1 else jax.device_put
        self.core = put(core, sharded)
        self.block = 0  # the next block to run
        self.overflow = np.zeros((p.n_replicas, 2), np.int64)  # each replica's, its windows
        self.windows = [
            Window(warm, measure, n_batches, slice(j * p.replicas, (j + 1) * p.replicas),
                   p.warmup_auto, p.max_extensions)
            for j, (warm, measure, n_batches) in enumerate(p.load_windows())
        ]  # fmt: skip
        width = iq_width(p.system, p.policy)
        n_classes = class_table(p.system).n_classes if p.system.classes else 0
        n, m = np.repeat(np.asarray(p.load_sizes(), np.int64), p.replicas, axis=0).T
        self.totals = Totals.zeros(p.n_replicas, p.system.levels, width, n, m,
                                   time_sum_scale(p.system), n_classes)  # fmt: skip
        self.mark = self.totals.copy()  # the totals at each load's last batch boundary

    @classmethod
    def start(cls, p: Plan) -> "Run":
        """A run at its first block, every replica at its initial state."""
        return cls(p, _initial_core(p))

    # -- the timeline --------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether every load's window has ended."""
        return all(w.done for w in self.windows)

    @property
    def end(self) -> int:
        """The block where the last current window ends."""
        return max(w.end for w in self.windows)

    @property
    def diagnostics(self) -> list:
        """Each load's warm-up diagnostic (None until its window has ended)."""
        return [w.diagnostic for w in self.windows]

    def _restart(self, w: Window) -> None:
        """A new window of load ``w`` starts at this block: its sums from zero."""
        self.totals.reset(w.rows)
        self.mark.reset(w.rows)
        w.restart()

    def _next_stop(self) -> int:
        return min(stop for w in self.windows if (stop := w.next_stop(self.block)) is not None)

    # -- advancing -----------------------------------------------------------

    def advance(self, n_blocks: int | None = None, *, progress: bool = False,
                checkpoint: str | None = None, checkpoint_every: float = 300.0) -> "Run":  # fmt: skip
        """Run ``n_blocks`` more blocks (default: to the end), in chunks.

        Raises :class:`LevelOverflowError` at the first chunk that overflowed
        when the plan says ``on_overflow="raise"``. With ``checkpoint``, the
        run is saved there every ``checkpoint_every`` seconds of running (0:
        at every chunk) and when it ends.

        With several processes every process must call this with the same
        arguments (the chunks are collective); only process 0 prints progress
        and writes the checkpoint.
        """
        p = self.plan
        multi = jax.process_count() > 1
        progress = progress and jax.process_index() == 0
        limit = math.inf if n_blocks is None else self.block + n_blocks
        if n_blocks is not None:
            check_int("n_blocks", n_blocks, 0, 2**62)
        mesh, _, keys, loads = placement(p)
        cap = max_chunk_blocks(p.system, p.policy)
        chunk, saved = 1, time.perf_counter()
        while not self.done and self.block < limit:
            boundary = self._next_stop()
            stop = min(boundary, limit)
            n = int(min(chunk, stop - self.block, cap))
            t0 = time.perf_counter()
            self.core, stats = _stepper(p)(
                self.core, keys, jnp.asarray(block_words(self.block)), jnp.int32(n), loads,
                system=p.system, policy=p.policy, mesh=mesh,
            )  # fmt: skip
            fields = {k: v for k, v in stats._asdict().items() if v is not None}
            if multi:  # global arrays: every process gets all replicas' stats
                fields = multihost_utils.process_allgather(fields, tiled=True)
            host = {k: np.asarray(v)[: p.n_replicas] for k, v in fields.items()}
            dt = time.perf_counter() - t0
            phase = "measure" if any(w.measuring(self.block) for w in self.windows) else "warm-up"
            self._add(host)
            self.block += n
            if self.overflow.any() and p.on_overflow == "raise":
                raise LevelOverflowError(_overflow_advice(self.overflow.sum(axis=0), p))
            for w in self.windows:
                if not w.done and self.block == w.next_stop(self.block - n):
                    self._boundary(w)
            if progress:
                rate = n * BLOCK * p.padded / max(dt, 1e-9)
                print(f"[jaxqueue] {p.policy.label()} {phase}: block {self.block}/{self.end} "
                      f"({rate:.3g} replica-steps/s)", file=sys.stderr, flush=True)  # fmt: skip
            now = time.perf_counter()
            due = checkpoint is not None and (self.done or now - saved >= checkpoint_every)
            if dt > 0:  # aim for chunks of about half a second
                chunk = max(1, min(4 * chunk, int(chunk * 0.5 / dt) or 1))
            if multi:  # the same chunks and saves in every process: process 0's clock
                chunk, due = _agree(min(chunk, cap), due)  # (chunk grows without bound)
            if due:
                self.save(checkpoint)
                saved = now
                if progress:
                    print(f"[jaxqueue] checkpoint: block {self.block} saved to {checkpoint}",
                          file=sys.stderr, flush=True)  # fmt: skip
        return self

    def _add(self, host: dict) -> None:
        """Add a chunk's sums (from ``self.block`` on) to the loads it measured,
        and its overflow counts to the loads not yet done (a chunk never
        crosses a load's boundary: every boundary is a stop)."""
        live = [w for w in self.windows if not w.done]
        over = np.stack([host["overflow"], host["iq_overflow"]], axis=1)
        if len(live) == len(self.windows):
            self.overflow += over
        else:
            for w in live:
                self.overflow[w.rows] += over[w.rows]
        measuring = [w for w in self.windows if w.measuring(self.block)]
        if len(measuring) == len(self.windows):
            self.totals.add(host)
            return
        for w in measuring:
            self.totals.add({k: v[w.rows] for k, v in host.items()}, rows=w.rows)

    def _boundary(self, w: Window) -> None:
        """Bookkeeping of load ``w`` at its warm-up end or a batch boundary
        (``self.block`` is on it)."""
        if self.block == w.warmup_end:
            self._restart(w)
            return
        w.finish_batch(self.totals.sums(since=self.mark, rows=w.rows),
                       keep_sums=self.plan.interval == "batch-means")  # fmt: skip
        self.mark.assign(self.totals, w.rows)
        if self.block < w.end:
            return
        if w.finish_window():  # the window becomes warm-up; a new one starts here
            self._restart(w)

    # -- checkpoints ----------------------------------------------------------

    def save(self, path: str) -> None:
        """Write the run to ``path`` (an npz file, replaced atomically).

        With several processes every process must call this (the state is
        gathered from all of them); process 0 writes the file, and every
        process returns once it is written.
        """
        fields = _core_fields(self.core)
        if jax.process_count() > 1:
            fields = multihost_utils.process_allgather(fields, tiled=True)
            if jax.process_index() == 0:
                self._write(path, fields)
            multihost_utils.sync_global_devices("jaxqueue checkpoint written")
            return
        self._write(path, fields)

    def _write(self, path: str, fields: dict) -> None:
        p = self.plan
        arrays = {f"core/{k}": np.asarray(v)[: p.n_replicas]
                  for k, v in fields.items()}  # fmt: skip
        for name, totals in (("totals", self.totals), ("mark", self.mark)):
            arrays.update({f"{name}/{k}": v for k, v in totals.arrays.items()})
        arrays["overflow"] = self.overflow
        for j, w in enumerate(self.windows):
            if w.queue:
                arrays[f"queue/{j}"] = np.stack(w.queue, axis=1)
            for i, window in enumerate(w.sums):
                arrays.update({f"batch/{j}/{i}/{k}": v for k, v in window.items()})
        meta = {"fingerprint": p.fingerprint(), "block": self.block,
                "windows": [w.meta() for w in self.windows]}  # fmt: skip
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)

    @classmethod
    def resume(cls, p: Plan, path: str) -> "Run":
        """The run saved at ``path``, which must have been written under the same plan.

        With several processes every process reads the file (it must be on a
        file system they all see).

        Raises:
            CheckpointMismatch: the file was written by a run with other
                settings, or by another version of jaxqueue.
        """
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
        theirs, ours = meta["fingerprint"], json.loads(json.dumps(p.fingerprint()))
        if theirs != ours:
            keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            detail = ", ".join(f"{k}: {_shown(theirs.get(k))!r} there, {_shown(ours.get(k))!r} here"
                               for k in keys)  # fmt: skip
            raise CheckpointMismatch(
                f"checkpoint {path} was written by another run ({detail}); delete it or "
                "give another path"
            )
        if p.system.classes and "totals/sampled_class" not in arrays:
            raise CheckpointMismatch(
                f"checkpoint {path} was written by an earlier jaxqueue that did not count where "
                "arrivals found their servers and what service candidates drew (the "
                "response-time quantiles and the pools' metrics with phase-type service or "
                "pools need them); delete it and run again, or give another path"
            )
        core = _core_from_fields(
            {k[5:]: v for k, v in arrays.items() if k.startswith("core/")}, p
        )
        run = cls(p, core)
        run.block = meta["block"]
        run.overflow = arrays["overflow"]
        for name in ("totals", "mark"):
            getattr(run, name).arrays = {k[len(name) + 1 :]: v for k, v in arrays.items()
                                         if k.startswith(name + "/")}  # fmt: skip
        for j, (w, saved) in enumerate(zip(run.windows, meta["windows"])):
            w.extensions, w.done, w.diagnostic = saved["extensions"], saved["done"], saved["diagnostic"]
            if saved["batches_done"]:
                w.queue = list(arrays[f"queue/{j}"].T)
            if p.interval == "batch-means":
                w.sums = [{k.split("/", 3)[3]: v for k, v in arrays.items()
                           if k.startswith(f"batch/{j}/{i}/")}
                          for i in range(saved["batches_done"])]  # fmt: skip
        return run

    # -- results ---------------------------------------------------------------

    def results(self, wall_seconds: float | None = None) -> list[SimulationResult]:
        """One :class:`~jaxqueue.results.simulation.SimulationResult` per load."""
        p = self.plan
        if not self.done:
            raise RuntimeError(f"the run is at block {self.block} of {self.end}: not finished")
        sums = self.totals.sums()
        sums["overflow"], sums["iq_overflow"] = self.overflow[:, 0], self.overflow[:, 1]
        load_vec = p.load_vector()
        system, pol = p.system, p.policy
        recorded = versions()
        laws = fractions = None
        if system.classes:  # each pool's law at its speed and first class
            table = class_table(system)
            laws = tuple(zip(pool_laws(table.pools), table.base))
        if system.pools is not None:  # each pool's share of the servers
            fractions = tuple(q.count / system.n_servers for q in system.pools)
        results = []
        for j, (lam, w, (n, m)) in enumerate(zip(p.loads, self.windows, p.load_sizes())):
            sl = w.rows
            per_time = n * system.step_rate(lam)
            warm = w.warmup_end
            settings = {
                "policy": pol.name,
                "policy_label": pol.label(),
                "options": pol.options(),
                "n_servers": n,
                "n_dispatchers": m,
                "ratio": n / m,
                "load": lam,
                "buffer": system.buffer,
                "levels": system.levels,
                "iqueue_levels": system.iqueue_levels,
                "service": "exp" if system.service is None else system.service.to_dict(),
                "pools": None if system.pools is None else [
                    {"servers": q.count, "speed": q.speed,
                     "service": None if q.law is None else q.law.to_dict()} for q in system.pools],
                "arrivals": None if system.arrivals is None else system.arrivals.to_dict(),
                "replicas": p.replicas,
                "steps": w.measure_blocks * BLOCK,
                "warmup": warm * BLOCK,
                "time_measured": w.measure_blocks * BLOCK / per_time,
                "time_warmup": warm * BLOCK / per_time,
                "seed": p.seed,
                "init": p.init if isinstance(p.init, str) else "array",
                "interval": p.interval,
                "batches": w.batches,
                "devices": len(p.devices),
                "platform": p.devices[0].platform,
                "backend": p.backend,
                "backend_note": p.backend_note,
                "wall_seconds": wall_seconds,
                "versions": dict(recorded),
            }
            part = {k: v[sl] for k, v in sums.items()}
            single = system.n_dispatchers == 1 and not pol.per_server
            bpart = None
            if p.interval == "batch-means":
                bpart = {k: np.stack([b[k] for b in w.sums], axis=1) for k in w.sums[0]}
            results.append(from_stats(part, load_vec[sl].astype(np.float64), pol, single,
                                      settings, batches=bpart,
                                      rate=system.service_rate if system.classes else None,
                                      step_rate=_sample_rate(system, lam), laws=laws,
                                      fractions=fractions,
                                      diagnostics={"warmup_diagnostic": w.diagnostic}))  # fmt: skip
        return results


def _sample_rate(system: System, load: float) -> float:
    """The rate per server of the steps a run counts in ``steps``: all of them,
    or a trace's service candidates (:func:`jaxqueue.sim.blocks.time_sum_scale`)."""
    return system.service_rate if isinstance(system.arrivals, Trace) else system.step_rate(load)


def _core_fields(core: Core) -> dict:
    out = {"tail": core.tail, "iq_tail": core.iq_tail, "iq_listed": core.iq_listed}
    if core.lists is not None:
        out.update({f"lists.{k}": v for k, v in core.lists._asdict().items()})
    if core.classes is not None:
        out["classes"] = core.classes
    if core.clock is not None:
        out.update({f"clock.{k}": v for k, v in core.clock._asdict().items()})
    return out


def _core_from_fields(fields: dict, p: Plan) -> Core:
    group = np.minimum(np.arange(p.padded), p.n_replicas - 1)  # padding repeats the last replica
    pad = {k: np.asarray(v)[group] for k, v in fields.items()}
    lists = None
    if "lists.q" in pad:
        lists = Lists(*(pad[f"lists.{k}"] for k in Lists._fields))
    clock = None
    if "clock.seg" in pad:
        clock = Clock(*(pad[f"clock.{k}"] for k in Clock._fields))
    sizes = None
    if p.sizes is not None:  # not saved: the plan's (the fingerprint holds them)
        sizes = np.asarray(p.sizes, np.int32)[np.minimum(group // p.replicas, len(p.loads) - 1)]
    return Core(pad["tail"], pad["iq_tail"], pad["iq_listed"], lists, pad.get("classes"), clock,
                sizes)  # fmt: skip


def _shown(value):
    """A fingerprint entry as printed: the exact hex floats (loads, an init
    occupancy) as decimals (``repr``, which round-trips); the comparison stays
    on the hex strings."""
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        try:
            return [float.fromhex(v) for v in value]
        except ValueError:
            return value
    return value


def _overflow_advice(overflow, p: Plan) -> str:
    over, iq_over = int(overflow[0]), int(overflow[1])
    system, parts = p.system, []
    if over:
        parts.append(
            f"{over} arrivals found a queue at the level bound levels={system.levels} "
            f"under {p.policy.label()}; rerun with a larger levels= (e.g. "
            f"{min(2 * system.levels, 10**6)})"
        )
    if iq_over:  # an I-queue lists at most N servers: iqueue_levels <= n_servers
        more = min(2 * system.iqueue_levels, system.n_servers)
        parts.append(
            f"{iq_over} idle servers found their I-queue at iqueue_levels={system.iqueue_levels}; "
            f"rerun with a larger iqueue_levels= (e.g. {more}, at most n_servers="
            f"{system.n_servers})"
        )
    return "; ".join(parts) + " (or pass on_overflow='report' to keep the counts in the result)"


def run(p: Plan, *, progress: bool = False, checkpoint: str | None = None,
        checkpoint_every: float = 300.0) -> list[SimulationResult]:  # fmt: skip
    """Run a plan from its initial state (or its checkpoint) to the end; one result per load.

    With ``checkpoint``: a file there is resumed when it matches the plan (a
    finished one returns its results at once) and refused with
    :class:`CheckpointMismatch` when not; the run is saved there every
    ``checkpoint_every`` seconds and when it ends.

    With several processes (``jax.distributed``) every process calls this
    with the same plan and gets the same results; a checkpoint must be on a
    file system every process sees.
    """
    t0 = time.perf_counter()
    exists = checkpoint is not None and os.path.exists(checkpoint)
    if checkpoint is not None and jax.process_count() > 1:
        seen = multihost_utils.process_allgather(np.asarray(exists, np.int32))
        if seen.min() != seen.max():
            raise RuntimeError(
                f"checkpoint {checkpoint} exists in processes {np.flatnonzero(seen).tolist()} "
                "only: with several processes it must be on a file system they all see"
            )
    if exists:
        r = Run.resume(p, checkpoint)
    else:
        r = Run.start(p)
    r.advance(progress=progress, checkpoint=checkpoint, checkpoint_every=checkpoint_every)
    return r.results(wall_seconds=time.perf_counter() - t0)
