"""The command line's printed output: result tables, their pools and diagnostics, and
the number format of a table (one rule, :func:`jaxqueue.results.display.format_metric`;
``--json`` prints the result schema instead).
"""

from __future__ import annotations

import json

import numpy as np

from jaxqueue.results.display import format_metric, format_number, metric_rows, title
from jaxqueue.results.estimates import Estimate, entries
from jaxqueue.results.schema import POOL_METRICS

__all__ = ["emit", "print_result", "servers_line", "tail_levels", "print_tail_rest", "num"]


TAIL_LINES = 20  # s_1 .. s_20 at most in a printed table; --json has every level


def tail_levels(tail) -> tuple[int, int]:
    """``(upto, shown)``: the table's levels are ``1 .. upto - 1``, down to the
    first at or below ``1e-6`` (at least two), of which ``1 .. shown - 1`` are printed."""
    upto = int(min(len(tail), max(3, (np.asarray(tail) > 1e-6).sum() + 1)))
    return upto, min(upto, TAIL_LINES + 1)


def print_tail_rest(upto: int, shown: int) -> None:
    if upto > shown:
        print(
            f"  {f's_{shown} .. s_{upto - 1}':24s} not shown (down to 1e-6; --json lists every level)"
        )


def print_result(res, title: str) -> None:
    print(title)
    print("metric" + (" (mean ± 95% CI half-width)" if res.source == "simulation" else ""))
    for name, entry in metric_rows(res):
        print(f"  {name:24s} {entry}")
    tail = res.tail.mean if isinstance(res.tail, Estimate) else np.asarray(res.tail)
    half = res.tail.ci95 if isinstance(res.tail, Estimate) else None
    upto, shown = tail_levels(tail)
    for i in range(1, shown):
        level = tail[i] if half is None else Estimate(tail[i], half[i])
        print(f"  s_{i:<22d} {format_metric(level)}")
    print_tail_rest(upto, shown)
    if res.pool_arrival_share is not None:
        _print_pools(res)


def _print_pools(res) -> None:
    """One column per pool: :data:`~jaxqueue.results.schema.POOL_METRICS` and the quantiles."""
    pools = res.settings.get("pools") or []
    heads = [f"speed {q['speed']:g}" for q in pools]
    rows = [(name, getattr(res, name)) for name in POOL_METRICS]
    rows += [
        (f"pool response p{100 * q:g}", v) for q, v in sorted(res.pool_response_quantiles.items())
    ]
    table = [
        (name, [format_metric(x if isinstance(x, Estimate) else float(x)) for x in entries(value)])
        for name, value in rows
    ]
    width = max([12, *(len(c) for _, cells in table for c in cells)])
    print(f"  {'by pool':24s} " + " ".join(f"{h:>{width}s}" for h in heads))
    for name, cells in table:
        print(f"  {name:24s} " + " ".join(f"{c:>{width}s}" for c in cells))


def servers_line(s: dict) -> str:
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


def emit(res, args) -> int:
    if args.json:
        print(json.dumps(res.to_dict()))
        return 0
    s = res.settings
    print_result(res, title(res) + servers_line(s))
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


def num(x: float) -> str:
    """A number without an interval in a table: six significant digits (so a small
    probability is not printed as 0; :func:`~jaxqueue.results.display.format_number`)."""
    return format_number(x)
