"""Checkpoints of a run: write its state, sums and timeline to an npz file, read
them back (refusing a file of another run, version or a damaged one), and
rebuild the replicas' state from it (docs/simulation.md, "Checkpoints")."""

from __future__ import annotations

import contextlib
import json
import os
import zipfile

import numpy as np

from jaxqueue.sim.per_server import Lists
from jaxqueue.sim.source import Clock
from jaxqueue.sim.state import Core

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointMismatch",
    "write_checkpoint",
    "read_checkpoint",
    "restore",
    "core_fields",
    "core_from_fields",
    "check_writable",
]

#: Version of the checkpoint file layout (2: each load's window on its own).
CHECKPOINT_FORMAT = 2


class CheckpointMismatch(ValueError):
    """A checkpoint file was written by a run with other settings or another version."""


def write_checkpoint(run, path: str, fields: dict) -> None:
    """Write ``run`` (a :class:`~jaxqueue.sim.runner.Run`) to ``path`` with its state
    ``fields`` (:func:`core_fields`, gathered): an npz file, replaced atomically."""
    p = run.plan
    arrays = {f"core/{k}": np.asarray(v)[: p.n_replicas] for k, v in fields.items()}
    for name, totals in (("totals", run.totals), ("mark", run.mark)):
        arrays.update({f"{name}/{k}": v for k, v in totals.arrays.items()})
    arrays["overflow"] = run.overflow
    for j, w in enumerate(run.windows):
        if w.queue:
            arrays[f"queue/{j}"] = np.stack(w.queue, axis=1)
        for i, window in enumerate(w.sums):
            arrays.update({f"batch/{j}/{i}/{k}": v for k, v in window.items()})
    meta = {
        "fingerprint": p.fingerprint(),
        "block": run.block,
        "windows": [w.meta() for w in run.windows],
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError as err:  # a full disk, a folder gone: the last good checkpoint stays
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise RuntimeError(
            f"checkpoint {path} cannot be written ({err.strerror or err}); "
            "the last one saved, if any, is kept"
        ) from None


def read_checkpoint(p, path: str) -> tuple[dict, dict]:
    """The arrays and the metadata of the checkpoint at ``path``, which must have been
    written under the plan ``p``.

    Raises:
        CheckpointMismatch: the file cannot be read, or was written by a run with other
            settings, or by another version of jaxqueue.
    """
    try:
        with open(path, "rb") as f, np.load(f) as data:  # (closed if np.load fails)
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
        theirs = meta["fingerprint"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise CheckpointMismatch(
            f"checkpoint {path} cannot be read ({type(err).__name__}: "
            f"{err}); delete it or give another path"
        ) from None
    ours = json.loads(json.dumps(p.fingerprint()))
    if theirs != ours:
        keys = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        detail = ", ".join(
            f"{k}: {_shown(theirs.get(k))!r} there, {_shown(ours.get(k))!r} here" for k in keys
        )
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
    return arrays, meta


def restore(run, arrays: dict, meta: dict, path: str) -> None:
    """Put a checkpoint's timeline, overflow counts, sums and batch records
    (:func:`read_checkpoint`) into a run started at its saved state, and
    check that a run could have reached them."""
    p = run.plan
    run.block = meta["block"]
    run.overflow = arrays["overflow"]
    for name in ("totals", "mark"):
        getattr(run, name).arrays = {
            k[len(name) + 1 :]: v for k, v in arrays.items() if k.startswith(name + "/")
        }
    for j, (w, saved) in enumerate(zip(run.windows, meta["windows"])):
        w.extensions, w.done, w.diagnostic = (
            saved["extensions"],
            saved["done"],
            saved["diagnostic"],
        )
        if saved["batches_done"]:
            w.queue = list(arrays[f"queue/{j}"].T)
        if p.interval == "batch-means":
            w.sums = [
                {
                    k.split("/", 3)[3]: v
                    for k, v in arrays.items()
                    if k.startswith(f"batch/{j}/{i}/")
                }
                for i in range(saved["batches_done"])
            ]
    check_consistent(run, arrays["core/tail"], path)


def core_fields(core: Core) -> dict:
    out = {"tail": core.tail, "iq_tail": core.iq_tail, "iq_listed": core.iq_listed}
    if core.lists is not None:
        out.update({f"lists.{k}": v for k, v in core.lists._asdict().items()})
    if core.classes is not None:
        out["classes"] = core.classes
    if core.clock is not None:
        out.update({f"clock.{k}": v for k, v in core.clock._asdict().items()})
    return out


def check_consistent(run, tail: np.ndarray, path: str) -> None:
    """Refuse a resumed state that no run could have reached: a ``tail`` (as
    saved, on the host) that does not start at each replica's N or grows with
    the level, a negative count, a block past the run's end (a file edited or
    damaged, with a fingerprint intact)."""
    p = run.plan
    n = np.repeat(np.asarray(p.load_sizes(), np.int64)[:, 0], p.replicas)
    why = None
    if tail.ndim != 2 or tail.shape[1] != p.system.levels + 1:
        why = f"its occupancy has shape {tail.shape}, not (replicas, {p.system.levels + 1})"
    elif (tail[:, 0] != n).any():
        why = "an occupancy does not count every server (its first entry is not N)"
    elif (tail < 0).any() or (np.diff(tail, axis=1) > 0).any():
        why = "an occupancy has a negative count or more servers at a higher level"
    elif not 0 <= run.block <= run.end:
        why = f"it is at block {run.block}, outside the run's 0 to {run.end}"
    elif any((np.asarray(v) < 0).any() for k, v in run.totals.arrays.items() if k != "user"):
        why = "a window sum is negative"
    if why is not None:
        raise CheckpointMismatch(
            f"checkpoint {path} holds a state no run reaches ({why}); "
            "delete it or give another path"
        )


def core_from_fields(fields: dict, p) -> Core:
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
    return Core(
        pad["tail"], pad["iq_tail"], pad["iq_listed"], lists, pad.get("classes"), clock, sizes
    )


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


def check_writable(path: str) -> None:
    """Refuse a checkpoint path that cannot be written, before the first step
    (a run once simulated to its first save, and lost it there)."""
    probe = f"{path}.tmp{os.getpid()}"
    try:
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as err:
        raise ValueError(
            f"checkpoint={path!r} cannot be written ({err.strerror or err}): "
            "give a path in a folder that exists and can be written"
        ) from None
