"""``policies``: the registered policies, their options (defaults), mean fields and
summaries. It imports the registry alone (JAX, for the policies' rules), not the
theory or the simulator.
"""

from __future__ import annotations

import json

from jaxqueue.cli.markup import plain
from jaxqueue.policies.registry import available, make

__all__ = ["cmd_policies"]


def cmd_policies(args) -> int:
    rows = []
    for name in available():
        pol = make(name)
        rows.append(
            {
                "name": name,
                "options": pol.options(),
                "mean_field": pol.mean_field_kind(),
                "summary": plain(" ".join((type(pol).__doc__ or "").split("\n\n")[0].split())),
            }
        )
    if args.json:
        print(json.dumps({"policies": rows}))
        return 0
    print(f"{'policy':14s} {'options':22s} {'mean field':14s} summary")
    for r in rows:
        opts = ",".join(f"{k}={v}" for k, v in r["options"].items()) or "-"
        print(f"{r['name']:14s} {opts:22s} {r['mean_field']:14s} {r['summary']}")
    return 0
