"""Replica-events per second of the simulator (not a test: it prints figures).

    python benchmarks/throughput.py            # the standard table
    python benchmarks/throughput.py --json     # machine-readable, alone on stdout
    python benchmarks/throughput.py --quick    # a smaller table

Rows: Pod(2) and JIQ at N = 1000, r = 10, lambda = 0.9 for 1, 100, 1000 and
10000 replicas, then N = 100 and N = 10^6 at the largest batch, which shows
that the cost of an event does not grow with N. JIQ-Original and
JIQ-Threshold(1) keep per-server state (O(N) memory per replica): their rows
are N = 1000 and, at 100 replicas, N = 100 and N = 10^4. Each figure is the best of
three timed chunks after a compile-and-warm call; one event is one
uniformized step of one replica. Runs on all devices of the default backend;
on a CPU, one device per core is exposed unless XLA_FLAGS says otherwise.
"""

from __future__ import annotations

import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={os.cpu_count() or 1}"
    ).strip()

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxqueue as jq  # noqa: E402
from jaxqueue import engine, levels  # noqa: E402
from jaxqueue.config import System  # noqa: E402
from jaxqueue.driver import initial_counts, run_blocks  # noqa: E402
from jaxqueue.rng import BLOCK  # noqa: E402


def measure(name: str, n: int, ratio: float, load: float, replicas: int,
            target_events: float) -> dict:  # fmt: skip
    """Best-of-three replica-events per second for one configuration."""
    opts = {"d": 2} if name in ("pod", "jiq-pod", "jiq-sq") else {}
    pol = jq.make(name, **({"z": 1} if name == "jiq-threshold" else opts))
    m = max(1, int(round(n / ratio)))
    lv = levels.default_levels(pol, n, m, load)
    use_iq = pol.uses_iqueues and (m > 1 or pol.per_server)
    iq = levels.default_iqueue_levels(pol, n, m, load) if use_iq else 0
    system = System(n, m, None, lv, iq)
    devs = jax.devices()
    padded = -(-replicas // len(devs)) * len(devs)
    one = engine.init(*initial_counts("empty", system, pol, load), system, pol)
    mesh = jax.sharding.Mesh(np.asarray(devs), ("replica",))
    sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("replica"))
    state = jax.device_put(jax.tree.map(lambda x: jnp.broadcast_to(x, (padded,) + x.shape), one), sh)
    ids = jax.device_put(jnp.arange(padded, dtype=jnp.int32), sh)
    lam = jax.device_put(jnp.full((padded,), load, jnp.float32), sh)
    key = jax.random.key(0)
    blocks = max(1, int(target_events // (padded * BLOCK)))
    t0 = time.perf_counter()
    state = run_blocks(state, key, ids, jnp.int32(0), jnp.int32(1), lam, system=system,
                       policy=pol, mesh=mesh)  # fmt: skip
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - t0
    best = float("inf")
    first = 1
    for _ in range(3):
        t0 = time.perf_counter()
        state = run_blocks(state, key, ids, jnp.int32(first), jnp.int32(blocks), lam,
                           system=system, policy=pol, mesh=mesh)  # fmt: skip
        jax.block_until_ready(state)
        best = min(best, time.perf_counter() - t0)
        first += blocks
    events = replicas * blocks * BLOCK  # padded replicas are not counted
    return {
        "policy": pol.label(), "n_servers": n, "n_dispatchers": m, "load": load,
        "replicas": replicas, "levels": lv, "iqueue_levels": iq,
        "events_per_second": events / best, "seconds": best, "events": events,
        "compile_and_first_block_seconds": compile_s,
    }  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer and shorter rows")
    ap.add_argument("--policies", default="pod,jiq,jiq-original,jiq-threshold")
    ap.add_argument("--events", type=float, default=2e8, help="events per timed chunk")
    args = ap.parse_args(argv)
    pols = [p for p in args.policies.split(",") if p]
    rows = []
    batches = (1, 100, 1000, 10000) if not args.quick else (100, 10000)
    configs = [(p, 1000, r) for p in pols for r in batches if r <= 1000 or not jq.make(p).per_server]
    for p in pols:
        per_server = jq.make(p).per_server
        for n in (100, 10**4) if per_server else (100, 10**6):
            configs.append((p, n, 100 if per_server else batches[-1]))
    for name, n, r in configs:
        target = args.events * (0.2 if args.quick else 1.0) * min(1.0, r / 1000)
        row = measure(name, n, 10.0, 0.9, r, max(target, 2e5))
        rows.append(row)
        print(f"{row['policy']:10s} N={n:<8d} replicas={r:<6d} levels={row['levels']:<3d} "
              f"iq_levels={row['iqueue_levels']:<3d} {row['events_per_second']:10.3e} replica-events/s",
              file=sys.stderr if args.json else sys.stdout, flush=True)  # fmt: skip
    meta = {
        "devices": [str(d) for d in jax.devices()], "platform": jax.devices()[0].platform,
        "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "versions": {"jaxqueue": jq.__version__, "jax": jax.__version__, "numpy": np.__version__},
    }  # fmt: skip
    if args.json:
        print(json.dumps({"rows": rows, **meta}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
