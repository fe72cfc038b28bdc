"""Plots of grid experiments (the ``plot`` extra: matplotlib): each function takes an
optional ``Axes`` and returns the axes it drew on; :func:`plot_store` writes a PNG.

No pyplot state is used, so this works headless and in threads. What is drawn how:
docs/sweeps.md (Figures).
"""

from __future__ import annotations

import os

import numpy as np

from jaxqueue.studies.figures import (
    CDF,
    FigureSpec,
    Series,
    cdf_quantiles,
    figure_series,
    summarize,
)
from jaxqueue.studies.spec import parse_spec
from jaxqueue.studies.store import Store

__all__ = [
    "plot_series",
    "plot_cdf",
    "plot_figure",
    "plot_store",
    "axis_label",
    "pyplot_free_figure",
]

_LABELS = {
    "load": r"$\lambda$",
    "servers": "N",
    "ratio": "r = N / M",
    "dispatchers": "M",
    "alpha": r"$\alpha$",
    "beta": r"$\beta$",
    "buffer": "buffer b",
    "d": "d",
    "z": "z",
    "index": "k",
    "mean_response_time": "mean response time T",
    "waiting_probability": "P(wait)",
    "blocking_probability": "P(blocked)",
    "mean_queue_length": "mean tasks per server",
    "p0": r"$p_0$",
    "join_rate": "join requests per server per unit time",
    "delete_rate": "delete requests per server per unit time",
    "probe_rate": "probes per server per unit time",
    "stale_fraction": "stale picks",
    "tail": r"$s_k$ (servers with $\geq k$ tasks)",
    "occupancy": "servers with exactly k tasks",
    "arrival_seen": "arrivals that find k tasks",
    "iqueue_distribution": "I-queues of size k",
    "response_quantile": "response-time quantile",
    "time": "response time t",
    CDF: r"$P(T \leq t)$",
}


#: Line style and width of a response-time law: simulated, theory, refined mean field.
_CDF_STYLES = {"y": ("-", 1.5), "theory": (":", 1.2), "refined": ("--", 1.0)}


def pyplot_free_figure(**kw):
    """A matplotlib ``Figure`` outside pyplot's state (headless, thread-safe).

    matplotlib is imported here, not at the top: it is an optional extra (``plot``)."""
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError:
        raise ModuleNotFoundError("plots need matplotlib: pip install 'jaxqueue[plot]'") from None
    return Figure(**kw)


def axis_label(key: str) -> str:
    """The axis label of a parameter or metric name."""
    return _LABELS.get(key, key)


def _titles(ax, title, xlabel, ylabel) -> None:
    """The axes' title and labels, where given."""
    if title:
        ax.set_title(title, fontsize=10)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)


def plot_series(
    series: list[Series],
    ax=None,
    *,
    logx: bool = False,
    logy: bool = False,
    theory: bool = True,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    colors: dict | None = None,
):
    """Draw lines of a figure on ``ax`` (a new figure's axes if None); returns ``ax``.

    Args:
        series: the lines (:func:`~jaxqueue.studies.figures.figure_series`).
        ax: a matplotlib Axes.
        logx, logy: log scales (non-positive values are left out on a log axis).
        theory: draw the theory lines where the series have theory values (and
            the refined mean field dashed where they have it).
        title, xlabel, ylabel: texts.
        colors: ``{label: color}`` to keep colours across panels (filled in).
    """
    if ax is None:
        ax = pyplot_free_figure(figsize=(6.4, 4.4), layout="constrained").add_subplot()
    colors = {} if colors is None else colors
    cycle = [f"C{i}" for i in range(10)]
    lowest = np.inf  # the smallest value drawn on a log y axis
    for s in series:
        color = colors.setdefault(s.label, cycle[len(colors) % len(cycle)])
        keep = np.isfinite(s.y)
        if logy:
            keep &= s.y > 0
        if logx:
            keep &= s.x > 0
        ci = np.where(np.isfinite(s.ci95), s.ci95, 0.0)
        if logy:  # an interval reaching to 0 or below runs off the bottom of the axes
            lower = np.minimum(ci, s.y * (1 - 1e-12))
            err = np.vstack([lower[keep], ci[keep]])
            lowest = min(lowest, s.y[keep].min(initial=np.inf))
        else:
            err = ci[keep]
        ax.errorbar(
            s.x[keep], s.y[keep], yerr=err, fmt="o", ms=4, capsize=2, color=color, label=s.label
        )
        if theory:
            th = np.isfinite(s.theory) & ((s.theory > 0) if logy else True)
            if logx:
                th &= s.x > 0
            if logy:
                lowest = min(lowest, s.theory[th].min(initial=np.inf))
            if th.sum() >= 1:
                ax.plot(
                    s.x[th], s.theory[th], "-" if th.sum() > 1 else "_", color=color, lw=1.2, ms=12
                )
            rf = np.isfinite(s.refined) & ((s.refined > 0) if logy else True)
            if logx:
                rf &= s.x > 0
            if rf.sum() >= 1:
                if logy:
                    lowest = min(lowest, s.refined[rf].min(initial=np.inf))
                ax.plot(
                    s.x[rf], s.refined[rf], "--" if rf.sum() > 1 else "x", color=color, lw=1.0, ms=6
                )
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
        if np.isfinite(lowest):
            ax.set_ylim(bottom=lowest / 3)
    _titles(ax, title, xlabel, ylabel)
    if series:
        handles, labels = ax.get_legend_handles_labels()
        if theory and any(np.isfinite(s.theory).any() for s in series):
            from matplotlib.lines import Line2D  # the optional extra: imported where drawn

            handles.append(Line2D([], [], color="0.3", lw=1.2))
            labels.append("theory (lines)")
        if theory and any(np.isfinite(s.refined).any() for s in series):
            from matplotlib.lines import Line2D  # the optional extra: imported where drawn

            handles.append(Line2D([], [], color="0.3", lw=1.0, ls="--"))
            labels.append("refined mean field at N (dashed)")
        ax.legend(handles, labels, fontsize=7, frameon=False)
    ax.grid(True, which="major", alpha=0.3)
    return ax


def plot_cdf(
    curves: list[Series],
    marks: list[Series] = (),
    ax=None,
    *,
    logx: bool = False,
    logy: bool = False,
    theory: bool = True,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    colors: dict | None = None,
):
    """Draw response-time laws on ``ax`` (a new figure's axes if None); returns ``ax``.

    Args:
        curves: the laws (:func:`~jaxqueue.studies.figures.figure_series` of a
            ``response_cdf`` figure): simulated solid, theory dotted and the
            refined mean field dashed, in the curve's colour.
        marks: the quantiles of the same curves
            (:func:`~jaxqueue.studies.figures.cdf_quantiles`), drawn at
            ``(quantile, q)`` with their 95% half-widths as horizontal bars.
        logx, logy, theory, title, xlabel, ylabel, colors: as for :func:`plot_series`.
    """
    if ax is None:
        ax = pyplot_free_figure(figsize=(6.4, 4.4), layout="constrained").add_subplot()
    colors = {} if colors is None else colors
    cycle = [f"C{i}" for i in range(10)]
    fields = ("y", "theory", "refined") if theory else ("y",)
    drawn = set()
    for s in curves:
        color = colors.setdefault(s.label, cycle[len(colors) % len(cycle)])
        for field in fields:
            y = getattr(s, field)
            keep = np.isfinite(y) & ((y > 0) if logy else True) & ((s.x > 0) if logx else True)
            if keep.any():
                ls, lw = _CDF_STYLES[field]
                ax.plot(
                    s.x[keep],
                    y[keep],
                    ls,
                    color=color,
                    lw=lw,
                    label=s.label if field == "y" else None,
                )
                drawn.add(field)
    levels = set()
    for m in marks:
        keep = np.isfinite(m.y) & ((m.y > 0) if logx else True)
        if keep.any():
            ci = np.where(np.isfinite(m.ci95), m.ci95, 0.0)
            ax.errorbar(
                m.y[keep],
                m.x[keep],
                xerr=ci[keep],
                fmt="o",
                ms=3,
                capsize=2,
                color=colors.get(m.label, "0.3"),
            )
            levels.update(m.x[keep].tolist())
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    _titles(ax, title, xlabel, ylabel)
    if curves:
        from matplotlib.lines import Line2D  # the optional extra: imported where drawn

        handles, labels = ax.get_legend_handles_labels()
        for field, text in (
            ("theory", "theory (dotted)"),
            ("refined", "refined mean field at N (dashed)"),
        ):
            if field in drawn:
                ls, lw = _CDF_STYLES[field]
                handles.append(Line2D([], [], color="0.3", ls=ls, lw=lw))
                labels.append(text)
        if levels:
            handles.append(Line2D([], [], color="0.3", marker="o", ms=3, ls=""))
            labels.append(
                f"quantiles at q = {', '.join(f'{q:g}' for q in sorted(levels))} (95% intervals)"
            )
        ax.legend(handles, labels, fontsize=7, frameon=False, loc="lower right")
    ax.grid(True, which="major", alpha=0.3)
    return ax


def plot_figure(rows: list[dict], fig: FigureSpec, ax=None, *, spec_name: str | None = None):
    """Draw a ``[[figure]]`` of a spec from store rows; returns the axes (an array with panels).

    With ``panels`` the figure has one axes per panel value and ``ax`` must be
    None or a sequence of that many axes. A ``response_cdf`` figure is drawn
    by :func:`plot_cdf`, with its stored quantiles on the curves.
    """
    series = figure_series(rows, fig)
    marks = cdf_quantiles(rows, fig) if fig.metrics == (CDF,) else None
    panels = sorted({s.panel for s in series}, key=lambda p: (p is None, p))
    if fig.panels is None:
        panels = [None]
    if ax is None:
        width = 5.2 * len(panels) if fig.panels else 6.4
        mpl_fig = pyplot_free_figure(figsize=(width, 4.4), layout="constrained")
        axes = mpl_fig.subplots(1, len(panels), squeeze=False)[0]
    else:
        axes = np.atleast_1d(ax)
        if len(axes) != len(panels):
            raise ValueError(f"figure {fig.name!r} has {len(panels)} panels, got {len(axes)} axes")
    colors: dict = {}
    metric = fig.metrics[0] if len(fig.metrics) == 1 else "value"
    ylabel = fig.ylabel or (axis_label(metric) + (f" x {fig.y_scale}" if fig.y_scale else ""))
    if fig.index is not None and not fig.ylabel:
        ylabel += f" at {'q' if metric == 'response_quantile' else 'k'} = {fig.index:g}"
    title = fig.title or (f"{spec_name}: {fig.name}" if spec_name else fig.name)
    if fig.panels is not None:
        axes[0].figure.suptitle(title, fontsize=11)
    for a, panel in zip(axes, panels):
        mine = [s for s in series if fig.panels is None or s.panel == panel]
        if fig.panels is not None:
            title = f"{axis_label(fig.panels)} = {panel if panel is not None else 'inf'}"
        style = dict(
            logx=fig.logx,
            logy=fig.logy,
            theory=fig.theory,
            title=title,
            xlabel=fig.xlabel or axis_label(fig.x),
            ylabel=ylabel,
            colors=colors,
        )
        if marks is None:
            plot_series(mine, a, **style)
        else:
            plot_cdf(mine, [m for m in marks if fig.panels is None or m.panel == panel], a, **style)
    return axes if fig.panels is not None else axes[0]


def plot_store(store_path, figure: str, out, *, spec_path=None, dpi: int = 120) -> list[dict]:
    """Write figure ``figure`` of the store at ``store_path`` as a PNG at ``out``.

    The figure is read from the spec text recorded in the store, or from
    ``spec_path`` (to draw figures edited or added after the run).

    Returns:
        :func:`~jaxqueue.studies.figures.summarize` of the figure's lines
        (largest relative error and |difference| / half-width against theory);
        of a ``response_cdf`` figure, of its quantiles (``x``: the level).
    """
    with Store.open_existing(store_path) as store:
        meta, rows = store.meta(), store.rows()
    if spec_path is not None:
        with open(spec_path, encoding="utf-8") as f:
            text = f.read()
    else:
        text = meta.get("spec_text")
        if not text:
            raise ValueError(f"{store_path} records no spec text: pass the spec file (--spec)")
    spec = parse_spec(text, name=meta.get("spec_name"))
    fig = spec.figure(figure)
    axes = plot_figure(rows, fig, spec_name=spec.name)
    mpl_fig = np.atleast_1d(axes)[0].figure
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    mpl_fig.savefig(out, dpi=dpi)
    lines = cdf_quantiles(rows, fig) if fig.metrics == (CDF,) else figure_series(rows, fig)
    return summarize(lines)
