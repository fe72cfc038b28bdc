"""The GPU check: bit-exactness of the Pallas kernel on the GPU, then throughput;
or, with ``--paper``, the paper-scale results that need a GPU.

One command on a GPU machine (needs only the project and what JAX brings):

    python benchmarks/gpu_check.py --out results/       # writes gpu_check.json and .md
    python benchmarks/gpu_check.py --paper --out paper/ # the paper's sweeps, resumed there

1. Bit-exactness: the kernel (compiled for the GPU) against the XLA engine on
   the same GPU, for Pod(2), JIQ (M > 1), JIQ-SQ(2) with a buffer and I1F:
   final states and every sum must be identical.
2. Throughput of the kernel: replica-events per second (one event is one uniformized step
   of one replica) for Pod(2) and JIQ (r = 10) at lambda = 0.9, N = 1000, at
   2^12, 2^15, 2^17 and 2^20 replicas and 16, 32 and 64 levels, for the XLA
   engine and the kernel, every kernel at 2^17 first, then 2^20, 2^15 and
   2^12. Each figure is the best of two timed calls of about half a second
   after a compile-and-warm call. The goal on an H200 is 1e10 for Pod(2) at 2^17
   replicas.

3. The product, as a user runs it, each with its wall time: every theory
   path once with the GPU as the default device (they run on the host's CPU
   in float64), ``jaxqueue.simulate`` of Pod(2) at 2^17 replicas and 10^6
   steps (the second call, and what its fixed cost is), the same through
   the command line, the README's main job (``python -m jaxqueue compare``)
   and the GPU-sized spec ``sweeps/mukherjee_hw.toml`` in its [gpu] mode
   (N to 102400, 1024 replicas a point; cut at the time left, its store
   resumes).

4. ``--paper`` (instead of 1-3): the specs whose results need a GPU, in their
   [gpu] modes (1024 replicas a point from the mean-field start):
   ``sweeps/mukherjee_hw.toml`` (N to 102400; ``sweep --plan`` estimates 1 min
   28 s on one H200) then ``sweeps/liu_ying_fig2.toml`` (N to 10^5; 9 min 40
   s), each ``python -m jaxqueue sweep SPEC --store OUT/NAME.gpu.sqlite --gpu``
   resuming the store in ``--out``, interrupted (its committed batches kept)
   when ``--paper-budget`` seconds (420 by default: the command ends within 8
   minutes) less 80 (the figures' minute, 20 s to stop) have passed; then each store's
   figures, ``python -m jaxqueue plot STORE --spec SPEC -o OUT/figures/NAME/``
   (from what the store holds: a partial store draws its points). The same
   command continues where the last one stopped (by the estimates, two or three
   calls on an H200, three or four on an H100); a spec whose store is complete
   is not run again. Each sweep's and plot's output is in ``OUT/NAME.gpu.log``.
   This process takes no GPU memory ahead (``XLA_PYTHON_CLIENT_PREALLOCATE``),
   leaving it to the sweeps. With ``--quick`` (automatic off a GPU) it is a dry
   run of the same path: each spec's [quick] mode at its smallest N
   (``OUT/NAME.dry.toml``, stores ``OUT/NAME.dry.sqlite``), in well under a
   minute on 2 CPU cores.

The exactness cases stop when ``--exact-budget`` seconds have passed, the
throughput rows when ``--budget`` seconds have and the product part when
``--product-budget`` seconds have (compiles take most of each),
so the script ends in time on any GPU; rows not reached are listed as
skipped. The JSON and the markdown table are rewritten after every case and
row, so a run cut short still leaves what it measured. Off a GPU it runs the kernel in
interpret mode at the smallest size only (``--quick``), to check the script.
It also prints the kernel's element-wise operations per replica-step
(:func:`jaxqueue.sim.kernel.step_ops`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

import jaxqueue as jq
from jaxqueue.core.rng import BLOCK, replica_keys
from jaxqueue.core.system import System
from jaxqueue.core.versions import versions
from jaxqueue.runs.initial import initial_counts
from jaxqueue.sim.blocks import block_words, run_blocks
from jaxqueue.sim.kernel import run_kernel, step_ops
from jaxqueue.sim.state import core_from_counts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEPS = os.path.join(ROOT, "sweeps")
LOAD = 0.9
N = 1000
POLICIES = {"pod": ("pod", {"d": 2}, 1, 0), "jiq": ("jiq", {}, 100, 32)}


def _setup(name, opts, m, iq, levels, replicas, buffer=None, n=N, init="mean-field"):
    policy = jq.make(name, **opts)
    system = System(n, m, buffer, buffer or levels, iq)
    policy.validate(system)
    counts = initial_counts(init, system, policy, LOAD)
    one = core_from_counts(*counts, system, policy)
    core = jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x), (replicas,) + x.shape), one)
    keys = replica_keys(7, np.arange(replicas))
    loads = jnp.full((replicas,), LOAD, jnp.float32)
    return system, policy, core, keys, loads


def _call(backend, system, policy, core, keys, first, blocks, loads, interpret):
    fb, nb = jnp.asarray(block_words(first)), jnp.int32(blocks)
    if backend == "xla":
        return run_blocks(core, keys, fb, nb, loads, system=system, policy=policy)
    return run_kernel(core, keys, fb, nb, loads, system=system, policy=policy, interpret=interpret)


EXACT_CASES = [
    ("pod", {"d": 2}, 1, 0, 16, None),
    ("jiq", {}, 100, 32, 16, None),
    ("jiq-sq", {"d": 2}, 50, 24, 4, 4),
    ("i1f", {}, 1, 0, 16, None),
]


def exactness(interpret: bool, budget: float, save) -> list[dict]:
    """The kernel against the engine on this device, bit for bit (cases not
    begun within ``budget`` seconds are skipped; ``save`` after each)."""
    rows = []
    t_start = time.perf_counter()
    for name, opts, m, iq, levels, buffer in EXACT_CASES:
        if time.perf_counter() - t_start > budget:
            rows.append({"policy": name, "n_dispatchers": m, "buffer": buffer, "skipped": True})
            save(rows)
            continue
        replicas = 256 if interpret else 4096
        t0 = time.perf_counter()
        try:
            system, policy, core, keys, loads = _setup(name, opts, m, iq, levels, replicas, buffer)
            out = {}
            for backend in ("xla", "pallas"):
                c = jax.tree.map(jnp.copy, core)
                out[backend] = jax.block_until_ready(
                    _call(backend, system, policy, c, keys, 2**32 - 3, 5, loads, interpret)
                )
        except Exception as e:  # reported, and the other cases still run
            rows.append(
                {
                    "policy": name,
                    "n_dispatchers": m,
                    "buffer": buffer,
                    "error": f"{type(e).__name__}: {e}"[:2000],
                }
            )
            traceback.print_exc()
            print(f"exactness {name} M={m} buffer={buffer}: FAILED", file=sys.stderr, flush=True)
            save(rows)
            continue
        la, lb = jax.tree.leaves(out["xla"]), jax.tree.leaves(out["pallas"])
        same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(la, lb))
        rows.append(
            {
                "policy": policy.label(),
                "n_dispatchers": m,
                "buffer": buffer,
                "levels": system.levels,
                "replicas": replicas,
                "blocks": 5,
                "identical": bool(same),
                "seconds": time.perf_counter() - t0,
            }
        )
        print(
            f"exactness {policy.label():12s} M={m:<4d} buffer={buffer}: "
            f"{'identical' if same else 'DIFFERENT'} ({rows[-1]['seconds']:.1f} s with "
            "both compiles)",
            file=sys.stderr,
            flush=True,
        )
        save(rows)
    return rows


def throughput(backend, name, levels, replicas, interpret, target_seconds=1.0) -> dict:
    pname, opts, m, iq = POLICIES[name]
    system, policy, core, keys, loads = _setup(pname, opts, m, iq, levels, replicas)
    t0 = time.perf_counter()
    core, _ = jax.block_until_ready(
        _call(backend, system, policy, core, keys, 0, 1, loads, interpret)
    )
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    core, _ = jax.block_until_ready(
        _call(backend, system, policy, core, keys, 1, 2, loads, interpret)
    )
    per_block = (time.perf_counter() - t0) / 2
    blocks = int(max(1, min(4096, target_seconds / max(per_block, 1e-9))))
    best, first = float("inf"), 3
    for _ in range(2):
        t0 = time.perf_counter()
        core, _ = jax.block_until_ready(
            _call(backend, system, policy, core, keys, first, blocks, loads, interpret)
        )
        best = min(best, time.perf_counter() - t0)
        first += blocks
    return {
        "backend": backend,
        "policy": policy.label(),
        "n_servers": N,
        "n_dispatchers": m,
        "load": LOAD,
        "levels": levels,
        "iqueue_levels": iq,
        "replicas": replicas,
        "blocks": blocks,
        "seconds": best,
        "compile_seconds": compile_s,
        "events_per_second": replicas * blocks * BLOCK / best,
    }


#: Each theory path once (run in a subprocess with the GPU as JAX's default device).
THEORY_PATHS = {
    "closed form (JIQ-Pod(2))": 'theory.mean_field("jiq-pod", 0.9, 10.0, d=2)',
    "generic fixed point (I1F)": 'theory.mean_field("i1f", 0.9)',
    "phase-type (Pod(2), hyperexp:4)": 'theory.mean_field("pod", 0.9, d=2, service="hyperexp:4")',
    "periodic (Pod(2), a rate profile)": (
        'theory.mean_field("pod", 0.8, d=2, arrivals=Profile((0.0, 5.0), (0.6, 1.4)))'
    ),
    "refined (JIQ, N = 100)": 'theory.refined_mean_field("jiq", 0.9, 10.0, n_servers=100)',
    "design (max load for T = 1.5)": 'theory.max_load_for_target("jiq-pod", 1.5, 10.0, d=2)',
    "exact chain (JIQ-Pod(2), N = 4)": 'solve_exact("jiq-pod", 0.6, 4, 2, d=2)',
}


def _timed(cmd: list[str], timeout: float) -> dict:
    """Run ``cmd`` (a user's command line) and return its wall time, exit status
    and the last lines of its output."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"seconds": time.perf_counter() - t0, "status": "timeout", "tail": str(out)[-400:]}
    return {
        "seconds": time.perf_counter() - t0,
        "status": "ok" if done.returncode == 0 else f"exit {done.returncode}",
        "tail": (done.stdout + done.stderr)[-400:],
    }


_SIMULATE = """
import json, sys, time, warnings
import jaxqueue as jq
# a timing from an empty start: its warm-up warning would follow the JSON line
warnings.simplefilter("ignore", jq.WarmupWarning)
kw = dict(d=2, replicas={replicas}, steps={steps}, warmup=0, init="empty", seed=1)
t0 = time.perf_counter(); jq.simulate("pod", 0.9, 1000, **kw); first = time.perf_counter() - t0
t0 = time.perf_counter(); res = jq.simulate("pod", 0.9, 1000, **kw); second = time.perf_counter() - t0
small = dict(kw, replicas=16)
jq.simulate("pod", 0.9, 1000, **small)
t0 = time.perf_counter(); jq.simulate("pod", 0.9, 1000, **small); base = time.perf_counter() - t0
print(json.dumps({{"first_s": first, "second_s": second, "sixteen_replicas_s": base,
                   "backend": res.settings["backend"], "T": res.mean_response_time.mean}}))
"""


def product(quick: bool, budget: float, save) -> list[dict]:
    """The product as a user runs it (see the module docstring), within ``budget`` seconds."""
    py, start, out = sys.executable, time.perf_counter(), []
    left = lambda: budget - (time.perf_counter() - start)  # noqa: E731
    replicas, steps = (2**10, 25_600) if quick else (2**17, 1_024_000)

    def add(name, row):
        row = {"what": name, **row}
        out.append(row)
        print(
            f"product: {name}: {row.get('status')} in {row.get('seconds', 0):.1f} s",
            file=sys.stderr,
            flush=True,
        )
        save(product_now=out)

    script = (
        "from jaxqueue import theory\nfrom jaxqueue.exact import solve_exact\n"
        "from jaxqueue.core.arrivals import Profile\n"
    ) + "\n".join(
        f"import time; t0 = time.perf_counter(); r = {code}; print({name!r}, "
        "round(time.perf_counter() - t0, 2))"
        for name, code in THEORY_PATHS.items()
    )
    res = _timed([py, "-c", script], min(120, left()))
    for line in res["tail"].splitlines():  # "name seconds" per path
        name, _, secs = line.rpartition(" ")
        if name in THEORY_PATHS:
            res[name] = float(secs)
    add("theory paths (every one, one process)", res)
    res = _timed([py, "-c", _SIMULATE.format(replicas=replicas, steps=steps)], min(150, left()))
    if res["status"] == "ok":
        res.update(json.loads(res["tail"].strip().splitlines()[-1]))
    add(f"jq.simulate pod(d=2) N=1000, {replicas} replicas x {steps} steps", res)
    cli = "simulate --policy pod --d 2 --servers 1000 --load 0.9 --warmup 0 --json --replicas"
    cli = [py, "-m", "jaxqueue", *cli.split(), str(replicas), "--steps", str(steps)]
    add(f"CLI simulate, {replicas} replicas x {steps} steps", _timed(cli, min(150, left())))
    main_job = [py, "-m", "jaxqueue", "compare"]
    if quick:
        main_job += ["--loads", "0.5", "--time", "10", "--replicas", "4"]
    add(
        "main job: python -m jaxqueue compare" + (" (quick)" if quick else ""),
        _timed(main_job, min(150, left())),
    )
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "spec.sqlite")
        spec = os.path.join(SWEEPS, "mukherjee_hw.toml")
        mode = "--quick" if quick else "--gpu"
        res = _timed([py, "-m", "jaxqueue", "sweep", spec, "--store", store, mode], left())
        res["points_stored"] = _points_stored(store)
        add(f"sweep sweeps/mukherjee_hw.toml {mode}", res)
    return out


def _points_stored(path: str) -> int:
    import sqlite3

    try:
        with sqlite3.connect(path) as db:
            return int(db.execute("SELECT COUNT(*) FROM points").fetchone()[0])
    except sqlite3.Error:
        return 0


#: The specs whose paper-scale results need a GPU, cheapest first (their [gpu] modes:
#: N to 102400 and to 10^5, 1024 replicas a point).
PAPER_SPECS = ("mukherjee_hw", "liu_ying_fig2")
#: Seconds of the paper budget kept for the figures, and for a stopped sweep to exit.
FIGURE_SECONDS, STOP_SECONDS = 60.0, 20.0


def dry_spec(name: str, out: str) -> str:
    """The CPU dry run's spec: ``name``'s with its [quick] grid cut to its smallest N,
    written to ``out`` (its path)."""
    from jaxqueue.studies.grids.spec_parser import toml

    with open(os.path.join(SWEEPS, f"{name}.toml"), encoding="utf-8") as f:
        text = f.read()
    quick = toml.loads(text).get("quick", {})
    smallest = min(quick.get("n_servers") or toml.loads(text)["grid"]["n_servers"])
    lines, table = [], None
    for line in text.splitlines():
        if line.strip().startswith("["):
            table = line.strip()
        if table == "[quick]" and line.strip().startswith("n_servers"):
            continue  # (one line in these specs; checked below)
        lines.append(line)
        if line.strip() == "[quick]":
            lines.append(f"n_servers = [{smallest}]")
    text = "\n".join(lines) + "\n"
    assert toml.loads(text)["quick"]["n_servers"] == [smallest], name
    path = os.path.join(out, f"{name}.dry.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _plan(spec_path: str, mode: str) -> dict:
    """``sweep --plan`` of a spec: its points, batches, replica-steps, the H200 and
    2-CPU-core estimates."""
    from jaxqueue.studies.grids.grid import plan_grid
    from jaxqueue.studies.grids.spec import load_spec

    plan = plan_grid(load_spec(spec_path, mode=mode))
    return {
        k: plan[k] for k in ("points", "batches", "replica_steps", "gpu_seconds", "cpu_seconds")
    }


def _stored(spec_path: str, mode: str, store: str) -> int:
    """The spec's points the store holds (whatever code wrote them)."""
    from jaxqueue.studies.grids.spec import load_spec
    from jaxqueue.studies.grids.store import Store, StoreMismatchError

    spec = load_spec(spec_path, mode=mode)
    try:
        with Store.open_existing(store) as opened:
            if opened.meta()["spec_hash"] != spec.spec_hash():
                return 0
            return len({p.point_id() for p in spec.points} & opened.done())
    except (OSError, StoreMismatchError):  # none yet (or one cut short as it was made)
        return 0


def _until(cmd: list[str], deadline: float, log_path: str, env: dict) -> str:
    """Run ``cmd`` (output appended to ``log_path``) until it ends or ``deadline``
    passes; then interrupt it (a sweep keeps its committed batches) and say so."""
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            code = proc.wait(timeout=max(deadline - time.perf_counter(), 1.0))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # Ctrl-C: the store keeps what was committed
            try:
                proc.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return "stopped for time (the same command resumes)"
    return "ok" if code == 0 else f"exit {code} (see {os.path.basename(log_path)})"


def paper(quick: bool, budget: float, out: str, save, env: dict) -> list[dict]:
    """The paper-scale results that need a GPU: each spec of :data:`PAPER_SPECS` swept in
    its [gpu] mode into ``out`` (resumed from the store there) while ``budget`` seconds
    allow, then its figures drawn from what the store holds. ``quick``: the CPU dry run,
    each spec's [quick] mode at its smallest N. ``env``: the environment of the sweeps'
    and plots' processes (their outputs go to ``NAME.MODE.log`` beside the store)."""
    start, rows, py = time.perf_counter(), [], sys.executable
    end, mode, tag = start + budget, "quick" if quick else "gpu", "dry" if quick else "gpu"
    for name in PAPER_SPECS:
        spec = dry_spec(name, out) if quick else os.path.join(SWEEPS, f"{name}.toml")
        store = os.path.join(out, f"{name}.{tag}.sqlite")
        row = {"spec": name, "mode": mode + (" (smallest N)" if quick else "")}
        row["spec_file"] = os.path.relpath(
            spec, out if quick else ROOT
        )  # (where the record is read)
        row.update(store=os.path.basename(store), plan=_plan(spec, mode))
        row["stored_before"] = _stored(spec, mode, store)
        t0, stop = time.perf_counter(), end - FIGURE_SECONDS - STOP_SECONDS
        if row["stored_before"] == row["plan"]["points"]:
            row["status"] = "finished before"
        elif t0 >= stop:
            row["status"] = "not started (no time left)"
        else:
            cmd = [py, "-m", "jaxqueue", "sweep", spec, "--store", store, f"--{mode}", "--progress"]
            # a dry run's store is a check's: resumed whatever code wrote it
            cmd += ["--accept-code-change"] if quick else []
            row["status"] = _until(cmd, stop, store[:-7] + ".log", env)
        row["seconds"] = time.perf_counter() - t0
        row["done"] = _stored(spec, mode, store)
        print(
            f"paper: {name}: {row['status']}, {row['done']} of {row['plan']['points']} "
            f"points stored ({row['seconds']:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
        save(paper_now=rows)
    for row in rows:  # the figures of what each store holds (a partial store: its points)
        folder = os.path.join(out, "figures", row["spec"])
        row["figures"], row["figure_status"] = [], "none (no point stored)"
        if row["done"]:
            store = os.path.join(out, row["store"])
            spec = os.path.join(out if quick else ROOT, row["spec_file"])
            cmd = [py, "-m", "jaxqueue", "plot", store, "--spec", spec, "-o", folder]
            deadline = max(end, time.perf_counter() + 30)
            row["figure_status"] = _until(cmd, deadline, store[:-7] + ".log", env)
            drawn = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
            row["figures"] = [f"figures/{row['spec']}/{f}" for f in drawn if f.endswith(".png")]
        save(paper_now=rows)
    return rows


def _paper_ok(row: dict) -> bool:
    """Whether a paper row ran as it should (stopped for time is as it should)."""
    return not row["status"].startswith("exit") and row["figure_status"] in (
        "ok",
        "none (no point stored)",
    )


def paper_markdown(meta, paper_rows) -> str:
    lines = [
        f"Paper-scale sweeps, {meta['date']}: {meta['device']}, jax {meta['jax']}, "
        f"jaxqueue {meta['jaxqueue']} ({meta['total_seconds']:.0f} s in all)",
        "",
        "| spec | mode | points stored | of | this call | seconds | estimate (H200, whole "
        "spec) | figures |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in paper_rows:
        plan, figures = r["plan"], r.get("figure_status", "(to draw)")
        if r.get("figures"):
            figures += ": " + ", ".join(os.path.basename(f) for f in r["figures"])
        lines.append(
            f"| {r['spec']} | {r['mode']} | {r['done']} ({r['stored_before']} before) | "
            f"{plan['points']} | {r['status']} | "
            f"{r['seconds']:.0f} | {plan['gpu_seconds']:.0f} s | {figures} |"
        )
    return "\n".join(lines) + "\n"


def markdown(meta, exact, rows, skipped, product_rows=(), paper_rows=()) -> str:
    if meta.get("paper_only"):
        return paper_markdown(meta, paper_rows)
    lines = [
        f"GPU check, {meta['date']}: {meta['device']}, jax {meta['jax']}, "
        f"jaxqueue {meta['jaxqueue']}",
        "",
        "Bit-exactness, kernel against the XLA engine on this device:",
        "",
        "| policy | M | buffer | levels | replicas | identical |",
        "|---|---|---|---|---|---|",
    ]
    for r in exact:
        if r.get("skipped") or r.get("error"):
            why = "skipped for time" if r.get("skipped") else "FAILED: " + r["error"][:80]
            lines.append(f"| {r['policy']} | {r['n_dispatchers']} | {r['buffer']} | | | {why} |")
            continue
        lines.append(
            f"| {r['policy']} | {r['n_dispatchers']} | {r['buffer']} | {r['levels']} | "
            f"{r['replicas']} | {'yes' if r['identical'] else 'NO'} |"
        )
    lines += [
        "",
        f"Replica-events per second, N = {N}, lambda = {LOAD} (JIQ: r = 10, 32 I-queue levels):",
        "",
        "| policy | levels | replicas | XLA engine | Pallas kernel | kernel / XLA |",
        "|---|---|---|---|---|---|",
    ]
    table = {}
    for r in rows:
        table.setdefault((r["policy"], r["levels"], r["replicas"]), {})[r["backend"]] = r
    for (pol, lv, rep), cell in table.items():
        x, k = cell.get("xla"), cell.get("pallas")
        fx = f"{x['events_per_second']:.3g}" if x else "-"
        fk = f"{k['events_per_second']:.3g}" if k else "-"
        ratio = f"{k['events_per_second'] / x['events_per_second']:.2f}" if x and k else "-"
        lines.append(f"| {pol} | {lv} | 2^{int(np.log2(rep))} | {fx} | {fk} | {ratio} |")
    if skipped:
        lines += [
            "",
            f"Skipped for time: {len(skipped)} rows ("
            + ", ".join(f"{b} {p} L={lv} 2^{int(np.log2(r))}" for b, p, lv, r in skipped)
            + ").",
        ]
    lines += [
        "",
        "Element-wise operations per replica-step in the kernel: "
        + ", ".join(f"{k} {v}" for k, v in meta["step_ops"].items())
        + ".",
    ]
    if product_rows:
        lines += [
            "",
            "The product as a user runs it (wall seconds, one process each, "
            "compiles included unless said):",
            "",
            "| what | status | seconds | notes |",
            "|---|---|---|---|",
        ]
        for r in product_rows:
            notes = {
                k: (round(v, 3) if isinstance(v, float) else v)
                for k, v in r.items()
                if k not in ("what", "status", "seconds", "tail")
            }
            lines.append(
                f"| {r['what']} | {r['status']} | {r['seconds']:.1f} | "
                f"{', '.join(f'{k} {v}' for k, v in notes.items())} |"
            )
    return "\n".join(lines) + "\n"


def _arguments(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the outputs")
    for flag, default, what in (
        ("--budget", 150.0, "the throughput rows"),
        ("--product-budget", 200.0, "the product part"),
        ("--exact-budget", 90.0, "the exactness cases"),
        ("--paper-budget", 420.0, "--paper: sweeps and figures"),
    ):
        ap.add_argument(flag, type=float, default=default, help=f"seconds for {what} ({default})")
    ap.add_argument("--quick", action="store_true", help="smallest size only (automatic off a GPU)")
    ap.add_argument(
        "--paper",
        action="store_true",
        help="instead of the checks, the paper-scale sweeps that need a GPU, into --out "
        "(resumed there), and their figures; with --quick a dry run at the smallest size",
    )
    for flag, default in (("--policies", "pod,jiq"), ("--backends", "pallas,xla")):
        ap.add_argument(flag, default=default, help=f"throughput rows for these ({default})")
    ap.add_argument("--json", action="store_true", help="the JSON record alone on stdout")
    args = ap.parse_args(argv)
    args.policies, args.backends = args.policies.split(","), args.backends.split(",")
    for value, valid, flag in (
        (args.policies, POLICIES, "--policies"),
        (args.backends, ("pallas", "xla"), "--backends"),
    ):
        if not value or any(v not in valid for v in value):
            ap.error(f"{flag} takes a comma-separated list of {', '.join(valid)}")
    return args


def _meta(dev, interpret: bool, paper_only: bool) -> dict:
    ops = {}
    for p in () if paper_only else POLICIES:  # (the kernel's: not the paper part's)
        for lv in (16, 32, 64):
            system = System(N, POLICIES[p][2], None, lv, POLICIES[p][3])
            ops[f"{p} L={lv}"] = step_ops(system, jq.make(POLICIES[p][0], **POLICIES[p][1]))
    return {
        "date": datetime.date.today().isoformat(),
        "device": getattr(dev, "device_kind", str(dev)),
        "platform": dev.platform,
        **versions(),
        "interpret": interpret,
        "step_ops": ops,
    }


def _throughput_rows(args, quick: bool, interpret: bool, rows: list, skipped: list, save):
    """The throughput rows in order, within ``--budget`` seconds."""
    sizes = (2**12,) if quick else (2**17, 2**20, 2**15, 2**12)
    # every kernel at the goal's size first, then the next size, and so on
    # (each size is a compile of its own); within a size in order of compile
    # time (JIQ at 64 levels is the slowest)
    kernels = [("pod", 16), ("jiq", 16)]
    if not quick:
        kernels = [("pod", 16), ("pod", 32), ("pod", 64), ("jiq", 16), ("jiq", 32), ("jiq", 64)]
    order = [
        (b, p, lv, r)
        for r in sizes
        for p, lv in kernels
        for b in ("pallas", "xla")
        if p in args.policies and b in args.backends
    ]
    t_rows = time.perf_counter()
    for b, p, lv, r in order:
        if time.perf_counter() - t_rows > args.budget:
            skipped.append((b, p, lv, r))
            continue
        try:
            row = throughput(b, p, lv, r, interpret, 0.3 if quick else 0.5)
        except Exception as e:  # a row that fails is reported, the others still run
            row = {"backend": b, "policy": p, "levels": lv, "replicas": r}
            row["error"] = f"{type(e).__name__}: {e}"[:500]
            print(f"{b:6s} {p:4s} L={lv:<3d} R={r:<8d} FAILED {row['error']}", file=sys.stderr)
        else:
            print(
                f"{b:6s} {row['policy']:8s} L={lv:<3d} R={r:<8d} "
                f"{row['events_per_second']:10.3e} replica-events/s "
                f"(compile {row['compile_seconds']:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
        rows.append(row)
        save()


def main(argv=None) -> int:
    args = _arguments(argv)
    env = dict(os.environ)  # the sweeps' own processes: JAX's memory defaults
    if args.paper:  # this process only plans: the sweeps' processes take the GPU's memory
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    start = time.perf_counter()
    dev = jax.devices()[0]
    interpret = dev.platform != "gpu"
    quick = args.quick or interpret
    meta = {**_meta(dev, interpret, args.paper), "paper_only": args.paper}
    print(f"device {meta['device']} ({dev.platform}), jax {jax.__version__}", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    exact, rows, skipped, product_rows, paper_rows = [], [], [], [], []

    def save(exact_now=None, product_now=None, paper_now=None):
        """Write the JSON and the markdown as they stand."""
        for now, kept in ((exact_now, exact), (product_now, product_rows), (paper_now, paper_rows)):
            if now is not None:
                kept[:] = now
        meta["total_seconds"] = time.perf_counter() - start
        record = {
            **meta,
            "exactness": exact,
            "rows": rows,
            "skipped": skipped,
            "product": product_rows,
            "paper": paper_rows,
        }
        with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
            json.dump(record, f, indent=1)
        good = [r for r in rows if "error" not in r]
        md = markdown(meta, exact, good, skipped, product_rows, paper_rows)
        with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
            f.write(md)
        return record, md

    if args.paper:
        paper(quick, args.paper_budget, args.out, save, env)
    else:
        exactness(interpret, args.exact_budget, save)
        _throughput_rows(args, quick, interpret, rows, skipped, save)
        product(quick, args.product_budget, save)
    record, md = save()
    print(json.dumps(record) if args.json else md)
    if args.paper:
        return 0 if all(_paper_ok(r) for r in paper_rows) else 1
    return 0 if all(r.get("identical", False) or r.get("skipped") for r in exact) else 1


if __name__ == "__main__":
    sys.exit(main())
