"""The sides of a study on common random numbers: systems planned to run on one
stream, so that replica ``i`` of every side has the same key and the sides take
the same random words step by step (docs/crn.md).

Every study of this folder is built from them. A sensitivity's sides are the
loads of one batch (in the load, ``alpha`` or ``beta``) or runs of their own (in
a parameter of the compiled system: a pool's speed or share, the service law's
SCV, a rate profile's amplitude); a paired comparison's sides are its points,
one batch per model; design on the simulated system iterates sensitivities and
checks the load found on independent streams; a grid's derivative and
difference rows read its batches' sides the same way. :meth:`Sides.run` runs
them, and :func:`combine` makes paired estimates of any function of the sides'
per-replica values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from jaxqueue.core.arrivals import Profile, as_arrivals
from jaxqueue.core.config import Model
from jaxqueue.core.service import Pool, as_law, capacity, fit_two_moments, realized_pools
from jaxqueue.core.system import check_load
from jaxqueue.core.user_metrics import PER_ARRIVAL
from jaxqueue.results.estimates import estimate
from jaxqueue.results.schema import QUANTILE_NAMES, SCALAR_METRICS
from jaxqueue.results.simulation import batch_means
from jaxqueue.runs import planner
from jaxqueue.sim.collect import load_samples
from jaxqueue.sim.runner import Plan, Run

__all__ = [
    "STREAM",
    "LOAD_PARAMETERS",
    "SYSTEM_PARAMETERS",
    "PARAMETERS",
    "RELATIVE_STEP",
    "Step",
    "Group",
    "Outcome",
    "Sides",
    "scalar_names",
    "side_samples",
    "combine",
    "refuse_auto_warmup",
    "check_step",
    "load_at",
    "value_at",
    "default_step",
    "system_value",
    "system_default_step",
    "side_model",
    "capacity_of",
    "plan_load_sides",
    "plan_system_sides",
]

#: The stream word every side draws from by default: replica ``i`` of each side has the same key.
STREAM = 0

#: The parameters whose sides are the loads of one batch: the load ``lambda``,
#: ``alpha`` of ``lambda = 1 - N**(-alpha)`` (Liu and Ying) and ``beta`` of
#: ``lambda = 1 - beta / sqrt(N)`` (Halfin-Whitt, Mukherjee et al.).
LOAD_PARAMETERS = ("load", "alpha", "beta")

#: Parameters that change the compiled System, each side its own run: ``speed``
#: and ``share`` of a server pool, ``scv`` of the service law (the two-moment
#: fit, :func:`~jaxqueue.core.service.fit_two_moments`), ``amplitude`` of a rate
#: profile (``1 + a (shape - 1)``: ``a = 1`` is the profile as given).
SYSTEM_PARAMETERS = ("speed", "share", "scv", "amplitude")

#: Every parameter a sensitivity is taken in.
PARAMETERS = LOAD_PARAMETERS + SYSTEM_PARAMETERS

#: The default step: the load moves by this fraction of its distance to the
#: nearer of 0 and the servers' capacity (with a finite buffer, of the load
#: itself); ``speed``, ``scv`` and ``amplitude`` by this fraction of their value.
RELATIVE_STEP = 0.05


def check_step(h) -> float:
    """``h`` as a float, or a ValueError unless it is a finite number > 0."""
    if isinstance(h, bool) or not (isinstance(h, (int, float)) and math.isfinite(h) and h > 0):
        raise ValueError(f"h={h!r} is out of range: need a finite step > 0")
    return float(h)


def _field(default, doc: str):
    return dataclasses.field(default=default, metadata={"doc": doc})


@dataclasses.dataclass(frozen=True)
class Step:
    """What a sensitivity differentiates in, and how far its sides lie: checked
    where it is made. :func:`jaxqueue.sensitivity` takes one as ``step=``, or
    its fields as keywords."""

    parameter: str | None = _field(
        None,
        "what to differentiate in (PARAMETERS): load, alpha or beta (the one given of "
        "them, the default), or speed, share (of pool ``pool``), scv or amplitude, taken "
        "at the model's value, each side its own run on the same seed and stream.",
    )
    h: float | None = _field(
        None, "the step in the parameter (default: default_step, or system_default_step)."
    )
    richardson: bool = _field(
        True,
        "also run h / 2 (twice the replicas' work): the half_step, extrapolated and gap "
        "estimates, and a CurvatureWarning where they disagree.",
    )
    pool: int = _field(
        0,
        "the pool whose speed or share moves (a share moves whole servers from or to the "
        "next pool).",
    )

    def __post_init__(self):
        if self.parameter is not None and self.parameter not in PARAMETERS:
            raise ValueError(
                f"parameter={self.parameter!r} is not valid: use one of {', '.join(PARAMETERS)}"
            )
        if self.h is not None:
            check_step(self.h)
        if not isinstance(self.richardson, bool):
            raise ValueError(f"richardson={self.richardson!r} is not valid: give True or False")
        if self.pool != 0 and self.parameter not in ("speed", "share"):
            raise ValueError(f"pool={self.pool!r} is for parameter='speed' or 'share' only")

    def offsets(self, h: float) -> tuple:
        """The sides' offsets from the value: ``-h, +h`` (and ``-h / 2, +h / 2``)."""
        return (-h, h, -h / 2, h / 2) if self.richardson else (-h, h)


class Group(NamedTuple):
    """Sides that run as the loads of one compiled plan."""

    plan: Plan  # the sides' loads as one batch
    points: tuple  # the sides' positions among all


class Outcome(NamedTuple):
    """What the sides' runs give, by side (:meth:`Sides.run`)."""

    results: list  # each side's SimulationResult
    samples: list  # each side's (per replica, per batch or None) values (side_samples)


class Sides(NamedTuple):
    """A study's sides, planned and checked, nothing compiled.

    ``groups`` are the compiled plans, each with the positions of the sides it
    runs. A sensitivity also holds its ``parameter``, the ``value`` it is taken
    at, the step ``h`` and the parameter at each side (``values``: ``-h, +h``
    and, with the Richardson check, ``-h / 2, +h / 2``).
    """

    groups: tuple
    parameter: str | None = None
    value: float | None = None
    h: float | None = None
    values: tuple = ()

    @property
    def plans(self) -> tuple:
        return tuple(g.plan for g in self.groups)

    def run(self, progress: bool = False, names: tuple | None = None) -> Outcome:
        """Run every group; each side's result and its per-replica values of
        ``names`` (default: every scalar the group's first side reports)."""
        count = sum(len(g.points) for g in self.groups)
        results, samples = [None] * count, [None] * count
        for group in self.groups:
            r = Run.start(group.plan).advance(progress=progress)
            found = r.results()
            keys = names or scalar_names(found[0], group.plan)
            for j, k in enumerate(group.points):
                samples[k], results[k] = side_samples(r, j, keys), found[j]
        return Outcome(results, samples)


def scalar_names(result, p: Plan) -> tuple:
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
    """``{name: (S,)}`` (or ``(R, B)``) of the scalar metrics ``names``."""
    out = {}
    for name in names:
        if name in QUANTILE_NAMES:
            out[name] = samples["response_quantiles"][..., QUANTILE_NAMES.index(name)]
        else:
            out[name] = np.asarray(samples[name], np.float64)
    return out


def combine(fn, samples: list, interval_batches: bool) -> dict:
    """``{name: Estimate}`` of ``fn(side values...)`` per replica (or per batch:
    then the Estimate's ``n`` counts the batch means and its ``replicas`` the replicas)."""
    out = {}
    for name in samples[0][0]:
        whole = fn(*(s[0][name] for s in samples))
        if interval_batches:
            per = fn(*(s[1][name] for s in samples))
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


def refuse_auto_warmup(opts, study: str, parts: str = "sides") -> None:
    """``warmup="auto"`` parts the sides: its extensions would give each a window of its own."""
    if opts.warmup == "auto":
        raise ValueError(
            f"warmup='auto' is not available for {study}: its extensions would give "
            f"the {parts} windows of their own; give warmup (steps) or warmup_time"
        )


# --- the load's parameters: the sides are the loads of one batch ------------------


def load_at(parameter: str, value: float, n_servers: int) -> float:
    """The load ``lambda`` at ``value`` of ``parameter`` (:data:`LOAD_PARAMETERS`)."""
    if parameter == "load":
        return float(value)
    if parameter == "alpha":
        return 1.0 - n_servers ** (-float(value))
    if parameter == "beta":
        return 1.0 - float(value) / math.sqrt(n_servers)
    raise ValueError(
        f"parameter={parameter!r} is not valid: use one of {', '.join(LOAD_PARAMETERS)}"
    )


def value_at(parameter: str, load: float, n_servers: int) -> float:
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


def plan_load_sides(model: Model, opts, bound, value: float, step: Step) -> Sides:
    """The sides ``value -+ h`` (and ``-+ h / 2``) of ``step.parameter``, a
    parameter of the load, as the loads of one plan, all on :data:`STREAM`."""
    n, parameter, h = model.n_servers, step.parameter, step.h
    if h is None:
        cap = capacity_of(model)
        # a load past the boundary: the load's own error, not that of a step of 0
        check_load(load_at(parameter, value, n), model.buffer, cap)
        # a law fitted to mean 1 has 1 / mean within rounding of 1: the step of capacity 1
        room_to = 1.0 if math.isclose(cap, 1.0, rel_tol=1e-12) else cap
        h = default_step(parameter, value, n, model.buffer, room_to)
    h = check_step(h)
    # the simulator runs at float32 loads: the differences divide by the values run
    loads = [float(np.float32(load_at(parameter, value + s, n))) for s in step.offsets(h)]
    p = planner.plan_model(model, loads, opts, bound, streams=[STREAM] * len(loads))
    values = tuple(value_at(parameter, lam, n) for lam in loads)
    return Sides((Group(p, tuple(range(len(loads)))),), parameter, value, h, values)


# --- the system's parameters: each side its own run ---------------------------------


def _pools(model: Model, pool: int) -> tuple:
    pools = realized_pools(model.pools, model.n_servers, warn=False)
    if pools is None:
        raise ValueError("a sensitivity in a pool's speed or share needs pools (pools=...)")
    if isinstance(pool, bool) or not isinstance(pool, int) or not 0 <= pool < len(pools):
        raise ValueError(f"pool={pool!r} is out of range: need an int 0 <= pool < {len(pools)}")
    return pools


def _profile(model: Model) -> Profile:
    prof = as_arrivals(model.arrivals)
    if not isinstance(prof, Profile):
        raise ValueError(
            "a sensitivity in the amplitude needs a rate profile (arrivals=Profile or a "
            "CSV time,rate file)"
        )
    return prof


def _not_a_system_parameter(parameter: str) -> ValueError:
    return ValueError(
        f"parameter={parameter!r} is not valid: use one of {', '.join(SYSTEM_PARAMETERS)}"
    )


def system_value(model: Model, parameter: str, pool: int = 0) -> float:
    """The parameter's value ``theta`` in ``model``: the pool's speed or share
    (its servers over ``N``), the law's SCV (1 for exponential service), 1 for
    the amplitude of the profile as given."""
    if parameter == "speed":
        return float(_pools(model, pool)[pool].speed)
    if parameter == "share":
        return _pools(model, pool)[pool].count / model.n_servers
    if parameter == "scv":
        law = as_law(model.service)
        return 1.0 if law is None else float(law.scv)
    if parameter == "amplitude":
        _profile(model)
        return 1.0
    raise _not_a_system_parameter(parameter)


def system_default_step(
    model: Model, parameter: str, value: float, richardson: bool = True
) -> float:
    """The default ``h``: :data:`RELATIVE_STEP` of the value, or for ``share``
    the fewest whole servers (``2 / N`` with the half step, else ``1 / N``)."""
    if parameter == "share":
        return (2.0 if richardson else 1.0) / model.n_servers
    return RELATIVE_STEP * value


def _moved_share(model: Model, value: float, pool: int) -> tuple:
    """The pools with whole servers moved between ``pool`` and the next, cyclically."""
    pools = list(_pools(model, pool))
    if len(pools) < 2:
        raise ValueError("a sensitivity in a pool's share needs two pools or more")
    move = round(value * model.n_servers) - pools[pool].count
    other = (pool + 1) % len(pools)
    for i, delta in ((pool, move), (other, -move)):
        if pools[i].count + delta < 1:
            raise ValueError(
                f"share={value:.6g} leaves pool {i} without servers: give a smaller h "
                "(1 / n_servers with richardson=False)"
            )
        pools[i] = Pool(pools[i].count + delta, pools[i].speed, pools[i].law)
    return tuple(pools)


def side_model(model: Model, parameter: str, value: float, pool: int = 0) -> Model:
    """``model`` with the parameter at ``value`` (a share moves whole servers
    between pool ``pool`` and the next pool, cyclically)."""
    if parameter == "speed":
        pools = list(_pools(model, pool))
        pools[pool] = dataclasses.replace(pools[pool], speed=float(value))
        return model.replace(pools=tuple(pools))
    if parameter == "share":
        return model.replace(pools=_moved_share(model, value, pool))
    if parameter == "scv":
        law = as_law(model.service)
        mean = 1.0 if law is None else float(law.mean)
        return model.replace(service=fit_two_moments(mean, value))
    if parameter == "amplitude":
        prof = _profile(model)
        shape = prof.shape
        rates = 1.0 + value * (shape - 1.0)
        if np.any(rates < 0):
            raise ValueError(
                f"amplitude={value:.6g} gives a negative rate: need amplitude <= "
                f"{1.0 / (1.0 - shape.min()):.6g} (give a smaller h)"
            )
        label = f"{prof.label}*{value:g}"
        return model.replace(arrivals=Profile(prof.times, tuple(rates) + (None,), label))
    raise _not_a_system_parameter(parameter)


def capacity_of(model: Model) -> float:
    """The servers' capacity in ``model``: tasks per server per unit time with every
    server busy (:func:`~jaxqueue.core.service.capacity` of its realized pools and
    law), the stability boundary of the load with infinite buffers."""
    pools = realized_pools(model.pools, model.n_servers, warn=False)
    return capacity(as_law(model.service), pools, model.n_servers)


def _check_stable(model: Model, models: list, load: float, parameter: str, values: list) -> None:
    """``load`` stable in ``model`` and on every side: below the servers' capacity
    with infinite buffers (a slower pool, or a server moved to one, lowers it)."""
    check_load(load, model.buffer, capacity_of(model))
    for m, v in zip(models, values):
        if m.buffer is not None:
            continue
        cap = capacity_of(m)
        if load >= cap:
            raise ValueError(
                f"the side at {parameter}={v:.6g} has a capacity of {cap:.6g} tasks per server "
                f"per unit time, not above load={load:.6g}: it is unstable with infinite "
                "buffers; give a smaller h (or a finite buffer)"
            )


def plan_system_sides(model: Model, load: float, opts, bound, step: Step) -> Sides:
    """One plan per side at ``theta -+ h`` (and ``-+ h / 2``) of ``step.parameter``,
    a parameter of the system, all at ``load`` on :data:`STREAM`: replica ``i``
    of every side has the same key. Without ``levels`` the sides share the
    largest side's level bound."""
    parameter, h, pool = step.parameter, step.h, step.pool
    value = system_value(model, parameter, pool)
    if h is None:
        h = check_step(system_default_step(model, parameter, value, step.richardson))
    offsets = step.offsets(h)
    if parameter == "share":
        servers = [s * model.n_servers for s in offsets]
        if any(abs(x - round(x)) > 1e-9 for x in servers):
            raise ValueError(
                f"h={h!r} is not valid for a share: h (and h / 2) must move whole servers, "
                f"multiples of 1 / n_servers = {1.0 / model.n_servers:.6g}"
            )
    models = [side_model(model, parameter, value + s, pool) for s in offsets]
    _check_stable(model, models, load, parameter, [value + s for s in offsets])
    plans = [planner.plan_model(m, [load], opts, bound, streams=[STREAM]) for m in models]
    if bound.levels is None:
        top = max(p.system.levels for p in plans)
        bound = dataclasses.replace(bound, levels=top)
        if model.buffer is None and any(p.system.levels != top for p in plans):
            plans = [planner.plan_model(m, [load], opts, bound, streams=[STREAM]) for m in models]
    values = tuple(value + s for s in offsets)
    if parameter == "share":
        values = tuple(round(v * model.n_servers) / model.n_servers for v in values)
    groups = tuple(Group(p, (k,)) for k, p in enumerate(plans))
    return Sides(groups, parameter, value, float(h), values)
