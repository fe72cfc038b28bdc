"""Wall time of the 1/N-refined mean field of JIQ-Pod(2) on a grid of (lambda, r) (not a test).

    python benchmarks/refined_grid.py [--n 100] [--loads 0.5,0.98] [--ratios 1,10]
                                      [--servers 100,1000] [--chunk 16] [--json]

lambda runs linearly and r logarithmically over the given ranges (default a
100 x 100 grid, lambda in [0.5, 0.98], r in [1, 10]). The truncation is the
smallest that leaves less than 1e-12 of mass past the bounds at every point,
read off the closed form (the tail ``s_L`` and the I-queue tail ``Q_J``).
One call of :func:`jaxqueue.theory.finite_n.refined.refined_grid` does the whole grid
(Newton from the closed form, then the correction, vmapped in chunks); the
figures are the first call (compile included) and a second call, and a
summary of the corrections: ``T`` of the mean field, its ``1 / N``
coefficient and the refined ``T`` at each ``N``. With ``--json`` the figures
go to stderr and one JSON object alone to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import numpy as np

from jaxqueue.theory.closed.closed_forms import tail
from jaxqueue.theory.closed.p0 import iqueue_distribution, solve_p0
from jaxqueue.theory.finite_n import refined

_MASS = 1e-12


def _pair(text: str) -> tuple[float, float]:
    lo, hi = (float(v) for v in text.split(","))
    return lo, hi


def _truncation(loads, ratios, d: int) -> tuple[int, int]:
    """``(levels, iqueue_levels)`` leaving less than ``_MASS`` past the bounds everywhere."""
    with jax.enable_x64(True):
        lam, r = np.meshgrid(loads, ratios, indexing="ij")
        s = np.asarray(tail("jiq-pod", lam, r, d=d, levels=64))
        levels = int(np.argmax(s.max(axis=(0, 1)) < _MASS))
        law = np.asarray(iqueue_distribution(solve_p0(lam, r, d).p0, lam, r, d, jmax=2000))
    q = np.cumsum(law[..., ::-1], axis=-1)[..., ::-1]  # Q_j = P(size >= j)
    return max(levels, 2), int(np.argmax(q.max(axis=(0, 1)) < _MASS))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="grid points per axis (default 100)")
    ap.add_argument(
        "--loads", type=_pair, default=(0.5, 0.98), help="lambda range (default 0.5,0.98)"
    )
    ap.add_argument("--ratios", type=_pair, default=(1.0, 10.0), help="r range (default 1,10)")
    ap.add_argument("--servers", default="100,1000", help="N values (default 100,1000)")
    ap.add_argument("--d", type=int, default=2, help="JIQ-Pod(d) probes (default 2)")
    ap.add_argument("--chunk", type=int, default=16, help="points per vmapped batch (default 16)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    loads = np.linspace(*args.loads, args.n)
    ratios = np.logspace(np.log10(args.ratios[0]), np.log10(args.ratios[1]), args.n)
    servers = tuple(int(v) for v in args.servers.split(","))
    levels, iqueue_levels = _truncation(loads, ratios, args.d)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        grid = refined.refined_grid(
            "jiq-pod",
            loads,
            ratios,
            servers,
            d=args.d,
            levels=levels,
            iqueue_levels=iqueue_levels,
            chunk=args.chunk,
        )
        times.append(time.perf_counter() - t0)
    points = loads.size * ratios.size
    ok = grid.status == 0
    t_mf = grid.mean_field["mean_response_time"]
    v_t = grid.correction["mean_response_time"]
    print(
        f"JIQ-Pod({args.d}) refined mean field on a {args.n} x {args.n} grid: lambda in "
        f"[{loads[0]:g}, {loads[-1]:g}], r in [{ratios[0]:g}, {ratios[-1]:g}], levels={levels}, "
        f"iqueue_levels={iqueue_levels} (state dimension {levels + iqueue_levels})",
        file=out,
    )
    print(
        f"  first call {times[0]:.1f} s (compile included), second call {times[1]:.1f} s = "
        f"{1e3 * times[1] / points:.1f} ms a point on {jax.device_count()} "
        f"{jax.devices()[0].platform.upper()} device(s); {int(ok.sum())}/{ok.size} "
        f"(point, N) converged",
        file=out,
    )
    print(
        f"  {'lambda':>6s} {'r':>6s} {'T mean field':>12s} {'V_T':>10s} "
        + " ".join(f"{'T at N=' + str(n):>12s}" for n in servers),
        file=out,
    )
    picks = [(i, j) for i in (0, args.n // 2, args.n - 1) for j in (0, args.n // 2, args.n - 1)]
    for i, j in picks:
        row = " ".join(
            f"{grid.refined['mean_response_time'][i, j, k]:12.5f}" for k in range(len(servers))
        )
        print(
            f"  {loads[i]:6.3f} {ratios[j]:6.2f} {t_mf[i, j]:12.5f} {v_t[i, j]:10.4f} {row}",
            file=out,
        )
    rel = {n: float(np.nanmax(np.abs(v_t / n) / t_mf)) for n in servers}
    i, j = np.unravel_index(np.nanargmax(np.abs(v_t)), v_t.shape)
    print(
        f"  largest |V_T| = {abs(v_t[i, j]):.3f} at lambda = {loads[i]:.3f}, r = "
        f"{ratios[j]:.2f}; largest |V_T / N| / T: "
        + ", ".join(f"{100 * v:.2f}% at N={n}" for n, v in rel.items()),
        file=out,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "policy": f"jiq-pod(d={args.d})",
                    "grid": [args.n, args.n],
                    "loads": [float(loads[0]), float(loads[-1])],
                    "ratios": [float(ratios[0]), float(ratios[-1])],
                    "servers": list(servers),
                    "levels": levels,
                    "iqueue_levels": iqueue_levels,
                    "chunk": args.chunk,
                    "first_call_seconds": times[0],
                    "second_call_seconds": times[1],
                    "ms_per_point": 1e3 * times[1] / points,
                    "converged": int(ok.sum()),
                    "cases": int(ok.size),
                    "max_abs_correction_T": float(abs(v_t[i, j])),
                    "max_relative_correction_T": {str(n): v for n, v in rel.items()},
                    "jax": jax.__version__,
                    "devices": f"{jax.device_count()} {jax.devices()[0].platform}",
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
