"""Figures of grid experiments: a store's rows (:mod:`jaxqueue.studies.store`) as the
lines of a spec's ``[[figure]]`` (:class:`Series`, plain numpy), the response-time law
of a point, and each line against theory (:func:`summarize`).

The figure tables are read in :mod:`jaxqueue.studies.figure_spec`; drawing is in
:mod:`jaxqueue.studies.plots` (the ``plot`` extra). What a figure draws: docs/sweeps.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict

import numpy as np

from jaxqueue.results.response import erlang_mixture_cdf, erlang_mixture_quantile
from jaxqueue.studies.figure_spec import (
    CDF,
    FIGURE_KEYS,
    METRIC_NAMES,
    PARAMETER_DEFAULTS,
    PARAMETERS,
    FigureSpec,
    check_expression,
    evaluate_expression,
    parse_figure,
)

__all__ = [
    "FigureSpec",
    "Series",
    "parse_figure",
    "figure_series",
    "cdf_quantiles",
    "summarize",
    "PARAMETERS",
    "FIGURE_KEYS",
    "METRIC_NAMES",
    "CDF",
    "CDF_POINTS",
    "check_expression",
    "evaluate_expression",
]

#: Times at which a response-time law is drawn, from 0 to the largest quantile
#: at ``CDF_LEVEL`` of the figure's curves.
CDF_POINTS = 201
CDF_LEVEL = 0.999


@dataclasses.dataclass(frozen=True)
class Series:
    """One line of a figure: simulated means with 95% half-widths, and theory (NaN: none).

    All arrays are float64 and sorted by ``x``; ``y``, ``ci95``, ``theory`` and
    ``refined`` (the 1/N-refined mean field, NaN unless the spec asked for it)
    already carry the figure's ``y_scale``.
    """

    panel: object
    label: str
    metric: str
    x: np.ndarray
    y: np.ndarray
    ci95: np.ndarray
    theory: np.ndarray
    refined: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))

    def __post_init__(self):
        if self.refined.size != self.x.size:  # not given: none
            object.__setattr__(self, "refined", np.full(self.x.size, math.nan))


def _matches(row: dict, key: str, values: tuple) -> bool:
    have = row["idx"] if key == "index" else row.get(key)
    for v in values:
        if isinstance(v, str) or isinstance(have, str) or have is None:
            if v == have or (
                have is None and v == ("inf" if key == "buffer" else PARAMETER_DEFAULTS.get(key))
            ):
                return True
        elif math.isclose(float(have), float(v), rel_tol=1e-9, abs_tol=1e-12):
            return True
    return False


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _fmt(value) -> str:
    return "inf" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))


def figure_series(rows: list[dict], fig: FigureSpec) -> list[Series]:
    """The lines of ``fig`` from store rows (:meth:`Store.rows`), in a stable order.

    For a ``response_cdf`` figure a line is the law ``P(T <= t)`` of one
    point at :data:`CDF_POINTS` times ``t`` (its ``ci95`` is NaN: the store
    keeps an interval per ``k``, not their joint law; :func:`cdf_quantiles`
    gives the quantiles with theirs).

    Raises:
        ValueError: no row matches the figure's metrics, index and filters.
    """
    if fig.metrics == (CDF,):
        return _cdf_series(rows, fig)
    picked = []
    for r in rows:
        if r["metric"] not in fig.metrics:
            continue
        if fig.index is not None and not _same(float(r["idx"]), fig.index):
            continue
        if fig.x == "index" and r["idx"] < 0:
            continue
        if all(_matches(r, k, v) for k, v in fig.where):
            picked.append(r)
    if not picked:
        raise ValueError(
            f"figure {fig.name!r}: no rows match its metrics {list(fig.metrics)}"
            + (f", index {fig.index:g}" if fig.index is not None else "")
            + (f" and filters {dict(fig.where)}" if fig.where else "")
        )
    series_keys = fig.series
    if series_keys is None:
        series_keys = _varying(picked, fig, lambda r: r["idx"] if fig.x == "index" else r[fig.x])
    groups: OrderedDict = OrderedDict()
    for r in picked:
        panel = r.get(fig.panels) if fig.panels else None
        key = tuple(r.get(p) for p in series_keys)
        groups.setdefault((_sort_key(panel), _sort_key(key), r["metric"]), (panel, key, []))
        groups[(_sort_key(panel), _sort_key(key), r["metric"])][2].append(r)
    out = []
    for gkey in sorted(groups):
        panel, key, members = groups[gkey]
        xs = np.array([float(m["idx"] if fig.x == "index" else m[fig.x]) for m in members])
        order = np.argsort(xs, kind="stable")
        scale = np.array([fig.scale(m) for m in members])
        col = lambda name, members=members: _column(members, name)  # noqa: E731
        label = _label(series_keys, key)
        if len(fig.metrics) > 1:
            label = f"{label} {gkey[2]}".strip()
        out.append(
            Series(
                panel,
                label or gkey[2],
                gkey[2],
                xs[order],
                (col("mean") * scale)[order],
                (col("ci95") * scale)[order],
                (col("theory") * scale)[order],
                (col("refined") * scale)[order],
            )
        )
    return out


def _varying(picked: list[dict], fig: FigureSpec, x_of) -> tuple:
    """The default series: every parameter other than x and panels that varies at a fixed
    x (``x_of(row)``) and panel."""
    buckets: dict = {}
    for r in picked:
        key = (_sort_key(x_of(r)), _sort_key(r.get(fig.panels)) if fig.panels else None)
        buckets.setdefault(key, []).append(r)
    varying = [
        p
        for p in PARAMETERS
        if p not in (fig.x, fig.panels) and any(_varies(b, p) for b in buckets.values())
    ]
    if "ratio" in varying:  # M follows N and r
        varying = [p for p in varying if p != "dispatchers"]
    if "alpha" in varying or "beta" in varying:  # the load follows N and alpha or beta
        varying = [p for p in varying if p != "load"]
    return tuple(varying)


def _column(members: list[dict], name: str) -> np.ndarray:
    return np.array([math.nan if m.get(name) is None else float(m[name]) for m in members])


def _label(series_keys: tuple, key: tuple) -> str:
    return " ".join(
        _fmt(v) if p == "policy" else f"{p}={_fmt(PARAMETER_DEFAULTS.get(p) if v is None else v)}"
        for p, v in zip(series_keys, key)
        if v is not None or p in ("buffer", "service", "pools", "arrivals")  # an option the
    )  # policy does not take is left out


def _cdf_curves(rows: list[dict], fig: FigureSpec) -> list[tuple]:
    """``(panel, label, rows)`` per curve of a ``response_cdf`` figure: the ``arrival_seen``
    and ``response_quantile`` rows of one point each, in a stable order."""
    picked = [
        r
        for r in rows
        if r["metric"] in ("arrival_seen", "response_quantile")
        and all(_matches(r, k, v) for k, v in fig.where)
    ]
    seen = [r for r in picked if r["metric"] == "arrival_seen"]
    if not seen:
        raise ValueError(
            f"figure {fig.name!r}: no arrival_seen rows match"
            + (f" its filters {dict(fig.where)}" if fig.where else "")
        )
    for r in seen:
        if r.get("service") is not None or r.get("pools") is not None:
            raise ValueError(
                f"figure {fig.name!r}: the response-time law is the Erlang mixture of "
                "arrival_seen, which holds for exp(1) service on identical servers, and a "
                f"point has service={r.get('service')!r}, pools={r.get('pools')!r}: leave it "
                "out with where"
            )
    series_keys = fig.series
    if series_keys is None:
        series_keys = _varying(seen, fig, lambda r: None)
    groups: dict = {}
    for r in picked:
        panel = r.get(fig.panels) if fig.panels else None
        key = tuple(r.get(p) for p in series_keys)
        groups.setdefault((_sort_key(panel), _sort_key(key)), (panel, key, []))[2].append(r)
    out = []
    for gkey in sorted(groups):
        panel, key, members = groups[gkey]
        label = _label(series_keys, key) or CDF
        if len({m["point_id"] for m in members}) > 1:
            in_panel = "" if panel is None else f" in panel {fig.panels}={_fmt(panel)}"
            raise ValueError(
                f"figure {fig.name!r}: a {CDF} curve is one point, and series "
                f"{list(series_keys)} put {len({m['point_id'] for m in members})} points on "
                f"the curve {label!r}{in_panel}: add the parameter that tells them apart to "
                "series or panels, or keep one with where (e.g. where = { load = 0.9 })"
            )
        out.append((panel, label, members))
    return out


def _seen_weights(members: list[dict], column: str):
    """A point's ``arrival_seen`` (``w_k`` at ``k = idx``) from ``column``, or None where
    some ``k`` has no finite value (no theory; a replica set that saw no arrival)."""
    seen = [m for m in members if m["metric"] == "arrival_seen"]
    values = _column(seen, column)
    if not np.isfinite(values).all() or not values.sum() > 0:
        return None
    w = np.zeros(int(max(m["idx"] for m in seen)) + 1)
    w[[int(m["idx"]) for m in seen]] = values
    return np.clip(w, 0.0, None)  # a solver's rounding can leave a -1e-17


def _cdf_series(rows: list[dict], fig: FigureSpec) -> list[Series]:
    curves = _cdf_curves(rows, fig)
    weights = [
        {c: _seen_weights(members, c) for c in ("mean", "theory", "refined")}
        for _, _, members in curves
    ]
    ends = [
        float(erlang_mixture_quantile(w, CDF_LEVEL))
        for ws in weights
        for w in ws.values()
        if w is not None
    ]
    if not ends:
        raise ValueError(f"figure {fig.name!r}: no point has a finite arrival_seen")
    t = np.linspace(0.0, max(ends), CDF_POINTS)
    out = []
    for (panel, label, _), ws in zip(curves, weights):
        law = {
            c: np.full(t.size, math.nan) if w is None else erlang_mixture_cdf(w, t)
            for c, w in ws.items()
        }
        out.append(
            Series(
                panel,
                label,
                CDF,
                t,
                law["mean"],
                np.full(t.size, math.nan),
                law["theory"],
                law["refined"],
            )
        )
    return out


def cdf_quantiles(rows: list[dict], fig: FigureSpec) -> list[Series]:
    """The stored response-time quantiles of each curve of a ``response_cdf`` figure.

    One :class:`Series` per curve of :func:`figure_series` (same panel and
    label): ``x`` the levels ``q``, ``y`` the simulated quantiles with their
    95% half-widths, ``theory`` and ``refined`` beside them. Plots draw them on
    the curves; :func:`summarize` of them compares the law with theory.
    """
    out = []
    for panel, label, members in _cdf_curves(rows, fig):
        qs = sorted(
            (m for m in members if m["metric"] == "response_quantile"), key=lambda m: m["idx"]
        )
        out.append(
            Series(
                panel,
                label,
                "response_quantile",
                _column(qs, "idx"),
                _column(qs, "mean"),
                _column(qs, "ci95"),
                _column(qs, "theory"),
                _column(qs, "refined"),
            )
        )
    return out


def _varies(rows, key) -> bool:
    return len({_sort_key(r.get(key)) for r in rows}) > 1


def _sort_key(value):
    if isinstance(value, tuple):
        return tuple(_sort_key(v) for v in value)
    if value is None:
        return (2, 0.0, "")
    if isinstance(value, str):
        return (1, 0.0, value)
    return (0, float(value), "")


def summarize(series: list[Series]) -> list[dict]:
    """Per line: points, the largest relative error and |difference| / half-width against theory.

    ``max_relative_error`` is ``max |y - theory| / |theory|`` over the points
    where theory is non-zero; ``max_z`` is ``max |y - theory| / ci95`` (None
    where no point has theory). Where the line has refined mean-field values,
    the same against them as ``refined_max_relative_error``,
    ``refined_at_x`` and ``refined_max_z``.
    """
    out = []
    for s in series:
        row = {"panel": s.panel, "label": s.label, "metric": s.metric, "points": int(s.x.size)}
        row.update(_against(s, s.theory, ""))
        if np.isfinite(s.refined).any():
            row.update(_against(s, s.refined, "refined_"))
        out.append(row)
    return out


def _against(s: Series, theory: np.ndarray, prefix: str) -> dict:
    ok = np.isfinite(theory) & np.isfinite(s.y)
    nz = ok & (theory != 0)
    rel = np.abs(s.y - theory)[nz] / np.abs(theory[nz])
    zs = np.abs(s.y - theory)[ok & (s.ci95 > 0)] / s.ci95[ok & (s.ci95 > 0)]
    return {
        f"{prefix}with_theory": int(ok.sum()),
        f"{prefix}max_relative_error": float(rel.max()) if rel.size else None,
        f"{prefix}at_x": float(s.x[nz][rel.argmax()]) if rel.size else None,
        f"{prefix}max_z": float(zs.max()) if zs.size else None,
    }
