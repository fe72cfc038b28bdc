"""Hostile files: a name planted where a temporary file goes, a store reached by another
name, a checkpoint tampered with or cut short, a FIFO or a device given as an input, a
damaged or full or empty or old store, an export without its extra or its disk space.
Each is refused with one line naming the file and what to do, or handled right.

Fast: one small Pod(2) run of two blocks (saved as often as needed), the rest no run.
"""

import errno
import hashlib
import json
import os
import random
import re
import signal
import sqlite3
import sys

import numpy as np
import pytest

from jaxqueue.cli import main as cli_main
from jaxqueue.sim import checkpoints, runner
from jaxqueue.studies.grids.store import SCHEMA, Store, StoreBusyError, writer_lock

#: One small run of several chunks (Pod(2), N = 10; as tests/cli/test_inputs.py).
RUN = dict(replicas=2, steps=8 * 256, warmup=256, levels=12, seed=5, init="empty")
SPEC = (
    '[grid]\npolicy = ["pod"]\nn_servers = [10]\nload = [0.5]\n[run]\nreplicas = 2\nsteps = 256\n'
)


def _plan():
    from jaxqueue.runs import planner

    return planner.plan("pod", [0.9], 10, d=2, **RUN)


@pytest.fixture(scope="module")
def run():
    """The run, two blocks in (saved by the tests that need a checkpoint)."""
    return runner.Run.start(_plan()).advance(2)


@pytest.fixture
def deadline():
    """A read that would hang (a FIFO) fails the test after 20 s instead."""

    def expired(signum, frame):
        raise TimeoutError("the read did not end: it hung")

    before = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, 20)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, before)


def _one_line(err) -> str:
    text = str(err.value) if hasattr(err, "value") else err
    assert "\n" not in text.rstrip("\n"), text
    return text


def _load(path) -> tuple[dict, dict]:
    with np.load(path) as data:
        arrays = {k: data[k].copy() for k in data.files}
    return arrays, json.loads(arrays.pop("meta").tobytes().decode())


def _save(path, arrays: dict, meta: dict, sign: bool = False) -> None:
    """Write a checkpoint's arrays and meta back (``sign``: with the checksum of its
    arrays recomputed, as an editor who knew the format would)."""
    if sign:
        meta = {**meta, "checksum": _checksum(arrays)}
    np.savez(path, **arrays, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))


def _checksum(arrays: dict) -> str:
    """The format's sha256: each array's name, dtype, shape and bytes, by name."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode() + b"\n")
        digest.update(a.tobytes())
    return digest.hexdigest()


# -- 1. temporary files ---------------------------------------------------------------


def test_a_checkpoint_is_not_written_through_a_name_planted_beside_it(tmp_path, run):
    """The temporary name was PATH.tmp<pid>, opened with open(..., "wb"): a symlink
    planted there truncated the file it pointed to."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep me")
    path = tmp_path / "c.npz"
    planted = tmp_path / f"c.npz.tmp{os.getpid()}"
    planted.symlink_to(victim)
    run.save(str(path))
    assert victim.read_bytes() == b"keep me"
    assert runner.Run.resume(_plan(), str(path)).block == run.block
    probe = tmp_path / "d.npz"  # the writability probe before a run's first step
    (tmp_path / f"d.npz.tmp{os.getpid()}").symlink_to(victim)
    checkpoints.check_writable(str(probe))
    assert victim.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["victim.txt", "c.npz", planted.name, f"d.npz.tmp{os.getpid()}"]
    )  # no temporary file of ours left, the planted links untouched
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~_umask()  # as open() makes a file


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# -- 2. the store's lock --------------------------------------------------------------


def test_the_store_lock_holds_the_file_by_any_name_and_leaves_no_lock_file(tmp_path, capsys):
    """The lock was PATH.lock: a second sweep through a symlink to the store (or after
    the lock file was deleted) got past it and died with an IntegrityError."""
    store, alias = tmp_path / "s.sqlite", tmp_path / "alias.sqlite"
    alias.symlink_to(store)  # (the store does not exist yet: the lock creates it)
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    with writer_lock(store):
        assert store.is_file()
        with pytest.raises(StoreBusyError) as err:
            with writer_lock(alias):
                pass
        assert _one_line(err) == (
            f"another sweep is running into {alias} (the file {os.path.realpath(store)}): wait "
            "for it to end, or give another --store"
        )
        assert cli_main(["sweep", str(spec), "--store", str(alias)]) == 3
        out = capsys.readouterr().err
        assert out.startswith(f"error: another sweep is running into {alias} ") and _one_line(out)
        with Store(store, "hash", "s", {}) as held:  # SQLite's own locks are apart from it
            held.commit_batch(0, [("p0", {}, 1.0)], [dict(point_id="p0", policy="pod", metric="m")])
        with Store.open_existing(alias) as reader:
            assert reader.done() == {"p0"}
    with writer_lock(alias):  # released with the first
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias.sqlite", "s.sqlite", "s.toml"]


# -- 3. checkpoint checksums and layout -----------------------------------------------


def test_a_tampered_but_consistent_checkpoint_is_refused_as_damaged(tmp_path, run):
    """Sums multiplied by 3 keep a state a run reaches: the file was trusted and gave
    wrong results with exit 0."""
    path = tmp_path / "c.npz"
    run.save(str(path))
    arrays, meta = _load(path)
    for key in arrays:
        if key.startswith(("totals/", "mark/")):
            arrays[key] = arrays[key] * 3
    _save(path, arrays, meta)
    with pytest.raises(checkpoints.CheckpointMismatch) as err:
        runner.Run.resume(_plan(), str(path))
    assert _one_line(err) == (
        f"checkpoint {path} is damaged (checksum mismatch); delete it or give another path"
    )
    run.save(str(path))  # the checksum: over the arrays' names, dtypes, shapes and bytes
    arrays, meta = _load(path)
    assert meta["checksum"] == _checksum(arrays) == checkpoints.array_checksum(arrays)


def test_a_checkpoint_without_a_checksum_is_refused_as_an_earlier_versions(tmp_path, run):
    path = tmp_path / "c.npz"
    run.save(str(path))
    arrays, meta = _load(path)
    meta.pop("checksum", None)
    _save(path, arrays, meta)
    with pytest.raises(checkpoints.CheckpointMismatch) as err:
        runner.Run.resume(_plan(), str(path))
    assert _one_line(err) == (
        f"checkpoint {path} was written by an earlier jaxqueue that did not record a "
        "checksum of its arrays; delete it and run again, or give another path"
    )


def _first(prefix):
    return lambda arrays: next(k for k in sorted(arrays) if k.startswith(prefix))


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda a, m: a.pop("overflow"), r"it lacks overflow"),
        (lambda a, m: a.pop("core/iq_tail"), r"it lacks core/iq_tail"),
        (
            lambda a, m: a.__setitem__("core/tail", a["core/tail"][:1]),
            r"core/tail \(1, 13\): not one row per replica \(2\)",
        ),
        (
            lambda a, m: a.__setitem__("overflow", a["overflow"][:, :1]),
            r"overflow has shape \(2, 1\), not \(2, 2\)",
        ),
        (lambda a, m: a.pop(_first("totals/")(a)), r"its totals \w+ are missing or of another"),
        (
            lambda a, m: a.__setitem__(_first("mark/")(a), a[_first("mark/")(a)][..., :1]),
            r"its mark \w+ are missing or of another shape",
        ),
        (lambda a, m: m.pop("windows"), r"it lacks meta windows"),
        (lambda a, m: m.__setitem__("windows", []), r"it has 0 load windows, the run 1"),
    ],
)
def test_a_checkpoint_lacking_an_array_or_of_another_shape_is_one_line(tmp_path, run, edit, why):
    """A key missing or a shape changed (with the checksum recomputed) gave a
    KeyError, IndexError or ValueError traceback."""
    path = tmp_path / "c.npz"
    run.save(str(path))
    arrays, meta = _load(path)
    edit(arrays, meta)
    _save(path, arrays, meta, sign=True)
    with pytest.raises(checkpoints.CheckpointMismatch) as err:
        runner.Run.resume(_plan(), str(path))
    text = _one_line(err)
    assert re.match(rf"checkpoint {re.escape(str(path))} is not one this run writes \(", text)
    assert re.search(why, text) and text.endswith("; delete it or give another path"), text


# -- 4. inputs that are not regular files, or too large -------------------------------


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_a_checkpoint_that_is_no_regular_file_is_refused(tmp_path, kind, deadline):
    path = {"fifo": tmp_path / "c.npz", "folder": tmp_path / "c.npz", "device": "/dev/zero"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    with pytest.raises(checkpoints.CheckpointMismatch) as err:
        runner.Run.resume(_plan(), str(path))
    assert _one_line(err) == (
        f"checkpoint {path} is not a regular file; give the path of the npz file a run saved"
    )


@pytest.mark.parametrize("kind", ["fifo", "folder", "large"])
def test_a_spec_that_is_no_regular_file_or_too_large_is_refused(tmp_path, kind, deadline, capsys):
    path = tmp_path / "s.toml"
    if kind == "fifo":
        os.mkfifo(path)
        why = "not a regular file: give a spec file (NAME.toml)"
    elif kind == "folder":
        path.mkdir()
        why = "not a regular file: give a spec file (NAME.toml)"
    else:
        comment = "#" * 1000 + "\n"
        path.write_text(comment * 1049 + SPEC)  # a valid spec, past 1 MiB
        size = path.stat().st_size
        assert size > 1 << 20
        why = f"{size} bytes, more than the 1048576 a spec file may have"
    assert cli_main(["sweep", str(path), "--plan"]) == 2
    assert capsys.readouterr().err == f"error: {path}: {why}\n"


@pytest.mark.parametrize("kind", ["fifo", "device", "large"])
def test_an_arrivals_file_that_is_no_regular_file_or_too_large_is_refused(
    tmp_path, kind, deadline, monkeypatch
):
    from jaxqueue.core import arrivals

    path = {
        "fifo": str(tmp_path / "a.csv"),
        "device": "/dev/zero",
        "large": str(tmp_path / "a.csv"),
    }
    path = path[kind]
    if kind == "fifo":
        os.mkfifo(path)
        why = "not a regular file: give a CSV or JSON file"
    elif kind == "device":
        why = "not a regular file: give a CSV or JSON file"
    else:
        monkeypatch.setattr(arrivals, "MAX_ARRIVALS_BYTES", 1000)  # (the limit: 256 MiB)
        with open(path, "w") as f:
            f.write("time,rate\n" + "".join(f"{i},1\n" for i in range(300)))
        why = f"{os.path.getsize(path)} bytes, more than the 1000 an arrivals file may have"
    assert arrivals.MAX_ARRIVALS_BYTES == (1000 if kind == "large" else 256 << 20)
    with pytest.raises(ValueError) as err:
        arrivals.parse_arrivals(path)
    assert _one_line(err) == f"arrivals={path!r}: {why}"


# -- 5. damaged, full, empty and old stores --------------------------------------------


def _store(path, n=40) -> None:
    with Store(path, "hash", "s", {"jaxqueue": "test"}) as store:
        rows = [dict(point_id=f"p{i}", policy="pod", metric="m", mean=i / 7) for i in range(n)]
        store.commit_batch(0, [(f"p{i}", {"i": i}, 1.0) for i in range(n)], rows)


def test_a_damaged_store_is_one_line_in_export_sweep_and_plan(tmp_path, capsys):
    """Random bytes in the pages of the results and points tables: tracebacks of
    `sqlite3.DatabaseError: database disk image is malformed`, or rows read silently
    from a damaged index."""
    store = tmp_path / "s.sqlite"
    _store(store)
    with sqlite3.connect(store) as db:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        roots = [r for (r,) in db.execute("SELECT rootpage FROM sqlite_master WHERE rootpage > 1")]
    db.close()
    data = bytearray(store.read_bytes())
    noise = random.Random(1)
    for page in roots:  # (page 1, with the schema, stays whole)
        start = (page - 1) * size
        data[start : start + size] = bytes(noise.randrange(256) for _ in range(size))
    store.write_bytes(bytes(data))
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    said = (
        f"{store} is damaged (database disk image is malformed): recover what it holds with "
        f"`sqlite3 {store} .recover | sqlite3 NEW.sqlite`"
    )
    for argv in (["export", str(store), "--csv", "-"], ["sweep", str(spec), "--store", str(store)]):
        assert cli_main(argv) == 3, argv
        err = capsys.readouterr().err
        assert err.startswith(f"error: {said}") and err.endswith(", or start a new store\n")
        assert _one_line(err)
    assert cli_main(["sweep", str(spec), "--store", str(store), "--plan"]) == 0
    err = capsys.readouterr().err
    assert f"note: {said}" in err and "; a run into it would be refused" in err
    assert store.read_bytes() == bytes(data)  # untouched


def test_a_full_disk_under_a_batch_is_one_line_and_the_store_resumes(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path, "hash", "s", {}) as store:
        (pages,) = store._db.execute("PRAGMA page_count").fetchone()
        store._db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full
        rows = [dict(point_id=f"p{i}", policy="pod", metric="m", mean=1.0) for i in range(500)]
        with pytest.raises(RuntimeError) as err:  # (was sqlite3.OperationalError)
            store.commit_batch(0, [(f"p{i}", {}, 1.0) for i in range(500)], rows)
        assert type(err.value).__name__ == "StoreFullError"
        assert _one_line(err) == (
            f"{path}: batch 0 was not written, the disk is full (database or disk is full): "
            "free some space and run the same sweep again, which resumes after the batches "
            "written"
        )
        assert store.done() == set() and store.next_batch() == 0  # rolled back, still usable


def test_exporting_an_empty_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "s.sqlite"
    path.write_bytes(b"")
    assert cli_main(["export", str(path), "--csv", "-"]) == 3
    assert capsys.readouterr().err == (
        f"error: {path} is empty: not a jaxqueue store (give the .sqlite file a sweep wrote)\n"
    )
    assert path.read_bytes() == b""


def test_a_store_of_an_old_layout_is_said_unreadable_by_export_and_plot(tmp_path, capsys):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        db.execute("CREATE TABLE points (point_id TEXT PRIMARY KEY, params TEXT, batch INTEGER)")
        db.execute("CREATE TABLE results (point_id TEXT, metric TEXT, idx REAL, mean REAL)")
        meta = {"spec_hash": "h", "spec_name": "s", "schema": "3"}
        meta["versions"] = json.dumps({"jaxqueue": "0.3.0"})
        db.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))
    db.close()
    said = (
        f"error: {path} has the table layout 3 (written by jaxqueue 0.3.0), and export and "
        f"plot of this version read layout {SCHEMA} only, so they cannot read it: export it "
        "with the jaxqueue that wrote it, or run its sweep again into a new store\n"
    )
    assert cli_main(["export", str(path), "--csv", "-"]) == 3
    assert capsys.readouterr().err == said
    assert cli_main(["plot", str(path), "-o", str(tmp_path / "f.png")]) == 3
    assert capsys.readouterr().err == said


# -- 6. missing extras, full disks and undecodable text --------------------------------


@pytest.mark.parametrize(
    "flag, module, extra", [("--parquet", "pyarrow", "parquet"), ("--netcdf", "h5netcdf", "xarray")]
)
def test_a_missing_export_extra_is_one_line(tmp_path, capsys, monkeypatch, flag, module, extra):
    store = tmp_path / "s.sqlite"
    _store(store, 2)
    monkeypatch.setitem(sys.modules, module, None)  # (import fails: not installed)
    out = tmp_path / "rows.out"
    assert cli_main(["export", str(store), flag, str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: this export needs {module}: pip install 'jaxqueue[{extra}]'\n"
    )
    assert not out.exists()


def test_a_full_disk_under_an_export_names_the_file_and_keeps_the_old_one(
    tmp_path, capsys, monkeypatch
):
    store = tmp_path / "s.sqlite"
    _store(store, 2)
    out = tmp_path / "rows.csv"
    out.write_text("the last export\n")

    def full(f, rows):
        f.write("point_id,policy\n")
        raise OSError(errno.ENOSPC, "No space left on device")  # (a write names no file)

    monkeypatch.setattr(Store, "_write_csv", staticmethod(full))
    assert cli_main(["export", str(store), "--csv", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: No space left on device: {out} (free some space and run the command again)\n"
    )
    assert out.read_text() == "the last export\n"  # whole, not cut
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv", "s.sqlite"]
    monkeypatch.undo()
    assert cli_main(["export", str(store), "--csv", str(out)]) == 0
    assert out.read_text().startswith("point_id,") and len(out.read_text().splitlines()) == 3
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~_umask()  # (its mode kept)


def test_a_spec_that_is_not_utf8_names_the_file(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_bytes(b"# caf\xe9\n" + SPEC.encode())  # Latin-1
    assert cli_main(["sweep", str(path), "--plan"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: not UTF-8 text ('utf-8' codec can't decode byte 0xe9")
    assert _one_line(err)


@pytest.mark.parametrize("name", ["a.json", "a.csv"])
def test_an_arrivals_file_that_is_not_utf8_names_the_file(tmp_path, name):
    from jaxqueue.core.arrivals import parse_arrivals

    path = tmp_path / name
    path.write_bytes(b"\xff\xfe{" if name.endswith(".json") else b"time,rate\n0,1\n\xff,2\n")
    with pytest.raises(ValueError) as err:
        parse_arrivals(str(path))
    assert _one_line(err).startswith(f"arrivals={str(path)!r}: not UTF-8 text (")
