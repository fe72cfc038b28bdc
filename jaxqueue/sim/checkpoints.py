"""Checkpoints of a run: write its state, sums and timeline to an npz file, read
them back (refusing a file of another run, version or a damaged one: the file's
meta holds a sha256 of its arrays), and rebuild the replicas' state from it
(docs/simulation.md, "Checkpoints")."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
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
    "array_checksum",
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
    meta["checksum"] = array_checksum(arrays)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    tmp = None
    try:
        # a fresh name of this process alone (O_EXCL), in the target's folder so that
        # the replace is atomic: a name planted there (a symlink) is not written through
        fd, tmp = tempfile.mkstemp(
            dir=os.path.dirname(os.path.abspath(path)),
            prefix=f".{os.path.basename(path)}.",
            suffix=".tmp",
        )
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.chmod(tmp, 0o666 & ~_UMASK)  # (mkstemp's are private) as open() would make it
        os.replace(tmp, path)
    except OSError as err:  # a full disk, a folder gone: the last good checkpoint stays
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        raise RuntimeError(
            f"checkpoint {path} cannot be written ({err.strerror or err}); "
            "the last one saved, if any, is kept"
        ) from None


def _process_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: The permissions a file gets are ``0o666 & ~_UMASK`` (read once, at import).
_UMASK = _process_umask()


def array_checksum(arrays: dict) -> str:
    """The sha256 (hex) of arrays by name: each one's name, dtype, shape and bytes, in
    the order of the names (a checkpoint's, less ``meta``, which records it)."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode() + b"\n")
        digest.update(a.tobytes())
    return digest.hexdigest()


def read_checkpoint(p, path: str) -> tuple[dict, dict]:
    """The arrays and the metadata of the checkpoint at ``path``, which must have been
    written under the plan ``p``.

    Raises:
        CheckpointMismatch: the file is not a regular file or cannot be read, was
            written by a run with other settings or by another version of jaxqueue
            (an earlier one: without a checksum), its arrays do not match its
            checksum (damaged), or it lacks an array or has one of another shape.
    """
    if not os.path.exists(path):
        raise CheckpointMismatch(f"checkpoint {path} does not exist; give the path of a saved run")
    if not os.path.isfile(os.path.realpath(path)):  # a FIFO would hang, /dev/zero fill memory
        raise CheckpointMismatch(
            f"checkpoint {path} is not a regular file; give the path of the npz file a run saved"
        )
    try:
        with open(path, "rb") as f, np.load(f) as data:  # (closed if np.load fails)
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
        theirs = meta["fingerprint"]
        if not isinstance(theirs, dict):
            raise ValueError(f"its fingerprint is {type(theirs).__name__}, not a dict")
    except (OSError, ValueError, KeyError, EOFError, TypeError, zipfile.BadZipFile) as err:
        raise CheckpointMismatch(
            f"checkpoint {path} cannot be read ({type(err).__name__}: "
            f"{_one_line(err)}); delete it or give another path"
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
    if "checksum" not in meta:
        raise CheckpointMismatch(
            f"checkpoint {path} was written by an earlier jaxqueue that did not record a "
            "checksum of its arrays; delete it and run again, or give another path"
        )
    if meta["checksum"] != array_checksum(arrays):
        raise CheckpointMismatch(
            f"checkpoint {path} is damaged (checksum mismatch); delete it or give another path"
        )
    _check_layout(arrays, meta, p, path)
    return arrays, meta


def _one_line(err) -> str:
    return " ".join(str(err).split())


def _check_layout(arrays: dict, meta: dict, p, path: str) -> None:
    """Refuse a checkpoint whose arrays or timeline a run of plan ``p`` does not
    write (a key missing, a shape that is not the replicas'), with one line,
    before anything is built from it (:func:`core_from_fields`, :func:`restore`)."""
    n, levels = p.n_replicas, p.system.levels
    why = None
    core = {k[5:]: v for k, v in arrays.items() if k.startswith("core/")}
    need = ["tail", "iq_tail", "iq_listed"]
    if p.policy.per_server:
        need += [f"lists.{k}" for k in Lists._fields]
    if p.system.classes and not p.policy.per_server:
        need.append("classes")
    if p.system.arrivals is not None:
        need += [f"clock.{k}" for k in Clock._fields]
    windows = meta.get("windows")
    missing = [f"core/{k}" for k in need if k not in core]
    missing += [k for k in ("overflow",) if k not in arrays]
    missing += [f"meta {k}" for k in ("block", "windows") if k not in meta]
    if missing:
        why = f"it lacks {', '.join(missing)}"
    elif bad := [f"core/{k} {v.shape}" for k, v in core.items() if v.ndim < 1 or len(v) != n]:
        why = f"{', '.join(bad)}: not one row per replica ({n})"
    elif core["tail"].shape != (n, levels + 1):
        why = f"core/tail has shape {core['tail'].shape}, not ({n}, {levels + 1})"
    elif arrays["overflow"].shape != (n, 2):
        why = f"overflow has shape {arrays['overflow'].shape}, not ({n}, 2)"
    elif not isinstance(meta["block"], int) or not isinstance(windows, list):
        why = "its timeline (meta block, windows) is not a block and a list"
    elif len(windows) != len(p.loads):
        why = f"it has {len(windows)} load windows, the run {len(p.loads)}"
    else:
        keys = ("extensions", "done", "diagnostic", "batches_done")
        for j, w in enumerate(windows):
            done = w.get("batches_done") if isinstance(w, dict) else None
            if not isinstance(done, int) or done < 0 or not set(keys) <= set(w):
                why = f"load window {j} lacks {', '.join(keys)}"
            elif done and (f"queue/{j}" not in arrays or arrays[f"queue/{j}"].ndim != 2):
                why = f"load window {j} has {done} batches and no queue/{j} of them"
            elif done and arrays[f"queue/{j}"].shape[1] != done:
                why = f"queue/{j} has {arrays[f'queue/{j}'].shape[1]} batches, not {done}"
            if why is not None:
                break
    if why is not None:
        raise CheckpointMismatch(
            f"checkpoint {path} is not one this run writes ({why}); delete it or give another path"
        )


def restore(run, arrays: dict, meta: dict, path: str) -> None:
    """Put a checkpoint's timeline, overflow counts, sums and batch records
    (:func:`read_checkpoint`) into a run started at its saved state, and
    check that a run could have reached them."""
    p = run.plan
    for name in ("totals", "mark"):  # as the fresh run's sums: their names and shapes
        theirs = {
            k[len(name) + 1 :]: v.shape for k, v in arrays.items() if k.startswith(f"{name}/")
        }
        ours = {k: np.shape(v) for k, v in getattr(run, name).arrays.items()}
        if theirs != ours:
            wrong = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            raise CheckpointMismatch(
                f"checkpoint {path} is not one this run writes (its {name} "
                f"{', '.join(wrong)} are missing or of another shape); delete it or give "
                "another path"
            )
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
    try:  # a fresh name (O_EXCL): a name planted there is not written through
        fd, probe = tempfile.mkstemp(
            dir=os.path.dirname(os.path.abspath(path)),
            prefix=f".{os.path.basename(path)}.",
            suffix=".tmp",
        )
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise ValueError(
            f"checkpoint={path!r} cannot be written ({err.strerror or err}): "
            "give a path in a folder that exists and can be written"
        ) from None
