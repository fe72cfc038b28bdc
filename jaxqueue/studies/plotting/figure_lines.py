"""The lines of a figure: the :class:`Series` record, and how a store's rows
(:meth:`~jaxqueue.studies.grids.store.Store.rows`) are matched, grouped, named and read
into its lines (:mod:`jaxqueue.studies.plotting.figures`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxqueue.studies.plotting.figure_spec import (
    PARAMETER_DEFAULTS,
    PARAMETERS,
    FigureSpec,
    line_label,
)

__all__ = [
    "Series",
    "sort_key",
    "varies",
    "same",
    "fmt",
    "matches",
    "column",
    "varying",
    "key_label",
    "line_name",
    "check_labels",
]


@dataclasses.dataclass(frozen=True)
class Series:
    """One line of a figure: simulated means with 95% half-widths, and theory (NaN: none).

    All arrays are float64 and sorted by ``x``; ``y``, ``ci95``, ``theory`` and
    ``refined`` (the 1/N-refined mean field, NaN unless the spec asked for it)
    already carry the figure's ``y_scale``. ``label`` names the line in ``plot``'s
    report and is the key of the figure's ``labels``; ``name`` is its display name
    (from ``labels``, else :func:`~jaxqueue.studies.plotting.figure_spec.line_label`);
    ``point_ids`` are the store's points of the line, in the order of ``x``;
    ``passed`` whether each point passed its warm-up diagnostic (all True where
    the store does not say: plots draw a failed point hollow).
    """

    panel: object
    label: str
    metric: str
    x: np.ndarray
    y: np.ndarray
    ci95: np.ndarray
    theory: np.ndarray
    refined: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    name: str = ""
    point_ids: tuple = ()
    passed: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, bool))

    def __post_init__(self):
        if self.refined.size != self.x.size:  # not given: none
            object.__setattr__(self, "refined", np.full(self.x.size, math.nan))
        if self.passed.size != self.x.size:  # not given: passed
            object.__setattr__(self, "passed", np.ones(self.x.size, bool))
        if not self.name:
            object.__setattr__(self, "name", self.label)


def sort_key(value):
    """A key that orders numbers, then text, then None (tuples element by element)."""
    if isinstance(value, tuple):
        return tuple(sort_key(v) for v in value)
    if value is None:
        return (2, 0.0, "")
    if isinstance(value, str):
        return (1, 0.0, value)
    return (0, float(value), "")


def varies(rows, key) -> bool:
    """Whether ``rows`` hold more than one value of ``key``."""
    return len({sort_key(r.get(key)) for r in rows}) > 1


def same(a, b) -> bool:
    """Equal values (floats to a relative 1e-9)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def fmt(value) -> str:
    """A parameter's value as a line names it (None: ``inf``, a buffer's)."""
    return "inf" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))


def matches(row: dict, key: str, values: tuple) -> bool:
    """Whether ``row``'s ``key`` is one of ``values`` (a figure's ``where``; None is
    ``"inf"`` for a buffer and the default of a service law, pools or arrivals)."""
    have = row["k"] if key == "k" else row.get(key)
    for v in values:
        if isinstance(v, str) or isinstance(have, str) or have is None:
            if v == have or (
                have is None and v == ("inf" if key == "buffer" else PARAMETER_DEFAULTS.get(key))
            ):
                return True
        elif math.isclose(float(have), float(v), rel_tol=1e-9, abs_tol=1e-12):
            return True
    return False


def column(members: list[dict], name: str) -> np.ndarray:
    """The rows' ``name`` as floats (None: NaN)."""
    return np.array([math.nan if m.get(name) is None else float(m[name]) for m in members])


def varying(picked: list[dict], fig: FigureSpec, x_of) -> tuple:
    """The default series: every parameter other than x and panels that varies at a fixed
    x (``x_of(row)``) and panel."""
    buckets: dict = {}
    for r in picked:
        key = (sort_key(x_of(r)), sort_key(r.get(fig.panels)) if fig.panels else None)
        buckets.setdefault(key, []).append(r)
    varying = [
        p
        for p in PARAMETERS
        if p not in (fig.x, fig.panels) and any(varies(b, p) for b in buckets.values())
    ]
    if "ratio" in varying:  # M follows N and r
        varying = [p for p in varying if p != "n_dispatchers"]
    if "alpha" in varying or "beta" in varying:  # the load follows N and alpha or beta
        varying = [p for p in varying if p != "load"]
    return tuple(varying)


def key_label(series_keys: tuple, key: tuple) -> str:
    """A line's name in ``plot``'s report: the policy, then ``key=value`` of the other
    series parameters."""
    return " ".join(
        fmt(v) if p == "policy" else f"{p}={fmt(PARAMETER_DEFAULTS.get(p) if v is None else v)}"
        for p, v in zip(series_keys, key)
        if v is not None or p in ("buffer", "service", "pools", "arrivals")  # an option the
    )  # policy does not take is left out


def line_name(fig: FigureSpec, label: str, series_keys: tuple, key: tuple, members, metric) -> str:
    """A line's display name: the figure's ``labels`` entry for ``label``, else the
    parameters that tell it apart (with its policy's options, where it has one policy)."""
    given = fig.label_map().get(label)
    if given is not None:
        return given
    shown = ("buffer", *PARAMETER_DEFAULTS)  # None is a value: infinite, exp, ...
    params = {p: v for p, v in zip(series_keys, key) if v is not None or p in shown}
    if "policy" in params:
        for option in ("d", "z", "order"):
            values = {m.get(option) for m in members}
            if len(values) == 1 and None not in values:
                params[option] = values.pop()
    return line_label(params, metric) or label


def check_labels(fig: FigureSpec, series: list) -> list:
    """``series``, or a ValueError where the figure's ``labels`` name a line it does not have."""
    if unknown := sorted(set(fig.label_map()) - {s.label for s in series}):
        lines = sorted({s.label for s in series})
        raise ValueError(
            f"figure {fig.name!r}: labels names {', '.join(map(repr, unknown))}, not a line "
            f"of the figure; its lines are {', '.join(map(repr, lines))}"
        )
    return series
