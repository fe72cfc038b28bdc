"""No silent acceptance: a value out of range is refused with its name, before anything runs;
a checkpoint that cannot be written, read or believed is refused with its path.

Fast: the refusals come before a compile (the runs are stopped if one starts), and the
checkpoint tests step a small Pod(2) system for a few blocks.
"""

import json
import math

import pytest

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.sim import checkpoints, runner
from jaxqueue.studies import compare


@pytest.fixture
def no_run(monkeypatch):
    """Any start of a run fails the test: the refusals must come first."""

    def started(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(runner.Run, "start", started)


@pytest.mark.parametrize("every", [-1.0, math.nan, math.inf, "300", True])
def test_checkpoint_every_must_be_finite_seconds(every, no_run, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"checkpoint_every=.* is out of range: need a finite "
        r"number of seconds >= 0",
    ):
        jq.simulate(
            "pod",
            0.9,
            10,
            replicas=2,
            steps=256,
            checkpoint=str(tmp_path / "c.npz"),
            checkpoint_every=every,
        )


def test_a_load_given_twice_to_compare_is_refused(no_run):
    """compare's table has a row per policy and load. (jq.sweep takes a load
    twice: its results are a list, and each entry draws its own stream, so
    repeated loads are independent runs in one batch.)"""
    with pytest.raises(ValueError, match=r"loads gives 0\.9 twice: give each once"):
        compare.compare(["pod"], 100, ratio=10, loads=(0.9, 0.5, 0.9))


def test_cli_refuses_zero_batch_points_and_infinite_checkpoint_intervals(tmp_path, capsys, no_run):
    spec = tmp_path / "s.toml"
    spec.write_text(
        '[grid]\npolicy = ["pod"]\nn_servers = [10]\nload = [0.5]\n[run]\nreplicas = 2\nsteps = 256\n'
    )
    for argv in (
        ["sweep", str(spec), "--batch-points", "0"],
        ["sweep", str(spec), "--batch-points", "0", "--plan"],
    ):
        assert cli_main(argv) == 2
        assert "batch_points=0 is out of range: need >= 1" in capsys.readouterr().err
    argv = [
        "simulate",
        "--policy",
        "pod",
        "--servers",
        "10",
        "--load",
        "0.5",
        "--replicas",
        "2",
        "--steps",
        "256",
        "--checkpoint",
        str(tmp_path / "c.npz"),
        "--checkpoint-every",
        "nan",
    ]
    assert cli_main(argv) == 2
    assert "checkpoint_every=nan is out of range" in capsys.readouterr().err


# -- checkpoints ------------------------------------------------------------------------

#: One small run of several chunks (Pod(2), N = 10; a shape the suite compiles anyway).
RUN = dict(replicas=2, steps=8 * 256, warmup=256, levels=12, seed=5, init="empty")


def _plan():
    from jaxqueue.runs import planner

    return planner.plan("pod", [0.9], 10, d=2, **RUN)


def test_a_checkpoint_path_that_cannot_be_written_is_refused_before_the_first_step(
    tmp_path, no_run
):
    with pytest.raises(
        ValueError,
        match=r"checkpoint='.*nowhere/c.npz' cannot be written "
        r"\(No such file or directory\): give a path",
    ):
        jq.simulate("pod", 0.9, 10, checkpoint=str(tmp_path / "nowhere" / "c.npz"), **RUN)


def test_the_first_save_comes_early_and_a_failed_save_keeps_the_last_good_one(
    tmp_path, monkeypatch
):
    import numpy as np

    path = str(tmp_path / "c.npz")
    saves = []
    real = runner.Run.save
    monkeypatch.setattr(
        runner.Run, "save", lambda self, p: saves.append(self.block) or real(self, p)
    )
    monkeypatch.setattr(runner, "FIRST_CHECKPOINT", 0.0)
    runner.Run.start(_plan()).advance(3, checkpoint=path, checkpoint_every=1e9)
    assert saves and saves[0] <= 3  # the first chunk's end, not checkpoint_every's 1e9 s
    good = runner.Run.resume(_plan(), path).block

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    with pytest.raises(
        RuntimeError,
        match=r"checkpoint .*c.npz cannot be written \(No space left "
        r"on device\); the last one saved, if any, is kept",
    ):
        runner.Run.resume(_plan(), path).advance(checkpoint=path, checkpoint_every=0)
    monkeypatch.undo()
    assert runner.Run.resume(_plan(), path).block == good  # the last good one, intact
    assert [f.name for f in tmp_path.iterdir()] == ["c.npz"]  # no temporary file left


@pytest.mark.parametrize("damage", ["empty", "truncated", "noise"])
def test_an_unreadable_checkpoint_is_refused_with_its_path(tmp_path, damage):
    path = tmp_path / "c.npz"
    runner.Run.start(_plan()).advance(2).save(str(path))
    data = path.read_bytes()
    path.write_bytes(
        {"empty": b"", "truncated": data[: len(data) // 2], "noise": bytes(range(256)) * 8}[damage]
    )
    with pytest.raises(runner.CheckpointMismatch, match=rf"checkpoint {path} cannot be read"):
        runner.Run.resume(_plan(), str(path))


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda a: a["core/tail"].__setitem__((0, 1), 11), "more servers at a higher level"),
        (lambda a: a["core/tail"].__setitem__((1, 0), 9), "does not count every server"),
        (
            lambda a: a[next(k for k in a if k.startswith("totals/"))].flat.__setitem__(0, -1),
            "a window sum is negative",
        ),
    ],
)
def test_a_checkpoint_whose_state_no_run_reaches_is_refused(tmp_path, edit, why):
    """Edited counts once resumed (an occupancy of 1.52 was reported); the
    fingerprint alone does not see them."""
    import numpy as np

    path = tmp_path / "c.npz"
    runner.Run.start(_plan()).advance(2).save(str(path))
    with np.load(path) as data:
        arrays = {k: data[k].copy() for k in data.files}
    edit(arrays)
    # signed again, as a tampering that knew the checksum would: the consistency check
    # stands on its own
    meta = json.loads(arrays["meta"].tobytes().decode())
    meta["checksum"] = checkpoints.array_checksum({k: v for k, v in arrays.items() if k != "meta"})
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(runner.CheckpointMismatch, match=rf"holds a state no run reaches \(.*{why}"):
        runner.Run.resume(_plan(), str(path))


# -- stores and files ---------------------------------------------------------------------


def test_a_file_that_is_no_store_is_refused_untouched(tmp_path, capsys):
    import sqlite3

    spec = tmp_path / "s.toml"
    spec.write_text(
        '[grid]\npolicy = ["pod"]\nn_servers = [10]\nload = [0.5]\n[run]\nreplicas = 2\nsteps = 256\n'
    )
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database")
    foreign = tmp_path / "app.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    before = {p: p.read_bytes() for p in (text, foreign)}
    for path, message in (
        (text, "cannot be used as a store (file is not a database)"),
        (foreign, "is an SQLite file but not a jaxqueue store (its tables: users)"),
        (tmp_path, "is a folder: give a store file"),
    ):
        for argv in (
            ["export", str(path), "--csv", "-"],
            ["sweep", str(spec), "--store", str(path)],
        ):
            assert cli_main(argv) == 3, argv
            err = capsys.readouterr().err
            assert err.startswith(f"error: {path}") and message in err, err
            assert err.count("\n") == 1  # one line, no traceback
    assert before == {p: p.read_bytes() for p in (text, foreign)}  # neither was touched


def test_a_store_in_a_folder_that_does_not_exist_is_said_by_the_plan_and_refused(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(
        '[grid]\npolicy = ["pod"]\nn_servers = [10]\nload = [0.5]\n[run]\nreplicas = 2\nsteps = 256\n'
    )
    store = tmp_path / "missing" / "s.sqlite"
    assert cli_main(["sweep", str(spec), "--store", str(store), "--plan"]) == 0
    assert (
        f"note: {store} cannot be created: its folder {store.parent} does not exist"
        in capsys.readouterr().err
    )
    assert cli_main(["sweep", str(spec), "--store", str(store)]) == 3
    assert f"error: {store} cannot be used as a store: " in capsys.readouterr().err


def test_an_os_error_is_one_line(tmp_path, capsys):
    import sqlite3

    from jaxqueue.studies.grids.store import Store

    store = tmp_path / "s.sqlite"
    Store(store, "hash", "s", {}).close()
    with sqlite3.connect(store):
        pass
    out = tmp_path / "missing" / "rows.csv"
    assert cli_main(["export", str(store), "--csv", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "No such file or directory" in err and str(out) in err
    assert err.count("\n") == 1
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    assert cli_main(["export", str(store), "--csv", str(folder)]) == 2  # a folder as a file
    err = capsys.readouterr().err
    assert err == f"error: Is a directory: {folder}\n"


def test_a_store_or_checkpoint_of_other_code_is_not_resumed(tmp_path, monkeypatch, capsys):
    """Other sources, same version string: resuming a store or a checkpoint is refused
    with both digests named; reading the store (export) still works."""
    from jaxqueue.core import versions as versions_module
    from jaxqueue.studies.grids.store import Store, StoreMismatchError

    ours = versions_module.source_digest()
    assert len(ours) == 16 and versions_module.versions()["source"] == ours
    path = tmp_path / "c.npz"
    runner.Run.start(_plan()).advance(2).save(str(path))
    store = tmp_path / "s.sqlite"
    Store(store, "hash", "s", versions_module.versions()).close()
    monkeypatch.setattr(versions_module, "source_digest", lambda: "0123456789abcdef")
    monkeypatch.setattr(runner, "source_digest", versions_module.source_digest)
    with pytest.raises(
        runner.CheckpointMismatch,
        match=rf"source: '{ours}' there, "
        r"'0123456789abcdef' here",
    ):
        runner.Run.resume(_plan(), str(path))
    with pytest.raises(
        StoreMismatchError,
        match=rf"written by other versions \(.*source: {ours} there, "
        r"0123456789abcdef here.*results of different code",
    ):
        Store(store, "hash", "s", versions_module.versions())
    assert cli_main(["export", str(store), "--csv", "-"]) == 0  # reading it is fine
    assert capsys.readouterr().out.startswith("point_id,")


def test_replicas_beyond_the_host_memory_are_refused_before_any_allocation(monkeypatch, no_run):
    """1e8 replicas were killed by the system's out-of-memory killer; the estimate
    (planner.state_bytes) refuses them at the plan, against the host's memory."""
    from jaxqueue.runs import planner

    monkeypatch.setattr(planner, "host_memory", lambda: 2**30)
    plan = planner.plan("pod", [0.9], 10, d=2, **{**RUN, "replicas": 1000})
    per = planner.state_bytes(plan.system, plan.policy, 1)
    assert 200 < per < 4000  # bytes a replica: a few per level, not per server
    fits = int(0.8 * 2**30 / per)
    planner.plan("pod", [0.9], 10, d=2, **{**RUN, "replicas": fits // 2})
    with pytest.raises(
        ValueError,
        match=r"replicas \(all loads\) need about .* GiB of host "
        r"memory .* more than 80% of this machine's 1 GiB",
    ):
        jq.simulate("pod", 0.9, 10, d=2, **{**RUN, "replicas": 2 * fits})


def test_the_plan_warns_of_a_grid_past_its_sizes(tmp_path, capsys, monkeypatch):
    """--plan once said nothing about 10^6 points or 3e17 replica-steps."""
    from jaxqueue.studies.grids import grid

    spec = tmp_path / "s.toml"
    spec.write_text(
        '[grid]\npolicy = ["pod"]\nn_servers = [10]\nload = [0.5, 0.6, 0.7]\n'
        "[run]\nreplicas = 2\nsteps = 256\n"
    )
    assert cli_main(["sweep", str(spec), "--plan"]) == 0
    assert "note:" not in capsys.readouterr().err  # a small grid: no warning
    monkeypatch.setattr(grid, "LARGE_POINTS", 2)
    monkeypatch.setattr(grid, "LARGE_REPLICA_STEPS", 1000)
    assert cli_main(["sweep", str(spec), "--plan"]) == 0
    err = capsys.readouterr().err
    assert "note: 3 points (more than 2): check the spec's axes" in err
    # 5 s of compiling, 1.17e4 replica-steps (128 replicas wide) at Pod's 1.2e8 a second
    assert "note: 1.17e+04 replica-steps: about 0.00139 hours on 2 CPU cores and" in err
    assert cli_main(["sweep", str(spec), "--plan", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["warnings"]) == 2
