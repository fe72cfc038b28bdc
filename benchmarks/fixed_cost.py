"""What a run costs besides its stepping, against the replicas (not a test: it prints figures).

    python benchmarks/fixed_cost.py                     # 16, 2^12, 2^15 replicas
    python benchmarks/fixed_cost.py --replicas 16,131072 --steps 1024000 --json

Pod(2) at N = 1000, load 0.9, from an empty start with no warm-up (the
figures measure the run, not the queue). Each size is run once to compile,
then timed in three parts of the runner: the plan and the initial state on
the devices, the stepping (the chunk loop, which pulls each chunk's sums to
the host and adds them there), and the results (estimates, response-time
quantiles of every replica). The fixed cost is the wall time less the
stepping's share at the kernel's or engine's rate, i.e. the plan, the start
and the results, plus the host work of the chunk loop.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax

from jaxqueue.core.rng import BLOCK
from jaxqueue.core.versions import versions
from jaxqueue.runs import planner
from jaxqueue.sim import runner


def measure(replicas: int, steps: int, backend: str) -> dict:
    kw = dict(
        d=2, replicas=replicas, steps=steps, warmup=0, init="empty", backend=backend, batches=20
    )
    for _ in range(2):  # the first compiles
        t0 = time.perf_counter()
        p = planner.plan("pod", [0.9], 1000, **kw)
        run = runner.Run.start(p)
        jax.block_until_ready(run.core)
        t1 = time.perf_counter()
        run.advance()
        t2 = time.perf_counter()
        run.results()
        t3 = time.perf_counter()
    stepped = replicas * p.measure_blocks * BLOCK
    return {
        "replicas": replicas,
        "steps": p.measure_blocks * BLOCK,
        "backend": p.backend,
        "plan_and_start_s": t1 - t0,
        "stepping_s": t2 - t1,
        "results_s": t3 - t2,
        "wall_s": t3 - t0,
        "replica_steps_per_s": stepped / (t2 - t1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--replicas",
        default=f"16,{2**12},{2**15}",
        help="comma-separated replica counts (default 16,4096,32768)",
    )
    ap.add_argument("--steps", type=int, default=25_600, help="measured steps per replica")
    ap.add_argument("--backend", default="auto", help="auto, xla, registers or pallas")
    ap.add_argument("--json", action="store_true", help="print one JSON record on stdout")
    args = ap.parse_args()
    rows = []
    for r in (int(x) for x in args.replicas.split(",")):
        rows.append(measure(r, args.steps, args.backend))
        print(f"[fixed_cost] {r} replicas done", file=sys.stderr, flush=True)
    record = {
        "benchmark": "fixed_cost",
        "platform": jax.devices()[0].platform,
        "devices": jax.device_count(),
        "versions": versions(),
        "rows": rows,
    }
    if args.json:
        print(json.dumps(record, indent=1))
        return
    print(
        f"Pod(2), N = 1000, load 0.9, {rows[0]['steps']} steps, on {record['platform']} "
        f"({record['devices']} devices)"
    )
    print(
        f"{'replicas':>9} {'backend':>8} {'plan+start':>11} {'stepping':>9} {'results':>8} "
        f"{'wall':>7} {'replica-steps/s':>16}"
    )
    for row in rows:
        print(
            f"{row['replicas']:>9} {row['backend']:>8} {row['plan_and_start_s']:>10.3f}s "
            f"{row['stepping_s']:>8.3f}s {row['results_s']:>7.3f}s {row['wall_s']:>6.2f}s "
            f"{row['replica_steps_per_s']:>16.3g}"
        )


if __name__ == "__main__":
    main()
