"""The run commands: ``simulate`` (one policy at one load or several) and ``transient``
(ensemble estimates at given times beside the mean-field ODE).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from jaxqueue import api
from jaxqueue.cli.flags import model_of, policy_options
from jaxqueue.cli.output import emit, servers_line
from jaxqueue.core.config import Bounds, RunOptions, options_from
from jaxqueue.core.system import halfin_whitt_load, heavy_traffic_load
from jaxqueue.core.user_metrics import user_metrics
from jaxqueue.policies import make
from jaxqueue.results.display import format_metric, format_number
from jaxqueue.results.estimates import Estimate
from jaxqueue.runs.arguments import RESERVED_METRIC_NAMES
from jaxqueue.runs.transient import transient
from jaxqueue.studies.crn.sensitivity import sensitivity
from jaxqueue.studies.transient import plot_transient, transient_study

__all__ = ["cmd_simulate", "cmd_transient"]


def cmd_simulate(args) -> int:
    loads = args.loads
    if args.alpha is not None:
        loads = [heavy_traffic_load(args.servers, args.alpha)]
    if args.beta is not None:
        loads = [halfin_whitt_load(args.servers, args.beta)]
    run = RunOptions.from_namespace(args, metrics=_metrics(args))
    if args.sensitivity:
        if args.checkpoint is not None:  # (it was ignored: a long run was not saved)
            raise ValueError(
                "--checkpoint does not apply to --sensitivity (its sides run as one batch "
                "that is not saved): drop --checkpoint, or run the sides with simulate"
            )
        return _sensitivity(args, run)
    # a failed warm-up is a WarmupWarning, shown on stderr with the flags to change
    # (jaxqueue.cli's warning display); stdout stays the table or the JSON
    results = api.simulate(
        model_of(args, arrivals=args.arrivals),
        loads[0] if len(loads) == 1 else loads,
        run=run,
        bounds=Bounds(args.levels, args.iqueue_levels),
        progress=args.progress,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
    )
    if len(loads) == 1:
        return emit(results, args)
    if args.json:  # one JSON object: the results in load order
        print(json.dumps({"loads": loads, "results": [res.to_dict() for res in results]}))
        return 0
    for i, res in enumerate(results):
        print("" if i == 0 else "\n", end="")
        emit(res, args)
    return 0


def _sensitivity(args, run) -> int:
    """``simulate --sensitivity PARAMETER``: every scalar metric's derivative (docs/crn.md)."""
    at = {"load": args.loads, "alpha": args.alpha, "beta": args.beta}
    at = {k: v[0] if k == "load" and len(v) == 1 else v for k, v in at.items() if v is not None}
    res = sensitivity(
        model_of(args, arrivals=args.arrivals),
        parameter=args.sensitivity,
        run=run,
        bounds=Bounds(args.levels, args.iqueue_levels),
        progress=args.progress,
        **at,
    )
    print(json.dumps(res.to_dict()) if args.json else res)
    return 0


def _metrics(args):
    """The ``--metric NAME=EXPR`` definitions, reading ``--alpha``/``--beta`` where given."""
    if not args.metrics:
        return None
    params = {"alpha": args.alpha, "beta": args.beta}
    return user_metrics(dict(args.metrics), params, RESERVED_METRIC_NAMES)


def cmd_transient(args) -> int:
    kw = dict(
        times=args.times,
        start_load=args.start_load,
        warmup_time=args.warmup_time,
        **options_from(args, transient.option_names),
    )
    pol = make(args.policy, **policy_options(args))
    has_mf = pol.has_queue_length_ode(args.pools)
    if args.plot is not None:
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not has_mf:
            raise ValueError(
                f"--plot draws the simulation against the mean-field ODE, and "
                f"{pol.label()} has none here: leave --plot out"
            )
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"--plot {args.plot}: no folder {folder}")
    res, rows, study = _transient_run(args, pol, has_mf, kw)
    if args.plot and study is not None:
        plot_transient(study, args.plot)
    if args.json:
        out = res.to_dict()
        out["rows"] = rows
        print(json.dumps(out))
        return 0
    _print_transient(res, rows)
    if args.plot and study is None:
        print("  (no plot: JSEW with pools has no mean field to draw beside the simulation)")
    elif args.plot:
        print(f"  plot written to {args.plot}")
    return 0


def _transient_run(args, pol, has_mf: bool, kw: dict):
    """``(result, rows, study)``: the study beside the mean-field ODE where the policy has
    one, else the simulation alone (rows and study None)."""
    if has_mf:
        study = transient_study(
            args.policy,
            args.load,
            args.servers,
            args.dispatchers,
            **kw,
        )
        return study["result"], study["rows"], study
    else:  # no mean-field ODE (per-server lists, routing by speed): the simulation alone
        print(
            f"[jaxqueue] no mean-field ODE for {pol.label()} here: the simulation alone",
            file=sys.stderr,
        )
        res = transient(
            args.policy,
            args.load,
            args.servers,
            args.dispatchers,
            init="empty",
            **kw,
        )
        return res, None, None


def _print_transient(res, rows) -> None:
    """The table of a transient run: ``s_1``, ``s_2``, the idle fraction (and ``p0``)
    per time, each pool's busy fraction, and the mean field beside them where given
    (the numbers by the tables' one rule, :func:`~jaxqueue.results.display.format_metric`)."""
    s = res.settings
    step = (
        f"load {s['start_load']} -> {s['load']} (after {s['warmup_time']:g} time units)"
        if s["start_load"] is not None
        else f"load {s['load']} from empty"
    )
    print(
        f"{s['policy_label']}  N={s['n_servers']}  M={s['n_dispatchers']}  {step}  "
        f"replicas={s['replicas']}  ({s['steps']} steps per replica){servers_line(s)}"
    )
    head = ["time", "s_1 ± 95%", "s_2 ± 95%", "idle ± 95%"]
    head += ["p0 ± 95%"] if res.p0 is not None else []
    head += ["mean field s_1, s_2"] if rows else []
    table = []
    for j, t in enumerate(res.times):
        line = [f"{t:.4g}", _cell(res.tail, j, 1), _cell(res.tail, j, 2)]
        line += [_cell(res.idle_fraction, j)]
        line += [_cell(res.p0, j)] if res.p0 is not None else []
        if rows:
            mf = (rows[j]["mf_s1"], rows[j].get("mf_s2", float("nan")))
            line.append(", ".join(format_number(v) for v in mf))
        table.append(line)
    _print_columns(head, table)
    if res.pool_utilization is not None:  # each pool's busy fraction
        busy = res.pool_utilization
        pools = range(np.shape(busy.mean)[1])
        head = ["time", *(f"busy, speed {q['speed']:g}" for q in s["pools"])]
        head += ["mean field"] if rows else []
        table = []
        for j, t in enumerate(res.times):
            line = [f"{t:.4g}", *(_cell(busy, j, i) for i in pools)]
            if rows:
                line.append(", ".join(format_number(rows[j][f"mf_busy{i}"]) for i in pools))
            table.append(line)
        _print_columns(head, table)


def _cell(est, *index) -> str:
    """Entry ``index`` of the Estimate ``est`` (time first), as a table shows it."""
    return format_metric(Estimate(est.mean[index], est.ci95[index]))


def _print_columns(head: list, table: list) -> None:
    """``head`` and the rows of ``table`` in columns as wide as their widest cell."""
    widths = [max(len(c) for c in column) for column in zip(head, *table)]
    for cells in (head, *table):
        print("  " + "  ".join(f"{c:<{w}s}" for c, w in zip(cells, widths)).rstrip())
