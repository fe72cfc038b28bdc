"""Sensitivities of simulated metrics by common random numbers: the central
difference of every scalar metric in the load (or ``alpha``, ``beta``), a
pool's speed or share, the service law's SCV or a profile's amplitude, its
sides (:mod:`jaxqueue.studies.crn.sides`) run on the same random words, with
paired intervals and a Richardson check at half the step (docs/crn.md).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from jaxqueue.core.config import (
    BOUND_KEYS,
    MODEL_OPTIONS,
    RUN_KEYS,
    split_keywords,
    takes_options,
)
from jaxqueue.core.service import realized_pools
from jaxqueue.core.system import MAX_SERVERS, check_int
from jaxqueue.results.display import StudyTable, optional_import
from jaxqueue.results.estimates import Estimate
from jaxqueue.results.stats import tolerance
from jaxqueue.studies.crn.sides import (
    LOAD_PARAMETERS,
    SYSTEM_PARAMETERS,
    Sides,
    Step,
    combine,
    load_at,
    plan_load_sides,
    plan_system_sides,
    refuse_auto_warmup,
)

__all__ = [
    "CURVATURE_ALPHA",
    "Sensitivity",
    "CurvatureWarning",
    "sensitivity",
    "plan_sides",
]

#: The family-wise rate of the Richardson check over a result's metrics.
CURVATURE_ALPHA = 0.01

#: The keywords of a sensitivity's :class:`~jaxqueue.studies.crn.sides.Step`.
STEP_KEYS = tuple(f.name for f in dataclasses.fields(Step))


class CurvatureWarning(UserWarning):
    """The central differences at ``h`` and ``h / 2`` disagree beyond their paired interval."""


@dataclasses.dataclass(frozen=True, repr=False)
class Sensitivity(StudyTable):
    """Derivatives of a simulated system's scalar metrics in one parameter.

    Attributes:
        parameter: one of :data:`PARAMETERS`.
        value: the parameter's value ``theta``.
        h: the step: the sides run at ``theta - h`` and ``theta + h`` (and at
            ``theta -+ h / 2`` for the Richardson check).
        derivatives: ``{metric: Estimate}``, ``(X(theta + h) - X(theta - h)) / 2h``
            with the 95% interval of the paired per-replica differences (or of
            their batch means).
        half_step: the same at ``h / 2`` (empty without the check).
        extrapolated: ``(4 D(h / 2) - D(h)) / 3`` per replica, bias ``O(h^4)``.
        gap: ``D(h) - D(h / 2)`` per replica: a curvature the step resolves.
        curved: the metrics whose ``gap`` is beyond its interval (family-wise
            :data:`CURVATURE_ALPHA` over the metrics): their ``D(h)`` carries a
            bias; read ``extrapolated`` or take a smaller ``h``.
        values: the parameter's values the sides ran at (the loads' float32
            values, converted back), in the order of ``sides``.
        sides: each side's :class:`~jaxqueue.results.simulation.SimulationResult`.
        settings: the run's settings (those of the first side) and the step.
    """

    parameter: str
    value: float
    h: float
    derivatives: dict
    half_step: dict
    extrapolated: dict
    gap: dict
    curved: tuple
    values: tuple
    sides: tuple
    settings: dict

    def __getitem__(self, metric: str) -> Estimate:
        return self.derivatives[metric]

    #: The estimates of each metric, by the column names of :meth:`records`.
    _PARTS = (
        ("derivative", "derivatives"),
        ("half_step", "half_step"),
        ("extrapolated", "extrapolated"),
        ("gap", "gap"),
    )

    _HTML_COLUMNS = (
        "metric",
        "derivative",
        "derivative_ci95",
        "half_step",
        "half_step_ci95",
        "curved",
    )

    def records(self) -> list[dict]:
        """One row per metric: ``derivative`` (``D(h)``), ``half_step``
        (``D(h/2)``), ``extrapolated`` and ``gap``, each with its 95% half-width
        as ``{name}_ci95`` (None without the Richardson check), ``curved``, and
        the parameter, its value, the step, the policy and ``n_servers``."""
        s = self.settings
        rows = []
        for name in self.derivatives:
            row = {
                "parameter": self.parameter,
                "value": self.value,
                "h": self.h,
                "policy": s.get("policy_label", s.get("policy")),
                "n_servers": s.get("n_servers"),
                "metric": name,
            }
            for column, part in self._PARTS:
                est = getattr(self, part).get(name)
                row[column] = None if est is None else float(est.mean)
                row[f"{column}_ci95"] = None if est is None else float(est.ci95)
            row["curved"] = name in self.curved
            rows.append(row)
        return rows

    def to_xarray(self):
        """An xarray Dataset over ``metric`` (extra ``xarray``): the columns of
        :meth:`records` as variables (NaN where there is no half step); the
        parameter, its value and the step as attributes."""
        xr = optional_import("xarray", "xarray")
        rows = self.records()
        data = {}
        for column, _ in self._PARTS:
            for key in (column, f"{column}_ci95"):
                data[key] = ("metric", [np.nan if r[key] is None else r[key] for r in rows])
        data["curved"] = ("metric", [r["curved"] for r in rows])
        ds = xr.Dataset(data, coords={"metric": [r["metric"] for r in rows]})
        ds.attrs.update(parameter=self.parameter, value=self.value, h=self.h)
        ds.attrs.update(policy=str(self.settings.get("policy_label")))
        return ds

    def to_dict(self) -> dict:
        """A JSON-ready dict: every Estimate as :meth:`Estimate.to_dict`."""

        def table(estimates: dict) -> dict:
            return {k: v.to_dict() for k, v in estimates.items()}

        return {
            "parameter": self.parameter,
            "value": self.value,
            "h": self.h,
            "derivatives": table(self.derivatives),
            "half_step": table(self.half_step),
            "extrapolated": table(self.extrapolated),
            "gap": table(self.gap),
            "curved": list(self.curved),
            "values": list(self.values),
            "settings": {k: v for k, v in self.settings.items() if k != "versions"},
        }

    def __str__(self) -> str:
        label = self.settings.get("policy_label", self.settings.get("policy", ""))
        lines = [
            f"d/d{self.parameter} at {self.parameter} = {self.value:.6g} "
            f"(h = {self.h:.3g}; {label}, N = {self.settings.get('n_servers')}; "
            "common random numbers)"
        ]
        width = max(len(k) for k in self.derivatives) if self.derivatives else 6
        for name, est in self.derivatives.items():
            row = f"  {name:<{width}}  {est:.4g}"
            if name in self.half_step:
                row += f"   h/2: {self.half_step[name]:.4g}"
                row += "   curved" if name in self.curved else ""
            lines.append(row)
        return "\n".join(lines)


@takes_options(*MODEL_OPTIONS, *RUN_KEYS, *BOUND_KEYS, also=(Step,))
def sensitivity(
    policy,
    load: float | None = None,
    n_servers: int | None = None,
    n_dispatchers: int = 1,
    *,
    alpha: float | None = None,
    beta: float | None = None,
    step: Step | None = None,
    run=None,
    bounds=None,
    progress: bool = False,
    **options,
) -> Sensitivity:
    """Derivatives of every scalar metric of a simulated system, by central
    differences under common random numbers.

    The sides ``theta -+ h`` (and ``theta -+ h / 2``) run as the loads of one
    lockstep batch that all draw from one stream: replica ``i`` of every side
    has the same key, so the sides take the same random words step by step and
    their paths part only where a word falls between two sides' thresholds
    (docs/crn.md). A parameter of the compiled system (a pool's speed or
    share, the SCV, the amplitude) runs each side on its own, on the same seed
    and stream: replica ``i`` of every side again has the same key. The
    interval of a derivative comes from the paired per-replica differences (or
    their batch means, as ``interval`` chooses).

    Args:
        policy, n_servers, n_dispatchers: as :func:`jaxqueue.simulate` (or a Model).
        load: ``lambda`` (with ``parameter="load"``, the default).
        alpha: instead of ``load``: ``lambda = 1 - N**(-alpha)``; the default
            parameter is then ``"alpha"``.
        beta: instead of ``load``: ``lambda = 1 - beta / sqrt(N)``; the default
            parameter is then ``"beta"``.
        step: a :class:`~jaxqueue.studies.crn.sides.Step` instead of its
            keywords ``parameter``, ``h``, ``richardson`` and ``pool`` (one given
            beside it is an error).
        run, bounds, progress: as :func:`jaxqueue.simulate`; the sides share
            the level bounds (sized at the largest load) and the run lengths;
            ``warmup="auto"`` is refused (its extensions would part the sides'
            windows).
        <options>

    Returns:
        a :class:`Sensitivity`.

    Warns:
        CurvatureWarning: where ``D(h)`` and ``D(h / 2)`` disagree.
    """
    step = _step(step, options)
    sides = _planned(
        policy, (n_servers, n_dispatchers), (load, alpha, beta), step, run, bounds, options
    )
    found = sides.run(progress)
    out = _derivatives(found.samples, sides.values, step.richardson)
    curved = _curved(out.get("gap", {}))
    parameter, h = sides.parameter, sides.h
    settings = dict(found.results[0].settings, parameter=parameter, value=sides.value, h=h)
    if parameter in ("speed", "share"):
        settings["pool"] = step.pool
    for name in curved:
        warnings.warn(_curvature_message(name, out, parameter, h), CurvatureWarning, stacklevel=2)
    return Sensitivity(
        parameter,
        sides.value,
        h,
        out["derivatives"],
        out.get("half_step", {}),
        out.get("extrapolated", {}),
        out.get("gap", {}),
        curved,
        sides.values,
        tuple(found.results),
        settings,
    )


def plan_sides(
    policy,
    load: float | None = None,
    n_servers: int | None = None,
    n_dispatchers: int = 1,
    *,
    alpha: float | None = None,
    beta: float | None = None,
    step: Step | None = None,
    run=None,
    bounds=None,
    **options,
) -> Sides:
    """The sides of :func:`sensitivity` (arguments as there), checked, nothing
    compiled: the loads of one plan on one stream, or in a parameter of the
    system one plan per side, all at one load on one seed and one stream."""
    step = _step(step, options)
    return _planned(
        policy, (n_servers, n_dispatchers), (load, alpha, beta), step, run, bounds, options
    )


def _planned(policy, sizes: tuple, at: tuple, step: Step, run, bounds, options: dict) -> Sides:
    """The sides of a front's arguments (:func:`sensitivity`, :func:`plan_sides`; a
    pool rounding is warned about at their caller's line): ``sizes`` are
    ``(n_servers, n_dispatchers)``, ``at`` is ``(load, alpha, beta)``."""
    model, opts, bound = split_keywords(policy, *sizes, options, run, bounds, where="sensitivity")
    name, value = _given(*at)
    parameter = step.parameter or name
    if parameter in LOAD_PARAMETERS and parameter != name:
        raise ValueError(f"parameter={parameter!r} needs {parameter}=..., got {name}=...")
    n = check_int("n_servers", model.n_servers, 2 if name != "load" else 1, MAX_SERVERS)
    refuse_auto_warmup(opts, "a sensitivity")
    if parameter in SYSTEM_PARAMETERS:
        if parameter in ("speed", "share"):  # the rounding of fractions to servers, named once
            realized_pools(model.pools, model.n_servers, stacklevel=3)
        lam = float(np.float32(load_at(name, value, n)))
        return plan_system_sides(model, lam, opts, bound, step)
    return plan_load_sides(model, opts, bound, value, dataclasses.replace(step, parameter=name))


def _step(step, options: dict) -> Step:
    """The Step given, or made of its keywords in ``options`` (taken out of it)."""
    given = {k: options.pop(k) for k in STEP_KEYS if k in options}
    if step is None:
        return Step(**given)
    if given:
        raise TypeError(
            f"sensitivity(): {', '.join(given)} given beside step=: set "
            f"{'it' if len(given) == 1 else 'them'} in the Step "
            f"(dataclasses.replace(step, {next(iter(given))}=...))"
        )
    if not isinstance(step, Step):
        raise TypeError(f"step={step!r} is not a Step")
    return step


def _given(load, alpha, beta) -> tuple[str, float]:
    """The parameter of the load given (one of ``load``, ``alpha``, ``beta``) and its value."""
    given = {k: v for k, v in (("load", load), ("alpha", alpha), ("beta", beta)) if v is not None}
    if len(given) != 1:
        raise TypeError(
            "sensitivity() takes one of load, alpha and beta, got "
            + (", ".join(given) if given else "none")
        )
    ((name, value),) = given.items()
    if np.ndim(value) != 0:
        raise TypeError(f"sensitivity() takes one value of {name}, got {value!r}")
    return name, float(value)


def _derivatives(samples: list, values: tuple, richardson: bool) -> dict:
    """The central differences at ``h`` (and ``h / 2``, extrapolated, their gap)."""
    batched = samples[0][1] is not None
    wide = values[1] - values[0]

    def at_h(lo, hi, *_):
        return (hi - lo) / wide

    out = {"derivatives": combine(at_h, samples, batched)}
    if not richardson:
        return out
    narrow = values[3] - values[2]

    def at_half(lo, hi, lo2, hi2):
        return (hi2 - lo2) / narrow

    def extrapolated(lo, hi, lo2, hi2):
        return (4.0 * at_half(lo, hi, lo2, hi2) - at_h(lo, hi)) / 3.0

    def gap(lo, hi, lo2, hi2):
        return at_h(lo, hi) - at_half(lo, hi, lo2, hi2)

    out["half_step"] = combine(at_half, samples, batched)
    out["extrapolated"] = combine(extrapolated, samples, batched)
    out["gap"] = combine(gap, samples, batched)
    return out


def _curved(gaps: dict) -> tuple:
    """The metrics whose gap ``D(h) - D(h / 2)`` is beyond its tolerance at
    family-wise :data:`CURVATURE_ALPHA` over the metrics (a gap with no spread,
    identical paths, is never flagged)."""
    curved = []
    for name, est in gaps.items():
        n, half = np.asarray(est.n), est.ci95
        if np.any(n < 2) or not np.isfinite(half) or not np.isfinite(est.mean):
            continue
        if abs(est.mean) > tolerance(est, family=len(gaps), alpha=CURVATURE_ALPHA):
            curved.append(name)
    return tuple(curved)


def _curvature_message(name: str, out: dict, parameter: str, h: float) -> str:
    full, half = out["derivatives"][name], out["half_step"][name]
    return (
        f"d {name} / d {parameter}: the central differences at h = {h:.3g} ({full:.4g}) and "
        f"h / 2 ({half:.4g}) disagree beyond their paired interval: the step is too wide "
        "for the curvature; read the extrapolated value or give a smaller h"
    )
