"""Design on the simulated system: the largest load whose simulated mean response
time (or a quantile) meets a target at finite N, by stochastic Newton steps (optax)
on the common-random-number derivatives of a sensitivity's sides
(:mod:`jaxqueue.studies.crn.sides`), beside the mean field's answer (docs/design.md).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import optax

from jaxqueue.core.config import split_keywords
from jaxqueue.core.status import Status
from jaxqueue.core.system import check_int
from jaxqueue.policies.registry import make
from jaxqueue.results.display import StudyTable, optional_import
from jaxqueue.results.estimates import Estimate
from jaxqueue.runs import planner
from jaxqueue.sim.runner import Plan
from jaxqueue.studies.crn.sides import Group, Sides, Step, combine, plan_load_sides
from jaxqueue.theory import mean_field
from jaxqueue.theory.closed.design import max_load_for_target

__all__ = ["design_simulated", "SimulatedDesign", "mean_field_load"]

#: The largest step in ``logit(lambda)`` one iteration takes.
MAX_STEP = 1.0

#: Iterations at the largest replica count whose gap the run does not resolve, before stopping.
PATIENCE = 3


@dataclasses.dataclass(frozen=True, repr=False)
class SimulatedDesign(StudyTable):
    """The largest load whose simulated metric meets a target.

    Attributes:
        metric, target: what was designed for (``metric(lambda) <= target``).
        load: the load the iterations ended at, where the check ran.
        check: the metric at ``load`` from a check run on fresh random numbers.
        root: ``load - (check - target) / slope``, the load where the metric
            equals the target, with the 95% interval ``check.ci95 / slope``
            (first order in the check's error).
        slope: ``d metric / d lambda`` at ``load`` (the last iteration's).
        mean_field: the mean field's answer (None where it has none).
        steps: simulated steps used, all replicas and the check included.
        history: ``(load, value, slope, replicas)`` of each iteration.
        settings: the check run's settings.
    """

    metric: str
    target: float
    load: float
    check: Estimate
    root: Estimate
    slope: Estimate
    mean_field: float | None
    steps: int
    history: tuple
    settings: dict

    _HTML_COLUMNS = ("iteration", "load", "value", "slope", "replicas")

    def records(self) -> list[dict]:
        """One row per iteration: its ``load``, the metric there (``value``), its
        ``slope`` in the load and the ``replicas`` it ran, with the metric and the
        target."""
        return [
            {
                "iteration": k,
                "metric": self.metric,
                "target": self.target,
                "load": float(lam),
                "value": float(value),
                "slope": float(slope),
                "replicas": int(replicas),
            }
            for k, (lam, value, slope, replicas) in enumerate(self.history)
        ]

    def to_xarray(self):
        """An xarray Dataset over ``iteration`` (extra ``xarray``): the columns of
        :meth:`records` as variables; the answer (``root`` and its 95% half-width,
        the check's load and value, the mean field's load) as attributes."""
        xr = optional_import("xarray", "xarray")
        rows = self.records()
        columns = ("load", "value", "slope", "replicas")
        data = {c: ("iteration", [r[c] for r in rows]) for c in columns}
        ds = xr.Dataset(data, coords={"iteration": [r["iteration"] for r in rows]})
        ds.attrs.update(metric=self.metric, target=self.target, load=self.load)
        ds.attrs.update(root=float(self.root.mean), root_ci95=float(self.root.ci95))
        ds.attrs.update(check=float(self.check.mean), check_ci95=float(self.check.ci95))
        ds.attrs["mean_field"] = math.nan if self.mean_field is None else self.mean_field
        return ds

    def __str__(self) -> str:
        s = self.settings
        mf = "none" if self.mean_field is None else f"{self.mean_field:.4f}"
        return "\n".join(
            [
                f"largest load with {self.metric} <= {self.target:g}: {s['policy_label']}, "
                f"N = {s['n_servers']}",
                f"  simulated: {self.root:.4f} (check at {self.load:.4f}: "
                f"{self.check:.4g}; {len(self.history)} iterations, {self.steps:.3g} steps)",
                f"  mean field: {mf}",
            ]
        )

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        for k in ("check", "root", "slope"):
            out[k] = getattr(self, k).to_dict()
        out["history"] = [list(h) for h in self.history]
        out["settings"] = {k: v for k, v in self.settings.items() if k != "versions"}
        return out


def design_simulated(
    policy,
    target: float,
    n_servers: int | None = None,
    n_dispatchers: int = 1,
    *,
    metric: str = "mean_response_time",
    load: float | None = None,
    replicas: int = 16,
    max_replicas: int = 64,
    iterations: int = 12,
    seed: int = 0,
    progress: bool = False,
    **options,
) -> SimulatedDesign:
    """The largest load whose simulated ``metric`` stays at or under ``target``
    (a metric that grows with the load: the mean response time, a quantile ``"p99"``).

    Each iteration runs a sensitivity at the current load (the sides ``lambda -+ h``
    on common random numbers, fresh words each iteration): the metric there (the
    sides' mean) and its derivative. The step is Newton's on ``log metric = log
    target`` in ``theta = logit(lambda)`` (at most :data:`MAX_STEP`), applied by
    optax's SGD with gain 1 while the gap is beyond the run's 95% half-width; once
    the gap sinks into the noise the replicas double, up to ``max_replicas``, and
    there the gain falls as ``1 / (1 + j)`` over the unresolved iterations ``j`` (a
    Robbins-Monro root finder). It stops after :data:`PATIENCE` of those, or
    ``iterations``. A check run at the load found, on fresh words (the sides'
    count of independent batches of the last replica count: the same compiled
    shape), gives the metric there with its interval.

    Args:
        policy, n_servers, n_dispatchers: as :func:`jaxqueue.simulate` (or a Model).
        target: the metric's target (mean service times).
        metric: a scalar metric or quantile name (default the mean response time).
        load: the first load (default: the mean field's answer, else ``1 - 1/target``).
        replicas, max_replicas: the first and the largest replica counts.
        iterations: the most sensitivity runs.
        seed: iteration ``k`` runs with ``seed + k``, the check with ``seed + iterations``.
        progress, **options: the keywords of :func:`jaxqueue.sensitivity` (``steps``,
            ``warmup``, ``levels``, ``d``, ``h``, ...; ``richardson`` is off by default).

    Returns:
        a :class:`SimulatedDesign`.
    """
    step = Step("load", options.pop("h", None), options.pop("richardson", False))
    options.update(replicas=replicas, seed=seed)
    model, opts, bound = split_keywords(
        policy, n_servers, n_dispatchers, options, where="design_simulated"
    )
    if not (isinstance(target, (int, float)) and math.isfinite(target) and target > 0):
        raise ValueError(f"target={target!r} is out of range: need a finite value > 0")
    iterations = check_int("iterations", iterations, 1, 1000)
    max_replicas = check_int("max_replicas", max_replicas, 2, 2**20)
    replicas = check_int("replicas", replicas, 2, max_replicas)
    answer = mean_field_load(model, metric, float(target))
    lam = load if load is not None else answer if answer is not None else 1.0 - 1.0 / target
    if not 0.0 < lam < 1.0:
        raise ValueError(f"load={lam!r} is out of range: the design starts at 0 < load < 1")
    opt = optax.inject_hyperparams(optax.sgd)(learning_rate=1.0)
    theta = jnp.asarray(math.log(lam / (1.0 - lam)))
    state = opt.init(theta)
    r, unresolved, steps, history = replicas, 0, 0, []
    for k in range(iterations):
        run = opts.replace(replicas=r, seed=seed + k)
        it = _iterate(plan_load_sides(model, run, bound, lam, step), metric, progress)
        steps += it.steps
        history.append((lam, it.value.mean, it.slope.mean, r))
        if not (it.slope.mean > 0 and it.value.mean > 0):
            raise ValueError(
                f"{metric} does not grow with the load at {lam:.6g} (slope {it.slope:.4g}): "
                "give a first load nearer the answer, or more steps"
            )
        if abs(it.value.mean - target) <= it.value.ci95:  # within the noise: more replicas
            unresolved += r >= max_replicas
            r = min(2 * r, max_replicas)
        if unresolved >= PATIENCE:
            break
        state.hyperparams["learning_rate"] = 1.0 / (1.0 + unresolved)
        updates, state = opt.update(jnp.asarray(_newton(it, lam, target)), state)
        theta = optax.apply_updates(theta, updates)
        lam = float(1.0 / (1.0 + jnp.exp(-theta)))
    check = _check(model, lam, metric, it, opts.replace(seed=seed + iterations), bound)
    root = Estimate(
        lam - (check.value.mean - target) / it.slope.mean,
        check.value.ci95 / it.slope.mean,
        check.value.n,
    )
    return SimulatedDesign(
        metric,
        float(target),
        lam,
        check.value,
        root,
        it.slope,
        answer,
        steps + check.steps,
        tuple(history),
        check.settings,
    )


class _Iteration(NamedTuple):
    value: Estimate  # the metric at the load (the sides' mean), paired interval
    slope: Estimate  # its derivative in the load
    steps: int  # simulated steps, all replicas
    plan: Plan  # the run
    settings: dict  # its first side's settings


def _iterate(sides: Sides, metric: str, progress: bool) -> _Iteration:
    """A sensitivity's sides run: the metric there (their mean) and its derivative."""
    found, samples = sides.run(progress, names=(metric,))
    batched = samples[0][1] is not None
    wide = sides.values[1] - sides.values[0]
    value = combine(lambda a, b, *_: (a + b) / 2.0, samples, batched)[metric]
    slope = combine(lambda a, b, *_: (b - a) / wide, samples, batched)[metric]
    return _Iteration(value, slope, _steps(found), sides.plans[0], found[0].settings)


def _newton(it: _Iteration, lam: float, target: float) -> float:
    """Newton's step on ``log X = log target`` in ``logit(lambda)``, at most :data:`MAX_STEP`."""
    value, slope = it.value.mean, it.slope.mean
    step = (math.log(value) - math.log(target)) / (slope / value * lam * (1.0 - lam))
    return float(np.clip(step, -MAX_STEP, MAX_STEP))


def _check(model, lam, metric, last: _Iteration, opts, bound) -> _Iteration:
    """The metric at ``lam`` from independent batches of ``last``'s shape (fresh
    words): the sides of one load, each on a stream of its own."""
    p = last.plan
    if bound.levels is None:
        bound = bound.replace(levels=p.system.levels)
    count = len(p.loads)
    opts = opts.replace(replicas=p.replicas)
    check = planner.plan_model(model, [lam] * count, opts, bound, streams=range(count))
    found, samples = Sides((Group(check, tuple(range(count))),)).run(names=(metric,))
    batched = samples[0][1] is not None

    def pooled(*xs):
        return np.concatenate(xs, axis=0)

    value = combine(pooled, samples, batched)[metric]
    return _Iteration(value, last.slope, _steps(found), check, found[0].settings)


def _steps(results) -> int:
    """Simulated steps of a run's results: every replica's warm-up and window."""
    return sum(
        r.settings["replicas"] * (r.settings["steps"] + r.settings["warmup"]) for r in results
    )


def mean_field_load(model, metric: str, target: float) -> float | None:
    """The mean field's largest load with ``metric <= target``: the closed form's
    design (:func:`jaxqueue.theory.closed.design.max_load_for_target`) for the mean
    response time, else bisection on the mean field; None where it has none."""
    pol = make(model.policy, **model.options())
    ratio = model.n_servers / model.n_dispatchers if pol.uses_iqueues else None
    if metric == "mean_response_time":
        try:
            found = max_load_for_target(model.policy, target, ratio, d=model.d)
        except ValueError:  # no closed form: the generic mean field below
            found = None
        if found is not None:
            return found.load if found.status == Status.CONVERGED else None

    def value(lam: float) -> float:
        est = mean_field(model.policy, lam, ratio, d=model.d, z=model.z).metric(metric)
        return math.nan if est is None else float(est)

    lo, hi = 1e-6, 1.0 - 1e-9
    if not value(lo) <= target or not math.isfinite(value(lo)):
        return None
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if value(mid) <= target else (lo, mid)
    return lo
