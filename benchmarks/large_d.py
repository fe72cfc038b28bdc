"""Replica-events per second of Pod(d) for small and large d (not a test: it prints figures).

    python benchmarks/large_d.py                  # N = 1000 and 10^4, the d below
    python benchmarks/large_d.py --levels 12      # every d with the same level bound
    python benchmarks/large_d.py --n 1000 --replicas 1000 --seconds 2

Rows: d = 2, 64 (the last drawn by Floyd's algorithm, O(d^2) an event), 65
and 100 (the first drawn from the tail, O(levels) an event), ``sqrt(N)
log(N)**2`` (Liu and Ying's scale, rounded, at most N - 1), N - 1 and N (JSQ),
at lambda = 0.9 on the machine's CPU devices. Each figure is the best of three
timed chunks after a compile-and-warm call; the last column is the cost of an
event relative to d = 2 at the same N.
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={os.cpu_count() or 1}"
    ).strip()

import argparse
import math
import time

import jax
import jax.numpy as jnp

import jaxqueue as jq
from jaxqueue.core.rng import BLOCK
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import block_words, run_blocks


def probes(n: int) -> list[int]:
    """The d of a table at ``n`` servers, in order, without repeats."""
    liu = min(n - 1, int(round(math.sqrt(n) * math.log(n) ** 2)))
    out = []
    for d in (2, 64, 65, 100, liu, n - 1, n):
        if 1 <= d <= n and d not in out:
            out.append(d)
    return out


def measure(n: int, d: int, replicas: int, seconds: float, levels: int | None) -> dict:
    """Best-of-three replica-events per second of Pod(d) at ``n`` servers."""
    pol = jq.make("pod", d=d)
    plan = planner.plan(pol, [0.9], n, 1, replicas=replicas, steps=2 * BLOCK, levels=levels)
    state = runner.Run.start(plan).core
    mesh, _, keys, lam = runner.placement(plan)

    def chunk(first, blocks):
        out = run_blocks(
            state,
            keys,
            jnp.asarray(block_words(first)),
            jnp.int32(blocks),
            lam,
            system=plan.system,
            policy=pol,
            mesh=mesh,
        )
        jax.block_until_ready(out)
        return out

    t0 = time.perf_counter()
    state, _ = chunk(0, 1)
    per_block = time.perf_counter() - t0  # an upper bound (compilation included)
    t0 = time.perf_counter()
    state, _ = chunk(1, 1)
    per_block = min(per_block, time.perf_counter() - t0)
    blocks = max(1, int(seconds / 3 / per_block))
    best, first = float("inf"), 2
    for _ in range(3):
        t0 = time.perf_counter()
        state, _ = chunk(first, blocks)
        best = min(best, time.perf_counter() - t0)
        first += blocks
    return {
        "n": n,
        "d": d,
        "levels": plan.system.levels,
        "events_per_second": replicas * blocks * BLOCK / best,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per row (about)")
    ap.add_argument("--levels", type=int, default=None, help="one level bound for every d")
    ap.add_argument("--d", type=int, nargs="*", default=None, help="these d instead")
    args = ap.parse_args(argv)
    print(f"Pod(d), lambda = 0.9, {args.replicas} replicas, {jax.device_count()} CPU devices")
    print(f"{'N':>6} {'d':>6} {'levels':>6} {'events/s':>10} {'cost / d=2':>10}")
    for n in args.n:
        base = None
        for d in args.d or probes(n):
            row = measure(n, d, args.replicas, args.seconds, args.levels)
            rate = row["events_per_second"]
            base = rate if d == 2 else base
            ratio = f"{base / rate:10.2f}" if base else f"{'':>10}"
            print(f"{n:>6} {d:>6} {row['levels']:>6} {rate:10.3g} {ratio}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
