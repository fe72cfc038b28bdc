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
    DEFAULT_REPLICAS,
    Bounds,
    Model,
    RunOptions,
    split_keywords,
    unexpected_keyword,
)
from jaxqueue.policies.base import Policy
from jaxqueue.results.simulation import SimulationResult
from jaxqueue.results.sweep import SweepResult
from jaxqueue.results.warmup import WarmupWarning, failure_message
from jaxqueue.runs import planner
from jaxqueue.sim import runner

__all__ = ["simulate", "sweep"]


def simulate(
    policy: str | Policy | Model,
    load: float | Sequence[float],
    n_servers: int | Sequence[int] | None = None,
    n_dispatchers: int | Sequence[int] = 1,
    *,
    run: RunOptions | None = None,
    bounds: Bounds | None = None,
    d: int | None = None,
    z: int | None = None,
    order: str | None = None,
    buffer: int | None = None,
    replicas: int = DEFAULT_REPLICAS,
    steps: int | None = None,
    warmup: int | str | None = None,
    seed: int = 0,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    init="auto",
    on_overflow: str = "raise",
    progress: bool = False,
    devices: Sequence | None = None,
    interval: str = "auto",
    batches: int = runner.BATCHES,
    checkpoint: str | None = None,
    checkpoint_every: float = 300.0,
    backend: str = "auto",
    service=None,
    pools=None,
    arrivals=None,
    time: float | None = None,
    warmup_time: float | None = None,
    metrics=None,
    **unknown,
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
            keywords (``replicas`` to ``on_overflow``; a keyword given beside
            it, other than at its default, is an error).
        bounds: a :class:`~jaxqueue.core.config.Bounds` instead of ``levels``
            and ``iqueue_levels`` (likewise).
        n_servers: ``N``, or one per load (a list): loads of other sizes
            then step in one compiled program (exchangeable policies with
            exponential servers and Poisson arrivals; all with one dispatcher
            or all with several), each with its own ``N``; ``time``,
            ``warmup_time`` and the default warm-up are then converted at
            each load's own ``N`` and load.
        n_dispatchers: ``M`` (``r = N / M``), or one per load.
        d, z: policy options (probes, threshold), where the policy takes them
            (default: the policy's own, ``d = 2`` and ``z = 1``; for
            ``jiq-original`` ``d = 1`` and ``z = 0``); an option the policy
            does not take is an error.
        order: ``jiq-original``'s pick order, ``"random"`` (default) or
            ``"fifo"``; an error for any other policy.
        buffer: places per server ``b``, or None for infinite buffers; or one
            finite buffer per load (a list): each replica blocks at its own,
            and each result has its own levels (as ``n_servers`` per load).
        replicas: replicas per load.
        steps: measured uniformized steps per replica (rounded up to whole
            blocks of 256; the result records the steps run). Default:
            ``time`` if given, else 1,000,000 (whatever ``N``: about 526
            time units at ``N = 1000``, ``lambda = 0.9``, but 5 at ``N = 10^5``).
            One per load (a list): each load measures its own window, the
            batch stepping to the longest (a load's result is the one it
            gets alone).
        time: the measured window in time units (mean service times) instead
            of ``steps``: ``steps = ceil(time * N * rate)``, ``rate`` the
            uniformized steps per server per time unit at the largest load
            (``lambda + 1`` for exponential service; the peak rate of a
            profile or an MMPP). Smaller loads step at the same count, so
            their windows are a little longer; each result's
            ``settings["time_measured"]`` records its own. Rounded up to
            whole blocks like ``steps``: a
            :class:`~jaxqueue.runs.planner.WindowWarning` when that simulates
            more than 10% beyond ``time`` at the largest load.
        warmup_time: the warm-up in time units instead of ``warmup`` (same
            conversion; not with ``warmup="auto"``).
        warmup: discarded uniformized steps per replica before measuring
            (one per load, a list, as ``steps``);
            default: 100 units of time at the largest load (see
            docs/simulation.md on the bias of a short warm-up). ``"auto"``
            starts with the default and, while the warm-up diagnostic of the
            measured window fails (:mod:`jaxqueue.results.warmup`), turns
            the window into warm-up and measures a new one, at most
            :data:`~jaxqueue.sim.runner.MAX_EXTENSIONS` times; the result's
            ``diagnostics["warmup"]`` says how many and whether it passed.
        seed: the run's integer seed; replica ``i`` of load ``j`` uses the
            stream of global replica ``j * replicas + i``. Runs meant as
            independent trials need different seeds.
        levels: the largest tracked queue length (infinite buffers); default
            from the mean-field tail of the largest load.
        iqueue_levels: largest tracked I-queue size (JIQ family, ``M > 1``).
        init: ``"auto"`` (default: the mean-field state where the policy
            has a mean field and ``N >= 100``, else empty), ``"empty"``,
            ``"mean-field"`` or an occupancy array. The mean-field state sets
            the queue lengths and, for the JIQ family with several
            dispatchers, the I-queue sizes (and JIQ-Original's stale listings,
            JIQ-Threshold's listed servers; with a service law or pools, the
            class of each server). Where the mean field cannot be solved
            (JIQ-Threshold with ``z >= 2`` at larger ratios, pools at a load
            their mean field does not cover), ``"auto"`` starts empty with a
            :class:`jaxqueue.StartWarning`.
        on_overflow: ``"raise"`` (default) fails the run with advice if a
            queue or I-queue passes its bound; ``"report"`` returns the
            result with the ``overflow`` counts in its diagnostics.
        progress: print progress at chunk boundaries to stderr.
        devices: devices to spread replicas over (default: all of the default
            backend's devices).
        interval: how the 95% intervals are made: ``"replicas"`` (across
            replicas), ``"batch-means"`` (from each replica's ``batches``
            batch means; see :func:`jaxqueue.results.simulation.batch_means`)
            or ``"auto"`` (default: batch means with at most
            :data:`~jaxqueue.sim.runner.BATCH_MEANS_REPLICAS` replicas).
        batches: batches of the measured window (default 20; fewer when the
            window has fewer blocks of 256 steps); they also feed the warm-up
            diagnostic.
        checkpoint: a file to save the run to, every ``checkpoint_every``
            seconds (0: at every chunk) and at its end. If it exists and was
            written by a run with the same settings, the run resumes from it
            (bit for bit the result of an uninterrupted run); if its settings
            or version differ, :class:`~jaxqueue.sim.runner.CheckpointMismatch`.
        checkpoint_every: seconds of running between checkpoints.
        backend: what steps the replicas (:data:`~jaxqueue.sim.runner.BACKENDS`):
            ``"auto"`` (default: the Pallas kernel on a GPU where it covers
            the run and its step fits in registers, at most
            :data:`~jaxqueue.sim.kernel.AUTO_MAX_VALUES` values a replica;
            else ``"xla"``), ``"xla"`` (the vmapped engine),
            ``"pallas"`` (the kernel; interpreted, slowly, off a GPU, for
            checking) or ``"registers"`` (the kernel's layout in plain XLA).
            Every backend gives bit-identical results; one that does not
            cover the run (the per-server policies, more than 8 probes or
            128 levels) warns (:class:`jaxqueue.BackendWarning`)
            and runs on ``"xla"``. The result's settings record the backend used.
        metrics: user-defined metrics, ``{name: expression or function}``: each a
            JAX function of a :class:`~jaxqueue.core.user_metrics.MetricState`
            (``fn(state) -> scalar``) or an expression over its fields
            (``"sum(s[1:])"``, :mod:`jaxqueue.core.expressions`). The result's
            ``user_metrics`` hold each one's time average (``name``) and its
            average over accepted arrivals (``name_per_arrival``), with intervals
            like the built-in ones; ``settings["metrics"]`` records them
            (docs/metrics.md). Runs on ``"xla"``.
        service: the service law: ``None`` (exponential, mean 1), a
            :class:`~jaxqueue.core.service.PhaseType` (:mod:`jaxqueue.core.service`
            builds Erlang, hyperexponential and two-moment fits) or its
            command-line form (``"erlang:3"``, ``"hyperexp:4"``, ``"fit:0.5"``,
            ``"ph:FILE.json"``). Covers the exchangeable policies (not
            ``jiq-original``, ``jiq-threshold``); runs on ``"xla"``. The mean
            response time and the quantiles then come from where each
            arrival found its server (queue length, pool and phase;
            docs/simulation.md).
        pools: heterogeneous servers: ``(fraction, speed)`` pairs (or the
            command-line form ``"0.2:2,0.8:1"``, or
            :class:`~jaxqueue.core.service.Pool` objects with their own laws);
            the fractions of ``N`` are rounded to whole servers. A server of
            speed ``v`` serves at ``v`` times the law's rates; the policies see
            queue lengths only. Stability needs ``load`` below the capacity
            ``sum_i fraction_i speed_i / mean_i``. The result then also has
            the metrics by pool (``pool_arrival_share``, ``pool_utilization``,
            ``pool_mean_queue_length``, ``pool_mean_response_time``,
            ``pool_waiting_probability``, ``pool_occupancy``,
            ``pool_response_quantiles``; docs/simulation.md).
        arrivals: ``None`` (Poisson arrivals at rate ``load * N``), a file
            (a CSV rate profile ``time,rate``, a CSV trace ``time[,service]``,
            whose service column is not simulated, only recorded as
            ``mean_service``, or an MMPP JSON file) or a :class:`~jaxqueue.core.arrivals.Profile`,
            :class:`~jaxqueue.core.arrivals.MMPP` or
            :class:`~jaxqueue.core.arrivals.Trace`; its rates are scaled so
            that the mean arrival rate is ``load * N`` (``load`` is the mean
            load; a profile's peak may pass the capacity). A trace run
            needs identical exponential servers. Runs on ``"xla"``.

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
    _refuse("simulate", unknown)
    loads = [load] if np.ndim(load) == 0 else list(load)
    results = _run(policy, loads, n_servers, n_dispatchers, _keywords(locals()), "simulate")
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


#: :func:`simulate`'s keyword defaults: a keyword at its default is not "given"
#: (it defers to ``run=`` or ``bounds=``, or to a Model's field).
_DEFAULTS = {
    name: par.default
    for name, par in inspect.signature(simulate).parameters.items()
    if par.kind is inspect.Parameter.KEYWORD_ONLY
}

#: The keywords that are not options of the run or the model: given to the runner.
_RUNNER_KEYS = ("progress", "checkpoint", "checkpoint_every")


def _keywords(names: dict) -> dict:
    """The keyword-only arguments of :func:`simulate` from its ``locals()``."""
    return {k: names[k] for k in _DEFAULTS}


def _refuse(where: str, unknown: dict) -> None:
    """An unknown keyword's TypeError, naming the closest keyword there is."""
    for name in unknown:
        raise unexpected_keyword(where, name, _DEFAULTS)


def _run(policy, loads, n_servers, n_dispatchers, keywords: dict, where: str) -> SweepResult:
    """Plan and run a sweep (the keywords: :func:`_keywords`)."""
    options = {k: v for k, v in keywords.items() if k not in ("run", "bounds") + _RUNNER_KEYS}
    model, run_options, bound = split_keywords(
        policy,
        n_servers,
        n_dispatchers,
        _given(**options),
        keywords["run"],
        keywords["bounds"],
        where=where,
    )
    p = planner.plan_model(model, loads, run_options, bound)
    return SweepResult(runner.run(p, **{k: keywords[k] for k in _RUNNER_KEYS}))


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


def _given(**values) -> dict:
    """The keywords whose value is not their default."""

    def at_default(value, default) -> bool:
        return value is default or (
            type(value) is type(default)
            and isinstance(value, (int, float, str))
            and value == default
        )

    return {k: v for k, v in values.items() if not at_default(v, _DEFAULTS[k])}
