"""The ``[[figure]]`` tables of a spec: their keys, their checks, and the arithmetic
expressions of point parameters that ``y_scale``, ``time`` and ``warmup_time`` take.

The keys and what they draw: docs/sweeps.md (Figures).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import operator
import re
import warnings

import numpy as np

from jaxqueue.core.expressions import compile_expression, parse_expression
from jaxqueue.core.user_metrics import PER_ARRIVAL
from jaxqueue.results.schema import (
    POOL_METRICS,
    SCALAR_METRICS,
    VECTOR_METRICS,
    split_pool_row_metric,
)
from jaxqueue.studies.grids.store import PARAMETER_COLUMNS
from jaxqueue.studies.plotting.figure_labels import (
    PARAMETER_DEFAULTS,
    axis_label,
    line_label,
    metric_label,
    policy_label,
)

__all__ = [
    "FigureSpec",
    "parse_figure",
    "PARAMETERS",
    "NUMERIC_PARAMETERS",
    "PARAMETER_DEFAULTS",
    "FIGURE_KEYS",
    "FIGURE_KINDS",
    "EXPONENT_KEYS",
    "METRIC_NAMES",
    "CDF",
    "check_expression",
    "RENAMED",
    "evaluate_expression",
    "axis_label",
    "metric_label",
    "policy_label",
    "line_label",
    "reference_line",
]

#: Point parameters a figure can use (the store's columns of the same names).
PARAMETERS = PARAMETER_COLUMNS
#: Keys of a ``[[figure]]`` table.
FIGURE_KEYS = (
    "name",
    "metric",
    "x",
    "series",
    "panels",
    "k",
    "index",
    "y_scale",
    "where",
    "logx",
    "logy",
    "title",
    "xlabel",
    "ylabel",
    "theory",
    "labels",
    "baseline",
    "kind",
    "across",
    "reference",
    "reference_range",
    "reference_label",
)
#: What a figure draws: the stored values against ``x`` (``"values"``), or the exponent
#: of a power law fitted across ``across`` at each ``x`` (``"exponent"``).
FIGURE_KINDS = ("values", "exponent")
#: The keys of an ``"exponent"`` figure alone.
EXPONENT_KEYS = ("across", "reference", "reference_range", "reference_label")
#: Points at which a reference line is drawn.
REFERENCE_POINTS = 101
#: Approximations a figure can draw beside its theory (``baseline``; jaxqueue.studies.plotting.baselines):
#: Lu et al.'s against the load, the diffusion limit's stationary mean against ``n_servers``.
BASELINES = ("lu", "diffusion")
#: The response-time law, ``P(T <= t)`` against ``t`` (drawn from ``arrival_seen``).
CDF = "response_cdf"
#: Metric names a figure can draw (as in the simulate JSON; quantiles as
#: ``response_quantile``; a pool's metric with ``k`` = the pool, from 0),
#: and the response-time law; also ``pool0_occupancy`` (``k`` the level) and
#: ``pool0_response_quantile`` (``k`` the quantile level) for each pool
#: (:func:`~jaxqueue.results.schema.pool_row_metric`).
METRIC_NAMES = SCALAR_METRICS + VECTOR_METRICS + POOL_METRICS + ("response_quantile", CDF)
_TEXT = ("policy", "order", "service", "pools", "arrivals")
NUMERIC_PARAMETERS = tuple(p for p in PARAMETERS if p not in _TEXT)
#: Names of earlier releases, still read with a DeprecationWarning: old -> new
#: (a figure's ``x``, ``series``, ``panels``, ``where`` and its key ``index``).
RENAMED = {"servers": "n_servers", "dispatchers": "n_dispatchers", "index": "k"}
#: What the names of :data:`RENAMED` are in a point's parameters, where
#: expressions (``y_scale``, ``time``) read them; both spellings are read there.
_POINT_NAMES = {"n_servers": "servers", "n_dispatchers": "dispatchers"}
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
    """One ``[[figure]]`` table, checked (its keys: docs/sweeps.md, Figures)."""

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
    labels: tuple = ()  # (line, display name) pairs: a line as ``plot`` names it
    baseline: str | None = None  # one of BASELINES: drawn dotted beside the theory
    kind: str = "values"  # one of FIGURE_KINDS
    across: str | None = None  # an exponent figure's parameter the power law is fitted in
    reference: str | None = None  # an expression of x, drawn as a line (exponent figures)
    reference_range: tuple | None = None  # (low, high) of x where it is drawn
    reference_label: str | None = None

    def label_map(self) -> dict:
        """``labels`` as a dict: the line's name (``Series.label``) -> its display name."""
        return dict(self.labels)

    def scale(self, params: dict) -> float:
        """The ``y_scale`` factor at one point's parameters (1 without one)."""
        if self.y_scale is None:
            return 1.0
        return evaluate_expression(self.y_scale, params)


def _evaluate(node, params: dict):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)  # (an int power of ints would compute without bound)
    if isinstance(node, ast.Name):
        value = params.get(node.id, params.get(_POINT_NAMES.get(node.id, "")))
        return math.nan if value is None else float(value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left, params), _evaluate(node.right, params))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, params)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError(
        "an expression allows numbers, the parameters "
        f"{', '.join(NUMERIC_PARAMETERS)}, + - * / ** and parentheses"
    )


def evaluate_expression(text: str, params: dict) -> float:
    """The value of an arithmetic expression of point parameters (NaN where one is None);
    a ValueError where it overflows a float or divides by zero."""
    try:  # (parse_expression: at most MAX_DEPTH deep, so _evaluate's recursion is bounded)
        return float(_evaluate(parse_expression(text), params))
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
        tree = parse_expression(text)
    except SyntaxError:
        raise ValueError(f"{key}={text!r} is not an expression") from None
    except ValueError as err:  # nested past the depth limit
        raise ValueError(f"{key}: {err}") from None
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    if bad := sorted(names - set(NUMERIC_PARAMETERS) - set(_POINT_NAMES.values())):
        raise ValueError(
            f"{key}={text!r} names {', '.join(bad)}: valid names are {', '.join(NUMERIC_PARAMETERS)}"
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


def renamed(key: str, value):
    """``value``'s name now (:data:`RENAMED`), with a DeprecationWarning where it
    is an earlier one; ``value`` itself otherwise."""
    new = RENAMED.get(value) if isinstance(value, str) else None
    if new is None:
        return value
    warnings.warn(
        f'[[figure]] {key}: "{value}" is deprecated, write "{new}"',
        DeprecationWarning,
        stacklevel=2,
    )
    return new


def _parameter(key: str, value, allow_index: bool = False) -> str:
    value = renamed(key, value)
    valid = PARAMETERS + (("k",) if allow_index else ())
    if value not in valid:
        raise ValueError(f"{key}={value!r} is not a parameter: use one of {', '.join(valid)}")
    return value


def parse_figure(table: dict, fail, user_metrics=(), derived=()) -> FigureSpec:
    """Check one ``[[figure]]`` table.

    Args:
        table: the TOML table.
        fail: ``fail(key, message)`` raises the caller's error for ``key``.
        user_metrics: the names the spec's ``[metrics]`` declares (each drawn as
            ``name`` and ``name_per_arrival``, scalars).
        derived: other scalar names the spec stores (its derivatives, ``d_m_d_load``).

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
    user = tuple(n for name in user_metrics for n in (name, name + PER_ARRIVAL)) + tuple(derived)
    try:
        out["metrics"] = _metrics(table["metric"], user)
    except ValueError as err:
        fail("metric", str(err))
    checks = {
        "x": lambda v: _parameter("x", v, allow_index=True),
        "panels": lambda v: _parameter("panels", v),
        "series": lambda v: tuple(
            _parameter("series", s) for s in (v if isinstance(v, list) else [v])
        ),
        "k": lambda v: _index(v),
        "y_scale": check_expression,
        "where": _where,
        "logx": lambda v: _flag("logx", v),
        "logy": lambda v: _flag("logy", v),
        "theory": lambda v: _flag("theory", v),
        "title": lambda v: _text("title", v),
        "xlabel": lambda v: _text("xlabel", v),
        "ylabel": lambda v: _text("ylabel", v),
        "labels": _labels,
        "baseline": _baseline,
        "kind": _kind,
        "across": lambda v: _parameter("across", v),
        "reference_range": _range,
        "reference_label": lambda v: _text("reference_label", v),
    }
    if "index" in table:  # the key of earlier releases
        if "k" in table:
            fail("index", "give k = ... (index is its earlier name), not both")
        table = {("k" if key == "index" else key): v for key, v in table.items()}
        renamed("key", "index")
    if CDF in out["metrics"]:  # its x is the response time
        _check_cdf(table, out["metrics"], fail)
        out["x"] = "time"
        del checks["x"]
    for key, check in checks.items():
        if key in table:
            try:
                out["index" if key == "k" else key] = check(table[key])
            except (TypeError, ValueError) as err:
                fail(key, str(err))
    if "reference" in table:  # an expression of x
        try:
            out["reference"] = _reference(table["reference"], out.get("x", "load"))
        except ValueError as err:
            fail("reference", str(err))
    fig = FigureSpec(**out)
    _check_kind(fig, table, fail)
    vector = [m for m in fig.metrics if m not in SCALAR_METRICS + (CDF,) + user]
    if vector and fig.x != "k" and fig.index is None:
        fail(
            "metric",
            f"metric {vector[0]!r} is a vector (or quantiles): give k = ... (the level, the "
            'quantile level, or the pool from 0), or x = "k"',
        )
    if fig.x == "k" and (not vector or len(vector) < len(fig.metrics)):
        fail(
            "x",
            'x = "k" needs vector metrics only (tail, occupancy, arrival_seen, '
            "iqueue_distribution, response_quantile, the pool metrics)",
        )
    if fig.x == "k" and fig.index is not None:
        fail("k", 'give either x = "k" or k = ..., not both')
    if fig.panels is not None and fig.panels == fig.x:
        fail("panels", f"panels={fig.panels!r} is also the x axis")
    if fig.series and (fig.x in fig.series or fig.panels in fig.series):
        fail("series", "series must not repeat x or panels")
    return fig


def _metrics(value, user: tuple) -> tuple:
    """A figure's ``metric`` (one or a list) checked against the metrics and ``user``'s."""
    metrics = value if isinstance(value, list) else [value]
    if not metrics:
        raise ValueError("metric is empty: give at least one metric")
    for m in metrics:
        if m not in METRIC_NAMES + user and split_pool_row_metric(m) is None:
            declared = (
                f"; the spec's [metrics]: {', '.join(user)}"
                if user
                else "; or a name the spec's [metrics] declares (none here)"
            )
            raise ValueError(
                f"metric={m!r} is not a metric: use one of "
                f"{', '.join(METRIC_NAMES)}, or poolI_occupancy, "
                f"poolI_response_quantile for pool I (from 0){declared}"
            )
    return tuple(metrics)


def _check_kind(fig: FigureSpec, table: dict, fail) -> None:
    """The keys of a figure's kind: an exponent figure's across, x and reference, and
    none of them on a figure of values; a values figure's baseline and its x."""
    if fig.kind == "values":
        if fig.baseline == "diffusion" and fig.x != "n_servers":
            fail(
                "baseline",
                'baseline = "diffusion" is drawn against x = "n_servers" (counts over sqrt(N)), '
                f"got x = {fig.x!r}",
            )
        for key in EXPONENT_KEYS:
            if key in table:
                fail(key, f'{key} applies to kind = "exponent" only (this figure draws values)')
        return
    if "baseline" in table:
        valid = ", ".join(k for k in FIGURE_KEYS if k != "baseline")
        fail("baseline", f'baseline does not apply to kind = "exponent"; its keys: {valid}')
    if fig.across is None:
        fail("across", 'kind = "exponent" needs across = "..." (e.g. "n_servers")')
    if fig.across not in NUMERIC_PARAMETERS:
        fail("across", f"across={fig.across!r} must be one of {', '.join(NUMERIC_PARAMETERS)}")
    if CDF in fig.metrics:
        fail("metric", f"metric {CDF!r} is drawn as values, not as an exponent")
    if fig.x in ("k", fig.across):
        fail("x", f"an exponent figure needs x = a parameter other than across, got {fig.x!r}")
    if fig.across == fig.panels or fig.across in (fig.series or ()):
        fail("across", f"across={fig.across!r} is fitted in: not also panels or series")
    if fig.reference is None and (fig.reference_range or fig.reference_label):
        fail("reference", "reference_range and reference_label need reference = ...")


def reference_line(fig: FigureSpec, xs) -> tuple | None:
    """``(x, y)`` of a figure's ``reference`` (None without one), on
    :data:`REFERENCE_POINTS` points of its ``reference_range``, else of the span of ``xs``."""
    if fig.reference is None:
        return None
    xs = np.asarray(xs, dtype=np.float64)
    xs = xs[np.isfinite(xs)]
    if fig.reference_range is None and xs.size == 0:
        return None
    low, high = fig.reference_range or (float(xs.min()), float(xs.max()))
    grid = np.linspace(low, high, REFERENCE_POINTS)
    y = compile_expression(fig.reference, [fig.x])(**{fig.x: grid})
    return grid, np.broadcast_to(np.asarray(y, dtype=np.float64), grid.shape)


def _kind(value) -> str:
    if value not in FIGURE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, FIGURE_KINDS))}, got {value!r}")
    return value


def _reference(value, x: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"reference must be a string expression of x ({x}), got {value!r}")
    compile_expression(value, [x])  # its errors name the allowed names and functions
    return value


def _range(value) -> tuple:
    ok = isinstance(value, list) and len(value) == 2
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if not ok or not math.isfinite(value[0]) or not math.isfinite(value[1]) or value[0] >= value[1]:
        raise ValueError(f"reference_range must be [low, high] with low < high, got {value!r}")
    return (float(value[0]), float(value[1]))


def _check_cdf(table: dict, metrics: tuple, fail) -> None:
    """The keys of a ``response_cdf`` figure: drawn alone, against the time, from every k."""
    if len(metrics) > 1:
        fail("metric", f"metric {CDF!r} is drawn alone: give it as the only metric")
    if table.get("x", "time") != "time":
        fail("x", f'metric {CDF!r} is drawn against x = "time" (the response time)')
    for key in ("k", "y_scale"):
        if key in table:
            fail(key, f"{key} does not apply to metric {CDF!r}, drawn from every k of arrival_seen")
    where = table.get("where")
    if isinstance(where, dict) and ("k" in where or "index" in where):
        fail(
            "where",
            f"metric {CDF!r} is drawn from every k of arrival_seen: where cannot filter k",
        )


def _index(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(
            f"k={value!r} is out of range: need a number >= 0 (k, or a quantile level in (0, 1))"
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


def _baseline(value) -> str:
    if value not in BASELINES:
        raise ValueError(
            f"baseline must be one of {', '.join(map(repr, BASELINES))}, got {value!r}"
        )
    return value


def _labels(value) -> tuple:
    if not isinstance(value, dict):
        raise ValueError(
            'labels must be an inline table { "line" = "display name" }, e.g. '
            f'{{ "jiq-pod d=2" = "JIQ-Pod(2)" }}, got {value!r}'
        )
    for key, text in value.items():
        if not isinstance(text, str):
            raise ValueError(f"labels: the name of {key!r} must be a string, got {text!r}")
    return tuple(sorted(value.items()))


def _where(value) -> tuple:
    if not isinstance(value, dict):
        raise ValueError(f"where must be an inline table {{ parameter = [values] }}, got {value!r}")
    out = []
    for key, vals in value.items():
        key = _parameter("where", key, allow_index=True)
        vals = tuple(vals if isinstance(vals, list) else [vals])
        if not vals:
            raise ValueError(f"where: {key} is empty")
        out.append((key, vals))
    return tuple(sorted(out))
