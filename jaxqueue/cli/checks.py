"""What the command line checks and settles before it imports the simulator or the
theory (JAX, seconds): a number out of range answers at once.

:func:`prepare` resolves the settings two flags give (``--dispatchers`` and
``--ratio``) and checks each flag's range with the checks a run makes later
(:mod:`jaxqueue.core.system`, which imports no JAX), so a mistake says what the
run would have said, a second or more sooner. What needs a policy (``--d``, ``--z``,
the policy's name) or a model (a service law's or pools' capacity) is left to the
run; so is anything this module cannot judge alike.
"""

from __future__ import annotations

import math

from jaxqueue.core.system import (
    MAX_SEED,
    MAX_SERVERS,
    MAX_STEPS,
    check_distinct,
    check_int,
    check_load,
    dispatchers_for_ratio,
    halfin_whitt_load,
    heavy_traffic_load,
)

__all__ = ["prepare"]

#: The largest replicas, batches, buffer and levels a run takes (its planner's bounds).
_MAX_REPLICAS, _MAX_BATCHES, _MAX_BUFFER, _MAX_LEVELS = 10**8, 10**4, 10**6, 10**6


def prepare(args):
    """``args`` with ``dispatchers`` and ``ratio`` resolved (in place), after the
    checks of its command: a ``ValueError`` worded as the run's own check."""
    check = _CHECKS.get(args.command)
    if check is not None:
        check(args)
    return args


def _simulate(args) -> None:
    n = check_int("n_servers", args.servers, 1, MAX_SERVERS)
    if args.ratio is not None:  # --ratio R: M = N / R
        args.dispatchers = dispatchers_for_ratio(n, args.ratio)
    elif args.dispatchers is None:
        args.dispatchers = 1
    check_int("n_dispatchers", args.dispatchers, 1, n)
    if args.alpha is not None:
        heavy_traffic_load(n, args.alpha)
    elif args.beta is not None:
        halfin_whitt_load(n, args.beta)
    else:
        _loads(args, args.loads)
    _run(args)
    check_int("batches", args.batches, 1, _MAX_BATCHES)
    if args.levels is not None:
        check_int("levels", args.levels, 1, _MAX_LEVELS)


def _compare(args) -> None:
    if args.dispatchers is not None:  # --dispatchers M: r = N / M
        n = check_int("n_servers", args.servers, 1, MAX_SERVERS)
        args.ratio = n / check_int("n_dispatchers", args.dispatchers, 1, n)
    dispatchers_for_ratio(args.servers, args.ratio)
    check_distinct("loads", args.loads)
    _loads(args, args.loads)
    _run(args)


def _theory(args) -> None:
    if args.dispatchers is not None:  # --dispatchers M: r = N / M (1: one dispatcher)
        if args.dispatchers != 1 and args.servers is None:
            raise ValueError(
                f"--dispatchers {args.dispatchers} gives the ratio r = N / M with --servers N: "
                "give --servers, or the ratio itself (--ratio)"
            )
        if args.dispatchers != 1:
            n = check_int("n_servers", args.servers, 1, MAX_SERVERS)
            args.ratio = n / check_int("n_dispatchers", args.dispatchers, 1, n)
    if args.model != "erlang":  # (the M/M/N queue words its own range)
        _loads(args, [args.load])


def _exact(args) -> None:
    n = check_int("n_servers", args.servers, 1, MAX_SERVERS)
    check_int("n_dispatchers", args.dispatchers, 1, n)
    _loads(args, [args.load])


def _transient(args) -> None:
    n = check_int("n_servers", args.servers, 1, MAX_SERVERS)
    check_int("n_dispatchers", args.dispatchers, 1, n)
    _loads(args, [args.load])
    check_int("seed", args.seed, 0, MAX_SEED)


_CHECKS = {
    "simulate": _simulate,
    "compare": _compare,
    "theory": _theory,
    "exact": _exact,
    "transient": _transient,
}


def _loads(args, loads) -> None:
    """Each load: above 0 (and at most 1e6), and below 1 with infinite buffers where
    the servers' capacity is 1 (identical exponential servers, Poisson arrivals; the
    capacity of a service law or of pools is the run's to judge)."""
    plain = all(getattr(args, k, None) is None for k in ("service", "pools", "arrivals"))
    buffer = args.buffer if plain or args.buffer is not None else 1
    for load in loads:
        check_load(load, buffer)


def _run(args) -> None:
    """The run's replicas, seed, buffer and lengths (``simulate`` and ``compare``)."""
    check_int("replicas", args.replicas, 1, _MAX_REPLICAS)
    check_int("seed", args.seed, 0, MAX_SEED)
    if args.buffer is not None:
        check_int("buffer", args.buffer, 1, _MAX_BUFFER)
    if args.steps is not None:
        check_int("steps", args.steps, 1, MAX_STEPS)
    if args.warmup is not None and args.warmup != "auto":
        check_int("warmup", args.warmup, 0, MAX_STEPS)
    _time_units("time", args.time, least=True)
    _time_units("warmup_time", args.warmup_time, least=False)


def _time_units(name: str, units, least: bool) -> None:
    """A run length in time units: finite and > 0 (``least``), or >= 0; the words of
    :func:`jaxqueue.runs.arguments.run_steps`, which checks it again."""
    if units is None:
        return
    if not math.isfinite(units) or units < 0 or (least and units <= 0):
        need = "> 0" if least else ">= 0"
        raise ValueError(
            f"{name}={units!r} is out of range: need a finite number {need} (time units)"
        )
