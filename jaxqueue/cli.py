"""Command line: ``python -m jaxqueue {simulate,transient,theory,exact,compare,sweep,export,plot,policies}``.

``--json`` prints one JSON object alone on stdout; progress and logs go to stderr.
``simulate``, ``theory`` and ``exact`` print the same keys (the result schema of
:mod:`jaxqueue.results.schema`), so their outputs can be compared field by field.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings

import numpy as np

from jaxqueue.results.estimates import Estimate, entries
from jaxqueue.results.schema import (
    POOL_METRICS,
    POOL_QUANTILE_NAMES,
    QUANTILE_NAMES,
    SCALAR_METRICS,
)

__all__ = ["main"]


def _loads(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--loads needs comma-separated numbers, got {text!r}"
        ) from None


def _warmup(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--warmup needs a number of steps or 'auto', got {text!r}"
        ) from None


def _add_policy(p: argparse.ArgumentParser, many: bool = False) -> None:
    if many:
        p.add_argument(
            "--policies",
            default="jiq,jiq-pod,pod",
            help="comma-separated policy names, each optionally with its own options "
            "as NAME:OPTION=VALUE[:...], e.g. jiq-pod:d=3,jiq-threshold:z=2 "
            "(default: jiq,jiq-pod,pod)",
        )
    else:
        p.add_argument("--policy", required=True, help="policy name (see `policies`)")
    shared = (
        " (to every listed policy that takes it, but those given their own options)" if many else ""
    )
    p.add_argument(
        "--d",
        type=int,
        default=None,
        help="probes d (pod, jiq-pod, jiq-sq, idle-first; jiq-original's join-SQ(d) "
        f"variant){shared}",
    )
    p.add_argument(
        "--z",
        type=int,
        default=None,
        help=f"threshold z (jiq-threshold, jiq-original's threshold variant){shared}",
    )
    if not many:
        p.add_argument(
            "--order",
            default=None,
            choices=("random", "fifo"),
            help="I-queue pick order (jiq-original; default random)",
        )


_SERVICE_HELP = (
    "service law: exp (default), erlang:K, hyperexp:SCV, fit:SCV (two-moment "
    'fit) or ph:FILE.json ({"alpha": [...], "S": [[...]]}); mean 1'
)


def _add_run(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--buffer", type=int, default=None, help="places per server b (default: infinite)"
    )
    p.add_argument("--service", default=None, help=_SERVICE_HELP)
    p.add_argument(
        "--pools",
        default=None,
        help="heterogeneous servers: FRACTION:SPEED pairs, e.g. 0.2:2,0.8:1",
    )
    p.add_argument(
        "--arrivals",
        default=None,
        help="time-varying arrivals: a CSV rate profile (header time,rate), a CSV "
        "trace of arrival times (header time[,service]; a service column is "
        "not simulated: the servers stay exponential, and it is only "
        "recorded, as mean_service) or an MMPP JSON file "
        '({"generator": [[...]], "rates": [...]}); scaled to mean load '
        "--load",
    )
    p.add_argument(
        "--replicas", type=int, default=32, help="independent replicas (per load; default 32)"
    )
    length = p.add_mutually_exclusive_group()
    length.add_argument(
        "--steps",
        type=int,
        default=None,
        help="measured uniformized steps per replica (default 1000000)",
    )
    length.add_argument(
        "--time",
        type=float,
        default=None,
        help="measured time units per replica instead of --steps (steps = "
        "time x N x the step rate per server at the load, rounded up to "
        "whole blocks of 256 steps; a warning when that simulates more "
        "than 10%% beyond --time)",
    )
    warm = p.add_mutually_exclusive_group()
    warm.add_argument(
        "--warmup",
        type=_warmup,
        default=None,
        help="discarded warm-up steps per replica (default: 100 time units), or "
        "'auto': extend it while the warm-up diagnostic fails",
    )
    warm.add_argument(
        "--warmup-time", type=float, default=None, help="warm-up time units instead of --warmup"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--levels", type=int, default=None, help="largest tracked queue length")
    p.add_argument("--iqueue-levels", type=int, default=None, help="largest tracked I-queue size")
    p.add_argument(
        "--init",
        default="auto",
        choices=("auto", "empty", "mean-field"),
        help="start (default auto: the mean-field occupancy where one exists)",
    )
    p.add_argument(
        "--interval",
        default="auto",
        choices=("auto", "replicas", "batch-means"),
        help="95%% intervals across replicas or from batch means (default auto: "
        "batch means with at most 10 replicas)",
    )
    p.add_argument(
        "--batches",
        type=int,
        default=20,
        help="batches of the measured window (1 to 10000, default 20; intervals "
        "from batch means need at least 2)",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="save the run to this file and resume from it when it exists and "
        "matches (a run stopped part-way resumes where it was saved)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=float,
        default=300.0,
        help="seconds between checkpoints (default 300; 0: every chunk)",
    )
    p.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "xla", "registers", "pallas"),
        help="what steps the replicas: auto (the Pallas kernel on a GPU where its "
        "step fits in registers, else xla), "
        "xla, pallas (interpreted off a GPU, for checking) or registers "
        "(the kernel's layout in plain XLA); results are bit-identical",
    )
    p.add_argument("--progress", action="store_true", help="progress on stderr")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m jaxqueue", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("simulate", help="simulate one policy at one load")
    _add_policy(p)
    p.add_argument(
        "--servers",
        type=int,
        required=True,
        help="N (up to 2**31 - 1; with a trace --arrivals up to 2**23 - 1)",
    )
    p.add_argument("--dispatchers", type=int, default=1, help="M (default 1)")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--load", type=float, help="lambda")
    load.add_argument(
        "--alpha", type=float, help="heavy traffic: lambda = 1 - N**(-alpha) (Liu and Ying)"
    )
    load.add_argument(
        "--beta", type=float, help="Halfin-Whitt: lambda = 1 - beta / sqrt(N) (Mukherjee et al.)"
    )
    _add_run(p)

    p = sub.add_parser(
        "transient", help="ensemble estimates at given times beside the mean-field ODE"
    )
    _add_policy(p)
    p.add_argument("--servers", type=int, required=True, help="N")
    p.add_argument("--dispatchers", type=int, default=1, help="M (default 1)")
    p.add_argument("--load", type=float, required=True, help="lambda from time 0 on")
    p.add_argument(
        "--start-load",
        type=float,
        default=None,
        help="a load step: run --warmup-time at this load first (from its mean field)",
    )
    p.add_argument(
        "--warmup-time", type=float, default=100.0, help="time units at --start-load (default 100)"
    )
    p.add_argument(
        "--times",
        type=_loads,
        default=[0.5, 1, 2, 4, 8, 16, 32],
        help="comma-separated times (default 0.5,1,2,4,8,16,32)",
    )
    p.add_argument(
        "--replicas", type=int, default=32, help="independent replicas (>= 2; default 32)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--buffer", type=int, default=None, help="places per server b (default: infinite)"
    )
    p.add_argument("--service", default=None, help=_SERVICE_HELP)
    p.add_argument("--pools", default=None, help="heterogeneous servers: FRACTION:SPEED pairs")
    p.add_argument("--plot", default=None, help="write a PNG of simulation and ODE (extra: plot)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("theory", help="mean-field prediction for one policy")
    _add_policy(p)
    p.add_argument("--load", type=float, required=True, help="lambda")
    p.add_argument(
        "--ratio", type=float, default=None, help="r = N / M (JIQ family; default: one dispatcher)"
    )
    p.add_argument(
        "--buffer", type=int, default=None, help="places per server b (default: infinite)"
    )
    p.add_argument(
        "--levels",
        type=int,
        default=None,
        help="largest queue length of the printed tail (default: automatic)",
    )
    p.add_argument(
        "--servers",
        type=int,
        default=None,
        help="N: add the 1/N-refined mean field at N servers (and its 1/N coefficients)",
    )
    p.add_argument("--service", default=None, help=_SERVICE_HELP)
    p.add_argument(
        "--pools",
        default=None,
        help="heterogeneous servers: FRACTION:SPEED pairs, e.g. 0.2:2,0.8:1",
    )
    p.add_argument(
        "--arrivals",
        default=None,
        help="a periodic rate profile (CSV time,rate): averages over the mean field's "
        "periodic regime; --load is the time-mean load",
    )
    p.add_argument(
        "--window",
        type=_window,
        default=None,
        help="START,LENGTH: with --arrivals, average over this window of the "
        "periodic regime (time 0 = the profile's start) instead of one period",
    )
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("exact", help="exact stationary solution of a small system")
    _add_policy(p)
    p.add_argument(
        "--servers", type=int, required=True, help="N (small: the state space grows fast)"
    )
    p.add_argument("--dispatchers", type=int, default=1, help="M (default 1)")
    p.add_argument("--load", type=float, required=True, help="lambda")
    p.add_argument(
        "--buffer", type=int, default=None, help="places per server b (default: infinite)"
    )
    p.add_argument(
        "--queue-bound",
        type=int,
        default=None,
        help="truncation of infinite buffers (default: automatic, mass below 1e-9)",
    )
    p.add_argument("--service", default=None, help=_SERVICE_HELP)
    p.add_argument(
        "--pools",
        default=None,
        help="heterogeneous servers: FRACTION:SPEED pairs, e.g. 0.5:2,0.5:1",
    )
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("compare", help="simulation beside mean-field theory over loads")
    _add_policy(p, many=True)
    p.add_argument("--servers", type=int, default=1000, help="N (default 1000)")
    p.add_argument("--ratio", type=float, default=10.0, help="r = N / M (default 10)")
    p.add_argument("--loads", type=_loads, default=[0.5, 0.7, 0.9, 0.95, 0.98])
    p.add_argument(
        "--time",
        type=float,
        default=300.0,
        help="measured time units per replica at the largest load (default 300)",
    )
    p.add_argument(
        "--warmup-time",
        type=float,
        default=50.0,
        help="warm-up time units, from the mean-field state (default 50)",
    )
    p.add_argument("--replicas", type=int, default=16, help="replicas per load (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--buffer", type=int, default=None, help="places per server b (default: infinite)"
    )
    p.add_argument("--service", default=None, help=_SERVICE_HELP)
    p.add_argument(
        "--pools",
        default=None,
        help="heterogeneous servers: FRACTION:SPEED pairs, e.g. 0.2:2,0.8:1",
    )
    p.add_argument(
        "--arrivals",
        default=None,
        help="time-varying arrivals (a CSV rate profile time,rate; a trace or an MMPP "
        "JSON file, simulated without a mean field), scaled to mean load --loads; "
        "each row's mean field is the periodic regime averaged over that row's "
        "measured window",
    )
    p.add_argument(
        "--metric",
        default="mean_response_time",
        choices=SCALAR_METRICS + QUANTILE_NAMES + POOL_METRICS + POOL_QUANTILE_NAMES,
        help="what the table puts side by side (default mean_response_time; "
        "p50 to p99.9: response-time quantiles; pool_*: a row per pool, "
        "with --pools, pool_p50 to pool_p99.9 each pool's quantiles); --json "
        "has every metric",
    )
    p.add_argument("--progress", action="store_true")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("sweep", help="run a grid experiment (a TOML spec) into a result store")
    p.add_argument("spec", help="the spec file (TOML)")
    p.add_argument(
        "--store",
        default=None,
        help="SQLite result store; the same command resumes (default: NAME.sqlite, "
        "with --quick NAME.quick.sqlite, with --gpu NAME.gpu.sqlite)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        action="store_true",
        help="apply the spec's [quick] overrides (a smaller grid, shorter runs)",
    )
    mode.add_argument(
        "--gpu",
        action="store_true",
        help="apply the spec's [gpu] overrides (many replicas over short windows "
        "from the mean-field start: a lockstep batch that fills a GPU)",
    )
    p.add_argument("--batch-points", type=int, default=None, help="points per batch (default 32)")
    p.add_argument("--progress", action="store_true", help="progress on stderr")
    p.add_argument(
        "--plan",
        action="store_true",
        help="print what would run (points, compiled shapes, batches, replica-steps) "
        "and run nothing",
    )
    p.add_argument("--json", action="store_true", help="with --plan: the plan as JSON on stdout")

    p = sub.add_parser("export", help="export a result store (CSV, Parquet, netCDF)")
    p.add_argument("store", help="the SQLite result store")
    p.add_argument(
        "--csv", default=None, help="write one row per point and metric to this CSV ('-': stdout)"
    )
    p.add_argument("--parquet", default=None, help="the same rows as Parquet (extra: parquet)")
    p.add_argument(
        "--netcdf", default=None, help="an xarray Dataset, grid axes as dimensions (extra: xarray)"
    )

    p = sub.add_parser("plot", help="draw a figure of a result store as a PNG (extra: plot)")
    p.add_argument("store", help="the SQLite result store")
    p.add_argument(
        "--figure", default=None, help="a [[figure]] name of the spec (default: every figure)"
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="the PNG (with several figures: a folder, one NAME.png each)",
    )
    p.add_argument(
        "--spec",
        default=None,
        help="read the figures from this spec file instead of the store's copy",
    )
    p.add_argument(
        "--json", action="store_true", help="print the comparison with theory as one JSON object"
    )

    p = sub.add_parser(
        "policies", help="list the policies, their options (defaults) and mean fields"
    )
    p.add_argument("--json", action="store_true")
    return ap


def _fmt(value, digits=4) -> str:
    if value is None:
        return "-"
    mean, half = (value.mean, value.ci95) if isinstance(value, Estimate) else (value, None)
    if half is None or (isinstance(half, float) and math.isnan(half)):
        return f"{mean:.{digits}g}" if digits > 4 else f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


TAIL_LINES = 20  # s_1 .. s_20 at most in a printed table; --json has every level


def _tail_levels(tail) -> tuple[int, int]:
    """``(upto, shown)``: the table's levels are ``1 .. upto - 1``, down to the
    first at or below ``1e-6`` (at least two), of which ``1 .. shown - 1`` are printed."""
    upto = int(min(len(tail), max(3, (np.asarray(tail) > 1e-6).sum() + 1)))
    return upto, min(upto, TAIL_LINES + 1)


def _print_tail_rest(upto: int, shown: int) -> None:
    if upto > shown:
        print(
            f"  {f's_{shown} .. s_{upto - 1}':24s} not shown (down to 1e-6; --json lists every level)"
        )


def _print_result(res, title: str) -> None:
    print(title)
    print("metric" + (" (mean ± 95% CI half-width)" if res.source == "simulation" else ""))
    digits = 4 if res.source == "simulation" else 6
    for name, value in res.scalar_metrics().items():
        print(f"  {name:24s} {_fmt(value, digits)}")
    for q, value in sorted(res.response_quantiles.items()):
        print(f"  {'response p' + format(100 * q, 'g'):24s} {_fmt(value, digits)}")
    tail = res.tail.mean if isinstance(res.tail, Estimate) else np.asarray(res.tail)
    half = res.tail.ci95 if isinstance(res.tail, Estimate) else None
    upto, shown = _tail_levels(tail)
    for i in range(1, shown):
        ci = f" ± {half[i]:.6f}" if half is not None else ""
        print(f"  s_{i:<22d} {tail[i]:.6f}{ci}")
    _print_tail_rest(upto, shown)
    if res.pool_arrival_share is not None:
        _print_pools(res, digits)


def _print_pools(res, digits: int) -> None:
    """One column per pool: :data:`~jaxqueue.results.schema.POOL_METRICS` and the quantiles."""
    pools = res.settings.get("pools") or []
    width = 2 * digits + 8 if res.source == "simulation" else 12
    heads = [f"speed {q['speed']:g}" for q in pools]
    print(f"  {'by pool':24s} " + " ".join(f"{h:>{width}s}" for h in heads))
    rows = [(name, getattr(res, name)) for name in POOL_METRICS]
    rows += [
        (f"pool response p{100 * q:g}", v) for q, v in sorted(res.pool_response_quantiles.items())
    ]
    for name, value in rows:
        cells = [_fmt(x if isinstance(x, Estimate) else float(x), digits) for x in entries(value)]
        print(f"  {name:24s} " + " ".join(f"{c:>{width}s}" for c in cells))


def _servers_line(s: dict) -> str:
    """The pools and the service law of a result's settings, where not the default."""
    out = ""
    if s.get("pools"):
        out += "\n  pools " + ", ".join(
            (f"{q['servers']} servers" if "servers" in q else f"{q['fraction']:g} of the servers")
            + f" at speed {q['speed']:g}"
            for q in s["pools"]
        )
    law = s.get("service")
    if isinstance(law, dict):
        out += (
            f"\n  service {law['label']}: {len(law['alpha'])} phases, mean {law['mean']:.4g}, "
            f"SCV {law['scv']:.4g}"
        )
    src = s.get("arrivals")
    if src:
        if src["kind"] == "trace":
            out += (
                f"\n  arrivals: trace {src['label']} ({src['arrivals']} arrivals, gap SCV "
                f"{src['scv']:.3g})"
            )
        else:
            out += f"\n  arrivals: {src['kind']} {src['label']}, peak {src['peak']:.3g} x the mean load"
    return out


def _emit(res, args) -> int:
    if args.json:
        print(json.dumps(res.to_dict()))
        return 0
    s = res.settings
    if res.source == "simulation":
        title = (
            f"{s['policy_label']}  N={s['n_servers']}  M={s['n_dispatchers']}  "
            f"load={s['load']}  buffer={s['buffer']}  replicas={s['replicas']}  "
            f"steps={s['steps']} (+{s['warmup']} warm-up) = {s['time_measured']:.1f} time units"
        )
    elif res.source == "exact":
        title = (
            f"exact: {s['policy_label']}  N={s['n_servers']}  M={s['n_dispatchers']}  "
            f"load={s['load']}  buffer={s['buffer']}  ({res.n_states} states, "
            f"truncated mass {res.truncated_mass:.2g})"
        )
    else:
        ratio = "" if s.get("ratio") is None else f"  r={s['ratio']:g}"
        title = (
            f"mean field: {s['policy_label']}  load={s['load']}{ratio}  buffer={s.get('buffer')}"
        )
    _print_result(res, title + _servers_line(s))
    orbit = res.diagnostics.get("orbit")
    if orbit is not None:
        start, length = s["window"]
        t = orbit["mean_response_time"]
        print(
            f"  averages over t in [{start:g}, {start + length:g}] of the periodic regime; over "
            f"one period the mean response time of an arrival runs from {t.min():.4f} "
            f"(t = {orbit['time'][t.argmin()]:.4g}) to {t.max():.4f} "
            f"(t = {orbit['time'][t.argmax()]:.4g})"
        )
        for i, busy in enumerate(np.asarray(orbit.get("pool_utilization", [])).T):
            print(
                f"  pool {i} (speed {s['pools'][i]['speed']:g}) busy from {busy.min():.4f} "
                f"(t = {orbit['time'][busy.argmin()]:.4g}) to {busy.max():.4f} "
                f"(t = {orbit['time'][busy.argmax()]:.4g})"
            )
    if res.source == "simulation":
        print(f"  ran on {s['devices']} {s['platform']} device(s), backend {s['backend']}")
        _print_run_diagnostics(res.diagnostics)
    return 0


def _print_run_diagnostics(diag: dict) -> None:
    if diag.get("interval") == "batch-means":
        widened = " (widened: batches correlated)" if diag.get("widened") else ""
        print(
            f"  intervals from {diag['batches']} batch means per replica, lag-1 correlation "
            f"{diag['lag1_correlation']:.3f}{widened}"
        )
    w = diag.get("warmup_diagnostic")
    if w:
        verdict = {True: "passed", False: "FAILED", None: "too few batches to judge"}[w["passed"]]
        drift = (
            ""
            if w["half_drift"] is None
            else (f", half drift {w['half_drift']:.4g} ± {w['half_drift_ci99']:.2g} (99%)")
        )
        extended = f", warm-up extended {w['extensions']} times" if w["extensions"] else ""
        print(
            f"  warm-up {w['warmup']} steps: diagnostic {verdict} (MSER truncation "
            f"{w['mser_truncation']} of {w['batches']} batches{drift}){extended}"
        )


def _window(text: str) -> tuple:
    try:
        start, length = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected START,LENGTH (two numbers), got {text!r}"
        ) from None
    return (start, length)


def _order(args) -> dict:
    """``order=`` only when given (a policy without the option then never sees it)."""
    return {} if args.order is None else {"order": args.order}


def _model(args, **more):
    """The Model of the command's flags (``--policy`` to ``--arrivals``)."""
    from jaxqueue.core.config import Model

    return Model(
        args.policy,
        args.servers,
        args.dispatchers,
        d=args.d,
        z=args.z,
        buffer=args.buffer,
        service=args.service,
        pools=args.pools,
        **_order(args),
        **more,
    )


def _cmd_simulate(args) -> int:
    from jaxqueue.api import simulate
    from jaxqueue.core.config import Bounds, RunOptions
    from jaxqueue.core.system import halfin_whitt_load, heavy_traffic_load

    load = args.load
    if args.alpha is not None:
        load = heavy_traffic_load(args.servers, args.alpha)
    if args.beta is not None:
        load = halfin_whitt_load(args.servers, args.beta)
    run = RunOptions(
        replicas=args.replicas,
        steps=args.steps,
        time=args.time,
        warmup=args.warmup,
        warmup_time=args.warmup_time,
        seed=args.seed,
        init=args.init,
        interval=args.interval,
        batches=args.batches,
        backend=args.backend,
    )
    res = simulate(
        _model(args, arrivals=args.arrivals),
        load,
        run=run,
        bounds=Bounds(args.levels, args.iqueue_levels),
        progress=args.progress,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
    )
    return _emit(res, args)


def _cmd_transient(args) -> int:
    from jaxqueue.policies import make
    from jaxqueue.runs.transient import transient
    from jaxqueue.studies.transient import plot_transient, transient_study

    kw = dict(
        times=args.times,
        start_load=args.start_load,
        warmup_time=args.warmup_time,
        replicas=args.replicas,
        seed=args.seed,
        buffer=args.buffer,
        d=args.d,
        z=args.z,
        **_order(args),
    )
    pol = make(args.policy, d=args.d, z=args.z, **_order(args))
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
    if has_mf:
        study = transient_study(
            args.policy,
            args.load,
            args.servers,
            args.dispatchers,
            service=args.service,
            pools=args.pools,
            **kw,
        )
        res, rows = study["result"], study["rows"]
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
            pools=args.pools,
            **kw,
        )
        rows, study = None, None
    if args.plot and study is not None:
        plot_transient(study, args.plot)
    if args.json:
        out = res.to_dict()
        out["rows"] = rows
        print(json.dumps(out))
        return 0
    s = res.settings
    step = (
        f"load {s['start_load']} -> {s['load']} (after {s['warmup_time']:g} time units)"
        if s["start_load"] is not None
        else f"load {s['load']} from empty"
    )
    print(
        f"{s['policy_label']}  N={s['n_servers']}  M={s['n_dispatchers']}  {step}  "
        f"replicas={s['replicas']}  ({s['steps']} steps per replica){_servers_line(s)}"
    )
    head = "  time      s_1 ± 95%            s_2 ± 95%            idle ± 95%"
    head += "           p0 ± 95%" if res.p0 is not None else ""
    print(head + ("      mean field s_1, s_2" if rows else ""))
    for j, t in enumerate(res.times):
        line = f"  {t:<8.4g}"
        for k in (1, 2):
            line += f"  {res.tail.mean[j][k]:.4f} ± {res.tail.ci95[j][k]:.4f}  "
        line += f"  {res.idle_fraction.mean[j]:.4f} ± {res.idle_fraction.ci95[j]:.4f}  "
        if res.p0 is not None:
            line += f"  {res.p0.mean[j]:.4f} ± {res.p0.ci95[j]:.4f}  "
        if rows:
            line += f"    {rows[j]['mf_s1']:.4f}, {rows[j].get('mf_s2', float('nan')):.4f}"
        print(line)
    if res.pool_utilization is not None:  # each pool's busy fraction
        busy = res.pool_utilization
        heads = "".join(f"  {'busy, speed ' + format(q['speed'], 'g'):<18s}" for q in s["pools"])
        print(f"  {'time':8s}{heads}" + ("      mean field" if rows else ""))
        for j, t in enumerate(res.times):
            line = f"  {t:<8.4g}" + "".join(
                f"  {m:.4f} ± {h:.4f}   " for m, h in zip(busy.mean[j], busy.ci95[j])
            )
            if rows:
                line += "    " + ", ".join(
                    f"{rows[j][f'mf_busy{i}']:.4f}" for i in range(busy.mean.shape[1])
                )
            print(line)
    if args.plot and study is None:
        print("  (no plot: JSEW with pools has no mean field to draw beside the simulation)")
    elif args.plot:
        print(f"  plot written to {args.plot}")
    return 0


def _cmd_theory(args) -> int:
    from jaxqueue import theory
    from jaxqueue.core.versions import versions

    if args.window is not None and args.arrivals is None:
        raise ValueError("--window averages a periodic regime: give --arrivals (a rate profile)")
    if args.servers is not None and args.arrivals is not None:
        raise ValueError(
            "--servers (the refined mean field) is for Poisson arrivals at a "
            "constant rate: leave out --arrivals"
        )
    if args.servers is not None and (args.service is not None or args.pools is not None):
        raise ValueError(
            "--servers (the refined mean field) is for identical exponential "
            "servers: leave out --service and --pools"
        )
    if args.servers is not None:
        # validated (and refused for a policy without an occupancy mean field) before any work
        if args.z is not None or args.order is not None:
            raise ValueError(
                "--servers (the refined mean field) takes no --z or --order: it "
                "covers the policies with an occupancy mean field"
            )
        rf = theory.refined_mean_field(
            args.policy,
            args.load,
            args.ratio,
            d=args.d,
            buffer=args.buffer,
            n_servers=args.servers,
            levels=args.levels,
        )
    mf = theory.mean_field(
        args.policy,
        args.load,
        args.ratio,
        d=args.d,
        z=args.z,
        **_order(args),
        buffer=args.buffer,
        levels=args.levels,
        service=args.service,
        pools=args.pools,
        arrivals=args.arrivals,
        window=args.window,
    )
    mf.settings["versions"] = versions()
    if args.servers is None:
        return _emit(mf, args)
    if rf.refined is not None:
        rf.refined.settings["versions"] = mf.settings["versions"]
    if args.json:
        out = mf.to_dict()
        extra = rf.to_dict()
        out["refined"], out["correction"] = extra["refined"], extra["correction"]
        out["refined_status"] = {"status": extra["status"], "reason": extra["reason"]}
        print(json.dumps(out))
        return 0
    _emit(mf, args)
    _print_refined(rf)
    return 0


def _print_refined(rf) -> None:
    print()
    if rf.refined is None:
        print(f"refined mean field at N={rf.n_servers}: {rf.status.name}: {rf.reason}")
        return
    print(
        f"refined mean field at N={rf.n_servers}: mean field + V / N "
        f"(generic fixed point, levels={rf.mean_field.settings['levels']})"
    )
    print(f"  {'metric':24s} {'mean field':>12s} {'V':>12s} {'refined':>12s}")
    for name, value in rf.refined.scalar_metrics().items():
        print(
            f"  {name:24s} {getattr(rf.mean_field, name):12.6f} {rf.correction[name]:12.6f} "
            f"{value:12.6f}"
        )
    for q, value in sorted(rf.refined.response_quantiles.items()):
        name = "response p" + format(100 * q, "g")
        print(
            f"  {name:24s} {rf.mean_field.response_quantiles[q]:12.6f} "
            f"{rf.correction['response_quantiles'][q]:12.6f} {value:12.6f}"
        )
    tail = rf.refined.tail
    upto, shown = _tail_levels(np.asarray(rf.mean_field.tail))
    for i in range(1, shown):
        print(
            f"  {'s_' + str(i):24s} {rf.mean_field.tail[i]:12.6f} {rf.correction['tail'][i]:12.6f} "
            f"{tail[i]:12.6f}"
        )
    _print_tail_rest(upto, shown)


def _cmd_exact(args) -> int:
    from jaxqueue.core.versions import versions
    from jaxqueue.exact import solve_exact

    res = solve_exact(_model(args), args.load, queue_bound=args.queue_bound)
    res.settings["versions"] = versions()
    return _emit(res, args)


def _policy_list(text: str) -> list:
    """``--policies``: names, or Policies where a name carries its own options
    (``NAME:OPTION=VALUE[:...]``; integers for ``d`` and ``z``)."""
    from jaxqueue.policies import make

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


def _cmd_compare(args) -> int:
    from jaxqueue.studies.compare import compare

    if args.metric in POOL_METRICS + POOL_QUANTILE_NAMES and args.pools is None:
        raise ValueError(
            f"--metric {args.metric} is a metric by server pool: give --pools (e.g. 0.2:2,0.8:1)"
        )
    rows = compare(
        _policy_list(args.policies),
        n_servers=args.servers,
        ratio=args.ratio,
        loads=args.loads,
        d=args.d,
        z=args.z,
        buffer=args.buffer,
        service=args.service,
        pools=args.pools,
        arrivals=args.arrivals,
        time_units=args.time,
        warmup_time=args.warmup_time,
        replicas=args.replicas,
        seed=args.seed,
        progress=args.progress,
        log=sys.stderr,
    )
    if args.json:
        print(json.dumps({"rows": [r.to_dict() for r in rows]}))
        return 0
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
    notes = set()
    for r in rows:
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
            sim = "-" if est is None else f"{_num(est.mean)} ± {_num(est.ci95)}"
            if value is None:
                print(f"{r.policy_label:18s} {r.load:6.3f}{label} {sim:>20s} {'-':>11s} {'-':>8s}")
                continue
            cell = f"{score:.2f}"
            if est is None:
                cell = "-"
            elif math.isnan(score):  # no interval to scale the difference by
                notes.add("zero" if est.ci95 == 0 else "none")
                cell = "n/a"
            print(
                f"{r.policy_label:18s} {r.load:6.3f}{label} {sim:>20s} "
                f"{_num(float(value)):>11s} {cell:>8s}"
            )
    for note in sorted(notes, reverse=True):
        print(
            "  n/a: "
            + {
                "zero": "the 95% CI has width 0 (every replica gave the same value, e.g. no "
                "blocked or waiting task at all), so diff/CI is undefined: run longer or "
                "more replicas",
                "none": "no 95% CI (too few replicas or batches for one)",
            }[note]
        )
    return 0


def _num(x: float) -> str:
    """A table entry: 4 decimals, or 3 significant digits below 0.001 (a
    small CI or probability is not printed as 0)."""
    return f"{x:.3g}" if x != 0 and abs(x) < 1e-3 else f"{x:.4f}"


def _cmd_sweep(args) -> int:
    from jaxqueue.studies.grid import DEFAULT_BATCH_POINTS, run_grid
    from jaxqueue.studies.spec import load_spec

    mode = "quick" if args.quick else "gpu" if args.gpu else None
    spec = load_spec(args.spec, mode=mode)
    # a mode is another spec (its own hash): its own default store
    store = args.store or f"{spec.name}{f'.{mode}' if mode else ''}.sqlite"
    args.store = store  # (named if the sweep is interrupted)
    if args.plan:
        return _print_plan(spec, store, args)
    if args.json:
        raise ValueError("--json goes with --plan (a sweep writes its results to the store)")
    points = DEFAULT_BATCH_POINTS if args.batch_points is None else args.batch_points  # 0: refused
    ran = run_grid(spec, store, batch_points=points, progress=args.progress)
    print(
        f"[jaxqueue] {spec.name}: ran {ran} of {len(spec.points)} points into {store}",
        file=sys.stderr,
    )
    return 0


def _print_plan(spec, store, args) -> int:
    from jaxqueue.studies.grid import DEFAULT_BATCH_POINTS, plan_grid

    points = DEFAULT_BATCH_POINTS if args.batch_points is None else args.batch_points  # 0: refused
    plan = plan_grid(spec, batch_points=points, store_path=store)
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
        f"{plan['replica_steps']:.3g} replica-steps; on one H200 about "
        f"{plan['gpu_seconds']:.0f} s (an estimate from the kernel's measured rates)"
    )
    print(
        f"{'policy':18s} {'N':>8s} {'M':>7s} {'buffer':>6s} {'points':>6s} {'batches':>7s} "
        f"{'replica-steps':>13s}"
    )
    for g in plan["groups"]:
        span = lambda v: str(v) if isinstance(v, int) else f"{v[0]}-{v[-1]}"  # noqa: E731
        buf = "inf" if g["buffer"] is None else span(g["buffer"])
        print(
            f"{g['policy']:18s} {span(g['servers']):>8s} {span(g['dispatchers']):>7s} {buf:>6s} "
            f"{g['points']:6d} {g['batches']:7d} {g['replica_steps']:13.3g}"
        )
    return 0


def _cmd_export(args) -> int:
    from jaxqueue.studies import export
    from jaxqueue.studies.store import Store

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


def _cmd_plot(args) -> int:
    import os

    from jaxqueue.studies.plots import plot_store
    from jaxqueue.studies.spec import parse_spec
    from jaxqueue.studies.store import Store

    if args.figure is not None:
        jobs = [(args.figure, args.output)]
    else:
        with Store.open_existing(args.store) as store:
            meta = store.meta()
        text = open(args.spec, encoding="utf-8").read() if args.spec else meta.get("spec_text")
        if not text:
            raise ValueError(f"{args.store} records no spec text: pass the spec file (--spec)")
        names = [f.name for f in parse_spec(text, name=meta["spec_name"]).figures]
        if not names:
            raise ValueError(f"spec {meta['spec_name']!r} has no [[figure]] table")
        jobs = [(n, os.path.join(args.output, f"{n}.png")) for n in names]
    report = {}
    for name, out in jobs:
        lines = plot_store(args.store, name, out, spec_path=args.spec)
        report[name] = {"png": out, "lines": lines}
        print(f"[jaxqueue] wrote {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(report))
        return 0
    for name, item in report.items():
        print(f"figure {name} ({item['png']}): simulation against theory")
        for line in item["lines"]:
            rel, z = line["max_relative_error"], line["max_z"]
            panel = "" if line["panel"] is None else f"[{line['panel']}] "
            text = (
                "no theory"
                if rel is None
                else (
                    f"max relative error {100 * rel:.2f}% at x = {line['at_x']:g}, "
                    f"max |diff| / CI {z:.2f}"
                    if z is not None
                    else f"max relative error {100 * rel:.2f}%"
                )
            )
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


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():  # a warning is one line on stderr, not a source excerpt
        warnings.showwarning = _show_warning
        return _run(args)


def _run(args) -> int:
    try:
        if args.command == "policies":
            return _cmd_policies(args)
        commands = {
            "simulate": _cmd_simulate,
            "theory": _cmd_theory,
            "exact": _cmd_exact,
            "compare": _cmd_compare,
            "sweep": _cmd_sweep,
            "export": _cmd_export,
            "plot": _cmd_plot,
            "transient": _cmd_transient,
        }
        return commands[args.command](args)
    except (ValueError, TypeError, NotImplementedError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # LevelOverflowError and friends
        print(f"error: {err}", file=sys.stderr)
        return 3
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return 1
    except OSError as err:  # a folder that cannot be written, a folder given as a file, ...
        text = f"{err.strerror}: {err.filename}" if err.strerror and err.filename else str(err)
        print(f"error: {text}", file=sys.stderr)
        return 2
    except MemoryError:
        print(
            "error: out of memory: run fewer replicas (or fewer loads) at a time", file=sys.stderr
        )
        return 3
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback, the shell's 128 + SIGINT
        print(f"interrupted{_resume_note(args)}", file=sys.stderr)
        return 130


def _resume_note(args) -> str:
    """Where an interrupted command keeps what it had done, if anywhere."""
    if args.command == "sweep" and not args.plan and args.store:
        return (
            f": the batches committed so far are in {args.store}; the same command "
            "resumes from there"
        )
    checkpoint = getattr(args, "checkpoint", None)
    if checkpoint:
        return (
            f": the run resumes from its last save in {checkpoint} (if one was written) "
            "with the same command"
        )
    return ""


def _cmd_policies(args) -> int:
    from jaxqueue.policies.registry import available, make

    rows = []
    for name in available():
        pol = make(name)
        rows.append(
            {
                "name": name,
                "options": pol.options(),
                "mean_field": pol.mean_field_kind(),
                "summary": " ".join((type(pol).__doc__ or "").split("\n\n")[0].split()),
            }
        )
    if args.json:
        print(json.dumps({"policies": rows}))
        return 0
    for r in rows:
        opts = ",".join(f"{k}={v}" for k, v in r["options"].items()) or "-"
        print(f"{r['name']:14s} {opts:22s} {r['mean_field']:14s} {r['summary']}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
