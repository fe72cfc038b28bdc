"""The headline of Wang, Feng and Cheng (Fig. 4): mean response time at lambda = 0.98, d = 2.

The paper: T is about 2.6 for JIQ-Pod(2), 5.3 for JIQ and 4.5 for Pod(2).
The mean field gives these with r = N / M = 10
(``jaxqueue.studies.headline.headline_ratio`` fits r to the two JIQ values);
this script prints the mean-field values and a simulation at N = 1000, r = 10
beside them.

    python sweeps/headline.py [--servers 1000] [--replicas 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxqueue.studies.compare import compare
from jaxqueue.studies.headline import headline_ratio


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--time", type=float, default=400.0, help="measured time units")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    fit = headline_ratio(load=0.98, d=2)
    rows = compare(
        ["jiq", "jiq-pod", "pod"],
        n_servers=args.servers,
        ratio=10.0,
        loads=[0.98],
        d=2,
        time_units=args.time,
        replicas=args.replicas,
        seed=args.seed,
    )
    paper = {"jiq": 5.3, "jiq-pod": 2.6, "pod": 4.5}
    if args.json:
        print(
            json.dumps(
                {
                    "fitted_ratio": fit.ratio,
                    "ratios": fit.ratios,
                    "paper": paper,
                    "rows": [r.to_dict() for r in rows],
                }
            )
        )
        return 0
    print(
        f"r fitted to the paper's JIQ and JIQ-Pod values: {fit.ratio:.2f} "
        f"(JIQ alone {fit.ratios['jiq']:.2f}, JIQ-Pod alone {fit.ratios['jiq-pod']:.2f})"
    )
    print(
        f"{'policy':14s} {'paper':>6s} {'mean field r=10':>16s} {f'simulated (N={args.servers})':>22s}"
    )
    for r in rows:
        sim = r.simulation.mean_response_time
        print(
            f"{r.policy_label:14s} {paper[r.simulation.settings['policy']]:6.1f} "
            f"{r.mean_field.mean_response_time:16.3f} {sim.mean:12.3f} ± {sim.ci95:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
