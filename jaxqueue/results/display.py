"""A result as a short table: the command line's printed metrics, a result's
``repr`` and its HTML for notebooks (the policy, the size, the load and the
scalar metrics with their intervals; the arrays stay in the result).
"""

from __future__ import annotations

import html
import math

import numpy as np

from jaxqueue.results.estimates import Estimate

__all__ = [
    "format_metric",
    "heading",
    "title",
    "digits_of",
    "metric_rows",
    "text_table",
    "html_table",
    "transient_text",
    "transient_html",
]

#: What a printed table calls each source before its heading (a simulation: nothing).
SOURCE_PREFIX = {"simulation": "", "exact": "exact: ", "mean-field": "mean field: "}

_VERDICTS = {True: "passed", False: "FAILED", None: "too few batches to judge"}


def format_metric(value, digits: int = 4) -> str:
    """A table entry: ``mean ± half-width`` to ``digits`` decimals for an
    Estimate, the value alone for a number (``digits`` significant digits
    above 4), ``-`` for a metric that does not apply."""
    if value is None:
        return "-"
    mean, half = (value.mean, value.ci95) if isinstance(value, Estimate) else (value, None)
    if half is None or (isinstance(half, float) and math.isnan(half)):
        return f"{mean:.{digits}g}" if digits > 4 else f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def heading(res) -> str:
    """What produced ``res``, on one line: the policy, the size, the load and
    the source's own facts (a simulation's replicas and window, an exact
    solution's states)."""
    s = res.settings
    if res.source == "simulation":
        return (
            f"{s.get('policy_label')}  N={s.get('n_servers')}  M={s.get('n_dispatchers')}  "
            f"load={s.get('load')}  buffer={s.get('buffer')}  replicas={s.get('replicas')}  "
            f"steps={s.get('steps')} (+{s.get('warmup')} warm-up) = "
            f"{s.get('time_measured', math.nan):.1f} time units"
        )
    if res.source == "exact":
        states, mass = getattr(res, "n_states", None), getattr(res, "truncated_mass", math.nan)
        return (
            f"{s.get('policy_label')}  N={s.get('n_servers')}  M={s.get('n_dispatchers')}  "
            f"load={s.get('load')}  buffer={s.get('buffer')}  ({states} states, "
            f"truncated mass {mass:.2g})"
        )
    ratio = "" if s.get("ratio") is None else f"  r={s['ratio']:g}"
    return f"{s.get('policy_label')}  load={s.get('load')}{ratio}  buffer={s.get('buffer')}"


def title(res) -> str:
    """The command line's title of a result table: its source, then :func:`heading`."""
    return SOURCE_PREFIX.get(res.source, f"{res.source}: ") + heading(res)


def digits_of(res) -> int:
    """Decimals of a table's entries: 4 for a simulation's intervals, else 6."""
    return 4 if res.source == "simulation" else 6


def metric_rows(res) -> list[tuple[str, str]]:
    """``(name, entry)`` of the scalar metrics that apply and the response-time quantiles."""
    digits = digits_of(res)
    rows = [(name, format_metric(v, digits)) for name, v in res.scalar_metrics().items()]
    rows += [
        (f"response p{100 * q:g}", format_metric(v, digits))
        for q, v in sorted(res.response_quantiles.items())
    ]
    return rows


def _summary_rows(res) -> list[tuple[str, str]]:
    rows = metric_rows(res)
    verdict = (res.diagnostics or {}).get("warmup_diagnostic")
    if verdict:
        rows.append(("warm-up diagnostic", _VERDICTS.get(verdict.get("passed"), "-")))
    return rows


def _column_head(res) -> str:
    return "metric" + (" (mean ± 95% CI half-width)" if res.source == "simulation" else "")


def text_table(res) -> str:
    """A result's ``repr``: its class and :func:`heading`, then its metrics."""
    lines = [f"{type(res).__name__}: {heading(res)}", _column_head(res)]
    lines += [f"  {name:24s} {entry}" for name, entry in _summary_rows(res)]
    return "\n".join(lines)


def html_table(res) -> str:
    """:func:`text_table` as an HTML table (a notebook's display of a result)."""
    esc = html.escape
    body = "".join(
        f"<tr><td style='text-align:left'>{esc(name)}</td>"
        f"<td style='text-align:left'>{esc(entry)}</td></tr>"
        for name, entry in _summary_rows(res)
    )
    value = "mean ± 95% CI half-width" if res.source == "simulation" else "value"
    return (
        f"<table><caption style='text-align:left'><b>{esc(type(res).__name__)}</b>: "
        f"{esc(heading(res))}</caption><thead><tr><th style='text-align:left'>metric</th>"
        f"<th style='text-align:left'>{value}</th>"
        f"</tr></thead><tbody>{body}</tbody></table>"
    )


#: A transient result's table shows every time up to this many, else the first and
#: last half of them.
TRANSIENT_ROWS = 10


def _transient_heading(res) -> str:
    """A transient run on one line: the policy, the size, the load (or the load step)."""
    s = res.settings
    if s.get("start_load") is None:
        load, start = f"load={s.get('load')}", f"start={s.get('init')}"
    else:  # a load step: time 0 is the step
        load = f"load={s.get('start_load')} -> {s.get('load')}"
        start = f"step after warmup_time={s.get('warmup_time')}"
    return (
        f"{s.get('policy_label')}  N={s.get('n_servers')}  M={s.get('n_dispatchers')}  "
        f"{load}  buffer={s.get('buffer')}  replicas={s.get('replicas')}  {start}"
    )


def _transient_rows(res) -> tuple[list[str], list[list[str]]]:
    """``(columns, rows)`` of a transient result's table: a row per time shown."""
    metrics = [("idle fraction", res.idle_fraction), ("mean queue length", res.mean_queue_length)]
    if res.p0 is not None:
        metrics.append(("p0", res.p0))
    times = list(range(len(res.times)))
    if len(times) > TRANSIENT_ROWS:
        half = TRANSIENT_ROWS // 2
        times = times[:half] + [None] + times[-half:]
    rows = []
    for i in times:
        if i is None:  # the times left out
            rows.append(["..."] * (len(metrics) + 1))
            continue
        cells = [
            format_metric(Estimate(np.asarray(e.mean)[i], np.asarray(e.ci95)[i], e.n), 4)
            for _, e in metrics
        ]
        rows.append([f"{float(res.times[i]):g}", *cells])
    return ["time", *(name for name, _ in metrics)], rows


def _transient_caption(res) -> str:
    t = np.asarray(res.times)
    span = f"{t.size} times in [{t.min():g}, {t.max():g}]" if t.size else "no times"
    pools = "" if res.pool_utilization is None else " and by pool"
    return f"{span}: mean ± 95% CI half-width across replicas (s_k(t){pools} in the fields)"


def transient_text(res) -> str:
    """A transient result's ``repr``: its class and run, then a row per time (the
    first and last ones past :data:`TRANSIENT_ROWS`) of its scalar metrics."""
    columns, rows = _transient_rows(res)
    widths = [max(len(c), *(len(r[j]) for r in rows)) for j, c in enumerate(columns)]
    lines = [f"{type(res).__name__}: {_transient_heading(res)}", _transient_caption(res)]
    for cells in [columns, *rows]:
        lines.append("  " + "  ".join(f"{c:>{w}s}" for c, w in zip(cells, widths)))
    return "\n".join(lines)


def transient_html(res) -> str:
    """:func:`transient_text` as an HTML table (a notebook's display)."""
    esc = html.escape
    columns, rows = _transient_rows(res)
    head = "".join(f"<th style='text-align:right'>{esc(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:right'>{esc(c)}</td>" for c in r) + "</tr>"
        for r in rows
    )
    return (
        f"<table><caption style='text-align:left'><b>{esc(type(res).__name__)}</b>: "
        f"{esc(_transient_heading(res))}<br>{esc(_transient_caption(res))}</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )
