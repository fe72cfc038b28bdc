"""The result store of grid sweeps: one SQLite file, one row per point and metric.

A batch of points is one transaction, so a sweep killed at any moment resumes where it
stopped; a store of another spec, code version or layout (:data:`SCHEMA`) is refused, and
a damaged one (SQLite's ``quick_check`` when it is opened, any read or write after) is
said with how to recover it. Every SQLite error comes out as one of this module's, naming
the file.
Its tables and columns: docs/sweeps.md (The store); the names: docs/vocabulary.md.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import functools
import json
import os
import shlex
import sqlite3
import stat
import tempfile
from collections.abc import Iterable

try:
    import fcntl
except ModuleNotFoundError:  # pragma: no cover (Windows)
    fcntl = None
    import msvcrt

__all__ = [
    "Store",
    "StoreMismatchError",
    "StoreDamagedError",
    "StoreLayoutError",
    "StoreFullError",
    "StoreBusyError",
    "writer_lock",
    "replacing",
    "COLUMNS",
    "PARAMETER_COLUMNS",
    "POINT_KEYS",
    "SCHEMA",
    "parameter_values",
]

#: The layout of the tables; a store written with another is refused.
SCHEMA = "5"

#: The columns of the results table (and of its CSV export), in order.
COLUMNS = (
    "point_id",
    "policy",
    "n_servers",
    "n_dispatchers",
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
    "metric",
    "k",
    "mean",
    "ci95",
    "theory",
    "refined",
    "replicas",
    "steps",
    "warmup",
    "warmup_passed",
    "seed",
)
#: The point's parameters among :data:`COLUMNS` (between its id and the metric).
PARAMETER_COLUMNS = COLUMNS[COLUMNS.index("point_id") + 1 : COLUMNS.index("metric")]
_TYPES = {
    "point_id": "TEXT NOT NULL",
    "policy": "TEXT NOT NULL",
    "n_servers": "INTEGER",
    "n_dispatchers": "INTEGER",
    "ratio": "REAL",
    "load": "REAL",
    "alpha": "REAL",
    "beta": "REAL",
    "d": "INTEGER",
    "z": "INTEGER",
    "order": "TEXT",
    "buffer": "INTEGER",
    "service": "TEXT",
    "pools": "TEXT",
    "arrivals": "TEXT",
    "metric": "TEXT NOT NULL",
    "k": "REAL NOT NULL",
    "mean": "REAL",
    "ci95": "REAL",
    "theory": "REAL",
    "refined": "REAL",
    "replicas": "INTEGER",
    "steps": "INTEGER",
    "warmup": "INTEGER",
    "warmup_passed": "INTEGER",
    "seed": "INTEGER",
}
#: The names the tables of layout :data:`SCHEMA` give some columns (the
#: names of the store's first layouts, kept so that their stores resume);
#: rows and every export use :data:`COLUMNS`.
_STORED = {"n_servers": "servers", "n_dispatchers": "dispatchers", "k": "idx"}
#: A point's parameter names (``Point.params``, a spec's ``[grid]``) by column, in order.
_PARAMETER_KEYS = {"n_servers": "servers", "n_dispatchers": "dispatchers"}
POINT_KEYS = tuple(_PARAMETER_KEYS.get(c, c) for c in PARAMETER_COLUMNS)
_QUOTED = ", ".join(f'"{_STORED.get(c, c)}"' for c in COLUMNS)
#: ``k`` of scalar metrics in the table (SQLite primary keys must not be NULL).
SCALAR_INDEX = -1.0


def parameter_values(params: dict) -> dict:
    """A point's parameters (:meth:`~jaxqueue.studies.grids.points.Point.params`) as
    the values of :data:`PARAMETER_COLUMNS`."""
    return {c: params.get(_PARAMETER_KEYS.get(c, c)) for c in PARAMETER_COLUMNS}


class StoreMismatchError(RuntimeError):
    """The store was written by another spec or another code version."""


class StoreDamagedError(StoreMismatchError):
    """The store's file is damaged: SQLite finds its pages malformed."""


class StoreLayoutError(RuntimeError):
    """The store has a table layout (:data:`SCHEMA`) that this version does not read.

    Not a :class:`StoreMismatchError` (a store this sweep may not resume): a store
    that export and plot cannot read at all, said as such wherever they are called."""


class StoreFullError(RuntimeError):
    """A batch could not be written to the store: its disk is full (the store keeps
    the batches written before; the same sweep resumes after them)."""


#: SQLite's primary result codes (``sqlite3.SQLITE_*`` from Python 3.11 on).
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 11, 13, 26


def _sqlite_code(err: sqlite3.Error) -> int | None:
    code = getattr(err, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return code & 0xFF
    text = str(err)  # (3.10: the message only)
    for words, code in (
        ("malformed", _SQLITE_CORRUPT),
        ("disk is full", _SQLITE_FULL),
        ("not a database", _SQLITE_NOTADB),
    ):
        if words in text:
            return code
    return None


def _damaged(path: str, reason: str = "database disk image is malformed") -> StoreDamagedError:
    name = shlex.quote(path)
    return StoreDamagedError(
        f"{path} is damaged ({reason}): recover what it holds with `sqlite3 {name} .recover "
        "| sqlite3 NEW.sqlite` (a sweep into NEW.sqlite resumes from it), or start a new store"
    )


def _store_error(path: str, err: sqlite3.Error, batch: int | None = None) -> RuntimeError:
    """The one-line error of an SQLite error on the store at ``path`` (``batch``: the
    batch a write was committing)."""
    text = " ".join(str(err).split())
    code = _sqlite_code(err)
    if code == _SQLITE_CORRUPT:
        return _damaged(path, text)
    if code == _SQLITE_FULL and batch is not None:
        return StoreFullError(
            f"{path}: batch {batch} was not written, the disk is full ({text}): free some "
            "space and run the same sweep again, which resumes after the batches written"
        )
    if code == _SQLITE_FULL:
        return StoreFullError(
            f"{path} cannot be written, the disk is full ({text}): free some space and run "
            "the same command again (the store keeps what was written before)"
        )
    if batch is not None:
        return StoreMismatchError(
            f"{path}: batch {batch} was not written ({text}); the same sweep resumes after "
            "the batches written once the store can be written again"
        )
    return StoreMismatchError(
        f"{path} cannot be used as a store ({text}): give a store file "
        "in a folder that exists and can be written"
    )


def _guarded(method):
    """``method`` of :class:`Store` with SQLite's errors as :func:`_store_error`'s (the
    connection closed when the store cannot be opened)."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as err:
            if method.__name__ == "__init__" and getattr(self, "_db", None) is not None:
                self.close()
            raise _store_error(self.path, err) from None

    return guarded


def _connect(path: str) -> sqlite3.Connection:
    """A connection to the store at ``path`` (created if missing or empty); a file
    that is not SQLite, an SQLite file of something else, a damaged one (SQLite's
    ``quick_check``) or a path that cannot be opened is a :class:`StoreMismatchError`
    naming it (the file is not touched)."""
    if os.path.isdir(path):
        raise StoreMismatchError(f"{path} is a folder: give a store file (NAME.sqlite)")
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO, a device
        raise StoreMismatchError(f"{path} is not a regular file: give a store file (NAME.sqlite)")
    db = None
    try:
        fresh = not os.path.exists(path) or os.path.getsize(path) == 0
        db = sqlite3.connect(path, check_same_thread=False)
        if not fresh:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not {"meta", "points", "results"} <= tables:
                db.close()
                raise StoreMismatchError(
                    f"{path} is an SQLite file but not a jaxqueue store (its tables: "
                    f"{', '.join(sorted(tables)) or 'none'}): give a new store file"
                )
            if db.execute("PRAGMA quick_check(1)").fetchall() != [("ok",)]:
                db.close()
                raise _damaged(path)
        return db
    except sqlite3.Error as err:  # not SQLite, damaged; a folder missing or read-only
        if db is not None:
            db.close()
        raise _store_error(path, err) from None


class StoreBusyError(RuntimeError):
    """Another process is running a sweep into the store."""


#: The byte ``msvcrt.locking`` locks on Windows (where a lock is mandatory): past the end
#: of any store, away from the bytes of SQLite's own locks (at 1 GiB).
_WINDOWS_LOCK_BYTE = 1 << 50


@contextlib.contextmanager
def writer_lock(path):
    """Hold a lock on the store file at ``path`` while a sweep writes it (and its
    ``PATH.running.npz``): a second sweep into it, by any name of that file (a symlink,
    another spelling), stops at once with :class:`StoreBusyError` instead of computing
    the same points. An advisory lock of the operating system on the file itself
    (``flock``: on Linux apart from the POSIX locks SQLite takes; on Windows
    ``msvcrt.locking`` of a byte past the file's end), so it goes with the process,
    however it ends, and no lock file is left. The store file is created, empty, if
    missing. (Closing the lock's descriptor drops the POSIX locks of the process on the
    file: hold it over the sweep's own connection, as :func:`run_grid` does, not over a
    connection the process keeps open after it.)"""
    path = os.fspath(path)
    real = os.path.realpath(path)
    if os.path.isdir(real):
        raise StoreMismatchError(f"{path} is a folder: give a store file (NAME.sqlite)")
    if os.path.exists(real) and not os.path.isfile(real):
        raise StoreMismatchError(f"{path} is not a regular file: give a store file (NAME.sqlite)")
    try:
        fd = os.open(real, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as err:
        raise StoreMismatchError(
            f"{path} cannot be used as a store: it cannot be opened for writing "
            f"({err.strerror or err}); give a store file in a folder that exists and can "
            "be written"
        ) from None
    try:
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:  # pragma: no cover (Windows)
                os.lseek(fd, _WINDOWS_LOCK_BYTE, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            named = f" (the file {real})" if real != os.path.abspath(path) else ""
            raise StoreBusyError(
                f"another sweep is running into {path}{named}: wait for it to end, or give "
                "another --store"
            ) from None
        yield
    finally:
        os.close(fd)  # (closing releases the lock)


def _process_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: The permissions a new file gets are ``0o666 & ~_UMASK`` (read once, at import).
_UMASK = _process_umask()


def _named(err: OSError, path: str) -> OSError:
    """``err`` naming ``path`` (an error of a write has no file name; one of a
    temporary file names that)."""
    return OSError(err.errno or errno.EIO, err.strerror or " ".join(str(err).split()), path)


@contextlib.contextmanager
def replacing(path):
    """The name under which to write the new content of the file ``path``: a fresh
    temporary file in its folder (``mkstemp``: no name planted there is written
    through), moved onto ``path`` when the block ends without an error. Until then the
    old file, if any, stays whole; on an error the temporary file is removed. The target
    of a symlink is replaced (as writing it would); a path that is not a regular file
    (``/dev/null``, a FIFO, a folder) is given as it is. An OSError names ``path``."""
    path = os.fspath(path)
    real = os.path.realpath(path)
    if os.path.exists(real) and not os.path.isfile(real):
        try:
            yield path
        except OSError as err:
            raise _named(err, path) from None
        return
    tmp = None
    try:
        mode = stat.S_IMODE(os.stat(real).st_mode) if os.path.exists(real) else 0o666 & ~_UMASK
        fd, tmp = tempfile.mkstemp(
            dir=os.path.dirname(real), prefix=f".{os.path.basename(real)}.", suffix=".tmp"
        )
        os.close(fd)
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, real)
        tmp = None
    except OSError as err:
        raise _named(err, path) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)


class Store:
    """A sweep's SQLite store (use as a context manager, or call :meth:`close`).

    Args:
        path: the SQLite file (created if missing).
        spec_hash: the hash of the resolved spec the sweep runs.
        spec_name: the spec's name (recorded).
        versions: the versions of the code (``jaxqueue.core.versions.versions()``).
        spec_text: the spec file's text (recorded for figures; None keeps what is there).
        accept_code_change: resume a store written by other versions of the code
            (or of JAX, NumPy, Python); the new versions are recorded in
            ``meta.versions_accepted`` with the first batch they write.

    Raises:
        StoreMismatchError: the file holds results of another spec, or of other
            versions not accepted.
    """

    @_guarded
    def __init__(
        self,
        path,
        spec_hash: str,
        spec_name: str,
        versions: dict,
        spec_text: str | None = None,
        *,
        accept_code_change: bool = False,
    ):
        self.path = os.fspath(path)
        # One writer thread of run_grid commits while the caller simulates; the
        # connection is used by one thread at a time.
        self._db = _connect(self.path)
        # "order" is an SQL keyword
        cols = ", ".join(f'"{_STORED.get(c, c)}" {_TYPES[c]}' for c in COLUMNS)
        with self._db:
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS points (point_id TEXT PRIMARY KEY, params TEXT, "
                "batch INTEGER, wall_seconds REAL)"
            )
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS results ({cols}, PRIMARY KEY (point_id, metric, idx))"
            )
        want = {
            "spec_hash": spec_hash,
            "spec_name": spec_name,
            "schema": SCHEMA,
            "versions": json.dumps(versions, sort_keys=True),
        }
        have = dict(self._db.execute("SELECT key, value FROM meta"))
        if not have:
            with self._db:
                self._db.executemany("INSERT INTO meta VALUES (?, ?)", sorted(want.items()))
            self._set_text(spec_text)
            return
        if have.get("schema") != SCHEMA:
            self.close()
            raise StoreMismatchError(
                f"{self.path} has the table layout {have.get('schema', '1')}, this version of "
                f"jaxqueue writes layout {SCHEMA}: use a new store file"
            )
        if have.get("spec_hash") != spec_hash:
            self.close()
            raise StoreMismatchError(
                f"{self.path} holds results of another spec (hash {have.get('spec_hash')}, "
                f"this one {spec_hash}): use a new store file for a changed spec"
            )
        if have.get("versions") != want["versions"]:
            self._versions_changed(have, versions, accept_code_change)
        self._set_text(spec_text)

    def _versions_changed(self, have: dict, versions: dict, accept: bool) -> None:
        """Resume with versions other than the store's first writer's only if they
        were accepted before or are accepted now (recorded with the first batch they
        write, in ``meta.versions_accepted``); else refuse, naming what changed."""
        accepted = json.loads(have.get("versions_accepted", "[]"))
        if any(entry["versions"] == versions for entry in accepted):
            return
        if not accept:
            first = json.loads(have["versions"])
            changed = ", ".join(
                f"{k}: {first.get(k)} there, {versions.get(k)} here"
                for k in sorted(set(first) | set(versions))
                if first.get(k) != versions.get(k)
            )
            self.close()
            raise StoreMismatchError(
                f"{self.path} was written by other versions ({changed}): results of "
                "different code are not mixed; use a new store file, or resume with "
                "--accept-code-change (accept_code_change=True) if the change cannot alter "
                "results (the store records which batches each version wrote)"
            )
        accepted.append({"versions": versions, "from_batch": self.next_batch()})
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('versions_accepted', ?)",
                (json.dumps(accepted, sort_keys=True),),
            )

    @_guarded
    def _set_text(self, text: str | None) -> None:
        if text is not None:
            with self._db:
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('spec_text', ?)", (text,))

    @_guarded
    def meta(self) -> dict:
        """The ``meta`` table: spec_hash, spec_name, versions (a dict: the first
        writer's), versions_accepted (a list of ``{"versions", "from_batch"}``) and
        spec_text."""
        meta = dict(self._db.execute("SELECT key, value FROM meta"))
        meta["versions"] = json.loads(meta["versions"])
        meta["versions_accepted"] = json.loads(meta.get("versions_accepted", "[]"))
        return meta

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._db is not None:
            self._db.close()
            self._db = None

    @_guarded
    def done(self) -> set[str]:
        """The ids of the points already committed."""
        return {row[0] for row in self._db.execute("SELECT point_id FROM points")}

    @_guarded
    def next_batch(self) -> int:
        """The index the next committed batch gets (batches of earlier runs keep theirs)."""
        (last,) = self._db.execute("SELECT MAX(batch) FROM points").fetchone()
        return 0 if last is None else last + 1

    def commit_batch(
        self, batch: int, points: Iterable[tuple[str, dict, float]], rows: Iterable[dict]
    ) -> None:
        """Write a finished batch in one transaction: its points and their result rows.

        Args:
            batch: the batch's index in the sweep (recorded).
            points: ``(point_id, params, wall_seconds)`` per point.
            rows: dicts with the keys of :data:`COLUMNS` (``k`` may be None
                for a scalar metric).

        Raises:
            StoreFullError: the disk is full; the batch was not written.
        """
        values = [
            tuple(SCALAR_INDEX if c == "k" and r.get(c) is None else r.get(c) for c in COLUMNS)
            for r in rows
        ]
        marks = ", ".join("?" for _ in COLUMNS)
        try:
            with self._db:  # one transaction: all of the batch or nothing
                self._db.executemany(f"INSERT INTO results VALUES ({marks})", values)
                self._db.executemany(
                    "INSERT INTO points VALUES (?, ?, ?, ?)",
                    [
                        (pid, json.dumps(params, sort_keys=True), batch, wall)
                        for pid, params, wall in points
                    ],
                )
        except sqlite3.IntegrityError:  # a point twice: a bug of the caller, not of the file
            raise
        except sqlite3.Error as err:  # (rolled back: the store holds the batches before)
            raise _store_error(self.path, err, batch) from None

    @_guarded
    def rows(self) -> list[dict]:
        """Every result row (keys :data:`COLUMNS`), ordered by point id, metric
        and ``k`` (``k`` is -1 for a scalar metric)."""
        cur = self._db.execute(f"SELECT {_QUOTED} FROM results ORDER BY point_id, metric, idx")
        return [dict(zip(COLUMNS, r)) for r in cur]

    def export_csv(self, path) -> int:
        """Write :meth:`rows` as CSV (a header of :data:`COLUMNS`) to ``path``, a
        file name (replaced whole: :func:`replacing`) or an open text stream
        (``sys.stdout``); returns the row count."""
        rows = self.rows()
        if hasattr(path, "write"):
            self._write_csv(path, rows)
        else:
            with replacing(path) as tmp, open(tmp, "w", newline="") as f:
                self._write_csv(f, rows)
        return len(rows)

    @staticmethod
    def _write_csv(f, rows) -> None:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for r in rows:  # (a scalar metric's k, -1 in the table, is empty as in every export)
            r = {**r, "k": None if r["k"] == SCALAR_INDEX else r["k"]}
            writer.writerow({k: ("" if r[k] is None else r[k]) for k in COLUMNS})

    @staticmethod
    def open_existing(path) -> Store:
        """Open a store for reading, whatever wrote it (export, plots).

        Raises:
            FileNotFoundError: no file at ``path``.
            StoreMismatchError: the file is empty, or not a jaxqueue store
                (:class:`StoreDamagedError`: a damaged one).
            StoreLayoutError: a store of a layout (:data:`SCHEMA`) this version
                does not read.
        """
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no store at {path}")
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            raise StoreMismatchError(
                f"{path} is empty: not a jaxqueue store (give the .sqlite file a sweep wrote)"
            )
        db = _connect(path)
        try:
            meta = dict(db.execute("SELECT key, value FROM meta"))
        except sqlite3.Error as err:
            raise _store_error(path, err) from None
        finally:
            db.close()
        if not {"spec_hash", "spec_name", "versions"} <= set(meta):
            raise StoreMismatchError(
                f"{path} is not a jaxqueue store (its meta table lacks "
                "spec_hash, spec_name or versions)"
            )
        try:
            versions = json.loads(meta["versions"])
        except ValueError:
            versions = None
        if not isinstance(versions, dict):
            raise StoreMismatchError(
                f"{path} is not a jaxqueue store (its meta versions are not a JSON object)"
            )
        layout = meta.get("schema", "1")  # (the first layout recorded none)
        if layout != SCHEMA:
            wrote = versions.get("jaxqueue")
            by = f" (written by jaxqueue {wrote})" if wrote else ""
            raise StoreLayoutError(
                f"{path} has the table layout {layout}{by}, and export and plot of this "
                f"version read layout {SCHEMA} only, so they cannot read it: export it with "
                "the jaxqueue that wrote it, or run its sweep again into a new store"
            )
        return Store(path, meta["spec_hash"], meta["spec_name"], versions)
