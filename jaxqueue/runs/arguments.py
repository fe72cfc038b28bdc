"""The checks of a run's arguments: sizes and buffers per load, run lengths in steps,
the service law and pools, the interval and the stream words (:mod:`jaxqueue.runs.planner`
puts them together). A ``ValueError`` names the parameter and its valid range."""

from __future__ import annotations

import math

import jax
import numpy as np

from jaxqueue.core.rng import BLOCK
from jaxqueue.core.service import PhaseType, as_law, make_pools
from jaxqueue.core.system import (
    DEFAULT_WARMUP_TIME,
    MAX_SERVERS,
    MAX_STEPS,
    System,
    as_int,
    check_int,
)
from jaxqueue.core.user_metrics import MetricState, evaluate, evaluation_error, user_metrics
from jaxqueue.policies.base import MAX_PROBES, Policy
from jaxqueue.results.schema import METRICS, QUANTILE_NAMES
from jaxqueue.sim.runner import BATCH_MEANS_REPLICAS

__all__ = [
    "DEFAULT_STEPS",
    "run_steps",
    "each_load",
    "load_sizes",
    "load_buffers",
    "size_key",
    "check_sized",
    "sized_lengths",
    "per_load",
    "service_law",
    "server_pools",
    "check_interval",
    "check_streams",
    "check_metrics",
    "RESERVED_METRIC_NAMES",
]

#: Measured steps per replica when neither ``steps`` nor ``time`` is given.
DEFAULT_STEPS = 1_000_000


def run_steps(
    name: str, steps, time_name: str, units, per_unit: float, default: int, *, least: int = 1
) -> int:
    """A run length in steps: ``steps`` as given, or ``ceil(units * per_unit)``
    (``units`` in time units, ``per_unit`` the uniformized steps per time unit
    at the largest load), or ``default``; both given is an error."""
    if units is None:
        return default if steps is None else steps
    if steps is not None:
        raise ValueError(
            f"give {name} or {time_name}, not both ({name}={steps!r}, {time_name}={units!r})"
        )
    bad = isinstance(units, bool) or not isinstance(units, (int, float, np.integer, np.floating))
    if bad or not math.isfinite(units) or units < 0 or (least and units <= 0):
        need = "> 0" if least else ">= 0"
        raise ValueError(
            f"{time_name}={units!r} is out of range: need a finite number {need} (time units)"
        )
    n = int(math.ceil(float(units) * per_unit))
    if n > MAX_STEPS:
        raise ValueError(
            f"{time_name}={units:g} is {n} steps per replica ({per_unit:g} a time "
            f"unit), out of range: need at most {MAX_STEPS}; run more replicas"
        )
    return max(n, least)


def each_load(name: str, value, n_loads: int, noun: str = "values") -> list | None:
    """``value`` as one entry per load when it is a sequence (a list, tuple or
    array; NumPy integers as Python ints), else None."""
    if not isinstance(value, (list, tuple, np.ndarray)):
        return None
    values = [as_int(v) for v in np.asarray(value, dtype=object).ravel()]
    if len(values) != n_loads:
        raise ValueError(
            f"{name} gives {len(values)} {noun} for {n_loads} loads: give one "
            f"per load, or a single {name}"
        )
    return values


def load_sizes(n_servers, n_dispatchers, n_loads: int) -> list[tuple[int, int]] | None:
    """``(N, M)`` of each load when ``n_servers`` or ``n_dispatchers`` is a
    sequence (one value per load; a single value applies to every load), else None."""
    servers = each_load("n_servers", n_servers, n_loads)
    dispatchers = each_load("n_dispatchers", n_dispatchers, n_loads)
    if servers is None and dispatchers is None:
        return None
    sizes = []
    for n, m in zip(servers or [n_servers] * n_loads, dispatchers or [n_dispatchers] * n_loads):
        n = check_int("n_servers", n, 1, MAX_SERVERS)
        sizes.append((n, check_int("n_dispatchers", m, 1, n)))
    return sizes


def load_buffers(buffer, n_loads: int) -> tuple[int | None, list[int] | None]:
    """``(buffer, buffers)``: the System's buffer (the largest), and one per
    load where ``buffer`` is a sequence (all finite: an infinite buffer and a
    finite one count their overflows otherwise), else None."""
    each = each_load("buffer", buffer, n_loads, "buffers")
    if each is None:
        return as_int(buffer), None
    if any(b is None for b in each):
        raise ValueError(
            "buffer per load: give finite buffers only (an infinite buffer and a "
            "finite one run as programs of their own)"
        )
    each = [check_int("buffer", b, 1, 10**6) for b in each]
    return max(each), each


def size_key(pol: Policy, n: int, m: int, buffer, bare: System) -> tuple | None:
    """What loads of other ``N`` and ``M`` must share to step in one compiled
    program, or None where the size fixes the program. The step reads ``N``
    and ``M`` as numbers for the exchangeable policies (the per-server lists
    hold N servers) with exponential servers and Poisson arrivals (``bare``:
    the servers' laws and the arrivals); one dispatcher and several have other
    states, and ``d = N`` is JSQ's exhaustive search, another draw. Past
    ``MAX_PROBES`` probes the draw reads a table built for its own ``N`` and
    ``M`` (docs/policies.md), so those sizes run alone: a batched point would
    draw by the formula instead, which differs from the table in rare draws."""
    if pol.per_server or bare.classes or bare.arrivals is not None:
        return None
    system = System(n, m, buffer, buffer or 1, 1 if m > 1 else 0)
    draws = tuple(pol.draws(system)) + tuple(pol.join_draws(system))
    alone = (n, m) if any(getattr(dr, "d", 1) > MAX_PROBES for dr in draws) else ()
    return (m == 1, tuple(pol.draws(system)), tuple(pol.join_draws(system)), *alone)


def check_sized(pol, sizes, bare: System, buffer) -> None:
    """Refuse loads of other sizes that cannot share a program (:func:`size_key`)."""
    keys = {size_key(pol, n, m, buffer, bare) for n, m, *_ in sizes}
    why = None
    if pol.per_server:
        why = f"{pol.label()} keeps per-server lists, whose shapes are N"
    elif None in keys:
        why = "phase-type service, server pools and arrival sources fix their shapes by N"
    elif len({k[0] for k in keys}) > 1:
        why = "one dispatcher and several have other states"
    elif len(keys) > 1:
        why = (
            f"{pol.label()} draws differently at these sizes (d = N is JSQ's exhaustive "
            f"search; past {MAX_PROBES} probes the draw reads a table of each N's counts)"
        )
    if why is not None:
        raise ValueError(
            f"n_servers, n_dispatchers or buffer per load: {why}; run each size "
            "on its own (one n_servers, n_dispatchers and buffer)"
        )


def sized_lengths(sizes, loads, bare: System, steps, time, warmup, warmup_time):
    """Run lengths per load for loads of other sizes: ``time`` and
    ``warmup_time`` (and the default warm-up) in time units at each load's own
    ``N`` and load, as ``(steps, time, warmup, warmup_time)`` for :func:`plan`."""
    rates = [size[0] * bare.step_rate(lam) for size, lam in zip(sizes, loads)]
    if time is not None and steps is None:
        steps = [run_steps("steps", None, "time", time, r, DEFAULT_STEPS) for r in rates]
        time = None
    if warmup is None:
        units = DEFAULT_WARMUP_TIME if warmup_time is None else warmup_time
        warmup = [run_steps("warmup", None, "warmup_time", units, r, 0, least=0) for r in rates]
        warmup_time = None
    return steps, time, warmup, warmup_time


def per_load(name: str, value, n_loads: int, least: int, units) -> list[int] | None:
    """``value`` as one run length per load when it is a sequence, else None
    (a single value, checked later); a sequence with a run length in time
    units is an error."""
    values = each_load(name, value, n_loads, "run lengths")
    if values is None:
        return None
    if units is not None:
        raise ValueError(f"give {name} (one per load) or a time in units, not both")
    return [check_int(name, v, least, MAX_STEPS) for v in values]


def service_law(service, pol) -> PhaseType | None:
    """The service law of a run (``None``: exponential), checked against the policy."""
    law = as_law(service)
    if law is None or law.is_unit_exponential:
        return None
    if pol.per_server:
        raise ValueError(
            f"service={law.label!r}: phase-type service covers the exchangeable policies "
            f"(random, jsq, pod, i1f, jiq, jiq-pod, jiq-sq, idle-first), not {pol.label()}, "
            "which steps on per-server lists; use service=None"
        )
    return law


def server_pools(pools, n: int, pol) -> tuple | None:
    """The pools of a run (``None``: identical servers); see :func:`make_pools`."""
    if pools is not None and pol.per_server:
        raise ValueError(
            f"pools cover the exchangeable policies, not {pol.label()}, which steps on "
            "per-server lists; use pools=None"
        )
    return make_pools(pools, n)


def check_interval(interval: str, batches: int, replicas: int, shortest: int) -> str:
    """The interval of a run (``"replicas"`` or ``"batch-means"``): ``interval``
    checked against ``batches`` and ``replicas``, ``shortest`` the fewest
    measured blocks of a load; ``"auto"`` resolved."""
    if interval not in ("auto", "replicas", "batch-means"):
        raise ValueError(
            f"interval={interval!r} is not valid: use 'auto', 'replicas' or 'batch-means'"
        )
    check_int("batches", batches, 1, 10**4)
    n_batches = min(batches, shortest)
    if interval == "batch-means" and n_batches < 2 and replicas >= 2:
        # asked for by name: not replaced by replica intervals in silence
        why = (
            f"batches={batches}"
            if batches < 2
            else f"steps={shortest * BLOCK} is one block of {BLOCK} steps"
        )
        raise ValueError(
            f"interval='batch-means' needs at least 2 batches, and {why}: pass "
            f"2 <= batches <= 10000 with steps >= {2 * BLOCK}, or interval='replicas' "
            "(or 'auto') for intervals across the replicas"
        )
    if interval == "auto":
        interval = "batch-means" if replicas <= BATCH_MEANS_REPLICAS else "replicas"
    if interval == "batch-means" and n_batches < 2:
        if replicas < 2 and batches < 2:
            raise ValueError(
                f"batches={batches} is out of range for one replica: intervals from batch "
                f"means need 2 <= batches <= 10000 (or at least 2 replicas)"
            )
        if replicas < 2:
            raise ValueError(
                f"steps={shortest * BLOCK} is one block of {BLOCK} steps: an interval needs at "
                f"least 2 batches (steps >= {2 * BLOCK}) or at least 2 replicas"
            )
        interval = "replicas"
    return interval


def check_streams(streams, n_loads: int) -> tuple | None:
    """One stream word per load (grid points), as a tuple of ints, or None."""
    if streams is None:
        return None
    streams = tuple(int(w) for w in streams)
    if len(streams) != n_loads or any(not 0 <= w < 2**32 for w in streams):
        raise ValueError(
            f"streams must give one word in [0, 2**32) per load: {n_loads} loads, "
            f"got {len(streams)} words"
        )
    return streams


#: Names a user metric may not take: the built-in metrics and a result's row settings.
_SIZE_NAMES = ("n_servers", "n_dispatchers", "ratio", "load")
_ROW_NAMES = ("response_quantile", "settings", "diagnostics", "source", "policy", "buffer")
RESERVED_METRIC_NAMES = METRICS + QUANTILE_NAMES + _ROW_NAMES + _SIZE_NAMES


def check_metrics(metrics, pol: Policy, backend: str, system: System | None = None) -> tuple:
    """The user metrics of a run (:func:`~jaxqueue.core.user_metrics.user_metrics`),
    checked before anything compiles: names, expressions, that ``iq`` is read only
    where the policy has I-queues, that each gives a scalar (traced abstractly), and
    that the backend evaluates them (the engine, ``"xla"``, does; the register layout
    does not). The abstract trace needs the sized ``system`` (skipped without)."""
    found = user_metrics(metrics, reserved=RESERVED_METRIC_NAMES)
    if not found:
        return ()
    if backend in ("registers", "pallas"):
        raise ValueError(
            f"metrics= needs backend 'xla' or 'auto', not {backend!r}: the register layout "
            "steps a fixed set of sums and does not evaluate user metrics"
        )
    for m in found:
        if m.uses_iq and not pol.uses_iqueues:
            raise ValueError(
                f"metric {m.name!r} reads iq, but {pol.label()} has no I-queues: "
                "it may read s, q, N, M and load"
            )
    if system is None:
        return found
    width = system.levels + 1
    iq = np.zeros(system.iqueue_levels + 1 if pol.uses_iqueues else 1, np.float32)
    vec, one = np.zeros(width, np.float32), np.float32(1)
    state = MetricState(vec, vec, one, one, one, iq if pol.uses_iqueues else None)
    for m in found:  # each alone: the error names its metric
        try:
            jax.eval_shape(lambda st, m=m: evaluate((m,), st), state)
        except Exception as err:  # an expression's or a function's own error
            reads = iq.size if pol.uses_iqueues else None
            raise ValueError(evaluation_error(m, err, system.levels, reads)) from err
    return found
