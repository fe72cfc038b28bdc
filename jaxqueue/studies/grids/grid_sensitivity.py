"""The sensitivities of a grid spec's points (``[run] sensitivity``): each point's sides
run as :func:`jaxqueue.studies.crn.sensitivity.sensitivity` runs them, and its derivatives
become store rows beside its metrics, with the theory's central difference at
:data:`THEORY_STEP` in the theory column (docs/sweeps.md, Sensitivities).
"""

from __future__ import annotations

import dataclasses
import warnings

import jax

from jaxqueue.core.user_metrics import at_fixed_point
from jaxqueue.results.schema import QUANTILE_NAMES, QUANTILES
from jaxqueue.studies.crn.sensitivity import CurvatureWarning, Sensitivity, load_at, sensitivity
from jaxqueue.studies.grids.derivatives import CURVED, derivative_name
from jaxqueue.studies.grids.grid_theory import theory_value, theory_values, warmup_passed
from jaxqueue.studies.grids.spec import GridSpec, Point
from jaxqueue.studies.grids.store import parameter_values

__all__ = [
    "THEORY_STEP",
    "point_sensitivity",
    "theory_slopes",
    "sensitivity_rows",
    "check_processes",
]

#: The step of the theory's central difference, in the parameter: the theories are
#: solved to about 1e-12, so the difference is good to about 1e-8 besides its
#: ``O(h^2)`` curvature term.
THEORY_STEP = 1e-4


def check_processes(spec: GridSpec) -> None:
    """Refuse sensitivities and paired differences with several processes: a point's
    sides run, and the per-replica values are read, on the first process alone."""
    for key, given in (("sensitivity", spec.run.sensitivity), ("paired", spec.run.paired)):
        if given and jax.process_count() > 1:
            raise ValueError(
                f"[run] {key} is not available with several processes (jax.distributed): "
                f"run the spec in one process, or without {key}"
            )


def _value(point: Point, parameter: str) -> float:
    return point.load if parameter == "load" else getattr(point, parameter)


def point_sensitivity(spec: GridSpec, point: Point, parameter: str, devices=None) -> Sensitivity:
    """The sensitivity of ``point`` in ``parameter``: :func:`jaxqueue.sensitivity` with the
    spec's run settings (its seed; the sides on one stream, every replica ``i`` one key),
    replica intervals; its :class:`~jaxqueue.studies.crn.sensitivity.CurvatureWarning` is
    kept as the result's ``curved``."""
    run = spec.run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CurvatureWarning)
        return sensitivity(
            spec.model(point),
            parameter=parameter,
            **{parameter: _value(point, parameter)},
            run=run.options_for([point], devices, spec.point_metrics(point) or None),
        )


def _theory_metric(name: str) -> tuple:
    """``(metric, k)`` of a scalar name in the theory's terms (``p99``: a quantile)."""
    if name in QUANTILE_NAMES:
        return "response_quantile", QUANTILES[QUANTILE_NAMES.index(name)]
    return name, None


def theory_slopes(spec: GridSpec, point: Point, parameter: str, names, cache: dict) -> dict:
    """``{name: d theory / d parameter}`` at ``point`` (None where the theory has no
    value): the spec's theory (the mean field for ``"refined"``) at the parameter
    ``-+`` :data:`THEORY_STEP`, differenced."""
    kind = "mean-field" if spec.run.theory == "refined" else spec.run.theory
    if kind == "none":
        return dict.fromkeys(names)
    value = _value(point, parameter)
    steps = (-THEORY_STEP, THEORY_STEP)
    sides = [
        dataclasses.replace(point, load=load_at(parameter, value + s, point.servers)) for s in steps
    ]
    try:
        solved = theory_values(sides, kind, cache)
    except (ValueError, RuntimeError, ArithmeticError):  # a side the theory cannot solve
        return dict.fromkeys(names)
    metrics = spec.point_metrics(point)
    solved = [
        at_fixed_point(r, metrics, p.servers, p.dispatchers, p.load) for r, p in zip(solved, sides)
    ]
    out = {}
    for name in names:
        lo, hi = (theory_value(r, *_theory_metric(name)) for r in solved)
        out[name] = None if lo is None or hi is None else (hi - lo) / (2 * THEORY_STEP)
    return out


def _rows(spec: GridSpec, point: Point, point_id: str, parameter: str, devices, cache) -> list:
    """The store rows of one point's derivatives in ``parameter`` and their flags."""
    sens = point_sensitivity(spec, point, parameter, devices)
    slopes = theory_slopes(spec, point, parameter, tuple(sens.derivatives), cache)
    verdicts = [warmup_passed(side) for side in sens.sides]
    base = {
        "point_id": point_id,
        **parameter_values(point.params()),
        "k": None,
        "refined": None,
        "replicas": spec.run.replicas,
        "steps": sens.settings["steps"],
        "warmup": sens.settings["warmup"],
        "warmup_passed": None if None in verdicts else min(verdicts),
        "seed": spec.run.seed,
    }
    rows = []
    for name, est in sens.derivatives.items():
        metric = derivative_name(name, parameter)
        rows.append(
            {
                **base,
                "metric": metric,
                "mean": float(est.mean),
                "ci95": float(est.ci95),
                "theory": slopes[name],
            }
        )
        flag = float(name in sens.curved)
        rows.append({**base, "metric": metric + CURVED, "mean": flag, "ci95": None, "theory": None})
    return rows


def sensitivity_rows(spec: GridSpec, batch: list, ids: dict, devices, cache: dict) -> list:
    """The derivative rows of a batch's points in every parameter of ``[run] sensitivity``
    (none without it); each point's sides run as a batch of their own."""
    rows = []
    for point in batch:
        for parameter in spec.run.sensitivity:
            rows += _rows(spec, point, ids[point], parameter, devices, cache)
    return rows
