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

from jaxqueue.results.schema import (
    POOL_METRICS,
    SCALAR_METRICS,
    VECTOR_METRICS,
    split_pool_row_metric,
)

__all__ = [
    "FigureSpec",
    "parse_figure",
    "PARAMETERS",
    "NUMERIC_PARAMETERS",
    "PARAMETER_DEFAULTS",
    "FIGURE_KEYS",
    "METRIC_NAMES",
    "CDF",
    "check_expression",
    "RENAMED",
    "evaluate_expression",
    "axis_label",
    "metric_label",
    "policy_label",
    "line_label",
]

#: Point parameters a figure can use (the store's columns of the same names).
PARAMETERS = (
    "policy",
    "n_servers",
    "n_dispatchers",
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
)
#: Approximations a figure can draw beside its theory (``baseline``; jaxqueue.studies.baselines).
BASELINES = ("lu",)
#: The response-time law, ``P(T <= t)`` against ``t`` (drawn from ``arrival_seen``).
CDF = "response_cdf"
#: Metric names a figure can draw (as in the simulate JSON; quantiles as
#: ``response_quantile``; a pool's metric with ``k`` = the pool, from 0),
#: and the response-time law; also ``pool0_occupancy`` (``k`` the level) and
#: ``pool0_response_quantile`` (``k`` the quantile level) for each pool
#: (:func:`~jaxqueue.results.schema.pool_row_metric`).
METRIC_NAMES = SCALAR_METRICS + VECTOR_METRICS + POOL_METRICS + ("response_quantile", CDF)
#: What a missing service law, pools or arrivals value means.
PARAMETER_DEFAULTS = {"service": "exp", "pools": "identical", "arrivals": "poisson"}
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


#: Axis labels of parameters and metrics (mathtext where a symbol reads better).
AXIS_LABELS = {
    "load": r"load $\lambda$",
    "n_servers": "servers $N$",
    "ratio": "$r = N / M$",
    "n_dispatchers": "dispatchers $M$",
    "alpha": r"$\alpha$",
    "beta": r"$\beta$",
    "buffer": "buffer $b$",
    "d": "$d$",
    "z": "$z$",
    "k": "$k$",
    "mean_response_time": "mean response time $T$",
    "waiting_probability": r"$P(\mathrm{wait})$",
    "blocking_probability": r"$P(\mathrm{blocked})$",
    "mean_queue_length": "mean tasks per server",
    "p0": "$p_0$",
    "join_rate": "join requests per server per unit time",
    "delete_rate": "delete requests per server per unit time",
    "probe_rate": "probes per server per unit time",
    "stale_fraction": "stale picks",
    "tail": r"$s_k$ (servers with $\geq k$ tasks)",
    "occupancy": "servers with exactly $k$ tasks",
    "arrival_seen": "arrivals that find $k$ tasks",
    "iqueue_distribution": "I-queues of size $k$",
    "response_quantile": "response-time quantile",
    "time": "response time $t$",
    CDF: r"$P(T \leq t)$",
}
#: Metrics at one index ``k`` (``index = k``): their symbol, then what it counts.
_AT_INDEX = {
    "tail": ("s", r"servers with $\geq {k}$ tasks"),
    "occupancy": ("x", "servers with {k} tasks"),
    "arrival_seen": ("w", "arrivals that find {k} tasks"),
    "iqueue_distribution": ("q", "I-queues of size {k}"),
}
#: Display names of the policies; ``{d}`` and ``{z}`` are their options.
POLICY_NAMES = {
    "jiq": "JIQ",
    "jiq-pod": "JIQ-Pod({d})",
    "pod": "Pod({d})",
    "jsq": "JSQ",
    "i1f": "I1F",
    "idle-first": "Idle-first({d})",
    "jiq-sq": "JIQ-SQ({d})",
    "jiq-threshold": "JIQ-Threshold({z})",
    "jiq-original": "JIQ-Original",
    "jsew": "JSEW",
    "random": "Random",
}
#: How a line names a parameter other than the policy and its options.
_LINE_NAMES = {
    "n_servers": "N",
    "n_dispatchers": "M",
    "ratio": "r",
    "buffer": "b",
    "load": r"\lambda",
    "alpha": r"\alpha",
    "beta": r"\beta",
}


def axis_label(key: str) -> str:
    """The axis label of a parameter or metric name."""
    return AXIS_LABELS.get(key, key)


def metric_label(metric: str, index: float | None = None) -> str:
    """The axis label of a metric at ``index`` (``$s_2$ (servers with >= 2 tasks)``,
    ``99% quantile of the response time``), or of the metric alone."""
    if index is None:
        return axis_label(metric)
    if metric == "response_quantile":
        return f"{100 * index:g}% quantile of the response time"
    if metric in _AT_INDEX:
        symbol, text = _AT_INDEX[metric]
        return f"${symbol}_{{{index:g}}}$ ({text.format(k=f'{index:g}')})"
    return f"{axis_label(metric)} at {index:g}"


def policy_label(policy: str, d=None, z=None, order=None) -> str:
    """A policy's display name with its options: ``JIQ-Pod(2)``, ``JIQ-Original (FIFO, z=1)``."""
    name = POLICY_NAMES.get(policy)
    if name is None:
        return " ".join([policy] + [f"{k}={v}" for k, v in (("d", d), ("z", z)) if v is not None])
    if ("{d}" in name and d is None) or ("{z}" in name and z is None):
        return name.split("(")[0]
    name = name.format(d=d, z=z)
    if policy == "jiq-original":
        extra = [str(order).upper() if order in ("fifo", "lifo") else order]
        extra += [
            f"{k}={v}" for k, v, plain in (("z", z, 0), ("d", d, 1)) if v not in (None, plain)
        ]
        extra = [e for e in extra if e]
        name += f" ({', '.join(extra)})" if extra else ""
    return name


def line_label(params: dict, metric: str | None = None) -> str:
    """A line's display name from the parameters that tell it apart (``params``: the
    series' parameters with the policy's options where the line has one policy), and
    its metric where the figure draws several."""
    parts = []
    if "policy" in params:
        parts.append(
            policy_label(params["policy"], params.get("d"), params.get("z"), params.get("order"))
        )
    for key, value in params.items():
        if key in ("policy", "d", "z", "order") and "policy" in params:
            continue
        if key in ("service", "pools", "arrivals"):
            parts.append(f"{key} {value if value is not None else PARAMETER_DEFAULTS[key]}")
        elif key == "buffer" and value is None:
            parts.append("$b = \\infty$")
        elif value is not None:
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            parts.append(f"${_LINE_NAMES.get(key, key)} = {shown}$")
    if metric is not None:
        parts.append(axis_label(metric).split(" per ")[0])
    return " ".join(parts)


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
    fig = FigureSpec(**out)
    vector = [m for m in fig.metrics if m not in SCALAR_METRICS + (CDF,)]
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
