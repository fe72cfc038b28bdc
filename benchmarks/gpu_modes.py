"""A spec's [gpu] mode against its full mode, on the small points a CPU can run (prints figures).

    python benchmarks/gpu_modes.py                          # every spec with a [gpu] table
    python benchmarks/gpu_modes.py --specs mukherjee_hw --max-servers 400 --json

A [gpu] mode trades the full mode's long windows for many replicas over short
windows from the mean-field start, so that a program's lockstep batch fills a
GPU. Its promise is an interval no wider than the full mode's, without a
bias the full mode does not have. This runs the points of both modes with at
most ``--max-servers`` servers (the large ones are for a GPU) through
:func:`jaxqueue.studies.grids.grid.run_grid`, each mode into a store of its own,
and prints for each point and metric of the spec's figures: both estimates,
the ratio of the half-widths (gpu / full; at most 1 is the promise) and
``z``, the difference over the two half-widths combined in quadrature (a
95% interval of the difference is ``|z| <= 1``). With ``F`` comparisons, a
``|z|`` above the Bonferroni factor at family size ``F`` (printed) says the
two modes disagree beyond chance (a family-wise level of 1e-3, at the
full mode's replicas). Theory is left out (neither mode needs it
to be compared).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from jaxqueue.core.versions import versions
from jaxqueue.results.stats import tolerance_factor
from jaxqueue.studies.grids.grid import run_grid
from jaxqueue.studies.grids.spec import load_spec
from jaxqueue.studies.grids.store import SCALAR_INDEX, Store

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"


def _small(spec, max_servers: int):
    """The spec with only its points of at most ``max_servers`` servers, and no theory."""
    points = tuple(p for p in spec.points if p.servers <= max_servers)
    return dataclasses.replace(
        spec, points=points, run=dataclasses.replace(spec.run, theory="none")
    )


def _rows(spec, folder: Path, mode: str) -> tuple[dict, float]:
    path = folder / f"{spec.name}.{mode}.sqlite"
    t0 = time.perf_counter()
    run_grid(spec, path, log=sys.stderr)
    wall = time.perf_counter() - t0
    with Store(path, spec.spec_hash(), spec.name, versions()) as store:
        rows = store.rows()
    index = lambda r: None if r["k"] == SCALAR_INDEX else int(r["k"])  # noqa: E731
    return {(r["point_id"], r["metric"], index(r)): r for r in rows}, wall


def _metrics(spec) -> set[tuple[str, int | None]]:
    """(metric, index) of the spec's figures; a figure over the index axis gives indices 1 .. 5."""
    out = set()
    for fig in spec.figures:
        for metric in fig.metrics:
            if fig.index is not None:
                out.add((metric, int(fig.index)))
            elif fig.x == "k":
                out.update((metric, k) for k in range(1, 6))
            else:
                out.add((metric, None))
    return out


def compare(name: str, max_servers: int, folder: Path) -> dict:
    path = SWEEPS / f"{name}.toml"
    full, gpu = (_small(load_spec(path, mode=m), max_servers) for m in (None, "gpu"))
    if not full.points:
        raise SystemExit(f"{name}: no point has at most {max_servers} servers")
    full_rows, full_wall = _rows(full, folder, "full")
    gpu_rows, gpu_wall = _rows(gpu, folder, "gpu")
    wanted = _metrics(full)
    out = []
    for key, f in sorted(full_rows.items(), key=lambda kv: (kv[1]["n_servers"], str(kv[0]))):
        if (key[1], key[2]) not in wanted or key not in gpu_rows:
            continue
        g = gpu_rows[key]
        if not f["ci95"] or not g["ci95"]:
            continue  # a metric that does not vary (an empty tail) says nothing
        z = (g["mean"] - f["mean"]) / math.hypot(f["ci95"], g["ci95"])
        label = f["policy"] + ("" if f["d"] is None else f"({f['d']})")
        axis = next(
            (f"{a}={f[a]:g}" for a in ("alpha", "beta") if f[a] is not None), f"load={f['load']:g}"
        )
        out.append(
            {
                "point": f"{label} N={f['n_servers']} {axis}",
                "metric": key[1],
                "index": key[2],
                "full": [f["mean"], f["ci95"]],
                "gpu": [g["mean"], g["ci95"]],
                "width_ratio": g["ci95"] / f["ci95"],
                "z": z,
            }
        )
    return {
        "spec": name,
        "max_servers": max_servers,
        "points": len(full.points),
        "full_wall_s": full_wall,
        "gpu_wall_s": gpu_wall,
        "full": {"replicas": full.run.replicas},
        "gpu": {"replicas": gpu.run.replicas},
        "comparisons": out,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    named = sorted(p.stem for p in SWEEPS.glob("*.toml") if "\n[gpu]" in p.read_text())
    ap.add_argument("--specs", default=",".join(named), help=f"comma-separated (default {named})")
    ap.add_argument("--max-servers", type=int, default=1000)
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.specs.split(","):
            results.append(compare(name, args.max_servers, Path(tmp)))
    family = sum(len(r["comparisons"]) for r in results)
    # a 95% half-width rescaled to a family-wise level of 1e-3 (Bonferroni) at the fewer replicas
    least = min(r["full"]["replicas"] for r in results)
    factor = tolerance_factor(least, family)
    summary = {
        "family": family,
        "bonferroni_factor": factor,
        "beyond": sum(abs(c["z"]) > factor for r in results for c in r["comparisons"]),
        "widest_ratio": max(c["width_ratio"] for r in results for c in r["comparisons"]),
        "versions": versions(),
    }
    if args.json:
        print(json.dumps({"specs": results, "summary": summary}))
        return 0
    for r in results:
        print(
            f"{r['spec']}: {r['points']} points of N <= {r['max_servers']}; full mode "
            f"{r['full']['replicas']} replicas, {r['full_wall_s']:.0f} s; gpu mode "
            f"{r['gpu']['replicas']} replicas, {r['gpu_wall_s']:.0f} s on this machine"
        )
        print(f"  {'point':34s} {'metric':24s} {'full':>20s} {'gpu':>20s} {'width':>6s} {'z':>6s}")
        for c in r["comparisons"]:
            metric = c["metric"] + ("" if c["index"] is None else f"[{int(c['index'])}]")
            full, gpu = (f"{m:.4g} ± {h:.2g}" for m, h in (c["full"], c["gpu"]))
            print(
                f"  {c['point']:34s} {metric:24s} {full:>20s} {gpu:>20s} "
                f"{c['width_ratio']:6.2f} {c['z']:6.2f}"
            )
    print(
        f"{summary['family']} comparisons; widest gpu/full half-width ratio "
        f"{summary['widest_ratio']:.2f}; |z| above the Bonferroni factor "
        f"{summary['bonferroni_factor']:.2f}: {summary['beyond']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
