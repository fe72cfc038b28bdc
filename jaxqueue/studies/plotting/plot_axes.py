"""The axes of the figures of grid experiments: markers spread where they would
overlap, plain tick labels on short log axes, the legend outside the data, titles
and wrapped texts (matplotlib, the ``plot`` extra, imported where it draws).
:mod:`jaxqueue.studies.plotting.plots` draws with them.
"""

from __future__ import annotations

import textwrap

import numpy as np

from jaxqueue.studies.plotting.figures import Series

__all__ = [
    "dodged_x",
    "plain_log_ticks",
    "plain_ticks",
    "legend",
    "key_line",
    "titles",
    "wrap",
    "positive",
    "pyplot_free_figure",
    "IMAGE_SUFFIXES",
    "DODGE",
    "MARKER_SPAN",
    "PLAIN_DECADES",
    "LEGEND_WIDTH",
    "CDF_STYLES",
    "REFERENCE",
]


#: The file types :func:`plot_store` writes, by suffix.
IMAGE_SUFFIXES = (".png", ".pdf", ".svg")
#: How far apart the markers of two lines at a shared x are drawn: a fraction of the
#: x axis's span (of its decades on a log axis).
DODGE = 0.008
#: How much of the y axis's span (decades on a log axis) a marker covers: two markers
#: at a shared x overlap where their intervals, widened by half this each, meet.
MARKER_SPAN = 0.02
#: A log axis spanning fewer decades than this has plain tick labels (30, 40, 60, 100);
#: a longer one keeps 10^k.
PLAIN_DECADES = 2.0
#: The width (inches) a figure of :func:`plot_figure` adds for its legend, right of the axes.
LEGEND_WIDTH = 2.2
#: Legend texts longer than this many characters wrap (mathtext kept on one line).
_LEGEND_CHARS = 36
#: Line style and width of a response-time law: simulated, theory, refined mean field.
CDF_STYLES = {"y": ("-", 1.5), "theory": (":", 1.2), "refined": ("--", 1.0)}
#: The legend: right of the axes, clear of the data, its top level with theirs.
_LEGEND = {
    "fontsize": 8,
    "frameon": False,
    "loc": "upper left",
    "bbox_to_anchor": (1.02, 1.0),
    "borderaxespad": 0.0,
}
#: The colour of a figure's reference line.
REFERENCE = "tab:red"


def pyplot_free_figure(**kw):
    """A matplotlib ``Figure`` outside pyplot's state (headless, thread-safe).

    matplotlib is imported here, not at the top: it is an optional extra (``plot``)."""
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError:
        raise ModuleNotFoundError("plots need matplotlib: pip install 'jaxqueue[plot]'") from None
    return Figure(**kw)


def key_line(**kw):
    """A legend handle drawn nowhere (matplotlib, the optional extra, imported where drawn)."""
    from matplotlib.lines import Line2D

    return Line2D([], [], color="0.3", **kw)


def titles(ax, title, xlabel, ylabel) -> None:
    """The axes' title and labels, where given."""
    if title:
        ax.set_title(title, fontsize=10)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)


def wrap(text: str, width: int) -> list[str]:
    """``text`` wrapped to ``width`` characters, never inside ``$...$`` (mathtext)."""
    parts = text.split("$")
    kept = "$".join(p.replace(" ", "\0") if i % 2 else p for i, p in enumerate(parts))
    return [line.replace("\0", " ") for line in textwrap.wrap(kept, width=width)] or [""]


def _span(values: np.ndarray, log: bool) -> tuple[float, float] | None:
    """The ends of the finite (log: positive, in decades) ``values``, or None."""
    values = values[np.isfinite(values) & ((values > 0) if log else True)]
    if values.size == 0:
        return None
    values = np.log10(values) if log else values
    return float(values.min()), float(values.max())


def dodged_x(
    series: list[Series],
    logx: bool = False,
    dodge: float = DODGE,
    *,
    logy: bool = False,
    marker: float = MARKER_SPAN,
) -> list[np.ndarray]:
    """The x at which each line's markers are drawn: where markers of lines at a shared x
    would overlap (their 95% intervals, widened by ``marker`` of the y axis's span, meet;
    a chain of such markers together), spread by ``dodge`` of the x axis's span (decades
    on a log axis) about the true x, centred; at the true x everywhere else (markers
    apart on a steep curve stay on their x), and where ``dodge`` is 0."""
    xs = [np.asarray(s.x, dtype=float) for s in series]
    if len(xs) < 2 or dodge == 0:
        return xs
    xspan = _span(np.concatenate(xs), logx)
    ys = [np.asarray(s.y, dtype=float) for s in series]
    yspan = _span(np.concatenate(ys), logy)
    if xspan is None or yspan is None:
        return xs
    step = dodge * ((xspan[1] - xspan[0]) or 1.0)
    pad = marker * ((yspan[1] - yspan[0]) or 1.0) / 2
    lows, highs = [], []
    for s, y in zip(series, ys):
        ci = np.where(np.isfinite(s.ci95), np.abs(s.ci95), 0.0)
        drawn = np.isfinite(y) & ((y > 0) if logy else True) & np.isfinite(s.x)
        drawn &= (s.x > 0) if logx else True
        with np.errstate(divide="ignore", invalid="ignore"):
            low = np.log10(np.maximum(y - ci, y * 1e-12)) if logy else y - ci
            high = np.log10(y + ci) if logy else y + ci
        lows.append(np.where(drawn, low - pad, np.nan))
        highs.append(np.where(drawn, high + pad, np.nan))
    moved = [np.zeros(x.size) for x in xs]
    at = [(x_, i, j) for i, x in enumerate(xs) for j, x_ in enumerate(x) if np.isfinite(lows[i][j])]
    for value in np.unique([x_ for x_, _, _ in at]):
        here = sorted((lows[i][j], highs[i][j], i, j) for x_, i, j in at if x_ == value)
        group, top = [], -np.inf
        for low, high, i, j in here + [(np.inf, np.inf, -1, -1)]:
            if low > top:  # no overlap with the group so far: spread the group, start anew
                for rank, (gi, gj) in enumerate(sorted(group)):
                    moved[gi][gj] = (rank - (len(group) - 1) / 2) * step
                group, top = [], -np.inf
            group.append((i, j))
            top = max(top, high)
    return [x * 10.0**m if logx else x + m for x, m in zip(xs, moved)]


def plain_log_ticks(axis) -> None:
    """On a log ``axis`` (matplotlib's ``ax.xaxis`` or ``ax.yaxis``) spanning fewer than
    :data:`PLAIN_DECADES` decades of its current limits, ticks labelled as plain numbers
    (``30, 40, 60, 100``, ``0.05, 0.1, 0.2``; not ``3x10^1`` or ``10^0, 2x10^0``); a
    longer axis keeps its ``10^k`` labels, a linear one is left alone."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    if axis.get_scale() != "log":
        return
    low, high = sorted(axis.get_view_interval())
    if not 0 < low < high:
        return
    decades = np.log10(high / low)
    if decades >= PLAIN_DECADES:
        return
    if decades < 0.5:  # under a factor of 3: evenly spaced values
        axis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    else:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if decades > 1.2 else (1, 2, 3, 5)))
    axis.set_major_formatter(FuncFormatter(_plain_number))
    axis.set_minor_formatter(NullFormatter())


def _plain_number(value, _pos=None) -> str:
    """A tick's value as a plain number to three figures: ``30``, ``0.05``, ``100000``."""
    if value == 0 or not np.isfinite(value):
        return f"{value:g}"
    return np.format_float_positional(float(f"{value:.3g}"), trim="-")


def positive(a: np.ndarray, log: bool) -> np.ndarray:
    return np.isfinite(a) & ((a > 0) if log else True)


def plain_ticks(ax) -> None:
    """:func:`plain_log_ticks` on both axes of ``ax``, at the limits drawn so far."""
    ax.autoscale_view()
    plain_log_ticks(ax.xaxis)
    plain_log_ticks(ax.yaxis)


def legend(ax, handles: list, labels: list) -> None:
    """A legend right of ``ax`` (outside the data), its long texts wrapped."""
    texts = ["\n".join(wrap(text, _LEGEND_CHARS)) for text in labels]
    ax.legend(handles, texts, **_LEGEND)
