"""``compare --paired``: differences on common random numbers (docs/crn.md) in place
of the mean field: one policy's loads from the first, or at each load the policies
from the first."""

from __future__ import annotations

import json

from jaxqueue.core.arrivals import as_arrivals
from jaxqueue.core.config import Model
from jaxqueue.core.system import dispatchers_for_ratio
from jaxqueue.studies.compare import run_lengths, with_options
from jaxqueue.studies.crn.paired import paired

__all__ = ["run_paired"]


def run_paired(args, policies: list) -> int:
    """``compare --paired`` with ``policies`` (names or Policies) and the other flags of ``args``."""
    m = dispatchers_for_ratio(args.servers, args.ratio)
    source = as_arrivals(args.arrivals)
    models = [
        Model(
            with_options(pol, args.d, args.z),
            args.servers,
            m,
            buffer=args.buffer,
            service=args.service,
            pools=args.pools,
            arrivals=source,
        )
        for pol in policies
    ]
    keys = dict(
        replicas=args.replicas,
        **run_lengths(args.steps, args.time, args.warmup, args.warmup_time),
        seed=args.seed,
        metrics=None if args.metrics is None else dict(args.metrics),
        progress=args.progress,
    )
    if len(models) == 1:
        found = [paired(models, list(args.loads), **keys)]
    else:
        found = [paired(models, load, **keys) for load in args.loads]
    if args.json:
        print(json.dumps({"comparisons": [c.to_dict() for c in found]}))
        return 0
    print("\n\n".join(str(c) for c in found))
    return 0
