"""Several processes (``jax.distributed``, CPU collectives over gloo) give the one-process result.

Two processes of one CPU device each form a global replica mesh on this
machine; a third process runs the same call alone on one device. Keys are by
position, so every process of the distributed run must return the
single-process result bit for bit: a plain run, a run checkpointed midway
and resumed (the file written by process 0, read by both), and a finished
checkpoint read back at once. Each process runs on a clock of its own (the
runner's chunk lengths follow process 0's). A sweep (``run_grid``) run by
two processes writes, from process 0, the store one process writes, and a
rerun of it by both finds every point done.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

TIMEOUT = 240  # seconds, per process

HELPER = textwrap.dedent(
    """
    import json, os, sys

    import jax

    jax.config.update("jax_num_cpu_devices", 1)  # before jaxqueue, which keeps a chosen count
    out, ckdir, port, pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if port != "-":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                                   process_id=pid)

    import jaxqueue as jq
    from jaxqueue.runs import planner
    from jaxqueue.sim import runner

    # Each process its own clock, for the runner's chunk lengths and checkpoint times: process
    # 0's chunks grow as fast as they may, process 1's would stay at one block. The processes
    # must still run the same chunks (process 0's).
    ticks = [0.0]


    def perf_counter():
        ticks[0] += 1e-6 if pid == 0 else 1.0
        return ticks[0]


    runner.time = type(sys)("fake_time")
    runner.time.perf_counter = perf_counter
    assert runner._agree(5 + pid, 1 - pid) == (5, 1)
    ARGS = dict(d=2, replicas=8, steps=10_000, seed=5, warmup=2_000, backend="xla")


    def clean(result):
        d = result.to_dict()
        for key in ("wall_seconds", "devices"):  # the only settings that may differ
            d["settings"].pop(key)
        return json.dumps(d, sort_keys=True)


    record = {"processes": jax.process_count(), "devices": len(jax.devices()),
              "local_devices": jax.local_device_count()}
    record["plain"] = clean(jq.simulate("pod", 0.9, 100, **ARGS))
    p = planner.plan("pod", [0.9], 100, **ARGS)
    path = os.path.join(ckdir, "run.npz")
    runner.Run.start(p).advance(13).save(path)  # mid-batch of the window
    resumed = runner.Run.resume(p, path).advance(checkpoint=path, checkpoint_every=0)
    record["resumed"] = clean(resumed.results()[0])
    record["finished"] = clean(jq.simulate("pod", 0.9, 100, checkpoint=path, **ARGS))
    record["files"] = sorted(os.listdir(ckdir))

    from jaxqueue.studies.grids.grid import run_grid
    from jaxqueue.studies.grids.spec import parse_spec

    spec = parse_spec(GRID_SPEC)
    record["grid_ran"] = run_grid(spec, os.path.join(ckdir, "grid.sqlite"), batch_points=2)
    record["grid_rerun"] = run_grid(spec, os.path.join(ckdir, "grid.sqlite"), batch_points=2)
    record["grid_files"] = sorted(os.listdir(ckdir))
    with open(out, "w") as f:
        json.dump(record, f)
    """
)

#: A small grid of two sizes and three loads (one program; three batches of
#: two points, each spread over the processes' devices).
GRID_SPEC = """
name = "two_hosts"
[grid]
policy = [{ name = "pod", d = 2 }]
n_servers = [6, 8]
load = [0.4, 0.6, 0.8]
[run]
replicas = 4
steps = 2048
warmup = 512
seed = 7
theory = "none"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    script = tmp_path / "helper.py"
    script.write_text(HELPER.replace("GRID_SPEC", repr(GRID_SPEC)))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # no forced device count: one device per process
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    port = str(_free_port())
    (tmp_path / "shared").mkdir()
    (tmp_path / "alone").mkdir()
    jobs = {
        "process 0": (tmp_path / "p0.json", "shared", port, "0"),
        "process 1": (tmp_path / "p1.json", "shared", port, "1"),
        "single": (tmp_path / "single.json", "alone", "-", "0"),
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(script), str(out), str(tmp_path / ckdir), port_, pid],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (out, ckdir, port_, pid) in jobs.items()
    }
    logs, failed = {}, []
    try:
        for name, proc in procs.items():
            try:
                logs[name] = proc.communicate(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                logs[name] = proc.communicate()
                failed.append(f"{name} timed out after {TIMEOUT} s")
                continue
            if proc.returncode != 0:
                failed.append(f"{name} exited with {proc.returncode}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if failed:
        detail = "\n".join(f"--- {n} stderr ---\n{err[-6000:]}" for n, (_, err) in logs.items())
        pytest.fail("; ".join(failed) + "\n" + detail)

    rec = {name: json.loads(out.read_text()) for name, (out, *_) in jobs.items()}
    assert (rec["single"]["processes"], rec["single"]["devices"]) == (1, 1)
    for name in ("process 0", "process 1"):
        r = rec[name]
        assert (r["processes"], r["devices"], r["local_devices"]) == (2, 2, 1)
        for key in ("plain", "resumed", "finished"):
            assert r[key] == rec["single"]["plain"], f"{name}: {key} differs from one process"
    assert rec["single"]["resumed"] == rec["single"]["finished"] == rec["single"]["plain"]
    # process 0 alone wrote the checkpoint, atomically: no temporary files are left
    assert rec["process 1"]["files"] == ["run.npz"]
    # the sweep: process 0 wrote the store, with the rows one process writes
    from jaxqueue.studies.grids.store import Store

    for name in ("process 0", "process 1"):
        assert (rec[name]["grid_ran"], rec[name]["grid_rerun"]) == (6, 0)
    # no checkpoint left; the store's lock file (held by process 0 while it wrote) stays
    assert rec["process 1"]["grid_files"] == ["grid.sqlite", "run.npz"]
    with (
        Store.open_existing(tmp_path / "shared" / "grid.sqlite") as two,
        Store.open_existing(tmp_path / "alone" / "grid.sqlite") as one,
    ):
        assert len(one.rows()) > 6 * 10 and two.rows() == one.rows()
