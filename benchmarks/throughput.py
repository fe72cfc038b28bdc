"""Replica-events per second of the simulator (not a test: it prints figures).

    python benchmarks/throughput.py            # the standard table
    python benchmarks/throughput.py --json     # machine-readable, alone on stdout
    python benchmarks/throughput.py --quick    # a smaller table

Rows: Pod(2) and JIQ at N = 1000, r = 10, lambda = 0.9 for 1, 100, 1000 and
10000 replicas, then N = 100 and N = 10^6 at the largest batch, which shows
that the cost of an event does not grow with N. JIQ-Original and
JIQ-Threshold(1) keep per-server state (O(N) memory per replica): their rows
are N = 1000 and, at 100 replicas, N = 100 and N = 10^4. Phase-type service
(``--services``, default erlang:2, erlang:4 and hyperexp:4) adds rows for Pod(2)
and JIQ at N = 1000 and 10^4 replicas; so do arrival sources (``--arrivals``,
default profile, mmpp and trace: a 24-segment daily profile with peak 1.5 x
the mean, a two-state MMPP with rates 0.5 and 1.5, and a trace of 10^5
arrivals with bursty gaps), and server pools (``--pools``, default
0.2:2,0.8:1: 20% of the servers twice as fast). Each figure is the best of
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

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxqueue as jq
from jaxqueue.core.rng import BLOCK
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import block_words, run_blocks


def source(kind: str):
    """The benchmark's arrival source of a kind (profile, mmpp, trace)."""
    from jaxqueue.core.arrivals import MMPP, Profile, Trace

    if kind == "profile":
        return Profile.from_function(
            lambda t: 1.0 + 0.5 * np.sin(2 * np.pi * t / 240.0), 240.0, 24, label="daily"
        )
    if kind == "mmpp":
        return MMPP(((-0.1, 0.1), (0.1, -0.1)), (0.5, 1.5), label="two-state")
    if kind == "trace":
        rng = np.random.default_rng(0)
        gaps = rng.exponential(1.0, 10**5) * np.where(rng.random(10**5) < 0.1, 5.0, 0.5)
        return Trace(np.cumsum(gaps), label="bursty")
    raise ValueError(f"--arrivals: unknown kind {kind!r}: use profile, mmpp or trace")


def measure(
    name: str,
    n: int,
    ratio: float,
    load: float,
    replicas: int,
    target_events: float,
    service: str | None = None,
    arrivals: str | None = None,
    pools: str | None = None,
) -> dict:
    """Best-of-three replica-events per second for one configuration."""
    pol = jq.make(name)  # the policy's defaults: d = 2, z = 1
    m = max(1, int(round(n / ratio)))
    plan = planner.plan(
        pol,
        [load],
        n,
        m,
        replicas=replicas,
        steps=2 * BLOCK,
        warmup=0,
        service=service,
        init="empty" if service or pools else "auto",
        arrivals=source(arrivals) if arrivals else None,
        pools=pools,
    )
    system = plan.system
    lv, iq = system.levels, system.iqueue_levels
    state = runner.Run.start(plan).core
    mesh, _, keys, lam = runner.placement(plan)
    blocks = max(1, int(target_events // (plan.padded * BLOCK)))
    t0 = time.perf_counter()
    state, _ = run_blocks(
        state,
        keys,
        jnp.asarray(block_words(0)),
        jnp.int32(1),
        lam,
        system=system,
        policy=pol,
        mesh=mesh,
    )
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - t0
    best = float("inf")
    first = 1
    for _ in range(3):
        t0 = time.perf_counter()
        state, stats = run_blocks(
            state,
            keys,
            jnp.asarray(block_words(first)),
            jnp.int32(blocks),
            lam,
            system=system,
            policy=pol,
            mesh=mesh,
        )
        jax.block_until_ready((state, stats))
        best = min(best, time.perf_counter() - t0)
        first += blocks
    events = replicas * blocks * BLOCK  # padded replicas are not counted
    return {
        "policy": pol.label(),
        "n_servers": n,
        "n_dispatchers": m,
        "load": load,
        "replicas": replicas,
        "levels": lv,
        "iqueue_levels": iq,
        "service": service or "exp",
        "arrivals": arrivals or "poisson",
        "pools": pools or "identical",
        "events_per_second": events / best,
        "seconds": best,
        "events": events,
        "compile_and_first_block_seconds": compile_s,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer and shorter rows")
    ap.add_argument("--policies", default="pod,jiq,jiq-original,jiq-threshold")
    ap.add_argument("--events", type=float, default=2e8, help="events per timed chunk")
    ap.add_argument(
        "--services",
        default="erlang:2,erlang:4,hyperexp:4",
        help="phase-type laws of the extra rows (empty: none)",
    )
    ap.add_argument(
        "--arrivals",
        default="profile,mmpp,trace",
        help="arrival sources of the extra rows (empty: none)",
    )
    ap.add_argument(
        "--pools",
        default="0.2:2,0.8:1",
        help="server pools of the extra rows, FRACTION:SPEED,... (empty: none)",
    )
    args = ap.parse_args(argv)
    pols = [p for p in args.policies.split(",") if p]
    rows = []
    batches = (1, 100, 1000, 10000) if not args.quick else (100, 10000)
    configs = [
        (p, 1000, r) for p in pols for r in batches if r <= 1000 or not jq.make(p).per_server
    ]
    for p in pols:
        per_server = jq.make(p).per_server
        for n in (100, 10**4) if per_server else (100, 10**6):
            configs.append((p, n, 100 if per_server else batches[-1]))
    configs = [c + (None, None, None) for c in configs]
    for law in (s for s in args.services.split(",") if s):
        configs += [(p, 1000, batches[-1], law, None, None) for p in ("pod", "jiq") if p in pols]
    for kind in (s for s in args.arrivals.split(",") if s):
        configs += [(p, 1000, batches[-1], None, kind, None) for p in ("pod", "jiq") if p in pols]
    if args.pools:
        configs += [
            (p, 1000, batches[-1], None, None, args.pools) for p in ("pod", "jiq") if p in pols
        ]
    for name, n, r, law, kind, pools in configs:
        target = args.events * (0.2 if args.quick else 1.0) * min(1.0, r / 1000)
        row = measure(name, n, 10.0, 0.9, r, max(target, 2e5), law, kind, pools)
        rows.append(row)
        print(
            f"{row['policy']:10s} {row['service']:10s} {row['arrivals']:8s} {row['pools']:12s} N={n:<8d} replicas={r:<6d} levels={row['levels']:<3d} "
            f"iq_levels={row['iqueue_levels']:<3d} {row['events_per_second']:10.3e} replica-events/s",
            file=sys.stderr if args.json else sys.stdout,
            flush=True,
        )
    meta = {
        "devices": [str(d) for d in jax.devices()],
        "platform": jax.devices()[0].platform,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "versions": {"jaxqueue": jq.__version__, "jax": jax.__version__, "numpy": np.__version__},
    }
    if args.json:
        print(json.dumps({"rows": rows, **meta}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
