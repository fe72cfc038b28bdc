"""What long runs cost beyond the step itself (not a test: it prints figures).

    python benchmarks/long_runs.py [--json]

For Pod(2) at N = 1000, lambda = 0.9 with 10^4 replicas, and for one replica
of JSQ with b = 5 at N = 10^5, lambda = 1 - N^-0.75 (a heavy-traffic run):

* ``kernel``: replica-steps per second of the compiled chunk alone;
* ``run``: the same through ``Run.advance`` (chunks of about half a second,
  each chunk's sums copied to the host and added into exact int64 totals,
  batch records), and its overhead against ``kernel``;
* ``checkpoint``: seconds and bytes of one checkpoint save.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

import jaxqueue as jq
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.system import heavy_traffic_load
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import block_words, run_blocks


def measure(policy: str, n: int, load: float, replicas: int, blocks: int, **kw) -> dict:
    p = planner.plan(
        policy,
        [load],
        n,
        replicas=replicas,
        steps=blocks * BLOCK,
        warmup=0,
        interval="replicas",
        **kw,
    )
    mesh, _, keys, lam = runner.placement(p)
    core = runner.Run.start(p).core
    core, _ = run_blocks(
        core,
        keys,
        jnp.asarray(block_words(0)),
        jnp.int32(1),
        lam,
        system=p.system,
        policy=p.policy,
        mesh=mesh,
    )  # compile
    jax.block_until_ready(core)
    t0 = time.perf_counter()
    core, stats = run_blocks(
        core,
        keys,
        jnp.asarray(block_words(1)),
        jnp.int32(blocks),
        lam,
        system=p.system,
        policy=p.policy,
        mesh=mesh,
    )
    jax.block_until_ready((core, stats))
    kernel = time.perf_counter() - t0
    run = runner.Run.start(p)
    t0 = time.perf_counter()
    run.advance()
    full = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.npz")
        t0 = time.perf_counter()
        run.save(path)
        save_s = time.perf_counter() - t0
        size = os.path.getsize(path)
    events = replicas * blocks * BLOCK
    return {
        "policy": p.policy.label(),
        "n_servers": n,
        "load": load,
        "replicas": replicas,
        "steps_per_replica": blocks * BLOCK,
        "kernel_events_per_second": events / kernel,
        "run_events_per_second": events / full,
        "overhead": full / kernel - 1.0,
        "checkpoint_seconds": save_s,
        "checkpoint_bytes": size,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    n_ht = 10**5
    rows = [
        measure("pod", 1000, 0.9, 10_000, 80),
        measure("jsq", n_ht, heavy_traffic_load(n_ht, 0.75), 1, 40_000, buffer=5),
    ]
    out = sys.stderr if args.json else sys.stdout
    for r in rows:
        print(
            f"{r['policy']:8s} N={r['n_servers']:<7d} replicas={r['replicas']:<6d} kernel "
            f"{r['kernel_events_per_second']:.3e}/s  run {r['run_events_per_second']:.3e}/s "
            f"(overhead {100 * r['overhead']:+.1f}%)  checkpoint {r['checkpoint_seconds']:.3f} s, "
            f"{r['checkpoint_bytes'] / 1e6:.2f} MB",
            file=out,
        )
    if args.json:
        meta = {
            "devices": len(jax.devices()),
            "platform": jax.devices()[0].platform,
            "versions": {"jaxqueue": jq.__version__, "jax": jax.__version__},
        }
        print(json.dumps({"rows": rows, **meta}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
