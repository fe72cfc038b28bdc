"""Baselines drawn beside a figure's theory: approximations computed when it is drawn.

A ``[[figure]]`` with ``baseline = "lu"`` draws Lu et al.'s approximation of JIQ,
reconstructed from their stated assumptions (:mod:`jaxqueue.theory.lu`), dotted
beside each line's mean field, against the load, for the lines whose policy it
covers (docs/sweeps.md, Figures).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxqueue.studies.figure_spec import CDF, FigureSpec
from jaxqueue.studies.figures import CURVE_POINTS, Series
from jaxqueue.studies.grid_theory import theory_key, theory_value, theory_values
from jaxqueue.studies.points import GridSpec

__all__ = ["BASELINE_NAMES", "baseline_curve"]

#: The baselines a figure can draw (its ``baseline`` key), with their legend names;
#: each is a theory kind of :func:`~jaxqueue.studies.grid_theory.theory_values`.
BASELINE_NAMES = {"lu": "Lu et al.'s approximation (reconstructed)"}


def baseline_curve(series: Series, fig: FigureSpec, spec: GridSpec, cache: dict | None = None):
    """``(x, y)`` of the figure's baseline for one line, or None.

    Where the figure has a ``baseline``, ``x`` is the load and the line's
    points differ only in the load, the baseline is evaluated at
    ``CURVE_POINTS`` loads from the line's first load to its last and at
    its own loads (scaled by ``y_scale``); None where it does not cover the
    line's policy or the figure is of another kind.
    """
    if fig.baseline is None or fig.x != "load" or fig.metrics == (CDF,) or series.x.size < 1:
        return None
    by_id = {p.point_id(): p for p in spec.points}
    points = [by_id.get(i) for i in series.point_ids]
    if not points or None in points:
        return None
    if len({theory_key(dataclasses.replace(p, load=0.0), fig.baseline) for p in points}) > 1:
        return None  # the line's points differ in more than the load
    loads = np.union1d(np.linspace(series.x[0], series.x[-1], CURVE_POINTS), series.x)
    fine = [dataclasses.replace(points[0], load=float(x)) for x in loads]
    values = theory_values(fine, fig.baseline, {} if cache is None else cache)
    y = np.array(
        [
            np.nan
            if (v := theory_value(r, series.metric, fig.index)) is None
            else v * fig.scale(p.params())
            for r, p in zip(values, fine)
        ]
    )
    return (loads, y) if np.isfinite(y).any() else None
