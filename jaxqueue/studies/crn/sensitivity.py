"""Sensitivities of simulated metrics by common random numbers: the central
difference of every scalar metric in the load (or ``alpha``, ``beta``), a
pool's speed or share, the service law's SCV or a profile's amplitude, the
sides run on the same random words, with paired intervals and a Richardson
check at half the step (docs/crn.md).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import NamedTuple

import numpy as np

from jaxqueue.core.config import split_keywords
from jaxqueue.core.system import MAX_SERVERS, check_int, check_load
from jaxqueue.core.user_metrics import PER_ARRIVAL
from jaxqueue.results.display import StudyTable, optional_import
from jaxqueue.results.estimates import Estimate, estimate
from jaxqueue.results.schema import QUANTILE_NAMES, SCALAR_METRICS
from jaxqueue.results.simulation import batch_means
from jaxqueue.results.stats import tolerance
from jaxqueue.runs import planner
from jaxqueue.sim.collect import load_samples
from jaxqueue.sim.runner import Plan, Run
from jaxqueue.studies.crn.sensitivity_sides import SYSTEM_PARAMETERS, capacity_of, plan_system_sides

__all__ = [
    "PARAMETERS",
    "LOAD_PARAMETERS",
    "RELATIVE_STEP",
    "CURVATURE_ALPHA",
    "Sensitivity",
    "CurvatureWarning",
    "sensitivity",
    "plan_sides",
    "plan_system_sides_of",
    "Sides",
    "default_step",
    "load_at",
    "scalar_names",
    "side_samples",
    "paired_estimates",
]

#: The parameters a sensitivity is taken in: the load ``lambda``, ``alpha`` of
#: ``lambda = 1 - N**(-alpha)`` (Liu and Ying) and ``beta`` of
#: ``lambda = 1 - beta / sqrt(N)`` (Halfin-Whitt, Mukherjee et al.), whose
#: sides are the loads of one batch; then those of the compiled system
#: (:data:`~jaxqueue.studies.crn.sensitivity_sides.SYSTEM_PARAMETERS`), each side
#: its own run.
LOAD_PARAMETERS = ("load", "alpha", "beta")
PARAMETERS = LOAD_PARAMETERS + SYSTEM_PARAMETERS

#: The default step moves the load by this fraction of its distance to the
#: nearer of 0 and the servers' capacity (1 for identical servers of mean
#: service 1; with a finite buffer, of the load itself): docs/crn.md.
RELATIVE_STEP = 0.05

#: The family-wise rate of the Richardson check over a result's metrics.
CURVATURE_ALPHA = 0.01

#: The stream word every side draws from: replica ``i`` of each side has the same key.
_STREAM = 0


class CurvatureWarning(UserWarning):
    """The central differences at ``h`` and ``h / 2`` disagree beyond their paired interval."""


def load_at(parameter: str, value: float, n_servers: int) -> float:
    """The load ``lambda`` at ``value`` of ``parameter`` (:data:`PARAMETERS`)."""
    if parameter == "load":
        return float(value)
    if parameter == "alpha":
        return 1.0 - n_servers ** (-float(value))
    if parameter == "beta":
        return 1.0 - float(value) / math.sqrt(n_servers)
    raise ValueError(
        f"parameter={parameter!r} is not valid: use one of {', '.join(LOAD_PARAMETERS)}"
    )


def _value_of(parameter: str, load: float, n_servers: int) -> float:
    """The inverse of :func:`load_at`: the parameter's value at ``load``."""
    if parameter == "alpha":
        return -math.log1p(-load) / math.log(n_servers)
    if parameter == "beta":
        return (1.0 - load) * math.sqrt(n_servers)
    return load


def _load_slope(parameter: str, value: float, n_servers: int) -> float:
    """``|d lambda / d parameter|`` at ``value``."""
    if parameter == "alpha":
        return math.log(n_servers) * n_servers ** (-float(value))
    if parameter == "beta":
        return 1.0 / math.sqrt(n_servers)
    return 1.0


def default_step(
    parameter: str, value: float, n_servers: int, buffer=None, capacity: float = 1.0
) -> float:
    """The default ``h``: it moves the load by :data:`RELATIVE_STEP` of its
    distance to the nearer of 0 and the stability boundary, converted to the
    parameter.

    The boundary is ``capacity``, the tasks per server per unit time the
    servers complete when all are busy (:func:`~jaxqueue.core.service.capacity`:
    1 for identical servers of mean service 1, ``sum_i f_i speed_i / mean_i``
    for pools). With a finite ``buffer`` every load is stable: the step is then
    a fraction of the load itself. A load at or past the capacity with
    infinite buffers has no room: the step is 0 (the load is refused when run).
    """
    lam = load_at(parameter, value, n_servers)
    room = lam if buffer is not None else min(lam, capacity - lam)
    return RELATIVE_STEP * max(room, 0.0) / _load_slope(parameter, value, n_servers)


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


def sensitivity(
    policy,
    load: float | None = None,
    n_servers: int | None = None,
    n_dispatchers: int = 1,
    *,
    parameter: str | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    h: float | None = None,
    richardson: bool = True,
    run=None,
    bounds=None,
    progress: bool = False,
    pool: int = 0,
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
        parameter: what to differentiate in (:data:`PARAMETERS`); ``load``,
            ``alpha`` and ``beta`` must be the one given of them; ``speed``,
            ``share`` (of pool ``pool``), ``scv`` and ``amplitude`` are taken at
            the model's value, each side its own run on the same seed and stream.
        pool: the pool whose ``speed`` or ``share`` moves (a share moves whole
            servers from or to the next pool).
        h: the step in the parameter (default :func:`default_step`, or
            :func:`~jaxqueue.studies.crn.sensitivity_sides.system_default_step`).
        richardson: also run ``h / 2`` (twice the replicas' work): the
            ``half_step``, ``extrapolated`` and ``gap`` estimates, and a
            :class:`CurvatureWarning` where they disagree.
        run, bounds, progress, **options: the keywords of :func:`jaxqueue.simulate`
            (``replicas``, ``steps``, ``seed``, ``d``, ``levels``, ...); the
            sides share the level bounds (sized at the largest load) and the
            run lengths; ``warmup="auto"`` is refused (its extensions would
            part the sides' windows).

    Returns:
        a :class:`Sensitivity`.

    Warns:
        CurvatureWarning: where ``D(h)`` and ``D(h / 2)`` disagree.
    """
    if pool != 0 and parameter not in ("speed", "share"):
        raise ValueError(f"pool={pool!r} is for parameter='speed' or 'share' only")
    keywords = dict(parameter=parameter, alpha=alpha, beta=beta, h=h, richardson=richardson)
    sides, samples, (parameter, value, h, values) = _run_sides(
        policy, load, n_servers, n_dispatchers, keywords, run, bounds, progress, pool, options
    )
    out = _derivatives(samples, values, richardson)
    curved = _curved(out.get("gap", {}))
    settings = dict(sides[0].settings, parameter=parameter, value=value, h=h)
    if parameter in ("speed", "share"):
        settings["pool"] = pool
    for name in curved:
        warnings.warn(_curvature_message(name, out, parameter, h), CurvatureWarning, stacklevel=2)
    return Sensitivity(
        parameter,
        value,
        float(h),
        out["derivatives"],
        out.get("half_step", {}),
        out.get("extrapolated", {}),
        out.get("gap", {}),
        curved,
        values,
        tuple(sides),
        settings,
    )


def _run_sides(
    policy, load, n_servers, n_dispatchers, keywords, run, bounds, progress, pool, options
):
    """Every side's result and per-replica samples, and (parameter, value, h, values)."""
    if keywords["parameter"] not in SYSTEM_PARAMETERS:
        p, parameter, value, h, values = plan_sides(
            policy, load, n_servers, n_dispatchers, run=run, bounds=bounds, **keywords, **options
        )
        r = Run.start(p).advance(progress=progress)
        sides = r.results()
        names = scalar_names(sides[0], p)
        samples = [side_samples(r, j, names) for j in range(len(p.loads))]
        return sides, samples, (parameter, value, h, values)
    s = plan_system_sides_of(
        policy,
        load,
        n_servers,
        n_dispatchers,
        run=run,
        bounds=bounds,
        pool=pool,
        **keywords,
        **options,
    )
    runs = [Run.start(p).advance(progress=progress) for p in s.plans]
    sides = [r.results()[0] for r in runs]
    names = scalar_names(sides[0], s.plans[0])
    samples = [side_samples(r, 0, names) for r in runs]
    return sides, samples, (s.parameter, s.value, s.h, s.values)


def plan_system_sides_of(
    policy,
    load: float | None = None,
    n_servers: int | None = None,
    n_dispatchers: int = 1,
    *,
    parameter: str,
    alpha: float | None = None,
    beta: float | None = None,
    h: float | None = None,
    richardson: bool = True,
    pool: int = 0,
    run=None,
    bounds=None,
    **options,
):
    """The runs of :func:`sensitivity` in a parameter of the system (arguments
    as there), checked, nothing compiled: one plan per side, all at one load
    on one seed and one stream
    (:class:`~jaxqueue.studies.crn.sensitivity_sides.SystemSides`)."""
    model, opts, bound = split_keywords(
        policy, n_servers, n_dispatchers, options, run, bounds, where="sensitivity"
    )
    name, at = _parameter(None, load, alpha, beta)
    n = check_int("n_servers", model.n_servers, 2 if name != "load" else 1, MAX_SERVERS)
    _no_auto_warmup(opts)
    lam = float(np.float32(load_at(name, at, n)))
    return plan_system_sides(model, lam, opts, bound, parameter, h, richardson, pool)


def _no_auto_warmup(opts) -> None:
    if opts.warmup == "auto":
        raise ValueError(
            "warmup='auto' is not available for a sensitivity: its extensions would give "
            "the sides windows of their own; give warmup (steps) or warmup_time"
        )


class Sides(NamedTuple):
    """A sensitivity's run (:func:`plan_sides`)."""

    plan: Plan  # the sides as the loads of one batch, all on one stream
    parameter: str
    value: float
    h: float
    values: tuple  # the parameter at each side's (float32) load: -h, +h[, -h/2, +h/2]


def plan_sides(
    policy,
    load: float | None = None,
    n_servers: int | None = None,
    n_dispatchers: int = 1,
    *,
    parameter: str | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    h: float | None = None,
    richardson: bool = True,
    run=None,
    bounds=None,
    **options,
) -> Sides:
    """The run of :func:`sensitivity` (arguments as there), checked, nothing compiled:
    the sides as the loads of one plan whose replicas ``i`` share a key."""
    model, opts, bound = split_keywords(
        policy, n_servers, n_dispatchers, options, run, bounds, where="sensitivity"
    )
    parameter, value = _parameter(parameter, load, alpha, beta)
    n = check_int("n_servers", model.n_servers, 2 if parameter != "load" else 1, MAX_SERVERS)
    _no_auto_warmup(opts)
    if h is None:
        cap = capacity_of(model)
        # a load past the boundary: the load's own error, not that of a step of 0
        check_load(load_at(parameter, value, n), model.buffer, cap)
        # a law fitted to mean 1 has 1 / mean within rounding of 1: the step of capacity 1
        room_to = 1.0 if math.isclose(cap, 1.0, rel_tol=1e-12) else cap
        h = default_step(parameter, value, n, model.buffer, room_to)
    if isinstance(h, bool) or not (isinstance(h, (int, float)) and math.isfinite(h) and h > 0):
        raise ValueError(f"h={h!r} is out of range: need a finite step > 0")
    steps = (-h, h, -h / 2, h / 2) if richardson else (-h, h)
    # the simulator runs at float32 loads: the differences divide by the values run
    loads = [float(np.float32(load_at(parameter, value + s, n))) for s in steps]
    p = planner.plan_model(model, loads, opts, bound, streams=[_STREAM] * len(loads))
    values = tuple(_value_of(parameter, lam, n) for lam in loads)
    return Sides(p, parameter, value, float(h), values)


def _parameter(parameter, load, alpha, beta) -> tuple[str, float]:
    """The parameter and its value from the one given of ``load``, ``alpha``, ``beta``."""
    given = {k: v for k, v in (("load", load), ("alpha", alpha), ("beta", beta)) if v is not None}
    if len(given) != 1:
        raise TypeError(
            "sensitivity() takes one of load, alpha and beta, got "
            + (", ".join(given) if given else "none")
        )
    ((name, value),) = given.items()
    if np.ndim(value) != 0:
        raise TypeError(f"sensitivity() takes one value of {name}, got {value!r}")
    if parameter is None:
        parameter = name
    if parameter not in PARAMETERS:
        raise ValueError(
            f"parameter={parameter!r} is not valid: use one of {', '.join(PARAMETERS)}"
        )
    if parameter in SYSTEM_PARAMETERS:
        raise ValueError(
            f"parameter={parameter!r} changes the compiled system: its sides are runs of "
            "their own (plan_system_sides_of), not the loads of one plan"
        )
    if parameter != name:
        raise ValueError(f"parameter={parameter!r} needs {parameter}=..., got {name}=...")
    return parameter, float(value)


def scalar_names(result, p) -> tuple:
    """The scalar metrics a side reports (not None), its quantiles and user metrics."""
    names = [k for k in SCALAR_METRICS if getattr(result, k, None) is not None]
    if result.response_quantiles:
        names += list(QUANTILE_NAMES)
    for m in p.metrics:
        names += [m.name, m.name + PER_ARRIVAL]
    return tuple(names)


def side_samples(r: Run, j: int, names: tuple):
    """Side ``j``'s per-replica values of each metric, and per batch (batch means) or None."""
    whole, per = load_samples(r, j)
    if per is None:
        return _scalars(whole, names), None
    # (R, B) laid out batch by batch: the order in which the batch means sum them
    return _scalars(whole, names), {
        k: np.asfortranarray(v) for k, v in _scalars(per, names).items()
    }


def _scalars(samples: dict, names: tuple) -> dict:
    """``{name: (S,)}`` (or ``(R, B)``) of the scalar metrics ``names`` from :func:`metric_samples`."""
    out = {}
    for name in names:
        if name in QUANTILE_NAMES:
            out[name] = samples["response_quantiles"][..., QUANTILE_NAMES.index(name)]
        else:
            out[name] = np.asarray(samples[name], np.float64)
    return out


def paired_estimates(combine, samples: list, interval_batches: bool) -> dict:
    """``{name: Estimate}`` of ``combine(side values...)`` per replica (or per batch:
    then the Estimate's ``n`` counts the batch means and its ``replicas`` the replicas)."""
    out = {}
    for name in samples[0][0]:
        whole = combine(*(s[0][name] for s in samples))
        if interval_batches:
            per = combine(*(s[1][name] for s in samples))
            est = batch_means(whole, per)[0]
            out[name] = dataclasses.replace(est, replicas=_replicas(whole))
        else:
            out[name] = estimate(whole)
    return out


def _replicas(whole) -> int | np.ndarray:
    """The replicas with a value (an int, or per entry where they differ)."""
    count = np.sum(np.isfinite(np.asarray(whole, np.float64)), axis=0)
    if np.ndim(count) == 0 or np.all(count == count.flat[0]):
        return int(np.ravel(count)[0])
    return np.asarray(count)


def _derivatives(samples: list, values: tuple, richardson: bool) -> dict:
    """The central differences at ``h`` (and ``h / 2``, extrapolated, their gap)."""
    batched = samples[0][1] is not None
    wide = values[1] - values[0]

    def at_h(lo, hi, *_):
        return (hi - lo) / wide

    out = {"derivatives": paired_estimates(at_h, samples, batched)}
    if not richardson:
        return out
    narrow = values[3] - values[2]

    def at_half(lo, hi, lo2, hi2):
        return (hi2 - lo2) / narrow

    def extrapolated(lo, hi, lo2, hi2):
        return (4.0 * at_half(lo, hi, lo2, hi2) - at_h(lo, hi)) / 3.0

    def gap(lo, hi, lo2, hi2):
        return at_h(lo, hi) - at_half(lo, hi, lo2, hi2)

    out["half_step"] = paired_estimates(at_half, samples, batched)
    out["extrapolated"] = paired_estimates(extrapolated, samples, batched)
    out["gap"] = paired_estimates(gap, samples, batched)
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
