"""Wall time of the JIQ-Threshold(z) mean field (not a test: it prints figures).

    python benchmarks/threshold_solve.py [--quick] [--json]

For each (z, r, load) of the table in docs/theory.md: the seconds of one
solve, whether it solved or was refused, the largest I-queue size and number
of busy members represented, and the share of the busy members' law left at
that bound (``busy_remainder``). ``--quick`` leaves out the points that take
more than about 20 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import numpy as np

import jaxqueue
from jaxqueue import theory

#: (z, r, load, quick)
POINTS = [
    (1, 10.0, 0.9, True),
    (1, 10.0, 0.5, True),
    (1, 10.0, 0.1, True),
    (1, 50.0, 0.5, False),
    (1, 100.0, 0.9, False),
    (2, 2.0, 0.9, True),
    (2, 4.0, 0.9, True),
    (2, 10.0, 0.9, False),
    (2, 10.0, 0.98, False),
    (2, 10.0, 0.5, False),
    (2, 20.0, 0.9, True),
    (3, 0.5, 0.5, True),
    (3, 1.0, 0.7, False),
    (3, 2.0, 0.5, True),
    (3, 2.0, 0.9, True),
    (3, 4.0, 0.5, True),
    (3, 4.0, 0.9, True),
    (3, 10.0, 0.9, True),
    (4, 2.0, 0.5, True),
    (5, 10.0, 0.5, True),
    (5, 10.0, 0.9, True),
]


def _solve(z: int, ratio: float, load: float) -> dict:
    t0 = time.perf_counter()
    try:
        mf = theory.mean_field("jiq-threshold", load, ratio, z=z)
    except RuntimeError as err:
        return {"seconds": time.perf_counter() - t0, "status": "refused", "why": str(err)}
    d = mf.diagnostics
    return {
        "seconds": time.perf_counter() - t0,
        "status": "solved",
        "mean_response_time": float(mf.mean_response_time),
        "p0": float(mf.p0),
        "iqueue_sizes": d["iqueue_sizes"],
        "busy_members": d["busy_members"],
        "busy_remainder": d["busy_remainder"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the points of about 20 s or less")
    ap.add_argument("--json", action="store_true", help="the JSON record alone on stdout")
    args = ap.parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    rows = []
    print("| z | r | load | seconds | result | J | B | busy_remainder |", file=out)
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", file=out)
    for z, ratio, load, quick in POINTS:
        if args.quick and not quick:
            continue
        row = {"z": z, "ratio": ratio, "load": load, **_solve(z, ratio, load)}
        rows.append(row)
        if row["status"] == "solved":
            what = f"T = {row['mean_response_time']:.4f}"
            bounds = f"{row['iqueue_sizes']} | {row['busy_members']} | {row['busy_remainder']:.1e}"
        else:
            what, bounds = "refused", "- | - | -"
        print(
            f"| {z} | {ratio:g} | {load:g} | {row['seconds']:.1f} | {what} | {bounds} |",
            file=out,
            flush=True,
        )
    if args.json:
        print(
            json.dumps(
                {
                    "points": rows,
                    "jaxqueue": jaxqueue.__version__,
                    "jax": jax.__version__,
                    "numpy": np.__version__,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
