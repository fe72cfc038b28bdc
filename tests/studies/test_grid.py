"""Grid experiments: batching by compiled shape, per-point streams, the store, resuming."""

import csv
import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxqueue.cli import main as cli_main
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import run_blocks
from jaxqueue.studies.grids.grid import plan_grid, run_grid, shape_groups
from jaxqueue.studies.grids.spec import SpecError, parse_spec
from jaxqueue.studies.grids.store import Store, StoreMismatchError

SPEC = """
name = "small"
[grid]
policy = ["pod", "jiq"]
n_servers = [6]
n_dispatchers = [2]
load = [{loads}]
[run]
replicas = 4
steps = 2048
warmup = 512
seed = 3
theory = "mean-field"
"""
LOADS = "0.3, 0.5, 0.6, 0.7, 0.8"


def _rows(path):
    with Store.open_existing(path) as store:
        return store.rows()


@pytest.mark.slow
def test_streams_make_a_point_independent_of_its_batch():
    kw = dict(replicas=3, steps=4 * 256, warmup=256, levels=12, seed=2, devices=jax.devices()[:1])
    both = runner.run(planner.plan("pod", [0.4, 0.7], 6, streams=[11, 22], **kw))
    alone = runner.run(planner.plan("pod", [0.7], 6, streams=[22], **kw))
    swapped = runner.run(planner.plan("pod", [0.7, 0.4], 6, streams=[22, 11], **kw))
    for other in (alone[0], swapped[0]):
        np.testing.assert_array_equal(both[1].tail.mean, other.tail.mean)
        assert both[1].mean_response_time == other.mean_response_time
    with pytest.raises(ValueError, match="one word in"):
        planner.plan("pod", [0.4, 0.7], 6, streams=[1], **kw)


@pytest.mark.slow
def test_grid_order_and_batching_do_not_change_the_rows(tmp_path):
    spec = parse_spec(SPEC.format(loads=LOADS))
    shuffled = parse_spec(SPEC.format(loads="0.7, 0.3, 0.8, 0.6, 0.5"))
    before = run_blocks._cache_size()
    assert run_grid(spec, tmp_path / "a.sqlite", batch_points=2) == 10
    # two shape groups (pod, jiq) of five loads each, batches of 2 (the last padded): two compiles
    assert run_blocks._cache_size() - before <= 2
    run_grid(shuffled, tmp_path / "b.sqlite", batch_points=5)
    a, b = _rows(tmp_path / "a.sqlite"), _rows(tmp_path / "b.sqlite")
    assert len(a) == len(b) > 0 and a == b
    # the theory column: the mean field beside the simulated mean response time
    t = [r for r in a if r["metric"] == "mean_response_time"]
    assert len(t) == 10 and all(r["theory"] is not None and r["theory"] >= 1.0 for r in t)
    # a rerun finds everything committed, and the plan says so
    assert run_grid(spec, tmp_path / "a.sqlite", batch_points=2) == 0
    plan = plan_grid(spec, batch_points=2, store_path=tmp_path / "a.sqlite")
    assert (plan["done"], plan["batches"], plan["replica_steps"]) == (10, 0, 0)


def test_plan_counts_shapes_batches_and_replica_steps(tmp_path):
    spec = parse_spec(SPEC.format(loads=LOADS))
    plan = plan_grid(spec, batch_points=2, store_path=tmp_path / "none.sqlite")
    assert not (tmp_path / "none.sqlite").exists()
    # two shapes (pod, jiq) of five loads: batches of 2, the last padded to 2
    assert (plan["points"], plan["done"], plan["shapes"], plan["batches"]) == (10, 0, 2, 6)
    assert plan["replica_steps"] == 6 * 2 * 4 * (2048 + 512)
    assert [g["policy"] for g in plan["groups"]] == ["pod(d=2)", "jiq"]
    with pytest.raises(ValueError, match="batch_points=0"):
        plan_grid(spec, batch_points=0)


def test_plan_reports_a_store_of_another_spec_and_each_mode_has_its_own_store(
    tmp_path, capsys, monkeypatch
):
    from jaxqueue.core.versions import versions

    spec = parse_spec(SPEC.format(loads=LOADS))
    with Store(tmp_path / "other.sqlite", "not-this-spec", "other", versions()):
        pass
    plan = plan_grid(spec, batch_points=2, store_path=tmp_path / "other.sqlite")
    assert "holds results of another spec" in plan["store_error"]
    assert (plan["done"], plan["batches"]) == (0, 6)
    assert plan_grid(spec, batch_points=2)["store_error"] is None
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.format(loads=LOADS) + "[quick]\nreplicas = 2\n[gpu]\nreplicas = 8\n")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["sweep", str(path), "--plan", "--store", "other.sqlite"]) == 0
    assert "a run into it would be refused" in capsys.readouterr().err
    seen = []
    monkeypatch.setattr(
        "jaxqueue.studies.grids.grid.run_grid",
        lambda spec, store, **kw: seen.append((spec.run.replicas, str(store))) or 0,
    )
    assert cli_main(["sweep", str(path), "--quick"]) == 0 and cli_main(["sweep", str(path)]) == 0
    assert cli_main(["sweep", str(path), "--gpu"]) == 0
    assert seen == [(2, "small.quick.sqlite"), (4, "small.sqlite"), (8, "small.gpu.sqlite")]
    with pytest.raises(SystemExit) as info:  # one mode at a time
        cli_main(["sweep", str(path), "--gpu", "--quick"])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_cli_sweep_plan_runs_nothing(tmp_path, capsys):
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.format(loads=LOADS))
    store = tmp_path / "s.sqlite"
    assert cli_main(["sweep", str(path), "--store", str(store), "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["points"] == 10 and plan["batches"] == 2 and not store.exists()
    assert cli_main(["sweep", str(path), "--store", str(store), "--plan"]) == 0
    assert "2 compiled shapes" in capsys.readouterr().out


@pytest.mark.slow
def test_refined_theory_beside_the_mean_field(tmp_path, capsys):
    from jaxqueue.studies.plotting.figures import FigureSpec, figure_series, summarize
    from jaxqueue.theory import mean_field
    from jaxqueue.theory.finite_n.refined import refined_mean_field

    # Pod(2) and JIQ-Original (no generic mean field: no refined value); the JIQ family's
    # refined values are checked in tests/theory/test_refined.py
    spec = parse_spec(
        SPEC.format(loads="0.5, 0.7")
        .replace('"mean-field"', '"refined"')
        .replace('["pod", "jiq"]', '["pod", "jiq-original"]')
    )
    assert run_grid(spec, tmp_path / "r.sqlite", batch_points=2) == 4
    rows = [r for r in _rows(tmp_path / "r.sqlite") if r["metric"] == "mean_response_time"]
    assert len(rows) == 4
    for r in rows:
        ratio = None if r["policy"] == "pod" else 3.0
        assert r["theory"] == mean_field(r["policy"], r["load"], ratio).mean_response_time
        if r["policy"] == "pod":
            ref = refined_mean_field("pod", r["load"], n_servers=6)
            assert r["refined"] == ref.refined.mean_response_time
        else:
            assert r["refined"] is None
    fig = FigureSpec(name="t", metrics=("mean_response_time",), x="load")
    lines = summarize(figure_series(_rows(tmp_path / "r.sqlite"), fig))
    assert any(line.get("refined_max_relative_error") is not None for line in lines)


def test_store_of_another_layout_is_refused(tmp_path):
    path = tmp_path / "old.sqlite"
    Store(path, "h", "n", {"jaxqueue": "x"}).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    with pytest.raises(StoreMismatchError, match="table layout 1"):
        Store(path, "h", "n", {"jaxqueue": "x"})


@pytest.mark.slow
def test_one_compile_for_many_loads(tmp_path):
    loads = ", ".join(f"{x:.2f}" for x in np.linspace(0.1, 0.8, 12))
    spec = parse_spec(
        SPEC.format(loads=loads)
        .replace('["pod", "jiq"]', '["random"]')
        .replace('theory = "mean-field"', 'theory = "none"')
    )
    assert len(shape_groups(spec)) == 1
    before = run_blocks._cache_size()
    assert run_grid(spec, tmp_path / "s.sqlite", batch_points=5, devices=jax.devices()[:1]) == 12
    assert run_blocks._cache_size() - before == 1  # 3 batches (the last padded), one program
    # run lengths in time units: each load has its own length; they share batches
    # (each its own window), so the batches are those above and reuse their program
    timed = parse_spec(
        SPEC.format(loads=loads)
        .replace('["pod", "jiq"]', '["random"]')
        .replace("steps = 2048", "time = 20")
        .replace("warmup = 512", "warmup = 512")
        .replace('theory = "mean-field"', 'theory = "none"')
    )
    before = run_blocks._cache_size()
    # time = 20 at N = 6 is 132 to 216 steps: one block of 256 each, said once
    with pytest.warns(planner.WindowWarning, match="at 12 of 12 points"):
        ran = run_grid(timed, tmp_path / "t.sqlite", batch_points=5, devices=jax.devices()[:1])
    assert ran == 12 and run_blocks._cache_size() - before == 0
    assert plan_grid(timed, batch_points=5)["batches"] == 3


def test_init_auto_keeps_sizes_apart_that_start_otherwise():
    """Under init = "auto" N < 100 starts empty and larger N at the mean field:
    such points get programs of their own (a point starts as it would alone)."""
    text = SPEC.format(loads="0.4").replace("n_servers = [6]", "n_servers = [6, 50, 200, 400]")
    assert len(shape_groups(parse_spec(text))) == 2  # pod, jiq
    assert len(shape_groups(parse_spec(text.replace("seed = 3", 'seed = 3\ninit = "auto"')))) == 4


@pytest.mark.slow
def test_one_program_for_many_sizes_and_the_rows_of_each_size_alone(tmp_path):
    """Servers 6, 8 and 10 at two loads under JIQ (2 dispatchers) share one
    compiled program (N and M are per-replica numbers); each point's rows are
    those of a grid of its size alone, the level bounds aside."""
    text = (
        SPEC.format(loads="0.4, 0.7")
        .replace('["pod", "jiq"]', '["jiq"]')
        .replace("n_servers = [6]", "n_servers = [6, 8, 10]")
        .replace('theory = "mean-field"', 'theory = "none"')
    )
    spec = parse_spec(text)
    assert len(shape_groups(spec)) == 1 and plan_grid(spec, batch_points=6)["shapes"] == 1
    before = run_blocks._cache_size()
    assert run_grid(spec, tmp_path / "all.sqlite", batch_points=6, devices=jax.devices()[:1]) == 6
    assert run_blocks._cache_size() - before == 1
    alone = parse_spec(text.replace("n_servers = [6, 8, 10]", "n_servers = [8]"))
    assert run_grid(alone, tmp_path / "8.sqlite", devices=jax.devices()[:1]) == 2

    def values(path):
        return {
            (r["load"], r["metric"], r["k"]): (r["mean"], r["ci95"])
            for r in _rows(path)
            if r["n_servers"] == 8
        }

    mine, theirs = values(tmp_path / "all.sqlite"), values(tmp_path / "8.sqlite")
    common = mine.keys() & theirs.keys()  # the I-queue levels differ by the bounds
    assert len(common) > 0.9 * len(theirs) and {k[1] for k in theirs} <= {k[1] for k in common}
    assert {k: mine[k] for k in common} == {k: theirs[k] for k in common}


def test_a_time_window_run_past_its_end_by_whole_blocks_is_said_once_before_running():
    """time = 20 at N = 6: ceil(20 * 6 * (load + 1)) steps, run as whole blocks
    of 256; past 10% over the asked time the sweep warns once, naming the worst
    point (load 0.3: 156 steps, 256 run, 32.8 time units), and its plan counts them."""
    import warnings

    from jaxqueue.studies.grids.grid import _warn_overruns, window_overruns

    text = SPEC.format(loads="0.3, 0.8").replace("steps = 2048", "time = 20")
    spec = parse_spec(text)
    over = window_overruns(spec)
    assert len(over) == 4 and all(units == 20 for _, units, _ in over)
    assert max(sim for _, _, sim in over) == pytest.approx(256 / (6 * 1.3))
    with pytest.warns(
        planner.WindowWarning,
        match=r"time=20 is run .* at 4 of 4 points; most at .*load=0.3: "
        r"32.82 time units for 20",
    ):
        _warn_overruns(spec)
    assert plan_grid(spec)["window_overruns"] == 4
    # time = 256 / (6 * 1.8) is one block at load 0.8 exactly, and 10% under one at 0.3
    fits = parse_spec(text.replace("time = 20", "time = 23.7037037").replace("0.3, 0.8", "0.8"))
    assert window_overruns(fits) == [] and plan_grid(fits)["window_overruns"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_overruns(fits)
        _warn_overruns(parse_spec(SPEC.format(loads="0.3")))  # steps: never warned


def test_store_refuses_another_spec_or_version(tmp_path):
    path = tmp_path / "s.sqlite"
    Store(path, "hash-a", "x", {"jaxqueue": "1"}).close()
    with pytest.raises(StoreMismatchError, match="another spec"):
        Store(path, "hash-b", "x", {"jaxqueue": "1"})
    with pytest.raises(StoreMismatchError, match="other versions"):
        Store(path, "hash-a", "x", {"jaxqueue": "2"})
    with Store(path, "hash-a", "x", {"jaxqueue": "1"}) as store:
        store.commit_batch(
            0,
            [("p1", {"load": 0.5}, 0.1)],
            [{"point_id": "p1", "policy": "pod", "metric": "m", "mean": 1.0}],
        )
        assert store.done() == {"p1"}
        assert store.rows()[0]["k"] == -1.0


@pytest.mark.slow
def test_killed_sweep_resumes_to_the_rows_of_an_uninterrupted_run(tmp_path):
    loads = ", ".join(f"{x:.2f}" for x in np.linspace(0.1, 0.8, 8))
    # one policy and no theory: three fresh processes each compile what they run
    text = (
        SPEC.format(loads=loads)
        .replace("steps = 2048", "steps = 262144")
        .replace('["pod", "jiq"]', '["random"]')
        .replace('theory = "mean-field"', 'theory = "none"')
    )
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(text)
    cmd = [sys.executable, "-m", "jaxqueue", "sweep", str(spec_file), "--batch-points", "1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # uninterrupted
    subprocess.run(
        cmd + ["--store", str(tmp_path / "full.sqlite")], check=True, env=env, capture_output=True
    )
    # killed part-way: wait for the first committed batch, then SIGKILL
    killed = tmp_path / "killed.sqlite"
    proc = subprocess.Popen(
        cmd + ["--store", str(killed)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        if killed.exists():
            try:
                with sqlite3.connect(killed) as db:
                    n = db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
            except sqlite3.OperationalError:
                n = 0
            if n >= 1:
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with sqlite3.connect(killed) as db:
        part = db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
    assert 1 <= part < 8, "the kill must land part-way"
    subprocess.run(cmd + ["--store", str(killed)], check=True, env=env, capture_output=True)
    assert _rows(killed) == _rows(tmp_path / "full.sqlite")


@pytest.mark.slow
def test_cli_sweep_and_csv_export(tmp_path, capsys):
    spec_file = tmp_path / "tiny.toml"
    spec_file.write_text(SPEC.format(loads="0.5").replace('["pod", "jiq"]', '["random"]'))
    store, out = tmp_path / "tiny.sqlite", tmp_path / "tiny.csv"
    assert cli_main(["sweep", str(spec_file), "--store", str(store)]) == 0
    assert cli_main(["export", str(store), "--csv", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    need = {
        "policy",
        "n_servers",
        "n_dispatchers",
        "load",
        "d",
        "z",
        "buffer",
        "metric",
        "mean",
        "ci95",
        "theory",
    }
    assert need <= set(rows[0])
    t = [r for r in rows if r["metric"] == "mean_response_time"]
    assert len(t) == 1 and float(t[0]["mean"]) > 1.0 and float(t[0]["theory"]) > 1.0
    assert capsys.readouterr().out == ""  # logs go to stderr
    assert cli_main(["export", str(tmp_path / "missing.sqlite"), "--csv", str(out)]) == 2


@pytest.mark.slow
def test_a_sweep_stopped_inside_a_batch_resumes_there(tmp_path, monkeypatch):
    """A sweep interrupted right after a checkpoint inside its first batch resumes from
    that checkpoint, and its rows equal those of an uninterrupted sweep."""
    from jaxqueue.studies.grids import grid

    spec = parse_spec(SPEC.format(loads="0.5, 0.7"))
    run_grid(spec, tmp_path / "clean.sqlite", batch_points=2)
    path = tmp_path / "stopped.sqlite"
    monkeypatch.setattr(grid, "CHECKPOINT_EVERY", 0.0)
    real_save, real_resume, saves, resumed = runner.Run.save, runner.Run.resume, [], []

    def save_then_stop(self, where):
        real_save(self, where)
        saves.append(self.block)
        if len(saves) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(runner.Run, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run_grid(spec, path, batch_points=2)
    assert os.path.exists(f"{path}.running.npz")
    monkeypatch.setattr(runner.Run, "save", real_save)
    monkeypatch.setattr(
        runner.Run,
        "resume",
        classmethod(
            lambda cls, p, where: resumed.append(saves[-1]) or real_resume.__func__(cls, p, where)
        ),
    )
    run_grid(spec, path, batch_points=2)
    assert resumed == [saves[1]] and 0 < saves[1]
    assert _rows(tmp_path / "clean.sqlite") == _rows(path)
    assert not os.path.exists(f"{path}.running.npz")


@pytest.mark.slow
def test_finite_buffers_share_a_program_and_each_point_keeps_its_rows(tmp_path):
    """buffer = [3, 5]: one compiled program for Pod(2), both buffers in one batch, and
    each point's stored rows are the ones it gets in a spec of its buffer alone."""
    text = (
        '[grid]\npolicy = ["pod"]\nn_servers = [6]\nbuffer = [{b}]\nload = [0.8, 1.2]\n'
        '[run]\nreplicas = 3\nsteps = 1024\nwarmup = 256\nseed = 1\ninit = "empty"\n'
        'theory = "none"\n'
    )
    both = parse_spec(text.format(b="3, 5"))
    assert len(shape_groups(both)) == 1 and plan_grid(both)["batches"] == 1
    run_grid(both, tmp_path / "both.sqlite", devices=jax.devices()[:1])
    rows = {
        (r["point_id"], r["metric"], r["k"]): (r["mean"], r["ci95"])
        for r in _rows(tmp_path / "both.sqlite")
    }
    for b in (3, 5):
        one = parse_spec(text.format(b=b))
        run_grid(one, tmp_path / f"{b}.sqlite", devices=jax.devices()[:1])
        alone = _rows(tmp_path / f"{b}.sqlite")
        assert alone and all(
            rows[r["point_id"], r["metric"], r["k"]] == (r["mean"], r["ci95"]) for r in alone
        )
        assert max(r["k"] for r in alone if r["metric"] == "tail") == b
        ids = {r["point_id"] for r in alone}
        assert sum(key[0] in ids for key in rows) == len(alone)  # no rows past its own levels


def test_a_second_sweep_into_a_busy_store_stops_at_once(tmp_path, capsys):
    """Two sweeps on one store both computed everything and the second died with an
    IntegrityError traceback: now the second stops before anything runs, with one line.
    The first holds the store's lock file in another process here (a real second writer)."""
    from jaxqueue.studies.grids.store import StoreBusyError, writer_lock

    path = tmp_path / "busy.sqlite"
    spec = tmp_path / "busy.toml"
    spec.write_text(SPEC.format(loads="0.5"))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom jaxqueue.studies.grids.store import writer_lock\n"
            f"with writer_lock({str(path)!r}):\n    print('held', flush=True)\n    time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cli_main(["sweep", str(spec), "--store", str(path)]) == 3
        err = capsys.readouterr().err
        assert err == (
            f"error: another sweep is running into {path}: wait for it to end, or give "
            "another --store\n"
        )
        assert path.stat().st_size == 0  # the holder's lock made it; nothing ran into it
    finally:
        holder.kill()
        holder.communicate()
    with writer_lock(path):  # the lock went with the process; within one process too
        with pytest.raises(StoreBusyError, match="another sweep is running into"):
            run_grid(parse_spec(SPEC.format(loads="0.5")), path)


def test_the_plan_estimates_cpu_time_by_policy_and_batch_width():
    """The CPU estimate follows each policy's measured rate (JIQ with I-queues 3.6x
    slower a replica-step than Pod(2) at their reference bounds, 12 and 32 levels), a
    step's cost in proportion to the levels past those, and counts a narrow batch as
    128 replicas wide."""
    from jaxqueue.studies.grids.batching import CPU_RATES, LATENCY_REPLICAS, group_bounds

    text = SPEC.format(loads="0.5").replace('theory = "mean-field"', 'theory = "none"')
    spec = parse_spec(text)
    groups = {g["policy"]: g for g in plan_grid(spec)["groups"]}
    levels = {p.policy: group_bounds([p])[0] for p in spec.points}
    compile_s = CPU_RATES["compile_s"]
    pod, jiq = groups["pod(d=2)"], groups["jiq"]
    # 4 replicas a batch run as 128: steps x 128 / (1.2e8 x min(1, 12 / levels))
    steps = pod["replica_steps"] / 4
    pod_rate = 1.2e8 * min(1.0, 12 / levels["pod"])
    assert pod["cpu_seconds"] - compile_s == pytest.approx(
        steps * LATENCY_REPLICAS["cpu"] / pod_rate, rel=1e-9
    )
    jiq_rate = 3.3e7 * min(1.0, 32 / levels["jiq"])
    assert (jiq["cpu_seconds"] - compile_s) / (pod["cpu_seconds"] - compile_s) == pytest.approx(
        pod_rate / jiq_rate, rel=1e-9
    )
    # a bound 100 times the reference: 100 times the time
    wide = dataclasses.replace(spec, run=dataclasses.replace(spec.run, levels=1200))
    wide_pod = {g["policy"]: g for g in plan_grid(wide)["groups"]}["pod(d=2)"]
    assert wide_pod["cpu_seconds"] - compile_s == pytest.approx(
        steps * LATENCY_REPLICAS["cpu"] / (1.2e8 * 12 / 1200), rel=1e-9
    )


def test_a_spec_may_set_the_level_bound_of_its_infinite_buffers(tmp_path):
    """[run] levels reaches the runner (a bound the mean field says is too small is
    refused before anything runs, naming it), enters the hash only where given, and
    a finite buffer keeps its own bound."""
    text = SPEC.format(loads="0.9").replace('["pod", "jiq"]', '["random"]')
    text = text.replace('theory = "mean-field"', 'theory = "none"')
    plain, bound = parse_spec(text), parse_spec(text + "levels = 2\n")
    assert plain.run.levels is None and bound.run.levels == 2
    assert plain.spec_hash() != bound.spec_hash()
    assert plain.spec_hash() == parse_spec(text.replace("seed = 3", "seed = 3\n")).spec_hash()
    with pytest.raises(ValueError, match=r"levels=2 is too small for load=0.9 under random"):
        run_grid(bound, tmp_path / "s.sqlite")
    with pytest.raises(SpecError, match=r"levels=0 is out of range"):
        parse_spec(text + "levels = 0\n")
    from jaxqueue.studies.grids.grid import _bounds

    buffered = parse_spec(text.replace("n_dispatchers = [2]", "n_dispatchers = [2]\nbuffer = [3]"))
    buffered = dataclasses.replace(buffered, run=dataclasses.replace(buffered.run, levels=50))
    assert _bounds(buffered, list(buffered.points)).levels is None  # the buffer's own
    assert _bounds(bound, list(bound.points)).levels == 2
