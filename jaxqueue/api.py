"""The Python API for simulation: :func:`simulate` one load or several
(:func:`sweep`, its earlier name for several, is deprecated).

Arguments: the policy, the load (or loads), the size (``n_servers``,
``n_dispatchers``), then keyword-only options; or a
:class:`~jaxqueue.core.config.Model` with ``run=`` and ``bounds=``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence

import numpy as np

from jaxqueue.core.config import (
    BOUND_KEYS,
    MODEL_OPTIONS,
    RUN_KEYS,
    Bounds,
    Model,
    RunOptions,
    split_keywords,
    takes_options,
)
from jaxqueue.policies.base import Policy
from jaxqueue.results.simulation import SimulationResult
from jaxqueue.results.sweep import SweepResult
from jaxqueue.results.warmup import WarmupWarning, failure_message
from jaxqueue.runs import planner
from jaxqueue.sim import runner

__all__ = ["simulate", "sweep"]


@takes_options(*MODEL_OPTIONS, *RUN_KEYS, *BOUND_KEYS)
def simulate(
    policy: str | Policy | Model,
    load: float | Sequence[float],
    n_servers: int | Sequence[int] | None = None,
    n_dispatchers: int | Sequence[int] = 1,
    *,
    run: RunOptions | None = None,
    bounds: Bounds | None = None,
    progress: bool = False,
    checkpoint: str | None = None,
    checkpoint_every: float = 300.0,
    **options,
) -> SimulationResult | SweepResult:
    """Simulate one policy at one load, or at several loads in one compiled batch.

    ``replicas`` independent replicas run at each load; all replicas of all
    loads step together. Every argument is checked before anything compiles.

    Args:
        policy: a name from :func:`jaxqueue.available` or a Policy; or a
            :class:`~jaxqueue.core.config.Model`, which then holds
            ``n_servers``, ``n_dispatchers``, ``d``, ``z``, ``order``,
            ``buffer``, ``service``, ``pools`` and ``arrivals`` (giving one
            of them beside it is an error).
        load: the value of ``lambda`` (> 0; < 1 for infinite buffers), or a
            sequence of them (a list, a tuple, a 1-d array): the result is then
            a :class:`~jaxqueue.results.sweep.SweepResult`, one result per load.
        run: a :class:`~jaxqueue.core.config.RunOptions` instead of the run's
            keywords (``replicas`` to ``metrics``; one given beside it is an
            error).
        bounds: a :class:`~jaxqueue.core.config.Bounds` instead of ``levels``
            and ``iqueue_levels`` (likewise).
        n_servers: ``N``, or one per load (a list): loads of other sizes
            then step in one compiled program (exchangeable policies with
            exponential servers and Poisson arrivals; all with one dispatcher
            or all with several), each with its own ``N``; ``time``,
            ``warmup_time`` and the default warm-up are then converted at
            each load's own ``N`` and load.
        n_dispatchers: ``M`` (``r = N / M``), or one per load.
        progress: print progress at chunk boundaries to stderr.
        checkpoint: a file to save the run to, every ``checkpoint_every``
            seconds (0: at every chunk) and at its end. If it exists and was
            written by a run with the same settings, the run resumes from it
            (bit for bit the result of an uninterrupted run); if its settings
            or version differ, :class:`~jaxqueue.sim.runner.CheckpointMismatch`.
        checkpoint_every: seconds of running between checkpoints.
        <options>

    Returns:
        A :class:`~jaxqueue.results.simulation.SimulationResult` for one load;
        for a sequence of loads, one per load, in order, in a
        :class:`~jaxqueue.results.sweep.SweepResult` (a list that also gives
        all loads as one frame).

    Warns:
        :class:`jaxqueue.WarmupWarning`: once per load whose warm-up
        diagnostic failed (:mod:`jaxqueue.results.warmup`), naming the load,
        with advice.

    Examples:
        >>> res = simulate("pod", 0.8, 100, d=2, replicas=8, steps=100_000)
        >>> res.mean_response_time.mean  # doctest: +SKIP
        1.59...
        >>> sweep = simulate("pod", [0.5, 0.8], 100, d=2, replicas=8, steps=100_000)
        >>> [r.mean_response_time.mean for r in sweep]  # doctest: +SKIP
        [1.16..., 1.59...]
    """
    loads = [load] if np.ndim(load) == 0 else list(load)
    runner_options = dict(
        progress=progress, checkpoint=checkpoint, checkpoint_every=checkpoint_every
    )
    results = _run(policy, loads, n_servers, n_dispatchers, options, run, bounds, runner_options)
    _warn_failed_warmups(results)
    return results[0] if np.ndim(load) == 0 else results


def sweep(policy, loads, n_servers=None, n_dispatchers=1, **options) -> SweepResult:
    """Deprecated: use :func:`simulate` with a list of loads, which returns
    the same :class:`~jaxqueue.results.sweep.SweepResult` (arguments as there:
    this calls it).

    Warns:
        DeprecationWarning: always; :class:`jaxqueue.WarmupWarning` as :func:`simulate`.
    """
    warnings.warn(
        "jaxqueue.sweep is deprecated: use jq.simulate with a list of loads "
        "(the same arguments and SweepResult)",
        DeprecationWarning,
        stacklevel=2,
    )
    return simulate(policy, list(loads), n_servers, n_dispatchers, **options)


# The one signature, shown for the deprecated name too (``help(jq.sweep)``).
sweep.__signature__ = inspect.signature(simulate).replace(
    parameters=[
        p.replace(name="loads") if p.name == "load" else p
        for p in inspect.signature(simulate).parameters.values()
    ],
    return_annotation=SweepResult,
)


def _run(policy, loads, n_servers, n_dispatchers, options, run, bounds, runner_options):
    """Plan and run a sweep of ``loads`` (``options``: the model, run and bound
    fields given as keywords)."""
    model, run_options, bound = split_keywords(
        policy, n_servers, n_dispatchers, options, run, bounds, where="simulate"
    )
    p = planner.plan_model(model, loads, run_options, bound)
    return SweepResult(runner.run(p, **runner_options))


def _warn_failed_warmups(results) -> None:
    """A :class:`~jaxqueue.results.warmup.WarmupWarning` per result whose warm-up
    diagnostic failed, pointed at the caller of the public function that called this."""
    for res in results:
        message = failure_message(
            res.diagnostics.get("warmup_diagnostic"),
            res.settings["load"],
            res.settings.get("n_servers"),
            init=res.settings.get("init"),
        )
        if message is not None:
            warnings.warn(WarmupWarning(message), stacklevel=3)
