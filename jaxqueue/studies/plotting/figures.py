"""Figures of grid experiments: a store's rows (:mod:`jaxqueue.studies.grids.store`) as the
lines of a spec's ``[[figure]]`` (:class:`Series`, plain numpy), the response-time law
of a point, and each line against theory (:func:`summarize`).

The figure tables are read in :mod:`jaxqueue.studies.plotting.figure_spec`; drawing is in
:mod:`jaxqueue.studies.plotting.plots` (the ``plot`` extra). What a figure draws: docs/sweeps.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict

import numpy as np

from jaxqueue.core.user_metrics import PER_ARRIVAL, at_fixed_point
from jaxqueue.results.response import erlang_mixture_cdf, erlang_mixture_quantile
from jaxqueue.studies.grids.grid_theory import theory_key, theory_value, theory_values
from jaxqueue.studies.grids.points import GridSpec
from jaxqueue.studies.grids.spec import MODES, parse_spec
from jaxqueue.studies.plotting.figure_labels import BENCHMARK_THEORIES, theory_name
from jaxqueue.studies.plotting.figure_lines import (
    Series,
    check_labels,
    column,
    fmt,
    key_label,
    line_name,
    matches,
    same,
    sort_key,
    varying,
)
from jaxqueue.studies.plotting.figure_spec import (
    CDF,
    FIGURE_KEYS,
    METRIC_NAMES,
    PARAMETERS,
    FigureSpec,
    check_expression,
    evaluate_expression,
    parse_figure,
)
from jaxqueue.studies.plotting.fits import positive_fit, power_law_fit

__all__ = [
    "FigureSpec",
    "Series",
    "parse_figure",
    "figure_series",
    "cdf_quantiles",
    "summarize",
    "theory_curve",
    "summary_text",
    "figure_caption",
    "store_spec",
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
#: Loads at which a theory curve is evaluated between a line's first and last load
#: (beside the line's own loads).
CURVE_POINTS = 61


def figure_series(rows: list[dict], fig: FigureSpec) -> list[Series]:
    """The lines of ``fig`` from store rows (:meth:`Store.rows`), in a stable order.

    For a ``response_cdf`` figure a line is the law ``P(T <= t)`` of one
    point at :data:`CDF_POINTS` times ``t`` (its ``ci95`` is NaN: the store
    keeps an interval per ``k``, not their joint law; :func:`cdf_quantiles`
    gives the quantiles with theirs). For an exponent figure (``kind =
    "exponent"``) a line's ``y`` are the exponents fitted across ``fig.across``
    at each ``x``, with their 95% half-widths.

    Raises:
        ValueError: no row matches the figure's metrics, index and filters
            (an exponent figure: or no line has an exponent).
    """
    if fig.metrics == (CDF,):
        return _cdf_series(rows, fig)
    picked = _picked(rows, fig)
    if fig.kind == "exponent":
        return _exponent_series(picked, fig)
    series_keys = fig.series
    if series_keys is None:
        series_keys = varying(picked, fig, lambda r: r["k"] if fig.x == "k" else r[fig.x])
    groups: OrderedDict = OrderedDict()
    for r in picked:
        panel = r.get(fig.panels) if fig.panels else None
        key = tuple(r.get(p) for p in series_keys)
        groups.setdefault((sort_key(panel), sort_key(key), r["metric"]), (panel, key, []))
        groups[(sort_key(panel), sort_key(key), r["metric"])][2].append(r)
    out = []
    for gkey in sorted(groups):
        panel, key, members = groups[gkey]
        xs = np.array([float(m["k"] if fig.x == "k" else m[fig.x]) for m in members])
        order = np.argsort(xs, kind="stable")
        scale = np.array([fig.scale(m) for m in members])
        col = lambda name, members=members: column(members, name)  # noqa: E731
        label = key_label(series_keys, key)
        many = len(fig.metrics) > 1
        if many:
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
                line_name(
                    fig, label or gkey[2], series_keys, key, members, gkey[2] if many else None
                ),
                tuple(members[i]["point_id"] for i in order),
                np.array([members[i].get("warmup_passed") != 0 for i in order], bool),
            )
        )
    return check_labels(fig, out)


def _picked(rows: list[dict], fig: FigureSpec) -> list[dict]:
    """The rows of ``fig``'s metrics at its ``k`` that pass its ``where``; a ValueError
    where there are none."""
    picked = []
    for r in rows:
        if r["metric"] not in fig.metrics:
            continue
        if fig.index is not None and not same(float(r["k"]), fig.index):
            continue
        if fig.x == "k" and r["k"] < 0:
            continue
        if all(matches(r, k, v) for k, v in fig.where):
            picked.append(r)
    if not picked:
        raise ValueError(
            f"figure {fig.name!r}: no rows match its metrics {list(fig.metrics)}"
            + (f", k = {fig.index:g}" if fig.index is not None else "")
            + (f" and filters {dict(fig.where)}" if fig.where else "")
        )
    return picked


def _exponent_series(picked: list[dict], fig: FigureSpec) -> list[Series]:
    """The lines of an exponent figure: at each x, the exponent of the line's points
    across ``fig.across`` (:func:`~jaxqueue.studies.plotting.fits.positive_fit`), with its 95%
    half-width; theory and refined the exponents of the stored values (NaN where fewer
    than two are positive). An x with no exponent is left out of its line."""
    series_keys = fig.series
    if series_keys is None:
        series_keys = varying(picked, fig, lambda r: (r[fig.x], r[fig.across]))
    groups: OrderedDict = OrderedDict()
    for r in picked:
        panel = r.get(fig.panels) if fig.panels else None
        key = tuple(r.get(p) for p in series_keys)
        at = groups.setdefault((sort_key(panel), sort_key(key), r["metric"]), (panel, key, {}))
        at[2].setdefault(sort_key(r[fig.x]), []).append(r)
    out = []
    for gkey in sorted(groups):
        panel, key, by_x = groups[gkey]
        fits = [f for x in sorted(by_x) if (f := _exponent(fig, by_x[x])) is not None]
        if not fits:
            continue
        members = [m for x in sorted(by_x) for m in by_x[x]]
        label = key_label(series_keys, key)
        many = len(fig.metrics) > 1
        if many:
            label = f"{label} {gkey[2]}".strip()
        columns = [np.array([f[i] for f in fits]) for i in range(5)]
        out.append(
            Series(
                panel,
                label or gkey[2],
                gkey[2],
                *columns,
                line_name(
                    fig, label or gkey[2], series_keys, key, members, gkey[2] if many else None
                ),
                tuple(i for f in fits for i in f[5]),
            )
        )
    if not out:
        raise ValueError(
            f"figure {fig.name!r}: no exponent: no line has two points with positive "
            f"estimates across {fig.across} at any {fig.x}"
        )
    return check_labels(fig, out)


def _exponent(fig: FigureSpec, members: list[dict]) -> tuple | None:
    """``(x, exponent, half-width, theory's, refined's, point ids)`` of one x's points
    across ``fig.across``, or None where they have no exponent."""
    across = np.array([float(m[fig.across]) for m in members])
    if np.unique(across).size < across.size:
        raise ValueError(
            f"figure {fig.name!r}: two points at one {fig.across} in a fit at "
            f"{fig.x}={fmt(members[0][fig.x])}: add the parameter that tells them apart "
            "to series or panels, or keep one with where"
        )
    scale = np.array([fig.scale(m) for m in members])
    replicas = np.array([int(m["replicas"]) for m in members])
    fit = positive_fit(
        across, column(members, "mean") * scale, column(members, "ci95") * scale, replicas
    )
    if fit is None:
        return None
    exact = []
    for name in ("theory", "refined"):
        values = column(members, name) * scale
        ok = np.isfinite(values) & (values > 0)
        have = np.unique(across[ok]).size >= 2
        exact.append(power_law_fit(across[ok], values[ok]).slope if have else math.nan)
    order = np.argsort(across, kind="stable")
    ids = tuple(members[i]["point_id"] for i in order)
    return (float(members[0][fig.x]), fit.slope, fit.ci95, *exact, ids)


def _cdf_curves(rows: list[dict], fig: FigureSpec) -> list[tuple]:
    """``(panel, label, rows, name)`` per curve of a ``response_cdf`` figure: the
    ``arrival_seen`` and ``response_quantile`` rows of one point each, in a stable order."""
    picked = [
        r
        for r in rows
        if r["metric"] in ("arrival_seen", "response_quantile")
        and all(matches(r, k, v) for k, v in fig.where)
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
        series_keys = varying(seen, fig, lambda r: None)
    groups: dict = {}
    for r in picked:
        panel = r.get(fig.panels) if fig.panels else None
        key = tuple(r.get(p) for p in series_keys)
        groups.setdefault((sort_key(panel), sort_key(key)), (panel, key, []))[2].append(r)
    out = []
    for gkey in sorted(groups):
        panel, key, members = groups[gkey]
        label = key_label(series_keys, key) or CDF
        if len({m["point_id"] for m in members}) > 1:
            in_panel = "" if panel is None else f" in panel {fig.panels}={fmt(panel)}"
            raise ValueError(
                f"figure {fig.name!r}: a {CDF} curve is one point, and series "
                f"{list(series_keys)} put {len({m['point_id'] for m in members})} points on "
                f"the curve {label!r}{in_panel}: add the parameter that tells them apart to "
                "series or panels, or keep one with where (e.g. where = { load = 0.9 })"
            )
        out.append((panel, label, members, line_name(fig, label, series_keys, key, members, None)))
    return out


def _seen_weights(members: list[dict], field: str):
    """A point's ``arrival_seen`` (``w_k`` at each ``k``) from ``field``, or None where
    some ``k`` has no finite value (no theory; a replica set that saw no arrival)."""
    seen = [m for m in members if m["metric"] == "arrival_seen"]
    values = column(seen, field)
    if not np.isfinite(values).all() or not values.sum() > 0:
        return None
    w = np.zeros(int(max(m["k"] for m in seen)) + 1)
    w[[int(m["k"]) for m in seen]] = values
    return np.clip(w, 0.0, None)  # a solver's rounding can leave a -1e-17


def _cdf_series(rows: list[dict], fig: FigureSpec) -> list[Series]:
    curves = _cdf_curves(rows, fig)
    weights = [
        {c: _seen_weights(members, c) for c in ("mean", "theory", "refined")}
        for _, _, members, _ in curves
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
    for (panel, label, members, name), ws in zip(curves, weights):
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
                name,
                (members[0]["point_id"],),
            )
        )
    return check_labels(fig, out)


def cdf_quantiles(rows: list[dict], fig: FigureSpec) -> list[Series]:
    """The stored response-time quantiles of each curve of a ``response_cdf`` figure.

    One :class:`Series` per curve of :func:`figure_series` (same panel and
    label): ``x`` the levels ``q``, ``y`` the simulated quantiles with their
    95% half-widths, ``theory`` and ``refined`` beside them. Plots draw them on
    the curves; :func:`summarize` of them compares the law with theory.
    """
    out = []
    for panel, label, members, name in _cdf_curves(rows, fig):
        qs = sorted(
            (m for m in members if m["metric"] == "response_quantile"), key=lambda m: m["k"]
        )
        out.append(
            Series(
                panel,
                label,
                "response_quantile",
                column(qs, "k"),
                column(qs, "mean"),
                column(qs, "ci95"),
                column(qs, "theory"),
                column(qs, "refined"),
                name,
                (members[0]["point_id"],),
            )
        )
    return out


def summarize(series: list[Series], theory: str | None = None) -> list[dict]:
    """Per line: points, the largest relative error and |difference| / half-width against theory.

    ``max_relative_error`` is ``max |y - theory| / |theory|`` over the points
    where theory is non-zero; ``max_z`` is ``max |y - theory| / ci95`` (None
    where no point has theory). Where the line has refined mean-field values,
    the same against them as ``refined_max_relative_error``,
    ``refined_at_x`` and ``refined_max_z``. Where ``theory`` (the spec's) is a
    benchmark rather than a prediction (:data:`BENCHMARK_THEORIES`: the M/M/N
    queue), a line also has ``benchmark`` (its name) and ``min_ratio``,
    ``max_ratio`` and ``max_ratio_at_x``: the range of ``y / theory``
    (:func:`summary_text` words the report so).
    """
    out = []
    for s in series:
        row = {"panel": s.panel, "label": s.label, "metric": s.metric, "points": int(s.x.size)}
        row.update(_against(s, s.theory, ""))
        if np.isfinite(s.refined).any():
            row.update(_against(s, s.refined, "refined_"))
        if theory in BENCHMARK_THEORIES:
            row.update(benchmark=theory_name(theory), **_ratio(s))
        out.append(row)
    return out


def _ratio(s: Series) -> dict:
    """The smallest and largest ``y / theory`` of a line (None each without theory)."""
    ok = np.isfinite(s.theory) & np.isfinite(s.y) & (s.theory != 0)
    if not ok.any():
        return {"min_ratio": None, "max_ratio": None, "max_ratio_at_x": None}
    ratio = s.y[ok] / s.theory[ok]
    return {
        "min_ratio": float(ratio.min()),
        "max_ratio": float(ratio.max()),
        "max_ratio_at_x": float(s.x[ok][ratio.argmax()]),
    }


def summary_text(line: dict) -> str:
    """``plot``'s report of one line of :func:`summarize`: ``max relative error 1.02% at
    x = 0.95, max |diff| / CI 0.69`` against a prediction; against a benchmark, the
    ratio to it (``ratio to the M/M/N (Erlang C) benchmark: 1.2 to 81 (largest at x =
    1000)``), which is no error; ``no theory`` where the line has none."""
    if line.get("benchmark") is not None:
        low, high = line.get("min_ratio"), line.get("max_ratio")
        if low is None:
            return f"no {line['benchmark']} benchmark"
        span = f"{low:.3g}" if f"{low:.3g}" == f"{high:.3g}" else f"{low:.3g} to {high:.3g}"
        return (
            f"ratio to the {line['benchmark']} benchmark: {span} "
            f"(largest at x = {line['max_ratio_at_x']:g})"
        )
    rel, z = line["max_relative_error"], line["max_z"]
    if rel is None:
        beside = line.get("baseline")
        return "no theory" + (f"; the {beside} drawn beside it" if beside else "")
    if z is None:
        return f"max relative error {100 * rel:.2f}%"
    return f"max relative error {100 * rel:.2f}% at x = {line['at_x']:g}, max |diff| / CI {z:.2f}"


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


def theory_curve(series: Series, fig: FigureSpec, spec: GridSpec, cache: dict | None = None):
    """``(x, theory)`` of a line's mean field on a fine grid of loads, or None.

    Where ``x`` is the load and the line's theory is the mean field of
    Poisson arrivals (the spec's ``theory`` is ``"mean-field"`` or
    ``"refined"``), the mean field is solved at :data:`CURVE_POINTS` loads
    from the line's first load to its last and at its own loads, and scaled
    by ``y_scale``. None elsewhere (theory at the points only: other axes,
    exact theory, arrival files, loads set by ``alpha`` or ``beta``), and
    where the curve does not pass through the stored theory at the line's
    own loads (a store run by other code), or where a load between them
    has no solution.
    """
    if fig.x != "load" or not fig.theory or fig.metrics == (CDF,) or series.x.size < 2:
        return None
    if fig.kind != "values":
        return None
    if spec.run.theory not in ("mean-field", "refined") or not np.isfinite(series.theory).any():
        return None
    by_id = {p.point_id(): p for p in spec.points}
    points = [by_id.get(i) for i in series.point_ids]
    if not points or None in points:
        return None
    first = points[0]
    if any(p.arrivals is not None or p.alpha is not None or p.beta is not None for p in points):
        return None
    if any(p.service is not None or p.pools is not None for p in points):
        return None  # the mean field by class takes seconds a load: theory at the points
    if len({theory_key(dataclasses.replace(p, load=0.0), "mean-field") for p in points}) > 1:
        return None  # the line's points differ in more than the load
    loads = np.union1d(np.linspace(series.x[0], series.x[-1], CURVE_POINTS), series.x)
    fine = [dataclasses.replace(first, load=float(x)) for x in loads]
    index = fig.index
    try:
        values = theory_values(fine, "mean-field", {} if cache is None else cache)
    except (ValueError, RuntimeError, ArithmeticError):  # a load between the points it
        return None  # cannot solve: theory at the points, as stored
    if series.metric in {n for name, _ in spec.metrics for n in (name, name + PER_ARRIVAL)}:
        values = [
            at_fixed_point(r, spec.point_metrics(p), p.servers, p.dispatchers, p.load)
            for r, p in zip(values, fine)
        ]
    y = np.array(
        [
            math.nan
            if (v := theory_value(r, series.metric, index)) is None
            else v * fig.scale(p.params())
            for r, p in zip(values, fine)
        ]
    )
    at_points = y[np.searchsorted(loads, series.x)]
    stored = np.isfinite(series.theory)
    if not np.allclose(at_points[stored], series.theory[stored], rtol=1e-9, atol=1e-12):
        return None
    return loads, y


def figure_caption(rows: list[dict], series: list[Series]) -> str:
    r"""What a figure's points are: ``$N = 1000$, 16 replicas per point, bars: 95% intervals``
    (N and the replicas of the rows of ``series``' points; a range where they vary:
    ``$500 \leq N \leq 1000$``, ``8 to 16 replicas per point``)."""
    ids = {i for s in series for i in s.point_ids}
    mine = [r for r in rows if r["point_id"] in ids]
    parts = []
    for key, one, many in (
        ("n_servers", "$N = {}$", r"${} \leq N \leq {}$"),
        ("replicas", "{} replicas per point", "{} to {} replicas per point"),
    ):
        values = sorted({r[key] for r in mine if r.get(key) is not None})
        if values:
            ends = [f"{values[0]:g}", f"{values[-1]:g}"]
            parts.append(one.format(ends[0]) if len(values) == 1 else many.format(*ends))
    if any(np.isfinite(s.ci95).any() for s in series):
        parts.append("bars: 95% intervals")
    return ", ".join(parts)


def store_spec(text: str, meta: dict) -> GridSpec:
    """The spec of a store's figures: ``text`` parsed in the mode (none, ``[quick]`` or
    ``[gpu]``) whose hash is the store's, else without a mode (the figures are the same;
    so too with arrivals files, which a spec's text alone cannot hash)."""
    plain = parse_spec(text, name=meta.get("spec_name"))
    for mode in (None, *MODES):
        try:
            spec = (
                plain if mode is None else parse_spec(text, name=meta.get("spec_name"), mode=mode)
            )
            if spec.spec_hash() == meta.get("spec_hash"):
                return spec
        except ValueError:  # a mode the spec does not have; arrivals files not read
            continue
    return plain
