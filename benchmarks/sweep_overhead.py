"""What the sweep layer adds to the batches it runs (not a test: it prints figures).

    python benchmarks/sweep_overhead.py            # 256 points of Pod(2), N = 100
    python benchmarks/sweep_overhead.py --json     # machine-readable, alone on stdout
    python benchmarks/sweep_overhead.py --points 64

A grid of many small points (Pod(2), N = 100, one load each, run lengths in
steps so that the points batch together) is run twice after a warm-up that
compiles its one shape: once through ``run_grid`` into a fresh SQLite store,
and once as the same batches through the runner directly (the same plans,
no spec, no store, no theory). The overhead is the difference over the
direct time (fastest of each over interleaved repeats, and the median of
the paired ratios). It is reported with theory "none" (spec parsing, point
ids, planning, rows and SQLite commits) and with theory "mean-field" (which
adds one closed-form mean field per point, their quantiles solved per batch).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxqueue.core.versions import versions
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.studies.grids.grid import DEFAULT_BATCH_POINTS, _bounds, run_grid
from jaxqueue.studies.grids.spec import parse_spec

SPEC = """
name = "overhead"
[grid]
policy = [{{ name = "pod", d = 2 }}]
n_servers = [100]
load = [{loads}]
[run]
replicas = {replicas}
steps = {steps}
warmup = 2560
seed = 0
theory = "{theory}"
"""


def direct(spec, batch_points: int) -> float:
    """Seconds to run the spec's batches through the runner alone (same plans)."""
    points = list(spec.points)
    levels, iq = _bounds(points)
    run = spec.run
    t0 = time.perf_counter()
    for i in range(0, len(points), batch_points):
        batch = points[i : i + batch_points]
        pad = [batch[-1]] * (batch_points - len(batch))
        plan = planner.plan(
            "pod",
            [p.load for p in batch + pad],
            100,
            1,
            replicas=run.replicas,
            steps=run.steps_for(batch[0]),
            warmup=run.warmup_for(batch[0]),
            seed=run.seed,
            levels=levels,
            iqueue_levels=iq,
            streams=[p.seed_word(run.seed) for p in batch] + [0] * len(pad),
            d=2,
        )
        runner.run(plan)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=256)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--steps", type=int, default=25600)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of each")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    loads = ", ".join(f"{x:.6f}" for x in np.linspace(0.3, 0.95, args.points))
    out = {
        "points": args.points,
        "replicas": args.replicas,
        "steps": args.steps,
        "batch_points": DEFAULT_BATCH_POINTS,
        "versions": versions(),
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for theory in ("none", "mean-field"):
            spec = parse_spec(
                SPEC.format(loads=loads, replicas=args.replicas, steps=args.steps, theory=theory)
            )
            warm = parse_spec(
                SPEC.format(loads="0.5", replicas=args.replicas, steps=args.steps, theory=theory)
            )
            run_grid(warm, Path(tmp) / f"warm-{theory}.sqlite")  # compile outside the timing
            direct(spec, DEFAULT_BATCH_POINTS)
            # Interleaved, so that a change in the machine's load hits both alike;
            # the fastest of each is the least disturbed.
            t_direct, t_grid = [], []
            for rep in range(args.repeats):
                t_direct.append(direct(spec, DEFAULT_BATCH_POINTS))
                t0 = time.perf_counter()
                run_grid(spec, Path(tmp) / f"grid-{theory}-{rep}.sqlite")
                t_grid.append(time.perf_counter() - t0)
            ratios = sorted(g / d for g, d in zip(t_grid, t_direct))
            row = {
                "theory": theory,
                "direct_s": min(t_direct),
                "grid_s": min(t_grid),
                "overhead": min(t_grid) / min(t_direct) - 1,
                "paired_median_overhead": ratios[len(ratios) // 2] - 1,
            }
            out["rows"].append(row)
            print(
                f"[sweep_overhead] theory={theory}: direct {min(t_direct):.2f} s, grid "
                f"{min(t_grid):.2f} s",
                file=sys.stderr,
            )
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"{args.points} points of Pod(2), N = 100, {args.replicas} replicas x {args.steps} "
        f"steps, {DEFAULT_BATCH_POINTS} points per batch"
    )
    print(
        f"{'theory':12s} {'direct (s)':>10s} {'grid (s)':>10s} {'overhead':>9s} "
        f"{'paired median':>13s}"
    )
    for r in out["rows"]:
        print(
            f"{r['theory']:12s} {r['direct_s']:10.2f} {r['grid_s']:10.2f} "
            f"{100 * r['overhead']:8.1f}% {100 * r['paired_median_overhead']:12.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
