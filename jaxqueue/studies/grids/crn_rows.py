"""A grid spec's derivative and difference rows, the grid's studies on common random
numbers (:mod:`jaxqueue.studies.crn.sides`):

* ``[run] sensitivity``: each point's sides run as
  :func:`jaxqueue.studies.crn.sensitivity.sensitivity` runs them, and its derivatives
  become store rows beside its metrics, with the theory's central difference at
  :data:`THEORY_STEP` in the theory column;
* ``[run] paired = true``: each point's metrics minus those of its line's reference,
  with the paired intervals and correlations of :func:`jaxqueue.paired`, from the
  per-replica values of the grid's own batches.

docs/sweeps.md, Sensitivities and paired points.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import jax

from jaxqueue.core.user_metrics import at_fixed_point
from jaxqueue.results.schema import QUANTILE_NAMES, QUANTILES
from jaxqueue.studies.crn.paired import compare_samples
from jaxqueue.studies.crn.sensitivity import CurvatureWarning, Sensitivity, sensitivity
from jaxqueue.studies.crn.sides import load_at, scalar_names, side_samples
from jaxqueue.studies.grids.grid_theory import theory_value, theory_values, warmup_passed
from jaxqueue.studies.grids.spec import GridSpec, Point
from jaxqueue.studies.grids.spec_values import (
    CORRELATION,
    COUPLED,
    CURVED,
    derivative_name,
    difference_name,
)
from jaxqueue.studies.grids.store import parameter_values

__all__ = [
    "THEORY_STEP",
    "point_sensitivity",
    "theory_slopes",
    "sensitivity_rows",
    "check_processes",
    "line_key",
    "references",
    "PairedRows",
]


def _base(spec: GridSpec, point: Point, point_id: str, lengths: dict, passed) -> dict:
    """The columns a point's derived rows share: its id and parameters, the run's."""
    return {
        "point_id": point_id,
        **parameter_values(point.params()),
        "k": None,
        "refined": None,
        "replicas": spec.run.replicas,
        **lengths,
        "warmup_passed": passed,
        "seed": spec.run.seed,
    }


def _row(base: dict, metric: str, mean, ci95=None, theory=None) -> dict:
    return {**base, "metric": metric, "mean": mean, "ci95": ci95, "theory": theory}


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
    """``(metric, k)`` of a scalar name in the theory's and the store's terms (``p99``:
    a quantile's)."""
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
    lengths = {k: sens.settings[k] for k in ("steps", "warmup")}
    passed = None if None in verdicts else min(verdicts)
    base = _base(spec, point, point_id, lengths, passed)
    rows = []
    for name, est in sens.derivatives.items():
        metric = derivative_name(name, parameter)
        rows.append(_row(base, metric, float(est.mean), float(est.ci95), slopes[name]))
        rows.append(_row(base, metric + CURVED, float(name in sens.curved)))
    return rows


def sensitivity_rows(spec: GridSpec, batch: list, ids: dict, devices, cache: dict) -> list:
    """The derivative rows of a batch's points in every parameter of ``[run] sensitivity``
    (none without it); each point's sides run as a batch of their own."""
    rows = []
    for point in batch:
        for parameter in spec.run.sensitivity:
            rows += _rows(spec, point, ids[point], parameter, devices, cache)
    return rows


#: The parameters that move a point along its line (the load, or what sets it).
_ALONG = ("load", "alpha", "beta")


def line_key(point: Point) -> str:
    """A point's line: its parameters but the load (and ``alpha``, ``beta``)."""
    params = {k: v for k, v in point.params().items() if k not in _ALONG}
    return json.dumps(params, sort_keys=True, default=str)


def references(points) -> dict:
    """``{point: reference}``: each point's line's point of lowest load (the first
    of the spec's order among equal loads)."""
    lowest: dict = {}
    for p in points:
        key = line_key(p)
        if key not in lowest or p.load < lowest[key].load:
            lowest[key] = p
    return {p: lowest[line_key(p)] for p in points}


class PairedRows:
    """The difference rows of a sweep's points, as their batches finish.

    A point's per-replica values are held in memory until its reference's are
    there (a reference's for the whole sweep), so a point and its reference may
    run in any batches of one sweep; a point whose reference was stored by an
    earlier sweep into the same store gets no difference rows (:meth:`missed`).
    """

    def __init__(self, spec: GridSpec, ids: dict, done: set):
        self.spec, self.ids = spec, ids
        self.reference = references(spec.points) if spec.run.paired else {}
        self.samples: dict = {}
        self.theory: dict = {}
        self.lengths: dict = {}
        self.waiting: dict = {}
        self.missed = [
            p
            for p, ref in self.reference.items()
            if p != ref and (ids[p] in done) != (ids[ref] in done)
        ]

    def rows(self, batch: list, results: list, run, stored=()) -> list:
        """The difference rows this batch completes (none unless the spec is paired):
        its points against references already run, and points waiting for its
        references; ``stored``: the batch's rows, whose theory the differences take."""
        if not self.reference:
            return []
        names = scalar_names(results[0], run.plan)
        theory = {(r["point_id"], r["metric"], r["k"]): r["theory"] for r in stored}
        for j, p in enumerate(batch):
            self.samples[p] = side_samples(run, j, names)
            self.theory[p] = {m: theory.get((self.ids[p], *_theory_metric(m))) for m in names}
            self.lengths[p] = {k: results[j].settings[k] for k in ("steps", "warmup")}
        out = []
        for p in batch:
            ref = self.reference[p]
            if p == ref:
                out += [r for q in self.waiting.pop(p, ()) for r in self._pair(q, ref)]
            elif ref in self.samples:
                out += self._pair(p, ref)
            else:
                self.waiting.setdefault(ref, []).append(p)
        return out

    def warning(self) -> str:
        """Why :attr:`missed` points have no difference rows."""
        return (
            f"[jaxqueue] {self.spec.name}: warning: {len(self.missed)} points have no "
            "diff_ rows: they and their line's reference ran in different sweeps into "
            "this store (the per-replica values are kept during a sweep only); run the "
            "spec into a new store to have them"
        )

    def _pair(self, p: Point, ref: Point) -> list:
        """The rows of ``p``'s differences from ``ref`` (``p``'s values then let go)."""
        diff, _, corr, coupled, _ = compare_samples([self.samples[ref], self.samples.pop(p)])
        at, at_ref = self.theory.pop(p), self.theory[ref]
        base = _base(self.spec, p, self.ids[p], self.lengths.pop(p), None)
        rows = []
        for name, est in diff[0].items():
            metric = difference_name(name)
            r = corr[0][name]
            gap = None if None in (at.get(name), at_ref.get(name)) else at[name] - at_ref[name]
            rows += [
                _row(base, metric, float(est.mean), float(est.ci95), gap),
                _row(base, metric + CORRELATION, r if math.isfinite(r) else None),
                _row(base, metric + COUPLED, float(coupled[0][name])),
            ]
        return rows
