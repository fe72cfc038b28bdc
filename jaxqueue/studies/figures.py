"""Figures of grid experiments: what to draw, read from a spec's ``[[figure]]`` tables.

A figure is a view of a store's rows (:mod:`jaxqueue.studies.store`): one or
more metrics against one point parameter, one line per combination of the
other parameters, optionally one panel per value of a parameter::

    [[figure]]
    name = "response_time"          # jaxqueue plot STORE --figure response_time
    metric = "mean_response_time"   # or a list; vector metrics need index (or x = "index")
    x = "load"                      # a point parameter, or "index" (k of a vector metric)
    series = ["policy", "d"]        # default: every other parameter that varies
    panels = "alpha"                # optional: one panel per value
    index = 2                       # the k of a vector metric (tail, occupancy, ...)
    y_scale = "servers ** (1 - alpha)"   # optional factor, an expression of the parameters
    where = { load = [0.9] }        # optional filter; "index" filters k when x = "index"
    logx = false
    logy = true
    title = "..."                   # optional; also xlabel, ylabel

The response-time law is a figure of its own: ``metric = "response_cdf"``
draws ``P(T <= t)`` against the response time ``t`` (``x = "time"``, the
default for it), one curve per point, from the point's ``arrival_seen``
(with exp(1) FIFO service a task that finds ``k`` tasks stays an
Erlang(``k + 1``, 1) time, so the law is an Erlang mixture;
:mod:`jaxqueue.results.response`) and from its theory's, with the stored
quantiles (p50 to p99.9, with their 95% intervals) on the curves::

    [[figure]]
    name = "fig9"
    metric = "response_cdf"
    where = { load = 0.88 }         # a curve is one point: filter the others out
    series = ["policy", "d", "z"]

This module reads and checks figure tables and turns rows into
:class:`Series` (plain numpy; no plotting library). Drawing is in
:mod:`jaxqueue.studies.plots` (the ``plot`` extra, matplotlib). Figures do not
enter the spec hash: they change no result, so a store can be replotted after
its figures are edited.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
import re
from collections import OrderedDict

import numpy as np

from jaxqueue.results.response import erlang_mixture_cdf, erlang_mixture_quantile
from jaxqueue.results.schema import (
    POOL_METRICS,
    SCALAR_METRICS,
    VECTOR_METRICS,
    split_pool_row_metric,
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
    "check_expression",
    "evaluate_expression",
]

#: Point parameters a figure can use (the store's columns of the same names).
PARAMETERS = (
    "policy",
    "servers",
    "dispatchers",
    "ratio",
    "load",
    "alpha",
    "beta",
    "buffer",
    "d",
    "z",
    "order",
    "service",
    "pools",
    "arrivals",
)
#: Keys of a ``[[figure]]`` table.
FIGURE_KEYS = (
    "name",
    "metric",
    "x",
    "series",
    "panels",
    "index",
    "y_scale",
    "where",
    "logx",
    "logy",
    "title",
    "xlabel",
    "ylabel",
    "theory",
)
#: The response-time law, ``P(T <= t)`` against ``t`` (drawn from ``arrival_seen``).
CDF = "response_cdf"
#: Metric names a figure can draw (as in the simulate JSON; quantiles as
#: ``response_quantile``; a pool's metric with ``index`` = the pool, from 0),
#: and the response-time law; also ``pool0_occupancy`` (index ``k``) and
#: ``pool0_response_quantile`` (index ``q``) for each pool
#: (:func:`~jaxqueue.results.schema.pool_row_metric`).
METRIC_NAMES = SCALAR_METRICS + VECTOR_METRICS + POOL_METRICS + ("response_quantile", CDF)
#: Times at which a response-time law is drawn, from 0 to the largest quantile
#: at ``CDF_LEVEL`` of the figure's curves.
CDF_POINTS = 201
CDF_LEVEL = 0.999
#: What a missing service law, pools or arrivals value means.
_DEFAULTS = {"service": "exp", "pools": "identical", "arrivals": "poisson"}
_TEXT = ("policy", "order", "service", "pools", "arrivals")
_NUMERIC = tuple(p for p in PARAMETERS if p not in _TEXT)
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}


@dataclasses.dataclass(frozen=True)
class FigureSpec:
    """One ``[[figure]]`` table, checked (see the module docstring for the keys)."""

    name: str
    metrics: tuple
    x: str = "load"
    series: tuple | None = None  # None: the parameters that vary at a fixed x and panel
    panels: str | None = None
    index: float | None = None
    y_scale: str | None = None
    where: tuple = ()
    logx: bool = False
    logy: bool = False
    title: str | None = None
    xlabel: str | None = None
    ylabel: str | None = None
    theory: bool = True

    def scale(self, params: dict) -> float:
        """The ``y_scale`` factor at one point's parameters (1 without one)."""
        if self.y_scale is None:
            return 1.0
        return evaluate_expression(self.y_scale, params)


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


def _evaluate(node, params: dict):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)  # (an int power of ints would compute without bound)
    if isinstance(node, ast.Name):
        value = params.get(node.id)
        return math.nan if value is None else float(value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left, params), _evaluate(node.right, params))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, params)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError(
        "an expression allows numbers, the parameters "
        f"{', '.join(_NUMERIC)}, + - * / ** and parentheses"
    )


def evaluate_expression(text: str, params: dict) -> float:
    """The value of an arithmetic expression of point parameters (NaN where one is None);
    a ValueError where it overflows a float or divides by zero."""
    try:
        return float(_evaluate(ast.parse(text, mode="eval").body, params))
    except (OverflowError, ZeroDivisionError) as err:
        raise ValueError(f"{text!r} cannot be evaluated in floating point ({err})") from None


def check_expression(text, key: str = "y_scale") -> str:
    """``text`` if it is an arithmetic expression of numeric parameters, else ValueError.

    Numbers, the names in ``PARAMETERS`` other than ``policy`` and ``order``,
    ``+ - * / **`` and parentheses; nothing else is evaluated.
    """
    if not isinstance(text, str):
        raise ValueError(f"{key} must be a string expression, got {text!r}")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError(f"{key}={text!r} is not an expression") from None
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    if bad := sorted(names - set(_NUMERIC)):
        raise ValueError(
            f"{key}={text!r} names {', '.join(bad)}: valid names are {', '.join(_NUMERIC)}"
        )
    try:
        _evaluate(tree, dict.fromkeys(names, 1.0))  # operators
    except ValueError as err:
        raise ValueError(f"{key}={text!r}: {err}") from None
    except OverflowError:
        raise ValueError(f"{key}={text!r} overflows a float") from None
    except ZeroDivisionError:  # at these values only: a point's own may not divide by zero
        pass
    return text


def _parameter(key: str, value, allow_index: bool = False) -> str:
    valid = PARAMETERS + (("index",) if allow_index else ())
    if value not in valid:
        raise ValueError(f"{key}={value!r} is not a parameter: use one of {', '.join(valid)}")
    return value


def parse_figure(table: dict, fail) -> FigureSpec:
    """Check one ``[[figure]]`` table.

    Args:
        table: the TOML table.
        fail: ``fail(key, message)`` raises the caller's error for ``key``.

    Returns:
        The :class:`FigureSpec`.
    """
    for key in table:
        if key not in FIGURE_KEYS:
            fail(key, f"unknown key {key!r} in [[figure]]; valid: {', '.join(FIGURE_KEYS)}")
    for key in ("name", "metric"):
        if key not in table:
            fail("name" if "name" in table else "", f"[[figure]] needs {key} = ...")
    name = table["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        fail("name", f"figure name must be letters, digits, '_', '.' or '-', got {name!r}")
    out = {"name": name}
    try:
        metrics = table["metric"] if isinstance(table["metric"], list) else [table["metric"]]
        if not metrics:
            raise ValueError("metric is empty: give at least one metric")
        for m in metrics:
            if m not in METRIC_NAMES and split_pool_row_metric(m) is None:
                raise ValueError(
                    f"metric={m!r} is not a metric: use one of "
                    f"{', '.join(METRIC_NAMES)}, or poolI_occupancy, "
                    "poolI_response_quantile for pool I (from 0)"
                )
        out["metrics"] = tuple(metrics)
    except ValueError as err:
        fail("metric", str(err))
    checks = {
        "x": lambda v: _parameter("x", v, allow_index=True),
        "panels": lambda v: _parameter("panels", v),
        "series": lambda v: tuple(
            _parameter("series", s) for s in (v if isinstance(v, list) else [v])
        ),
        "index": lambda v: _index(v),
        "y_scale": check_expression,
        "where": _where,
        "logx": lambda v: _flag("logx", v),
        "logy": lambda v: _flag("logy", v),
        "theory": lambda v: _flag("theory", v),
        "title": lambda v: _text("title", v),
        "xlabel": lambda v: _text("xlabel", v),
        "ylabel": lambda v: _text("ylabel", v),
    }
    if CDF in out["metrics"]:  # its x is the response time
        _check_cdf(table, out["metrics"], fail)
        out["x"] = "time"
        del checks["x"]
    for key, check in checks.items():
        if key in table:
            try:
                out[key] = check(table[key])
            except (TypeError, ValueError) as err:
                fail(key, str(err))
    fig = FigureSpec(**out)
    vector = [m for m in fig.metrics if m not in SCALAR_METRICS + (CDF,)]
    if vector and fig.x != "index" and fig.index is None:
        fail(
            "metric",
            f"metric {vector[0]!r} is a vector (or quantiles): give index = k (the "
            'quantile level, or the pool from 0), or x = "index"',
        )
    if fig.x == "index" and (not vector or len(vector) < len(fig.metrics)):
        fail(
            "x",
            'x = "index" needs vector metrics only (tail, occupancy, arrival_seen, '
            "iqueue_distribution, response_quantile, the pool metrics)",
        )
    if fig.x == "index" and fig.index is not None:
        fail("index", 'give either x = "index" or index = k, not both')
    if fig.panels is not None and fig.panels == fig.x:
        fail("panels", f"panels={fig.panels!r} is also the x axis")
    if fig.series and (fig.x in fig.series or fig.panels in fig.series):
        fail("series", "series must not repeat x or panels")
    return fig


def _check_cdf(table: dict, metrics: tuple, fail) -> None:
    """The keys of a ``response_cdf`` figure: drawn alone, against the time, from every k."""
    if len(metrics) > 1:
        fail("metric", f"metric {CDF!r} is drawn alone: give it as the only metric")
    if table.get("x", "time") != "time":
        fail("x", f'metric {CDF!r} is drawn against x = "time" (the response time)')
    for key in ("index", "y_scale"):
        if key in table:
            fail(key, f"{key} does not apply to metric {CDF!r}, drawn from every k of arrival_seen")
    where = table.get("where")
    if isinstance(where, dict) and "index" in where:
        fail(
            "where",
            f"metric {CDF!r} is drawn from every k of arrival_seen: where cannot filter index",
        )


def _index(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(
            f"index={value!r} is out of range: need a number >= 0 (k, or a "
            "quantile level in (0, 1))"
        )
    return float(value)


def _flag(key, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def _text(key, value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")
    return value


def _where(value) -> tuple:
    if not isinstance(value, dict):
        raise ValueError(f"where must be an inline table {{ parameter = [values] }}, got {value!r}")
    out = []
    for key, vals in value.items():
        _parameter("where", key, allow_index=True)
        vals = tuple(vals if isinstance(vals, list) else [vals])
        if not vals:
            raise ValueError(f"where: {key} is empty")
        out.append((key, vals))
    return tuple(sorted(out))


def _matches(row: dict, key: str, values: tuple) -> bool:
    have = row["idx"] if key == "index" else row.get(key)
    for v in values:
        if isinstance(v, str) or isinstance(have, str) or have is None:
            if v == have or (
                have is None and v == ("inf" if key == "buffer" else _DEFAULTS.get(key))
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
        _fmt(v) if p == "policy" else f"{p}={_fmt(_DEFAULTS.get(p) if v is None else v)}"
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
