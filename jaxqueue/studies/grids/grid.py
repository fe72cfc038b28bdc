"""Grid experiments: run a spec's points in batches that share a compiled shape, into a
store (:func:`run_grid`), or say what would run (:func:`plan_grid`).

A point's result does not depend on the other points of its batch or on the order of
the grid; how batches form, resume and are written: docs/sweeps.md (Batches, The store).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxqueue.core.config import Bounds
from jaxqueue.core.progress import PointProgress, tqdm_bar
from jaxqueue.core.service import realized_pools
from jaxqueue.core.versions import versions
from jaxqueue.policies.registry import make
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.sim.source import check_source
from jaxqueue.studies.grids.batching import (
    CPU_MERGE_RATIO,
    batches,
    device_batches,
    group_bounds,
    plan_group,
    run_length,
    run_lengths,
    shape_groups,
    warn_overruns,
    window_overruns,
)
from jaxqueue.studies.grids.crn_rows import PairedRows, check_processes, sensitivity_rows
from jaxqueue.studies.grids.grid_theory import (
    refined_values,
    store_rows,
    theory_value,
    theory_values,
    warmup_passed,
)
from jaxqueue.studies.grids.spec import GridSpec
from jaxqueue.studies.grids.store import Store, StoreMismatchError, writer_lock

__all__ = [
    "run_grid",
    "plan_grid",
    "shape_groups",
    "window_overruns",
    "DEFAULT_BATCH_POINTS",
    "warmup_warning",
    "CPU_MERGE_RATIO",
]

#: Points per batch (the replicas of this many points step together).
DEFAULT_BATCH_POINTS = 32

# the names these steps had when they were defined here, still importable from here
_warn_overruns, _batches, _length = warn_overruns, batches, run_length
_bounds, _theory, _theory_value = group_bounds, theory_values, theory_value


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
        buffer, points, batches, replica_steps, gpu_seconds, cpu_seconds;
        ``store_error`` (None, or why a run into ``store_path`` would be refused);
        ``window_overruns``, the points whose whole blocks run more than
        10% past the spec's ``time`` (:func:`window_overruns`); and
        ``gpu_seconds``, an estimate of the time on one H200 (per group too;
        :func:`gpu_seconds`), batched as on a GPU; ``cpu_seconds``, one on 2 CPU
        cores (:func:`cpu_seconds`); ``warnings``: lines about a grid past
        :data:`LARGE_POINTS` points, :data:`LARGE_REPLICA_STEPS` replica-steps or a
        day on 2 CPU cores.
    """
    if batch_points < 1:
        raise ValueError(f"batch_points={batch_points} is out of range: need >= 1")
    done, store_error = _stored(spec, store_path)
    groups, n_done = [], 0
    for points in shape_groups(spec).values():
        group, stored = plan_group(spec, points, batch_points, done, devices)
        groups.append(group)
        n_done += stored
    total_steps = sum(g["replica_steps"] for g in groups)
    gpu_total = sum(g["gpu_seconds"] for g in groups)
    cpu_total = sum(g["cpu_seconds"] for g in groups)
    return {
        "spec": spec.name,
        "points": len(spec.points),
        "done": n_done,
        "shapes": len(groups),
        "batches": sum(g["batches"] for g in groups),
        "replica_steps": total_steps,
        "groups": groups,
        "store_error": store_error,
        "window_overruns": len(window_overruns(spec)),
        "gpu_seconds": gpu_total,
        "cpu_seconds": cpu_total,
        "warnings": _plan_warnings(spec, total_steps, gpu_total, cpu_total),
    }


def _stored(spec: GridSpec, store_path) -> tuple[set, str | None]:
    """The ids a store of this spec holds, and why a run into it would be refused (or None)."""
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
    return done, store_error


def _plan_warnings(spec: GridSpec, total_steps, gpu_total: float, cpu_total: float) -> list[str]:
    """Lines about a grid past :data:`LARGE_POINTS` points or :data:`LARGE_REPLICA_STEPS`."""
    warnings_ = []
    if len(spec.points) > LARGE_POINTS:
        warnings_.append(
            f"{len(spec.points)} points (more than {LARGE_POINTS}): check the "
            "spec's axes; each point is a batch member and a set of store rows"
        )
    if cpu_total > 86_400 or total_steps > LARGE_REPLICA_STEPS:
        warnings_.append(
            f"{total_steps:.3g} replica-steps: about {cpu_total / 3600:.3g} hours on 2 CPU "
            f"cores and {gpu_total / 3600:.3g} on one H200 by the estimate"
        )
    return warnings_


def run_grid(
    spec: GridSpec,
    store_path,
    *,
    batch_points: int = DEFAULT_BATCH_POINTS,
    progress: bool = False,
    devices=None,
    log=sys.stderr,
    accept_code_change: bool = False,
) -> int:
    """Run every point of ``spec`` not yet in the store at ``store_path``; returns points run.

    Args:
        spec: a validated :class:`~jaxqueue.studies.grids.spec.GridSpec`.
        store_path: the SQLite file (created, or resumed if it holds this spec).
        batch_points: points per batch; a shape group with fewer points uses
            its size, and the last batch of a group is padded to the same
            size (padding replicas are run and dropped), so one group compiles once.
        progress: report progress on the ``jaxqueue`` logger (INFO,
            :mod:`jaxqueue.core.progress`): points done, replica-steps per
            second and time left, a line per batch (the batch that compiles a
            shape left out of the rate); a bar on a terminal with the
            ``progress`` extra (tqdm).
        devices: devices to spread replicas over (default: all; with
            ``jax.distributed``, every device of every process).
        log: where the warning about points whose warm-up diagnostic failed
            goes (stderr by default; never stdout).
        accept_code_change: resume a store written by other versions of the
            code (:class:`~jaxqueue.studies.grids.store.Store`; recorded in the store).

    One sweep writes a store at a time: a second one into the same store
    stops before anything runs with :class:`~jaxqueue.studies.grids.store.StoreBusyError`
    (:func:`~jaxqueue.studies.grids.store.writer_lock`).

    With several processes (``jax.distributed``) every process calls this
    with the same spec and store path: each batch's replicas are spread over
    every device of every process, the first process alone opens, reads and
    writes the store (the others learn from it what is done), and the
    batch's checkpoint must be on a file system every process sees. Every
    process returns the same count.
    """
    if batch_points < 1:
        raise ValueError(f"batch_points={batch_points} is out of range: need >= 1")
    lead = jax.process_index() == 0  # with jax.distributed: the process that owns the store
    # JAX's devices: a sweep compiles a program once for many batches, so a small
    # batch does not go to the host's CPU as a small run of its own would
    devices = tuple(devices) if devices is not None else tuple(jax.devices())
    groups = shape_groups(spec)
    _check_groups(groups, spec.run.init)  # before anything runs
    check_processes(spec)
    rounded = {(p.servers, p.pools) for p in spec.points if p.pools is not None}
    for n, pools in sorted(rounded):  # fractions that are not whole servers: said once each
        realized_pools(pools, n, stacklevel=2)
    warn_overruns(spec)
    ids = {p: p.point_id() for p in spec.points}  # a hash each: computed once
    with contextlib.ExitStack() as stack:
        store, writer = (
            _open_store(stack, spec, store_path, accept_code_change) if lead else (None, None)
        )
        done = _done(spec, ids, store)
        finished = sum(ids[p] in done for p in spec.points)
        ran = 0
        batch_index = store.next_batch() if lead else 0
        schedule = _schedule(spec, groups, batch_points, lambda p: ids[p] not in done, devices)
        left = sum(
            _batch_steps(spec, b, size, ln) for _, size, chosen, ln in schedule for b in chosen
        )
        report = _progress(spec, finished, left) if progress and lead else None
        pending, cache, failed = None, {}, []
        paired = PairedRows(spec, ids, done) if lead else None
        for points, size, chosen, lengths in schedule:
            bounds = _bounds(spec, points)  # over the whole group: shapes, starts fixed
            if report is not None and chosen:
                report.compiling(_shape_words(points, chosen, size))
            for k, batch in enumerate(chosen):
                t_batch = time.perf_counter()
                plan = _batch_plan(spec, batch, size, bounds, devices)
                results, kept = _run_batch(plan, f"{store_path}.running.npz", spec.run.paired)
                results = results[: len(batch)]
                wall = time.perf_counter() - t_batch
                ran += len(batch)
                if not lead:  # the other processes step their replicas; the first writes
                    continue
                # JAX runs on this thread only: theory and rows here, SQLite on the writer.
                rows, committed = _batch_rows(spec, batch, results, ids, wall, cache)
                rows += sensitivity_rows(spec, batch, ids, devices, cache)
                rows += paired.rows(batch, results, kept, rows)
                failed += [p for p, r in zip(batch, results) if warmup_passed(r) == 0]
                if pending is not None:
                    pending.result()  # the previous batch is committed (or its error raised)
                pending = writer.submit(store.commit_batch, batch_index, committed, rows)
                batch_index += 1
                if report is not None:
                    steps = _batch_steps(spec, batch, size, lengths)
                    report.update(len(batch), steps, wall, compiled=k == 0)
        if pending is not None:
            pending.result()
        if report is not None:
            report.close()
    if failed:
        _warn_warmup(spec, failed, ran, log)
    if lead and paired.missed:
        print(paired.warning(), file=log, flush=True)
    return ran


def _schedule(spec: GridSpec, groups, batch_points: int, todo, devices) -> list:
    """Per shape group, ``(points, size, batches, run lengths)``: the batches to run."""
    out = []
    for points in groups.values():
        lengths = run_lengths(points, spec)
        size, chosen = device_batches(points, spec, batch_points, todo, devices, lengths)
        out.append((points, size, chosen, lengths))
    return out


def _batch_steps(spec: GridSpec, batch: list, size: int, lengths: dict) -> int:
    """The replica-steps a batch takes: its padded width times its longest point's."""
    return size * spec.run.replicas * max(lengths[p] for p in batch)


def _progress(spec: GridSpec, finished: int, steps_left: float) -> PointProgress:
    """The sweep's progress on the ``jaxqueue`` logger: points done of the spec's, and
    the time left from the ``steps_left`` replica-steps still to run."""
    total = len(spec.points)
    form = "{l_bar}{bar}| {n_fmt}/{total_fmt} points [{elapsed}{postfix}]"
    bar = tqdm_bar(total, finished, spec.name, "pt", bar_format=form)
    return PointProgress(spec.name, total, finished, steps_left=steps_left, bar=bar)


def _shape_words(points: list, chosen: list, size: int) -> str:
    """A shape group's compile, in words: its policy, the points to run and the batches."""
    label = make(points[0].policy, **dict(points[0].options)).label()
    todo = sum(len(batch) for batch in chosen)
    return f"{label} for {todo} points in {len(chosen)} batches of {size}"


def _warn_warmup(spec: GridSpec, failed: list, ran: int, log) -> None:
    """Say on ``log`` which points' warm-up diagnostic failed: their rows may be biased."""
    print(warmup_warning(spec, failed, ran), file=log, flush=True)


def warmup_warning(spec: GridSpec, failed: list, ran: int) -> str:
    """The sweep's warning for the points ``failed`` (of ``ran``) whose warm-up diagnostic
    failed, naming the first three and the ``[run]`` keys that would change the verdict:
    a longer warm-up or window, and a mean-field start only where a failed point started
    empty and its policy has a mean field."""

    def words(p) -> str:
        extra = "".join(
            f" {k}={v:g}" for k, v in (("alpha", p.alpha), ("beta", p.beta)) if v is not None
        )
        return f"policy={p.policy} n_servers={p.servers} load={p.load:.6g}{extra}"

    run = spec.run
    shown = ", ".join(words(p) for p in failed[:3])
    more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
    warm = "warmup" if run.warmup is not None else "warmup_time"
    window = "steps" if run.steps is not None else "time"
    advice = f"lengthen the warm-up ({warm} in [run]) or the measured window ({window} in [run])"
    if any(_started_empty(run.init, p) for p in failed):
        advice += ', or start from the mean field (init = "mean-field" in [run])'
    return (
        f"[jaxqueue] {spec.name}: warning: the warm-up diagnostic failed at {len(failed)} of "
        f"the {ran} points run ({shown}{more}; warmup_passed = 0 in the store): their "
        f"estimates may carry the start's bias; {advice}"
    )


def _started_empty(init: str, point) -> bool:
    """Whether ``point`` started empty under the spec's ``init`` though its policy has a
    mean field to start from (``"auto"`` starts small systems empty)."""
    if init == "mean-field" or (
        init == "auto" and point.servers >= planner.AUTO_MEAN_FIELD_SERVERS
    ):
        return False
    return make(point.policy, **dict(point.options)).mean_field_kind() != "none"


def _bounds(spec: GridSpec, points: list) -> Bounds:
    """The level bounds of a shape group: the spec's ``levels`` where its buffers are
    infinite, else those sized from the mean field (:func:`group_bounds`)."""
    levels, iqueue_levels = group_bounds(points)
    if spec.run.levels is not None and levels is not None:
        levels = spec.run.levels
    return Bounds(levels, iqueue_levels)


def _check_groups(groups, init: str) -> None:
    """Refuse a mean-field start without a mean field, and a profile's segments that
    the step rate cannot follow, before anything runs."""
    for points in groups.values():
        pol = make(points[0].policy, **dict(points[0].options))
        if init == "mean-field" and pol.mean_field_kind() == "none":
            raise ValueError(
                f"init='mean-field' needs a mean field, and {pol.name!r} has none "
                f'({pol.no_mean_field}); use init = "empty" for this spec'
            )
        if points[0].source is not None:  # a profile's segments against the step rate
            check_source(points[0].system(), [p.load for p in points])


def _open_store(stack: contextlib.ExitStack, spec: GridSpec, store_path, accept: bool):
    """``(store, writer)``: the store, held by this sweep alone (a second sweep into it
    stops here), and the one thread that writes it."""
    stack.enter_context(writer_lock(store_path))
    store = stack.enter_context(
        Store(
            store_path,
            spec.spec_hash(),
            spec.name,
            versions(),
            spec.source_text,
            accept_code_change=accept,
        )
    )
    writer = stack.enter_context(
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxqueue-store")
    )
    return store, writer


def _batch_plan(spec: GridSpec, batch: list, size: int, bounds: Bounds, devices):
    """The runner's plan of one batch, padded to ``size`` points with its last one
    (padding replicas run on stream 0 and are dropped)."""
    run = spec.run
    pad = [batch[-1]] * (size - len(batch))
    first = batch[0]
    everyone = batch + pad
    model = spec.model(first).replace(
        n_servers=[p.servers for p in everyone],
        n_dispatchers=[p.dispatchers for p in everyone],
        buffer=None if first.buffer is None else [p.buffer for p in everyone],
    )
    options = run.options_for(everyone, devices, spec.point_metrics(first) or None)
    return planner.plan_model(
        model,
        [p.load for p in everyone],
        options,
        bounds,
        streams=[run.stream_for(p) for p in batch] + [0] * len(pad),
    )


def _batch_rows(spec: GridSpec, batch: list, results: list, ids: dict, wall: float, cache):
    """``(rows, committed)`` of a batch's results: its store rows with theory beside
    them, and ``(id, params, wall seconds)`` per point."""
    run = spec.run
    rows, committed = [], []
    kind = "mean-field" if run.theory == "refined" else run.theory
    refined = refined_values(batch, cache) if run.theory == "refined" else [None] * len(batch)
    theories = theory_values(
        batch, kind, cache, results, lambda text: spec.arrivals_file(text).source
    )
    for p, res, th, rf in zip(batch, results, theories, refined):
        rows += store_rows(p, ids[p], spec, res, th, rf)
        committed.append((ids[p], {**p.params(), "stream": run.stream_for(p)}, wall / len(batch)))
    return rows, committed


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


def _run_batch(plan, checkpoint: str, keep: bool = False):
    """Run one batch, saved to ``checkpoint`` every few minutes: a sweep stopped in a
    long batch resumes inside it. A checkpoint of another batch is replaced.
    ``(results, run)``: with ``keep`` (one process) the finished run, whose
    per-replica values a paired spec's differences take; else None."""
    try:
        out = _finish(plan, checkpoint, keep)
    except runner.CheckpointMismatch:
        _remove(checkpoint)
        out = _finish(plan, checkpoint, keep)
    _remove(checkpoint)
    return out


def _finish(plan, checkpoint: str, keep: bool):
    """``(results, run or None)`` of a batch run to its end from its checkpoint, if any."""
    if not keep:
        return runner.run(plan, checkpoint=checkpoint, checkpoint_every=CHECKPOINT_EVERY), None
    if os.path.exists(checkpoint):
        r = runner.Run.resume(plan, checkpoint)
    else:
        r = runner.Run.start(plan)
    r.advance(checkpoint=checkpoint, checkpoint_every=CHECKPOINT_EVERY)
    return r.results(), r


def _remove(checkpoint: str) -> None:
    """Remove a batch's checkpoint (the first process; the others wait for it,
    so that none sees it at the next batch's start)."""
    _sync("jaxqueue sweep: before the checkpoint is removed")
    if jax.process_index() == 0:
        os.remove(checkpoint)
    _sync("jaxqueue sweep: checkpoint removed")
