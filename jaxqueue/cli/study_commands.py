"""The study commands: ``compare`` (simulation beside the mean field over loads),
``sweep`` (a grid spec into a result store, or its plan), ``export`` and ``plot``.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

from jaxqueue.cli.paired_command import run_paired
from jaxqueue.core.config import options_from
from jaxqueue.core.progress import duration
from jaxqueue.policies import make
from jaxqueue.results.display import applies, format_metric
from jaxqueue.results.estimates import entries
from jaxqueue.results.schema import POOL_METRICS, POOL_QUANTILE_NAMES
from jaxqueue.runs.estimates import size_text
from jaxqueue.studies import compare as compare_study
from jaxqueue.studies.grids import export, grid
from jaxqueue.studies.grids import spec as grid_spec
from jaxqueue.studies.grids.store import Store
from jaxqueue.studies.plotting.figures import summary_text
from jaxqueue.studies.plotting.plot_axes import IMAGE_SUFFIXES
from jaxqueue.studies.plotting.plots import plot_store, read_store

__all__ = ["cmd_compare", "cmd_sweep", "cmd_export", "cmd_plot"]


def _policy_list(text: str) -> list:
    """``--policies``: names, or Policies where a name carries its own options
    (``NAME:OPTION=VALUE[:...]``; integers for ``d`` and ``z``)."""
    out = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, *given = item.split(":")
        if not given:
            out.append(name)
            continue
        opts = {}
        for pair in given:
            key, eq, value = pair.partition("=")
            if not eq or not key or not value:
                raise ValueError(
                    f"--policies: {item!r} is not NAME:OPTION=VALUE[:...] (e.g. jiq-pod:d=3)"
                )
            try:
                opts[key] = int(value) if key in ("d", "z") else value
            except ValueError:
                raise ValueError(
                    f"--policies: {item!r}: {key} must be an integer, got {value!r}"
                ) from None
        out.append(make(name, **opts))
    return out


def cmd_compare(args) -> int:
    if args.paired:
        return run_paired(args, _policy_list(args.policies))
    if args.metric in POOL_METRICS + POOL_QUANTILE_NAMES and args.pools is None:
        raise ValueError(
            f"--metric {args.metric} is a metric by server pool: give --pools (e.g. 0.2:2,0.8:1)"
        )
    metrics = None if args.metrics is None else dict(args.metrics)
    rows = compare_study.compare(
        _policy_list(args.policies),
        n_servers=args.servers,
        ratio=args.ratio,
        loads=args.loads,
        time_units=args.time,
        progress=args.progress,
        **options_from(args, compare_study.COMPARE_OPTIONS, metrics=metrics),
    )
    if args.json:
        print(json.dumps({"rows": [r.to_dict() for r in rows]}))
        return 0
    _print_compare(rows, args)
    return 0


#: The mark of a row whose warm-up diagnostic failed, and its footnote (the flags to change).
WARMUP_MARK = "*"
WARMUP_NOTE = (
    f"  {WARMUP_MARK}: the warm-up diagnostic failed (a warning on stderr says more): the "
    "estimate may carry the start's bias; lengthen the warm-up (--warmup-time or --warmup) "
    "or the window (--time or --steps), or let --warmup auto extend the warm-up"
)


def _print_compare(rows, args) -> None:
    """The table of ``compare``: a line per policy and load (and pool, for a pool
    metric), simulation and its 95% CI beside the mean field, and notes for n/a cells
    and for rows whose warm-up diagnostic failed (marked :data:`WARMUP_MARK`)."""
    what = args.metric.replace("_", " ")
    model = "".join(
        f", {k} {v}"
        for k, v in (("buffer", args.buffer), ("service", args.service), ("pools", args.pools))
        if v is not None
    )
    src = rows[0].simulation.settings.get("arrivals") if rows else None
    if src:
        model += f", {src['kind']} arrivals {src['label']}"
    print(
        f"N = {args.servers}, r = {args.ratio:g}{model}: {what}, simulation (95% CI) vs mean field"
    )
    by_pool = args.metric in POOL_METRICS + POOL_QUANTILE_NAMES
    pool = f" {'pool':>9s}" if by_pool else ""
    print(
        f"{'policy':18s} {'load':>6s}{pool} {'simulated':>20s} {'mean field':>11s} {'diff/CI':>8s}"
    )
    notes = _print_compare_rows(rows, args)
    for note in sorted(notes - {"warmup"}, reverse=True):
        print(
            "  n/a: "
            + {
                "zero": "the 95% CI has width 0 (every replica gave the same value, e.g. no "
                "blocked or waiting task at all), so diff/CI is undefined: run longer or "
                "more replicas",
                "none": "no 95% CI (too few replicas or batches for one)",
            }[note]
        )
    if "warmup" in notes:
        print(WARMUP_NOTE)


def _print_compare_rows(rows, args) -> set:
    """The table's lines; returns the notes they need: why cells are n/a (``"zero"``,
    ``"none"``), and ``"warmup"`` where a row's warm-up diagnostic failed."""
    by_pool = args.metric in POOL_METRICS + POOL_QUANTILE_NAMES
    notes = set()
    for r in rows:
        mark = f" {WARMUP_MARK}" if compare_study.warmup_failed(r.simulation) else ""
        if mark:
            notes.add("warmup")
        t = r.simulation.metric(args.metric)
        pred = None if r.mean_field is None else r.mean_field.metric(args.metric)
        z = r.z_score(args.metric)
        if not by_pool:
            t, pred, z, labels = [t], [pred], [z], [""]
        else:  # a row per pool
            speeds = [q["speed"] for q in r.simulation.settings["pools"]]
            labels = [f" {'speed ' + format(v, 'g'):>9s}" for v in speeds]
            t = [None] * len(labels) if t is None else entries(t)
            pred = [None] * len(labels) if pred is None else list(pred)
            z = np.broadcast_to(z, (len(labels),))
        for est, value, score, label in zip(t, pred, z, labels):
            if not applies(args.metric, est):  # (a message the policy does not send)
                est = None
            if not applies(args.metric, value):
                value = None
            sim = format_metric(est)
            if value is None:
                print(
                    f"{r.policy_label:18s} {r.load:6.3f}{label} {sim:>20s} {'-':>11s} "
                    f"{'-':>8s}{mark}"
                )
                continue
            cell = f"{score:.2f}"
            if est is None:
                cell = "-"
            elif math.isnan(score):  # no interval to scale the difference by
                notes.add("zero" if est.ci95 == 0 else "none")
                cell = "n/a"
            print(
                f"{r.policy_label:18s} {r.load:6.3f}{label} {sim:>20s} "
                f"{format_metric(float(value)):>11s} {cell:>8s}{mark}"
            )
    return notes


def cmd_sweep(args) -> int:
    mode = "quick" if args.quick else "gpu" if args.gpu else "cpu" if args.cpu else None
    spec = grid_spec.load_spec(args.spec, mode=mode)
    # a mode is another spec (its own hash): its own default store
    store = args.store or f"{spec.name}{f'.{mode}' if mode else ''}.sqlite"
    args.store = store  # (named if the sweep is interrupted)
    if args.plan:
        return _print_plan(spec, store, args)
    if args.json:
        raise ValueError("--json goes with --plan (a sweep writes its results to the store)")
    given = args.batch_points  # 0: refused
    points = grid.DEFAULT_BATCH_POINTS if given is None else given
    ran = grid.run_grid(
        spec,
        store,
        batch_points=points,
        progress=args.progress,
        accept_code_change=args.accept_code_change,
    )
    print(
        f"[jaxqueue] {spec.name}: ran {ran} of {len(spec.points)} points into {store}",
        file=sys.stderr,
    )
    return 0


def _print_plan(spec, store, args) -> int:
    given = args.batch_points  # 0: refused
    points = grid.DEFAULT_BATCH_POINTS if given is None else given
    plan = grid.plan_grid(spec, batch_points=points, store_path=store)
    if args.json:
        print(json.dumps(plan))
        return 0
    for line in plan["warnings"]:
        print(f"note: {line}", file=sys.stderr)
    if plan.get("store_error"):
        print(f"note: {plan['store_error']}; a run into it would be refused", file=sys.stderr)
    if plan["window_overruns"]:
        print(
            f"note: {plan['window_overruns']} points run more than 10% past the spec's time, "
            "as whole blocks of 256 steps",
            file=sys.stderr,
        )
    print(
        f"{plan['spec']}: {plan['points']} points ({plan['done']} stored), "
        f"{plan['shapes']} compiled shapes, {plan['batches']} batches, "
        f"{plan['replica_steps']:.3g} replica-steps; about {duration(plan['cpu_seconds'])} on "
        f"2 CPU cores and {duration(plan['gpu_seconds'])} on one H200 (estimates from "
        "measured rates)"
    )
    largest = max(plan["groups"], key=lambda g: g.get("batch_state_bytes", 0), default=None)
    if largest is not None and largest.get("batch_replicas"):
        print(
            f"largest batch: {largest['batch_replicas']} replicas of {largest['policy']}, "
            f"about {size_text(largest['batch_state_bytes'])} of replica state"
        )
    print(
        f"{'policy':18s} {'N':>8s} {'M':>7s} {'buffer':>6s} {'points':>6s} {'batches':>7s} "
        f"{'replica-steps':>13s}"
    )
    for g in plan["groups"]:
        span = lambda v: str(v) if isinstance(v, int) else f"{v[0]}-{v[-1]}"  # noqa: E731
        buf = "inf" if g["buffer"] is None else span(g["buffer"])
        print(
            f"{g['policy']:18s} {span(g['n_servers']):>8s} {span(g['n_dispatchers']):>7s} {buf:>6s} "
            f"{g['points']:6d} {g['batches']:7d} {g['replica_steps']:13.3g}"
        )
    return 0


def cmd_export(args) -> int:
    if not (args.csv or args.parquet or args.netcdf):
        raise ValueError("export needs at least one of --csv, --parquet, --netcdf")
    for flag, path in (("--parquet", args.parquet), ("--netcdf", args.netcdf)):
        if path == "-":
            raise ValueError(f"{flag} - : only --csv writes to stdout; give {flag} a file name")
    with Store.open_existing(args.store) as store:
        rows, meta = store.rows(), store.meta()
        if args.csv:
            to_stdout = args.csv == "-"
            n = store.export_csv(sys.stdout if to_stdout else args.csv)
            where = "stdout" if to_stdout else args.csv
            print(f"[jaxqueue] wrote {n} rows to {where}", file=sys.stderr)
    if args.parquet:
        n = export.export_parquet(rows, args.parquet)
        print(f"[jaxqueue] wrote {n} rows to {args.parquet}", file=sys.stderr)
    if args.netcdf:
        export.export_netcdf(rows, args.netcdf, meta)
        print(f"[jaxqueue] wrote a Dataset of {len(rows)} rows to {args.netcdf}", file=sys.stderr)
    return 0


def _plot_jobs(args) -> list[tuple[str, str]]:
    """``(figure, file)`` of each figure ``plot`` draws: ``-o`` is the file where it has
    an image suffix (one figure), else a folder of ``NAME.png``."""
    spec, _ = read_store(args.store, args.spec)
    names = [args.figure] if args.figure is not None else [f.name for f in spec.figures]
    if not names:
        raise ValueError(f"spec {spec.name!r} has no [[figure]] table")
    suffix = os.path.splitext(args.output)[1].lower()
    if suffix in IMAGE_SUFFIXES:
        if len(names) > 1:
            raise ValueError(
                f"-o {args.output} is one {suffix[1:].upper()} file and spec {spec.name!r} has "
                f"{len(names)} figures ({', '.join(names)}): pick one with --figure NAME, or "
                "give -o a folder"
            )
        return [(names[0], args.output)]
    if suffix in (".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp", ".svgz", ".pgf"):
        raise ValueError(f"-o {args.output}: plot writes {', '.join(IMAGE_SUFFIXES)} files")
    return [(n, os.path.join(args.output, f"{n}.png")) for n in names]


def cmd_plot(args) -> int:
    if args.dpi <= 0:
        raise ValueError(f"--dpi must be positive, got {args.dpi}")
    jobs = _plot_jobs(args)
    report = {}
    for name, out in jobs:
        lines = plot_store(args.store, name, out, spec_path=args.spec, dpi=args.dpi)
        report[name] = {"file": out, "lines": lines}
        print(f"[jaxqueue] wrote {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(report))
        return 0
    for name, item in report.items():
        benchmark = next((ln["benchmark"] for ln in item["lines"] if ln.get("benchmark")), None)
        against = f"the {benchmark} benchmark" if benchmark else "theory"
        print(f"figure {name} ({item['file']}): simulation against {against}")
        for line in item["lines"]:
            panel = "" if line["panel"] is None else f"[{line['panel']}] "
            text = summary_text(line)
            print(f"  {panel}{line['label']:28s} {line['points']:3d} points  {text}")
            rrel = line.get("refined_max_relative_error")
            if rrel is not None:
                rz = line["refined_max_z"]
                print(
                    f"  {'':{len(panel)}s}{'  refined mean field at N':28s} {'':10s} max "
                    f"relative error {100 * rrel:.2f}% at x = {line['refined_at_x']:g}"
                    + (f", max |diff| / CI {rz:.2f}" if rz is not None else "")
                )
    return 0
