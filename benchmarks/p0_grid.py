"""Wall time of the p0 fixed point on a 1000 x 1000 grid (not a test: it prints figures).

    python benchmarks/p0_grid.py [--n 1000] [--d 1] [--json]

lambda runs linearly over [0.01, 0.999] and r logarithmically over [0.1, 1000];
the figures are the first call (compile included) and the best of three
calls after it, in float32 and in float64.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import numpy as np

from jaxqueue import theory


def _time(loads, ratios, d):
    t0 = time.perf_counter()
    sol = theory.p0_grid(loads, ratios, d)
    jax.block_until_ready(sol)
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        sol = theory.p0_grid(loads, ratios, d)
        jax.block_until_ready(sol)
        best = min(best, time.perf_counter() - t0)
    status = np.asarray(sol.status)
    return {
        "first_call_seconds": first,
        "solve_seconds": best,
        "points": int(status.size),
        "converged": int((status == 0).sum()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument(
        "--d", type=int, default=1, help="probes of the JIQ-Pod(d) fallback (default 1: JIQ)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = {}
    for name, x64 in (("float32", False), ("float64", True)):
        with jax.enable_x64(x64):
            loads = np.linspace(0.01, 0.999, args.n)
            ratios = np.logspace(-1, 3, args.n)
            rows[name] = _time(loads, ratios, args.d)
        r = rows[name]
        print(
            f"{name}: {args.n}x{args.n} grid, d={args.d}: {r['solve_seconds']:.2f} s "
            f"({r['first_call_seconds']:.2f} s with compile), {r['converged']}/{r['points']} "
            "converged",
            file=sys.stderr if args.json else sys.stdout,
        )
    if args.json:
        print(json.dumps({"grid": args.n, "d": args.d, **rows, "jax": jax.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
