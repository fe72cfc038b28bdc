"""The simulation runner: run a :class:`Plan` in chunks, checkpoint it, collect its results.

A :class:`Run` holds the replicas' state on the devices, the exact host totals
of each load's measured window and the next block; keys by position and exact
integer sums make a run cut into any chunks, resumed from a checkpoint
(:mod:`jaxqueue.sim.checkpoints`) or spread over any devices or processes give
the same result, bit for bit (docs/simulation.md, "The structure of a run").
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from jaxqueue.core.progress import Progress, log, tqdm_bar
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.system import System, check_int
from jaxqueue.core.user_metrics import metric_settings
from jaxqueue.core.versions import __version__, source_digest
from jaxqueue.policies.base import Policy
from jaxqueue.results.simulation import SimulationResult
from jaxqueue.sim.blocks import block_words, max_chunk_blocks, run_blocks, time_sum_scale
from jaxqueue.sim.checkpoints import (
    CHECKPOINT_FORMAT,
    CheckpointMismatch,
    check_writable,
    core_fields,
    core_from_fields,
    read_checkpoint,
    restore,
    write_checkpoint,
)
from jaxqueue.sim.classes import class_table
from jaxqueue.sim.collect import load_results
from jaxqueue.sim.kernel import run_kernel
from jaxqueue.sim.placement import placement, put_global
from jaxqueue.sim.registers import run_registers
from jaxqueue.sim.source import init_clock
from jaxqueue.sim.state import Core, core_from_counts, iq_width
from jaxqueue.sim.totals import Totals
from jaxqueue.sim.windows import Window

__all__ = [
    "Plan",
    "Run",
    "run",
    "placement",
    "LevelOverflowError",
    "CheckpointMismatch",
    "BATCHES",
    "BATCH_MEANS_REPLICAS",
    "MAX_EXTENSIONS",
    "BACKENDS",
    "CHECKPOINT_FORMAT",
]

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

#: Seconds of running before the first checkpoint, when ``checkpoint_every``
#: is longer: a failing save shows early, and a short run is kept soon.
FIRST_CHECKPOINT = 10.0


class LevelOverflowError(RuntimeError):
    """A queue or an I-queue passed its tracked bound; the run is not valid."""


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
        sizes: ``None`` (every load has the System's ``N``, ``M`` and
            buffer), or one ``(n_servers, n_dispatchers)`` per load, or one
            ``(n_servers, n_dispatchers, buffer)`` (finite buffers): the loads
            of one batch differ in size (a sweep's points of other ``N`` or
            buffer in one compiled program); the System then holds the
            largest ``N``, ``M`` and buffer and level bounds that cover every
            load, and each replica carries its own (``Core.sizes``).
        start: builds each load's initial state, ``start(init, system,
            policy, load) -> (counts, classes)``
            (:func:`jaxqueue.runs.initial.initial_state`). The layer that plans
            a run supplies it: a mean-field start needs the theory, which the
            simulator does not import. Not compared, hashed or fingerprinted
            (``init`` is).
        metrics: the user metrics (:class:`~jaxqueue.core.user_metrics.UserMetric`;
            the ``"xla"`` backend only).
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
    start: Callable | None = dataclasses.field(default=None, compare=False, repr=False)
    metrics: tuple = ()

    def load_sizes(self) -> list[tuple[int, int]]:
        """Each load's ``(n_servers, n_dispatchers)``."""
        if self.sizes is None:
            return [(self.system.n_servers, self.system.n_dispatchers)] * len(self.loads)
        return [tuple(size[:2]) for size in self.sizes]

    def load_system(self, j: int) -> System:
        """Load ``j``'s System: the plan's, at that load's ``N``, ``M`` and
        buffer (a buffer is its own level bound)."""
        if self.sizes is None:
            return self.system
        n, m, *buffer = self.sizes[j]
        system = dataclasses.replace(self.system, n_servers=n, n_dispatchers=m)
        return dataclasses.replace(system, buffer=buffer[0], levels=buffer[0]) if buffer else system

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
        for name in (
            "service",
            "pools",
            "arrivals",
        ):  # as before they existed: old checkpoints resume
            if system[name] is None:
                del system[name]
        if self.system.arrivals is not None:
            system["arrivals"] = self.system.arrivals.to_dict()
        return {
            "jaxqueue": __version__,
            "source": source_digest(),
            "format": CHECKPOINT_FORMAT,
            "block": BLOCK,
            "policy": self.policy.name,
            "options": self.policy.options(),
            "system": system,
            "loads": [float(x).hex() for x in self.loads],
            "replicas": self.replicas,
            "warmup_blocks": self.warmup_blocks,
            "measure_blocks": self.measure_blocks,
            "seed": self.seed,
            "init": self.init
            if isinstance(self.init, str)
            else [float(x).hex() for x in self.init],
            "streams": list(self.streams or []) or None,
            "batches": self.batches,
            "interval": self.interval,
            "warmup_auto": self.warmup_auto,
            "max_extensions": self.max_extensions,
            **({"windows": [list(w) for w in self.windows]} if self.windows else {}),
            **({"sizes": [list(s) for s in self.sizes]} if self.sizes else {}),
            **({"metrics": metric_settings(self.metrics)} if self.metrics else {}),
        }

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
        if p.start is None:
            raise ValueError("the plan has no start: build plans with jaxqueue.runs.planner.plan")
        counts, classes = p.start(init_arg, system, p.policy, lam)
        if system.levels < p.system.levels:  # a load's own buffer: no server past it
            counts = (np.pad(counts[0], (0, p.system.levels - system.levels)), *counts[1:])
            system = dataclasses.replace(system, buffer=p.system.buffer, levels=p.system.levels)
        starts.append(core_from_counts(*counts, system, p.policy, classes))
    group = np.minimum(np.arange(p.padded) // p.replicas, len(p.loads) - 1)
    core = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs])[group], *starts)
    if p.sizes is not None:  # each replica's N and M (and buffer), read by the step as numbers
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
        put = put_global if jax.process_count() > 1 else jax.device_put
        self.core = put(core, sharded)
        self.block = 0  # the next block to run
        self.overflow = np.zeros((p.n_replicas, 2), np.int64)  # each replica's, its windows
        self.windows = [
            Window(
                warm,
                measure,
                n_batches,
                slice(j * p.replicas, (j + 1) * p.replicas),
                p.warmup_auto,
                p.max_extensions,
            )
            for j, (warm, measure, n_batches) in enumerate(p.load_windows())
        ]
        width = iq_width(p.system, p.policy)
        n_classes = class_table(p.system).n_classes if p.system.classes else 0
        n, m = np.repeat(np.asarray(p.load_sizes(), np.int64), p.replicas, axis=0).T
        scale, n_user = time_sum_scale(p.system), len(p.metrics)
        self.totals = Totals.zeros(
            p.n_replicas, p.system.levels, width, n, m, scale, n_classes, n_user
        )
        self.mark = self.totals.copy()  # the totals at each load's last batch boundary

    @classmethod
    def start(cls, p: Plan) -> Run:
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

    def advance(
        self,
        n_blocks: int | None = None,
        *,
        progress: bool = False,
        checkpoint: str | None = None,
        checkpoint_every: float = 300.0,
    ) -> Run:
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
        chunk, saved, first = 1, time.perf_counter(), True
        report = self._progress() if progress else None
        while not self.done and self.block < limit:
            boundary = self._next_stop()
            stop = min(boundary, limit)
            n = int(min(chunk, stop - self.block, cap))
            t0 = time.perf_counter()
            self.core, stats = _stepper(p)(
                self.core,
                keys,
                jnp.asarray(block_words(self.block)),
                jnp.int32(n),
                loads,
                system=p.system,
                policy=p.policy,
                mesh=mesh,
                **({"metrics": p.metrics} if p.metrics else {}),
            )
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
            if report is not None:
                report.update(self.block, self.end, phase)
            now = time.perf_counter()
            every = min(checkpoint_every, FIRST_CHECKPOINT) if first else checkpoint_every
            due = checkpoint is not None and (self.done or now - saved >= every)
            if dt > 0:  # aim for chunks of about half a second
                chunk = max(1, min(4 * chunk, int(chunk * 0.5 / dt) or 1))
            if multi:  # the same chunks and saves in every process: process 0's clock
                chunk, due = _agree(min(chunk, cap), due)  # (chunk grows without bound)
            if due:
                self.save(checkpoint)
                saved, first = now, False
                if progress:
                    log(f"checkpoint: block {self.block} saved to {checkpoint}")
        if report is not None:
            report.close()
        return self

    def _progress(self) -> Progress:
        """The progress report of :meth:`advance`, told that the first chunk compiles."""
        name = self.plan.policy.label()
        bar = tqdm_bar(self.end, self.block, name, "block")
        report = Progress(name, BLOCK * self.plan.padded, bar=bar)
        report.start(self.block, self.end)
        return report

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
        w.finish_batch(
            self.totals.sums(since=self.mark, rows=w.rows),
            keep_sums=self.plan.interval == "batch-means",
        )
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
        fields = core_fields(self.core)
        if jax.process_count() > 1:
            fields = multihost_utils.process_allgather(fields, tiled=True)
            if jax.process_index() == 0:
                write_checkpoint(self, path, fields)
            multihost_utils.sync_global_devices("jaxqueue checkpoint written")
            return
        write_checkpoint(self, path, fields)

    @classmethod
    def resume(cls, p: Plan, path: str) -> Run:
        """The run saved at ``path``, which must have been written under the same plan.

        With several processes every process reads the file (it must be on a
        file system they all see).

        Raises:
            CheckpointMismatch: the file was written by a run with other
                settings, or by another version of jaxqueue.
        """
        arrays, meta = read_checkpoint(p, path)
        core = core_from_fields({k[5:]: v for k, v in arrays.items() if k.startswith("core/")}, p)
        run = cls(p, core)
        restore(run, arrays, meta, path)
        return run

    # -- results ---------------------------------------------------------------

    def results(self, wall_seconds: float | None = None) -> list[SimulationResult]:
        """One :class:`~jaxqueue.results.simulation.SimulationResult` per load."""
        if not self.done:
            raise RuntimeError(f"the run is at block {self.block} of {self.end}: not finished")
        return load_results(self, wall_seconds)


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


def run(
    p: Plan,
    *,
    progress: bool = False,
    checkpoint: str | None = None,
    checkpoint_every: float = 300.0,
) -> list[SimulationResult]:
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
    if (
        isinstance(checkpoint_every, bool)
        or not isinstance(checkpoint_every, (int, float))
        or not math.isfinite(checkpoint_every)
        or checkpoint_every < 0
    ):
        raise ValueError(
            f"checkpoint_every={checkpoint_every!r} is out of range: need a finite "
            "number of seconds >= 0 (0: a save after every chunk)"
        )
    exists = checkpoint is not None and os.path.exists(checkpoint)
    if checkpoint is not None and not exists and jax.process_index() == 0:
        check_writable(checkpoint)
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
