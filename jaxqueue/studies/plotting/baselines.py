"""Baselines drawn beside a figure's theory: approximations computed when it is drawn.

A ``[[figure]]`` with ``baseline = "lu"`` draws Lu et al.'s approximation of JIQ,
reconstructed from their stated assumptions (:mod:`jaxqueue.theory.baselines.lu`), dotted
beside each line's mean field, against the load, for the lines whose policy it
covers. With ``baseline = "diffusion"`` it draws the stationary mean of the
Halfin-Whitt diffusion limit (:func:`jaxqueue.theory.baselines.diffusion.stationary_means`)
as a level line against ``n_servers``, where the values are counts over
``sqrt(N)`` (docs/sweeps.md, Figures; docs/diffusion.md).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxqueue.studies.grids.grid_theory import theory_key, theory_value, theory_values
from jaxqueue.studies.grids.points import GridSpec, Point
from jaxqueue.studies.plotting.figure_spec import CDF, FigureSpec
from jaxqueue.studies.plotting.figures import CURVE_POINTS, Series
from jaxqueue.theory.baselines.diffusion import stationary_means

__all__ = ["BASELINE_NAMES", "SHARED_BASELINES", "DIFFUSION_METRICS", "baseline_curve"]

#: The baselines a figure can draw (its ``baseline`` key), with their legend names;
#: ``"lu"`` is a theory kind of :func:`~jaxqueue.studies.grids.grid_theory.theory_values`.
BASELINE_NAMES = {
    "lu": "Lu et al.'s approximation (reconstructed)",
    "diffusion": "diffusion limit (stationary)",
}
#: Baselines that do not depend on a line's policy: drawn once per panel and value, in grey.
SHARED_BASELINES = ("diffusion",)
#: ``(metric, k)`` -> the stationary mean of the metric times ``sqrt(N)`` in the limit:
#: servers with at least two tasks, ``E[Q_2]``
#: (:func:`~jaxqueue.theory.baselines.diffusion.stationary_means`); idle servers, ``-E[Q_1]``,
#: which is ``beta`` exactly (Ito's formula, or Little's law: the busy servers are the
#: load, ``N - beta sqrt(N)``), drawn as ``beta`` itself.
DIFFUSION_METRICS = {("tail", 2.0): "q2", ("occupancy", 0.0): "beta"}
#: The policies whose limit it is: idle-first-else-JSQ(d), every d, and JSQ.
DIFFUSION_POLICIES = ("idle-first", "jsq")


def baseline_curve(series: Series, fig: FigureSpec, spec: GridSpec, cache: dict | None = None):
    """``(x, y)`` of the figure's baseline for one line, or None.

    ``"lu"``: where ``x`` is the load and the line's points differ only in the
    load, the baseline is evaluated at ``CURVE_POINTS`` loads from the line's
    first load to its last and at its own loads (scaled by ``y_scale``); None
    where it does not cover the line's policy or the figure is of another kind.

    ``"diffusion"``: a level line over the line's ``x`` at the limit's
    stationary mean (:data:`DIFFUSION_METRICS`: ``E[Q_2]`` for ``tail`` with
    ``k = 2``, ``beta`` for ``occupancy`` with ``k = 0``), where ``x`` is ``n_servers``,
    the line's points share one ``beta``, their policy is idle-first or JSQ
    (exp(1) servers, no pools, buffer or arrivals file) and ``y_scale`` is
    ``sqrt(n_servers)`` at each of them; None otherwise.
    """
    if fig.baseline is None or fig.metrics == (CDF,) or series.x.size < 1:
        return None
    by_id = {p.point_id(): p for p in spec.points}
    points = [by_id.get(i) for i in series.point_ids]
    if not points or None in points:
        return None
    if fig.baseline == "diffusion":
        return _diffusion_line(series, fig, points)
    if fig.x != "load":
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


def _diffusion_line(series: Series, fig: FigureSpec, points: list[Point]):
    """The diffusion baseline of one line (:func:`baseline_curve`), or None."""
    which = DIFFUSION_METRICS.get((series.metric, fig.index))
    if which is None or fig.x != "n_servers":
        return None
    betas = {p.beta for p in points}
    if len(betas) != 1 or None in betas:
        return None
    for p in points:
        plain = p.service is None and p.pools is None and p.arrivals is None
        if p.policy not in DIFFUSION_POLICIES or not plain or p.buffer is not None:
            return None
        scale = fig.scale(p.params())
        if not math.isclose(scale, math.sqrt(p.servers), rel_tol=1e-9):
            return None  # not counts over sqrt(N)
    beta = float(betas.pop())
    level = beta if which == "beta" else float(stationary_means(beta).q2.mean)
    x = np.array([series.x.min(), series.x.max()], np.float64)
    return x, np.full(2, level)
