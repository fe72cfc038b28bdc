"""The sides of a sensitivity in a parameter of the compiled system: a pool's
speed or share, the service law's SCV, a rate profile's amplitude. Each side
is its own model and run on the same stream (docs/crn.md).
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
from jaxqueue.runs import planner

__all__ = [
    "SYSTEM_PARAMETERS",
    "SystemSides",
    "system_value",
    "system_default_step",
    "side_model",
    "plan_system_sides",
    "capacity_of",
]

#: Parameters that change the compiled System: ``speed`` and ``share`` of a
#: server pool, ``scv`` of the service law (the two-moment fit,
#: :func:`~jaxqueue.core.service.fit_two_moments`), ``amplitude`` of a rate
#: profile (``1 + a (shape - 1)``: ``a = 1`` is the profile as given).
SYSTEM_PARAMETERS = ("speed", "share", "scv", "amplitude")

#: The default step of ``speed``, ``scv`` and ``amplitude``: this fraction of the value.
RELATIVE_STEP = 0.05

#: The stream word every side draws from: replica ``i`` of each side has the same key.
STREAM = 0


class SystemSides(NamedTuple):
    """A sensitivity's runs in a parameter of the system (:func:`plan_system_sides`)."""

    plans: tuple  # one Plan per side, all on one stream and one seed
    parameter: str
    value: float
    h: float
    values: tuple  # the parameter at each side: -h, +h[, -h/2, +h/2]


def _pools(model: Model, pool: int) -> tuple:
    pools = realized_pools(model.pools, model.n_servers, warn=False)
    if pools is None:
        raise ValueError("a sensitivity in a pool's speed or share needs pools (pools=...)")
    if isinstance(pool, bool) or not isinstance(pool, int) or not 0 <= pool < len(pools):
        raise ValueError(f"pool={pool!r} is out of range: need an int 0 <= pool < {len(pools)}")
    return pools


def _scv(model: Model) -> float:
    law = as_law(model.service)
    return 1.0 if law is None else float(law.scv)


def _profile(model: Model) -> Profile:
    prof = as_arrivals(model.arrivals)
    if not isinstance(prof, Profile):
        raise ValueError(
            "a sensitivity in the amplitude needs a rate profile (arrivals=Profile or a "
            "CSV time,rate file)"
        )
    return prof


def system_value(model: Model, parameter: str, pool: int = 0) -> float:
    """The parameter's value ``theta`` in ``model``: the pool's speed or share
    (its servers over ``N``), the law's SCV (1 for exponential service), 1 for
    the amplitude of the profile as given."""
    if parameter == "speed":
        return float(_pools(model, pool)[pool].speed)
    if parameter == "share":
        return _pools(model, pool)[pool].count / model.n_servers
    if parameter == "scv":
        return _scv(model)
    if parameter == "amplitude":
        _profile(model)
        return 1.0
    raise ValueError(
        f"parameter={parameter!r} is not valid: use one of {', '.join(SYSTEM_PARAMETERS)}"
    )


def system_default_step(
    model: Model, parameter: str, value: float, richardson: bool = True
) -> float:
    """The default ``h``: :data:`RELATIVE_STEP` of the value, or for ``share``
    the fewest whole servers (``2 / N`` with the half step, else ``1 / N``)."""
    if parameter == "share":
        return (2.0 if richardson else 1.0) / model.n_servers
    return RELATIVE_STEP * value


def side_model(model: Model, parameter: str, value: float, pool: int = 0) -> Model:
    """``model`` with the parameter at ``value`` (a share moves whole servers
    between pool ``pool`` and the next pool, cyclically)."""
    if parameter == "speed":
        pools = list(_pools(model, pool))
        pools[pool] = dataclasses.replace(pools[pool], speed=float(value))
        return model.replace(pools=tuple(pools))
    if parameter == "share":
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
        return model.replace(pools=tuple(pools))
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
    raise ValueError(
        f"parameter={parameter!r} is not valid: use one of {', '.join(SYSTEM_PARAMETERS)}"
    )


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


def plan_system_sides(
    model: Model,
    load: float,
    opts,
    bound,
    parameter: str,
    h: float | None = None,
    richardson: bool = True,
    pool: int = 0,
) -> SystemSides:
    """One plan per side at ``theta -+ h`` (and ``-+ h / 2``), all at ``load``
    with one seed and one stream: replica ``i`` of every side has the same key.
    Without ``levels`` the sides share the largest side's level bound."""
    value = system_value(model, parameter, pool)
    if parameter in ("speed", "share"):  # the rounding of fractions to servers, named once
        realized_pools(model.pools, model.n_servers, stacklevel=3)
    if h is None:
        h = system_default_step(model, parameter, value, richardson)
    if isinstance(h, bool) or not (isinstance(h, (int, float)) and math.isfinite(h) and h > 0):
        raise ValueError(f"h={h!r} is out of range: need a finite step > 0")
    steps = (-h, h, -h / 2, h / 2) if richardson else (-h, h)
    if parameter == "share":
        servers = [s * model.n_servers for s in steps]
        if any(abs(x - round(x)) > 1e-9 for x in servers):
            raise ValueError(
                f"h={h!r} is not valid for a share: h (and h / 2) must move whole servers, "
                f"multiples of 1 / n_servers = {1.0 / model.n_servers:.6g}"
            )
    models = [side_model(model, parameter, value + s, pool) for s in steps]
    _check_stable(model, models, load, parameter, [value + s for s in steps])
    plans = [planner.plan_model(m, [load], opts, bound, streams=[STREAM]) for m in models]
    if bound.levels is None:
        top = max(p.system.levels for p in plans)
        bound = dataclasses.replace(bound, levels=top)
        if model.buffer is None and any(p.system.levels != top for p in plans):
            plans = [planner.plan_model(m, [load], opts, bound, streams=[STREAM]) for m in models]
    values = tuple(value + s for s in steps)
    if parameter == "share":
        values = tuple(round(v * model.n_servers) / model.n_servers for v in values)
    return SystemSides(tuple(plans), parameter, value, float(h), values)
