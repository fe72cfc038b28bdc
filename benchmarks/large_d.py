"""Replica-events per second of Pod(d) for small and large d (not a test: it prints figures).

    python benchmarks/large_d.py                  # N = 1000 and 10^4, the d below
    python benchmarks/large_d.py --levels 12      # every d with the same level bound
    python benchmarks/large_d.py --n 1000 --replicas 1000 --seconds 2 --repeats 7

Rows: d = 2, 64 (the last drawn by Floyd's algorithm, O(d^2) an event), 65
and 100 (the first drawn from the tail, O(levels) an event), ``sqrt(N)
log(N)**2`` (Liu and Ying's scale, rounded, at most N - 1), N - 1 and N (JSQ),
at lambda = 0.9 on the machine's CPU devices. Every row is compiled and warmed
first; then each repeat times one chunk of every row in turn (interleaved, so
that a busy moment of the machine falls on all rows alike). A row reports its
median rate and the median over the repeats of the cost of an event relative
to d = 2 at the same N in the same repeat.
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
import statistics
import time

import jax
import jax.numpy as jnp

import jaxqueue as jq
from jaxqueue.core.rng import BLOCK
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import block_words, run_blocks


def probes(n: int) -> list[int]:
    """The d of a table at ``n`` servers, in order, without repeats (d = 2 first)."""
    liu = min(n - 1, int(round(math.sqrt(n) * math.log(n) ** 2)))
    out = []
    for d in (2, 64, 65, 100, liu, n - 1, n):
        if 1 <= d <= n and d not in out:
            out.append(d)
    return out


class Row:
    """One compiled Pod(d) at ``n`` servers, timed one chunk at a time."""

    def __init__(self, n: int, d: int, replicas: int, seconds: float, levels: int | None):
        self.pol = jq.make("pod", d=d)
        self.plan = planner.plan(
            self.pol, [0.9], n, 1, replicas=replicas, steps=2 * BLOCK, levels=levels
        )
        self.n, self.d, self.replicas, self.first = n, d, replicas, 0
        self.state = runner.Run.start(self.plan).core
        self.mesh, _, self.keys, self.lam = runner.placement(self.plan)
        per_block = min(self.time(1) for _ in range(2))  # compiles, then warm
        self.blocks = max(1, int(seconds / per_block))
        self.rates: list[float] = []

    def time(self, blocks: int) -> float:
        """Seconds for one chunk of ``blocks`` blocks (the state carried on)."""
        t0 = time.perf_counter()
        self.state, _ = jax.block_until_ready(
            run_blocks(
                self.state,
                self.keys,
                jnp.asarray(block_words(self.first)),
                jnp.int32(blocks),
                self.lam,
                system=self.plan.system,
                policy=self.pol,
                mesh=self.mesh,
            )
        )
        self.first += blocks
        return time.perf_counter() - t0

    def measure(self) -> float:
        rate = self.replicas * self.blocks * BLOCK / self.time(self.blocks)
        self.rates.append(rate)
        return rate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per chunk (about)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved chunks per row")
    ap.add_argument("--levels", type=int, default=None, help="one level bound for every d")
    ap.add_argument("--d", type=int, nargs="*", default=None, help="these d (d = 2 is added)")
    args = ap.parse_args(argv)
    print(
        f"Pod(d), lambda = 0.9, {args.replicas} replicas, {jax.device_count()} CPU devices, "
        f"median of {args.repeats} interleaved repeats"
    )
    print(f"{'N':>8} {'d':>8} {'levels':>6} {'events/s':>10} {'cost / d=2':>10}")
    for n in args.n:
        ds = [2] + [d for d in args.d if d != 2] if args.d else probes(n)
        rows = [Row(n, d, args.replicas, args.seconds, args.levels) for d in ds]
        ratios: dict[int, list[float]] = {d: [] for d in ds}
        for _ in range(args.repeats):
            base = None
            for row in rows:
                rate = row.measure()
                base = rate if row.d == 2 else base
                ratios[row.d].append(base / rate)
        for row in rows:
            rate, ratio = statistics.median(row.rates), statistics.median(ratios[row.d])
            levels = row.plan.system.levels
            print(f"{n:>8} {row.d:>8} {levels:>6} {rate:10.3g} {ratio:10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
