"""A result as a short table: the command line's printed metrics, a result's
``repr`` and its HTML for notebooks (the policy, the size, the load and the
scalar metrics with their intervals; the arrays stay in the result).
"""

from __future__ import annotations

import html
import importlib
import math

import numpy as np

from jaxqueue.results.estimates import Estimate

__all__ = [
    "format_metric",
    "format_number",
    "applies",
    "MESSAGE_RATES",
    "heading",
    "title",
    "metric_rows",
    "text_table",
    "html_table",
    "transient_text",
    "transient_html",
    "records_html",
    "StudyTable",
    "optional_import",
]

#: What a printed table calls each source before its heading (a simulation: nothing).
SOURCE_PREFIX = {"simulation": "", "exact": "exact: ", "mean-field": "mean field: "}

_VERDICTS = {True: "passed", False: "FAILED", None: "too few batches to judge"}


#: The message rates: one that is zero, interval and all, is a message the policy
#: does not send (JIQ's probes, a single dispatcher's deletes), shown as ``-``.
MESSAGE_RATES = ("join_rate", "delete_rate", "probe_rate")


def applies(name: str | None, value) -> bool:
    """Whether a table shows a value for metric ``name``: not where it is None, nor
    for a message rate that is exactly zero with a zero (or no) interval (no such
    message is sent: :data:`MESSAGE_RATES`)."""
    if value is None:
        return False
    if name not in MESSAGE_RATES:
        return True
    mean, half = (value.mean, value.ci95) if isinstance(value, Estimate) else (value, 0.0)
    if np.ndim(mean) != 0:
        return True
    return not (float(mean) == 0.0 and (half is None or not float(half) > 0.0))


def format_number(x) -> str:
    """A number without an interval, in a table: six significant digits."""
    return f"{float(x):.6g}"


def format_metric(value, name: str | None = None) -> str:
    """A table entry, by the one rule of every table: an Estimate as ``mean ±
    half-width``, the half-width to two significant digits and the mean to the same
    decimal place (the Estimate's own text: ``1.07020 ± 0.00063``, ``1.7721 ±
    0.0091``, ``2.1e-05 ± 4.2e-06``); a number, or an Estimate without a finite
    interval (one replica), to six significant digits (:func:`format_number`);
    ``-`` for a metric that does not apply (:func:`applies`, given its ``name``)."""
    if not applies(name, value):
        return "-"
    if not isinstance(value, Estimate):
        return format_number(value)
    half = value.ci95
    if half is None or (np.ndim(half) == 0 and math.isnan(float(half))):
        return format_number(value.mean)
    return format(value, "")


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


def metric_rows(res) -> list[tuple[str, str]]:
    """``(name, entry)`` of the scalar metrics that apply and the response-time quantiles
    (:func:`format_metric`: a message rate of messages not sent shows ``-``)."""
    rows = [(name, format_metric(v, name)) for name, v in res.scalar_metrics().items()]
    rows += [
        (f"response p{100 * q:g}", format_metric(v))
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
            format_metric(Estimate(np.asarray(e.mean)[i], np.asarray(e.ci95)[i], e.n))
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


def records_html(kind: str, caption: str, rows: list[dict], columns: list[str]) -> str:
    """Rows of a study's records as an HTML table (a notebook's display of a
    sensitivity or a paired comparison): the ``columns`` in order, numbers to six
    significant digits, ``-`` for None or NaN."""
    esc = html.escape

    def cell(x) -> str:
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return "-"
        if isinstance(x, (bool, np.bool_, str)):
            return esc(str(x))
        return esc(format_number(x))

    head = "".join(f"<th style='text-align:left'>{esc(c)}</th>" for c in columns)
    body = "".join(
        "<tr>"
        + "".join(f"<td style='text-align:left'>{cell(r.get(c))}</td>" for c in columns)
        + "</tr>"
        for r in rows
    )
    return (
        f"<table><caption style='text-align:left'><b>{esc(kind)}</b>: {esc(caption)}</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def optional_import(module: str, extra: str, what: str = "this"):
    """``module``, or a one-line ModuleNotFoundError saying that ``what`` needs it and
    naming the extra that installs it (every optional dependency is met here)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"{what} needs {module}: pip install 'jaxqueue[{extra}]'"
        ) from None


class StudyTable:
    """What a study's result (a sensitivity, a paired comparison) shares with the
    other results: its printed text as its ``repr``, its :meth:`records` as an
    HTML table in a notebook and as a pandas DataFrame. A subclass gives
    ``records()``, ``__str__`` and the columns its HTML table shows."""

    _HTML_COLUMNS: tuple = ()

    def records(self) -> list[dict]:  # pragma: no cover (each study gives its own)
        raise NotImplementedError

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        caption = str(self).splitlines()[0]
        rows = self.records()
        columns = [c for c in self._HTML_COLUMNS if any(r.get(c) is not None for r in rows)]
        return records_html(type(self).__name__, caption, rows, columns)

    def to_frame(self):
        """:meth:`records` as a pandas DataFrame (extra ``frames``)."""
        return optional_import("pandas", "frames").DataFrame(self.records())
