"""Plots of grid experiments (the ``plot`` extra: matplotlib): each function takes an
optional ``Axes`` and returns the axes it drew on; :func:`plot_store` writes a PNG, PDF or SVG.

No pyplot state is used, so this works headless and in threads. What is drawn how:
docs/sweeps.md (Figures).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3

import numpy as np

from jaxqueue.studies.grids.points import GridSpec
from jaxqueue.studies.grids.store import Store, StoreMismatchError
from jaxqueue.studies.plotting.baselines import BASELINE_NAMES, SHARED_BASELINES, baseline_curve
from jaxqueue.studies.plotting.figure_labels import panel_label, theory_name, zero_note
from jaxqueue.studies.plotting.figure_spec import axis_label, metric_label, reference_line
from jaxqueue.studies.plotting.figures import (
    CDF,
    FigureSpec,
    Series,
    cdf_quantiles,
    figure_caption,
    figure_series,
    store_spec,
    summarize,
    theory_curve,
)
from jaxqueue.studies.plotting.plot_axes import (
    CDF_STYLES,
    DODGE,
    LEGEND_WIDTH,
    REFERENCE,
    dodged_x,
    key_line,
    legend,
    plain_ticks,
    positive,
    pyplot_free_figure,
    titles,
    wrap,
)

__all__ = [
    "Panel",
    "plot_series",
    "plot_cdf",
    "plot_figure",
    "plot_store",
    "read_store",
]


@dataclasses.dataclass(frozen=True)
class Panel:
    """How one panel of a figure is drawn.

    Attributes:
        logx, logy: log scales (non-positive values are left out on a log axis).
        theory: draw the theory lines where the series have theory values (and
            the refined mean field dashed where they have it).
        title, xlabel, ylabel: texts.
        theory_label: what the theory lines are, in the legend (``"mean field"``,
            ``"M/M/N (Erlang C)"``: :func:`~jaxqueue.studies.plotting.figure_labels.theory_name`
            of the spec's ``theory``).
        dodge: the spread of overlapping markers at a shared x (0: none).
    """

    logx: bool = False
    logy: bool = False
    theory: bool = True
    title: str | None = None
    xlabel: str | None = None
    ylabel: str | None = None
    theory_label: str = "theory"
    dodge: float = DODGE


def _panel(panel: Panel | None, style: dict) -> Panel:
    """``panel`` (default ``Panel()``) with the fields ``style`` gives by name."""
    base = Panel() if panel is None else panel
    unknown = sorted(set(style) - {f.name for f in dataclasses.fields(Panel)})
    if unknown:
        raise TypeError(
            f"{unknown[0]!r} is not a field of Panel: {[f.name for f in dataclasses.fields(Panel)]}"
        )
    return dataclasses.replace(base, **style)


def _draw_theory(ax, s: Series, curve, color, logx: bool, logy: bool, baseline=None) -> float:
    """A line's theory (its fine curve where given, else through its points), refined
    mean field and ``baseline`` ``(x, y)`` (dotted, or None); returns the smallest value
    of the theory and refined mean field drawn (for a log y axis)."""
    x, y = (s.x, s.theory) if curve is None else curve
    th = positive(y, logy) & positive(x, logx)
    if th.sum() >= 1:
        ax.plot(x[th], y[th], "-" if th.sum() > 1 else "_", color=color, lw=1.2, ms=12)
    rf = positive(s.refined, logy) & positive(s.x, logx)
    if rf.sum() >= 1:
        style = "--" if rf.sum() > 1 else "x"
        ax.plot(s.x[rf], s.refined[rf], style, color=color, lw=1.0, ms=6)
    if baseline is not None:
        bx, by = baseline
        ok = positive(by, logy) & positive(bx, logx)
        ax.plot(bx[ok], by[ok], ":", color=color, lw=1.4)
    return min(y[th].min(initial=np.inf), s.refined[rf].min(initial=np.inf))


def plot_series(
    series: list[Series],
    ax=None,
    *,
    panel: Panel | None = None,
    colors: dict | None = None,
    curves: list | None = None,
    baselines: list | None = None,
    baseline_name: str | None = None,
    reference: tuple | None = None,
    **style,
):
    """Draw lines of a figure on ``ax`` (a new figure's axes if None); returns ``ax``.

    Simulated values are markers with their 95% intervals (no line), spread by
    ``dodge`` where markers of lines at a shared x would overlap
    (:func:`dodged_x`); theory is a line in the same colour, the refined mean
    field dashed. The legend is right of the axes, clear of the data; a log
    axis of under two decades has plain tick labels (:func:`plain_log_ticks`).

    Args:
        series: the lines (:func:`~jaxqueue.studies.plotting.figures.figure_series`).
        ax: a matplotlib Axes.
        panel: how the panel is drawn (:class:`Panel`: log axes, theory, texts,
            the markers' dodge); ``style``, its fields by name
            (``logy=True``), over it.
        colors: ``{label: color}`` to keep colours across panels (filled in).
        curves: per line, ``(x, theory)`` to draw instead of its theory at its
            points (:func:`~jaxqueue.studies.plotting.figures.theory_curve`), or None.
        baselines: per line, ``(x, y)`` of an approximation drawn dotted in its
            colour (:func:`~jaxqueue.studies.plotting.baselines.baseline_curve`), or None;
            ``baseline_name`` names it in the legend.
        reference: ``(x, y, name)`` of a reference line (a paper's rate), drawn
            wide and light behind the lines, or None.
    """
    ax, handles, labels = _draw_series(
        series,
        ax,
        _panel(panel, style),
        colors=colors,
        curves=curves,
        baselines=baselines,
        baseline_name=baseline_name,
        reference=reference,
    )
    if handles:
        legend(ax, handles, labels)
    return ax


def _draw_series(
    series,
    ax,
    panel: Panel,
    *,
    colors,
    curves,
    baselines=None,
    baseline_name=None,
    reference=None,
    shared_baseline=False,
):
    """:func:`plot_series` without its legend: ``(ax, handles, labels)`` of the legend.

    ``shared_baseline``: the baselines are level lines that do not depend on a
    line's policy (:data:`~jaxqueue.studies.plotting.baselines.SHARED_BASELINES`), drawn
    once per value in grey (:func:`_draw_levels`) rather than per line.
    """
    if ax is None:
        ax = pyplot_free_figure(
            figsize=(6.4 + LEGEND_WIDTH, 4.4), layout="constrained"
        ).add_subplot()
    logx, logy, theory, dodge = panel.logx, panel.logy, panel.theory, panel.dodge
    colors = {} if colors is None else colors
    curves = [None] * len(series) if curves is None else curves
    lowest = np.inf  # the smallest value drawn on a log y axis
    if reference is not None:
        rx, ry, name = reference
        ok = positive(ry, logy) & positive(rx, logx)
        ax.plot(rx[ok], ry[ok], "-", color=REFERENCE, lw=3, alpha=0.45, label=name, zorder=1)
    for i, (s, x, curve) in enumerate(
        zip(series, dodged_x(series, logx, dodge, logy=logy), curves)
    ):
        color = colors.setdefault(s.label, f"C{len(colors) % 10}")
        keep = positive(s.y, logy) & positive(s.x, logx)
        ci = np.where(np.isfinite(s.ci95), s.ci95, 0.0)
        err = ci[keep]
        if logy:  # an interval reaching to 0 or below runs off the bottom of the axes
            err = np.vstack([np.minimum(ci, s.y * (1 - 1e-12))[keep], ci[keep]])
            lowest = min(lowest, s.y[keep].min(initial=np.inf))
        ax.errorbar(
            x[keep], s.y[keep], yerr=err, fmt="o", ms=4, capsize=2, color=color, label=s.name
        )
        failed = keep & ~s.passed
        if failed.any():  # a point whose warm-up diagnostic failed: hollow
            ax.plot(x[failed], s.y[failed], "o", ms=4, mfc="white", mec=color, zorder=3)
        if theory:
            line = None if baselines is None or shared_baseline else baselines[i]
            lowest = min(lowest, _draw_theory(ax, s, curve, color, logx, logy, line))
    if theory and baselines is not None and shared_baseline:
        _draw_levels(ax, baselines, logx, logy)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
        if np.isfinite(lowest):
            ax.set_ylim(bottom=lowest / 1.5)
    titles(ax, panel.title, panel.xlabel, panel.ylabel)
    plain_ticks(ax)
    handles, labels = [], []
    if series:
        handles, labels = ax.get_legend_handles_labels()
        if theory and any(np.isfinite(s.theory).any() for s in series):
            handles.append(key_line(lw=1.2))
            labels.append(panel.theory_label)
        if theory and any(np.isfinite(s.refined).any() for s in series):
            handles.append(key_line(lw=1.0, ls="--"))
            labels.append("refined mean field at $N$ (dashed)")
        if any((~s.passed).any() for s in series):
            handles.append(key_line(marker="o", ms=4, ls="", mfc="white"))
            labels.append("warm-up diagnostic failed (hollow)")
        if theory and baselines is not None and any(b is not None for b in baselines):
            handles.append(key_line(lw=1.4, ls=":"))
            # "(reconstructed) (dotted)" reads as two asides: "(reconstructed), dotted"
            labels.append(
                baseline_name + (", dotted" if baseline_name.endswith(")") else " (dotted)")
            )
    ax.grid(True, which="major", alpha=0.3)
    return ax, handles, labels


def _draw_levels(ax, baselines: list, logx: bool, logy: bool) -> None:
    """Level lines ``(x, y)`` (y constant), each value once, dotted in grey over the
    x range of the lines that have it."""
    spans: dict = {}
    for line in baselines:
        if line is None:
            continue
        bx, by = line
        ok = positive(by, logy) & positive(bx, logx)
        if ok.any():
            low, high = spans.get(float(by[ok][0]), (np.inf, -np.inf))
            spans[float(by[ok][0])] = (min(low, bx[ok].min()), max(high, bx[ok].max()))
    for y, (low, high) in spans.items():
        ax.plot([low, high], [y, y], ":", color="0.3", lw=1.4)


def plot_cdf(
    curves: list[Series],
    marks: list[Series] = (),
    ax=None,
    *,
    panel: Panel | None = None,
    colors: dict | None = None,
    **style,
):
    """Draw response-time laws on ``ax`` (a new figure's axes if None); returns ``ax``.

    Args:
        curves: the laws (:func:`~jaxqueue.studies.plotting.figures.figure_series` of a
            ``response_cdf`` figure): simulated solid, theory dotted and the
            refined mean field dashed, in the curve's colour.
        marks: the quantiles of the same curves
            (:func:`~jaxqueue.studies.plotting.figures.cdf_quantiles`), drawn at
            ``(quantile, q)`` with their 95% half-widths as horizontal bars.
        panel, colors, style: as for :func:`plot_series`.
    """
    ax, handles, labels = _draw_cdf(curves, marks, ax, _panel(panel, style), colors=colors)
    if handles:
        legend(ax, handles, labels)
    return ax


def _draw_cdf(curves, marks, ax, panel: Panel, *, colors):
    """:func:`plot_cdf` without its legend: ``(ax, handles, labels)`` of the legend."""
    logx, logy, theory = panel.logx, panel.logy, panel.theory
    if ax is None:
        ax = pyplot_free_figure(
            figsize=(6.4 + LEGEND_WIDTH, 4.4), layout="constrained"
        ).add_subplot()
    colors = {} if colors is None else colors
    fields = ("y", "theory", "refined") if theory else ("y",)
    drawn = set()
    for s in curves:
        color = colors.setdefault(s.label, f"C{len(colors) % 10}")
        for field in fields:
            y = getattr(s, field)
            keep = positive(y, logy) & positive(s.x, logx)
            if keep.any():
                ls, lw = CDF_STYLES[field]
                label = s.name if field == "y" else None
                ax.plot(s.x[keep], y[keep], ls, color=color, lw=lw, label=label)
                drawn.add(field)
    levels = set()
    for m in marks:
        keep = positive(m.y, logx)
        if keep.any():
            ci = np.where(np.isfinite(m.ci95), m.ci95, 0.0)
            color = colors.get(m.label, "0.3")
            ax.errorbar(m.y[keep], m.x[keep], xerr=ci[keep], fmt="o", ms=3, capsize=2, color=color)
            levels.update(m.x[keep].tolist())
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    titles(ax, panel.title, panel.xlabel, panel.ylabel)
    plain_ticks(ax)
    handles, labels = [], []
    if curves:
        handles, labels = ax.get_legend_handles_labels()
        for field, text in (
            ("theory", f"{panel.theory_label} (dotted)"),
            ("refined", "refined mean field at $N$ (dashed)"),
        ):
            if field in drawn:
                ls, lw = CDF_STYLES[field]
                handles.append(key_line(ls=ls, lw=lw))
                labels.append(text)
        if levels:
            handles.append(key_line(marker="o", ms=3, ls=""))
            qs = ", ".join(f"{q:g}" for q in sorted(levels))
            labels.append(f"quantiles at q = {qs} (95% intervals)")
    ax.grid(True, which="major", alpha=0.3)
    return ax, handles, labels


def _heading(title: str, caption: str, width_inches: float) -> str:
    """A title wrapped to the width of the figure (not inside ``$...$``), with the caption
    and any notes on their own lines."""
    width = max(30, int(width_inches * 11))
    return "\n".join(wrap(title, width) + ([caption] if caption else []))


def _ylabel(fig: FigureSpec) -> str:
    if fig.ylabel:
        return fig.ylabel
    if fig.kind == "exponent":
        return f"exponent fitted across {axis_label(fig.across)} (95% intervals)"
    if len(fig.metrics) > 1:
        return "value" + (f" x {fig.y_scale}" if fig.y_scale else "")
    return metric_label(fig.metrics[0], fig.index) + (f" x {fig.y_scale}" if fig.y_scale else "")


def _reference(fig: FigureSpec, series: list) -> tuple | None:
    """``(x, y, name)`` of a figure's reference line over its lines' x, or None."""
    xs = np.concatenate([s.x for s in series]) if series else np.zeros(0)
    line = reference_line(fig, xs)
    if line is None:
        return None
    return (*line, fig.reference_label or f"reference: {fig.reference}")


def _axes(fig: FigureSpec, panels: list, ax):
    """The axes to draw on: ``ax`` (checked), or a new figure's, one per panel, with room
    for the legend right of the last."""
    if ax is None:
        width = (5.2 * len(panels) if len(panels) > 1 else 6.4) + LEGEND_WIDTH
        mpl_fig = pyplot_free_figure(figsize=(width, 4.6), layout="constrained")
        return mpl_fig.subplots(1, len(panels), squeeze=False)[0]
    axes = np.atleast_1d(ax)
    if len(axes) != len(panels):
        raise ValueError(f"figure {fig.name!r} has {len(panels)} panels, got {len(axes)} axes")
    return axes


def _all_zero(s: Series) -> bool:
    """Whether a line is 0 at every point with 0-wide intervals and no non-zero theory
    (JIQ-Original's delete requests: it sends none): a flat line at 0 says nothing."""
    ci = np.where(np.isfinite(s.ci95), s.ci95, 0.0)
    theory = np.concatenate([s.theory, s.refined])
    return (
        s.y.size > 0
        and bool(np.all(s.y == 0))
        and bool(np.all(ci == 0))
        and bool(np.all(~np.isfinite(theory) | (theory == 0)))
    )


def plot_figure(
    rows: list[dict],
    fig: FigureSpec,
    ax=None,
    *,
    spec_name: str | None = None,
    spec: GridSpec | None = None,
):
    """Draw a ``[[figure]]`` of a spec from store rows; returns the axes (an array with panels).

    With ``panels`` the figure has one axes per panel value, titled by it (one
    panel: no panel title, its value in the caption), and ``ax`` must be None
    or a sequence of that many axes; their lines share one legend, right of
    the last. A ``response_cdf`` figure is drawn by :func:`plot_cdf`, with its
    stored quantiles on the curves. With the store's ``spec``
    (:func:`~jaxqueue.studies.plotting.figures.store_spec`), theory against the load is
    drawn as a curve on a fine grid of loads
    (:func:`~jaxqueue.studies.plotting.figures.theory_curve`) and named after the
    spec's theory (``mean field``, ``M/M/N (Erlang C)``). A line that is 0 at
    every point with 0-wide intervals and no theory is not drawn; the caption
    says so (``JIQ-Original: no delete requests``).
    """
    series = figure_series(rows, fig)
    marks = cdf_quantiles(rows, fig) if fig.metrics == (CDF,) else None
    caption = figure_caption(rows, series)
    notes = []
    if marks is None and fig.kind == "values":
        zero = [s for s in series if _all_zero(s)]
        if zero and len(zero) < len(series):
            notes = list(dict.fromkeys(zero_note(s.name, s.metric) for s in zero))
            series = [s for s in series if not _all_zero(s)]
    panels = sorted({s.panel for s in series}, key=lambda p: (p is None, p))
    if fig.panels is None:
        panels = [None]
    axes = _axes(fig, panels, ax)
    several = fig.panels is not None and len(panels) > 1
    if fig.panels is not None and not several:  # one panel: its value in the caption
        caption = ", ".join(t for t in (panel_label(fig.panels, panels[0]), caption) if t)
    if notes:
        caption += "\nnot drawn: " + "; ".join(notes)
    cache: dict = {}
    curves = [None if spec is None else theory_curve(s, fig, spec, cache) for s in series]
    lines = [None if spec is None else baseline_curve(s, fig, spec, {}) for s in series]
    title = fig.title or (f"{spec_name}: {fig.name}" if spec_name else fig.name)
    heading = _heading(title, caption, axes[0].figure.get_figwidth())
    if several:
        axes[0].figure.suptitle(heading, fontsize=10)
    colors: dict = {}
    keys: dict = {}  # label -> handle, over the panels
    for a, panel in zip(axes, panels):
        mine = [i for i, s in enumerate(series) if fig.panels is None or s.panel == panel]
        look = Panel(
            logx=fig.logx,
            logy=fig.logy,
            theory=fig.theory,
            title=panel_label(fig.panels, panel) if several else heading,
            xlabel=fig.xlabel or axis_label(fig.x),
            ylabel=_ylabel(fig),
            theory_label=theory_name(None if spec is None else spec.run.theory),
        )
        if marks is None:
            _, handles, labels = _draw_series(
                [series[i] for i in mine],
                a,
                look,
                colors=colors,
                curves=[curves[i] for i in mine],
                baselines=[lines[i] for i in mine],
                baseline_name=BASELINE_NAMES.get(fig.baseline),
                shared_baseline=fig.baseline in SHARED_BASELINES,
                reference=_reference(fig, [series[i] for i in mine]),
            )
        else:
            mine_marks = [m for m in marks if fig.panels is None or m.panel == panel]
            _, handles, labels = _draw_cdf(
                [series[i] for i in mine], mine_marks, a, look, colors=colors
            )
        for handle, label in zip(handles, labels):
            keys.setdefault(label, handle)
        if fig.x == "k" and not fig.logx:  # levels: whole numbers
            from matplotlib.ticker import MaxNLocator

            a.xaxis.set_major_locator(MaxNLocator(integer=True))
    if keys:
        legend(axes[-1], list(keys.values()), list(keys))
    return axes if fig.panels is not None else axes[0]


def read_store(store_path, spec_path=None) -> tuple[GridSpec, list[dict]]:
    """The spec of a store's figures (its recorded text, or the file ``spec_path``, in
    the store's mode: :func:`~jaxqueue.studies.plotting.figures.store_spec`) and its rows.

    Raises:
        ValueError: the file is not a result store, or records no spec text.
    """
    try:
        with Store.open_existing(store_path) as store:
            meta, rows = store.meta(), store.rows()
    except (StoreMismatchError, sqlite3.DatabaseError):
        raise ValueError(
            f"{store_path} is not a result store: give the .sqlite file a sweep wrote "
            "(a spec file goes with --spec)"
        ) from None
    if spec_path is not None:
        with open(spec_path, encoding="utf-8") as f:
            text = f.read()
    else:
        text = meta.get("spec_text")
        if not text:
            raise ValueError(f"{store_path} records no spec text: pass the spec file (--spec)")
    return store_spec(text, meta), rows


def plot_store(store_path, figure: str, out, *, spec_path=None, dpi: int = 120) -> list[dict]:
    """Write figure ``figure`` of the store at ``store_path`` to ``out``, a PNG, PDF or
    SVG by its suffix (:data:`IMAGE_SUFFIXES`; another suffix is matplotlib's to read).

    The figure is read from the spec text recorded in the store, or from
    ``spec_path`` (to draw figures edited or added after the run).

    Returns:
        :func:`~jaxqueue.studies.plotting.figures.summarize` of the figure's lines
        (largest relative error and |difference| / half-width against theory;
        against a benchmark such as the M/M/N queue, also the ratio to it);
        of a ``response_cdf`` figure, of its quantiles (``x``: the level).
        With a ``baseline``, each line also has ``baseline`` (its legend name,
        None where the line has none) and ``baseline_values`` (at the line's
        ``x``; None where none).
    """
    spec, rows = read_store(store_path, spec_path)
    fig = spec.figure(figure)
    axes = plot_figure(rows, fig, spec_name=spec.name, spec=spec)
    mpl_fig = np.atleast_1d(axes)[0].figure
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    mpl_fig.savefig(out, dpi=dpi)
    lines = cdf_quantiles(rows, fig) if fig.metrics == (CDF,) else figure_series(rows, fig)
    report = summarize(lines, spec.run.theory)
    if fig.baseline is not None and fig.metrics != (CDF,):
        _report_baselines(report, lines, fig, spec)
    return report


def _report_baselines(report: list[dict], lines: list, fig: FigureSpec, spec: GridSpec) -> None:
    """Add to each line's report its baseline's name and values at its ``x`` (None: none)."""
    cache: dict = {}
    for row, s in zip(report, lines):
        curve = baseline_curve(s, fig, spec, cache)
        row["baseline"] = None if curve is None else BASELINE_NAMES[fig.baseline]
        row["baseline_values"] = None
        if curve is not None:
            at = np.interp(s.x, *curve, left=np.nan, right=np.nan)
            row["baseline_values"] = [float(v) if np.isfinite(v) else None for v in at]
