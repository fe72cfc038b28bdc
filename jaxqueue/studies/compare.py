"""Simulation beside mean-field theory, one row per (policy, load)."""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections.abc import Sequence

import numpy as np

from jaxqueue.api import simulate
from jaxqueue.core.arrivals import Profile, as_arrivals
from jaxqueue.core.config import (
    COMPARE_TIME,
    COMPARE_WARMUP_TIME,
    MODEL_OPTIONS,
    RUN_KEYS,
    Model,
    RunOptions,
    check_options,
    takes_options,
)
from jaxqueue.core.progress import log, show_progress
from jaxqueue.core.service import pool_shares, realized_pools
from jaxqueue.core.system import check_distinct, dispatchers_for_ratio
from jaxqueue.core.user_metrics import at_fixed_point, user_metrics
from jaxqueue.policies.base import Policy
from jaxqueue.policies.registry import make, option_names
from jaxqueue.results.schema import Result
from jaxqueue.results.simulation import SimulationResult
from jaxqueue.results.warmup import WarmupWarning, failure_message
from jaxqueue.runs.arguments import RESERVED_METRIC_NAMES
from jaxqueue.runs.bounds import limit_ratio
from jaxqueue.theory import mean_field

__all__ = ["compare", "Comparison", "with_options", "run_lengths", "warmup_failed"]

#: The settings that place a user metric's fixed-point value: N, M and the load.
_POINT = ("n_servers", "n_dispatchers", "load")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One row: a simulated result and the mean field at the same point (None where none exists).

    Both are results of the one schema (:class:`~jaxqueue.results.schema.Result`).
    """

    simulation: SimulationResult
    mean_field: Result | None

    @property
    def policy_label(self) -> str:
        return self.simulation.settings["policy_label"]

    @property
    def load(self) -> float:
        return self.simulation.settings["load"]

    def z_score(self, metric: str = "mean_response_time"):
        """(simulated - mean field) / simulated 95% half-width (NaN without a
        mean field); ``metric`` is a name of :meth:`Result.metric` (``"p99"``;
        a pool metric gives an array, one per pool)."""
        est = self.simulation.metric(metric)
        if self.mean_field is None or est is None:
            return math.nan
        pred = self.mean_field.metric(metric)
        if pred is None:
            return math.nan
        with np.errstate(invalid="ignore", divide="ignore"):
            z = (np.asarray(est.mean) - np.asarray(pred)) / np.asarray(est.ci95)
        z = np.where(np.asarray(est.ci95) > 0, z, np.nan)
        return float(z) if z.ndim == 0 else z

    def to_dict(self) -> dict:
        s = self.simulation.settings
        keys = ("policy", "policy_label", "options", "n_servers", "n_dispatchers", "ratio", "load")
        return {
            **{k: s[k] for k in keys},
            "simulation": self.simulation.to_dict(),
            "mean_field": None if self.mean_field is None else self.mean_field.to_dict(),
        }


def with_options(name: str | Policy, d: int | None = None, z: int | None = None) -> Policy:
    """The policy ``name`` with ``d`` and ``z`` applied where it takes them.

    A comparison of several policies shares one ``d`` and one ``z`` (as the
    papers' figures do): each policy takes the options it has and keeps its
    default for those left None. This is the one place where an option is
    not an error for a policy that does not take it.
    """
    if isinstance(name, Policy):
        return name
    taken = option_names(name)
    opts = {k: v for k, v in (("d", d), ("z", z)) if k in taken}
    return make(name, **opts)


#: The run options :func:`compare` takes: a simulation's but ``time`` (its own
#: ``time_units``) and ``init`` (the mean-field state where there is one).
COMPARE_RUN_KEYS = tuple(k for k in RUN_KEYS if k not in ("time", "init"))


@takes_options(*(k for k in MODEL_OPTIONS if k != "order"), *COMPARE_RUN_KEYS)
def compare(
    policies: Sequence[str | Policy],
    n_servers: int = 1000,
    ratio: float = 10.0,
    loads: Sequence[float] = (0.5, 0.7, 0.9, 0.95, 0.98),
    *,
    time_units: float | None = None,
    progress: bool = False,
    **options,
) -> list[Comparison]:
    """Simulated metrics (95% CI) beside the mean-field values, one row per policy and load.

    Each policy runs all loads in one compiled batch, starting from the
    mean-field occupancy (empty for policies without a mean field), with
    ``warmup_time`` discarded and ``time_units`` measured (time units at the
    largest load; smaller loads get more; or ``warmup`` and ``steps`` in
    steps, as in :func:`jaxqueue.simulate`, see :func:`run_lengths`). A row
    whose warm-up diagnostic failed is a
    :class:`~jaxqueue.results.warmup.WarmupWarning` naming its policy and load
    (:func:`warmup_failed` tells the rows). ``mean_field`` is None where there
    is none (JIQ-Original and JIQ-Threshold where their solvers refuse the
    point, ``jsew`` with pools of other mean service times); the reason is a
    warning on the ``jaxqueue`` logger (shown on stderr where logging is not
    set up). What runs is said on that logger at INFO; ``progress`` shows it
    with each run's progress (:mod:`jaxqueue.core.progress`: a compiling
    phase, then rates that leave the compilation out).

    With ``arrivals`` a rate profile, each row's mean field is the periodic
    regime of :mod:`jaxqueue.theory.profiles.periodic` averaged over that row's own
    measured window (``settings["time_warmup"]`` to the end of
    ``settings["time_measured"]``), so a window holding part of a period is
    no bias; the simulation starts from the constant-load mean field at the
    mean load. An MMPP or a trace has no mean field (rows with None).

    Args:
        policies: policy names or Policies (``d`` and ``z`` apply to the
            names that take them, see :func:`with_options`, and must apply to
            one; a Policy keeps its own options). All are checked before
            anything runs.
        n_servers: ``N``; ``M = N / ratio``, a whole number (else an error).
        ratio: ``r = N / M``.
        loads: values of ``lambda`` (the mean loads under ``arrivals``).
        time_units: the measured window per replica in time units at the
            largest load (or ``steps``; neither: ``COMPARE_TIME``, 300).
        progress: each run's progress on stderr (:mod:`jaxqueue.core.progress`).
        <options>
            In a comparison: ``d`` and ``z`` apply to the policies given by
            name that take them (:func:`with_options`) and must apply to one.
            The simulation and :func:`jaxqueue.theory.mean_field` both get
            ``buffer``, ``service``, ``pools`` and ``arrivals``; pools given as
            fractions of ``N`` are rounded to whole servers once
            (:func:`~jaxqueue.core.service.realized_pools`) and both get the
            rounded pools (the fraction given is ``"nominal_fraction"``), with a
            :class:`~jaxqueue.core.service.PoolRoundingWarning` where the
            rounding moves a fraction. A user metric's mean-field value is the
            metric at the fixed point (docs/metrics.md). Neither ``warmup_time``
            nor ``warmup``: ``warmup_time`` of ``COMPARE_WARMUP_TIME``, 50
            (``warmup="auto"`` extends the default warm-up of 100 time units
            while the warm-up diagnostic fails).

    Returns:
        A list of :class:`Comparison` rows.
    """
    check_options("compare", options, compare)
    m = dispatchers_for_ratio(n_servers, ratio)
    check_distinct("loads", loads)
    run = RunOptions(**{k: v for k, v in options.items() if k in COMPARE_RUN_KEYS})
    lengths = run_lengths(run.steps, time_units, run.warmup, run.warmup_time)
    # every name checked before any run
    pols = _policies(policies, options.get("d"), options.get("z"))
    metrics = user_metrics(run.metrics, reserved=RESERVED_METRIC_NAMES)
    pools = options.get("pools")
    pools = pools if pools is None or isinstance(pools, str) else tuple(pools)
    nominal = pool_shares(pools)
    # the servers and their arrivals, shared by every policy (each policy's model is
    # this one with its policy)
    system = Model(
        None,
        n_servers,
        m,
        buffer=options.get("buffer"),
        service=options.get("service"),
        # the whole servers the simulator runs: the theory beside it is for these
        pools=realized_pools(pools, n_servers, stacklevel=2),
        # a file is read once, for the runs and the theory
        arrivals=as_arrivals(options.get("arrivals")),
    )
    source = system.arrivals
    if progress:
        show_progress()
    rows = []
    for pol in pols:
        limit = limit_ratio(pol, n_servers, m)  # None: one dispatcher's limit
        model = system.replace(policy=pol)
        theory = _mean_fields(model, loads, limit)
        has_mf = theory is not None
        log(f"simulating {pol.label()} at loads {list(loads)}")
        runs = run.replace(
            **lengths, init="mean-field" if has_mf else "empty", metrics=metrics or None
        )
        with warnings.catch_warnings():  # said below, with the policy's name
            warnings.filterwarnings("ignore", category=WarmupWarning)
            results = simulate(model, loads, run=runs, progress=progress)
        for res in results:
            _warn_failed_warmup(pol, res)
        if source is not None:  # the constant-load values were the start only
            theory = (
                [_periodic_theory(model, res, limit) for res in results]
                if has_mf and isinstance(source, Profile)
                else None
            )
        for mf in theory or ():
            _record_nominal(mf, nominal)
        if theory and metrics:  # each user metric at the fixed point
            theory = [
                at_fixed_point(mf, metrics, *(res.settings[k] for k in _POINT))
                for mf, res in zip(theory, results)
            ]
        rows += [Comparison(res, mf) for res, mf in zip(results, theory or [None] * len(results))]
    return rows


#: The options :func:`compare` takes as keywords (the command line passes its flags of
#: these names).
COMPARE_OPTIONS = compare.option_names


def run_lengths(steps=None, time_units=None, warmup=None, warmup_time=None) -> dict:
    """A comparison's window and warm-up as the ``steps``, ``time``, ``warmup``
    and ``warmup_time`` of a run: as given, and where neither of a pair is,
    ``COMPARE_TIME`` (300) or ``COMPARE_WARMUP_TIME`` (50) time units. Two of a
    pair given is the run's error (one or the other)."""
    if steps is None and time_units is None:
        time_units = COMPARE_TIME
    if warmup is None and warmup_time is None:
        warmup_time = COMPARE_WARMUP_TIME
    return {"steps": steps, "time": time_units, "warmup": warmup, "warmup_time": warmup_time}


def warmup_failed(res) -> bool:
    """Whether the warm-up diagnostic of the simulated result ``res`` failed."""
    verdict = (getattr(res, "diagnostics", None) or {}).get("warmup_diagnostic")
    return bool(verdict) and verdict.get("passed") is False


def _warn_failed_warmup(pol: Policy, res) -> None:
    """A :class:`~jaxqueue.results.warmup.WarmupWarning` where ``res``'s warm-up
    diagnostic failed, naming the policy among those compared, and advising only
    what :func:`compare` (and ``compare`` on the command line) takes: its start is
    the mean field wherever the policy has one, so no other start is advised."""
    if not warmup_failed(res):
        return
    text = failure_message(
        res.diagnostics.get("warmup_diagnostic"),
        res.settings["load"],
        res.settings.get("n_servers"),
        init="mean-field",
    )
    if text is None:
        return
    label = res.settings.get("policy_label") or pol.label()
    for verb in ("failed", "still fails"):
        text = text.replace(f"diagnostic {verb} at ", f"diagnostic {verb} for {label} at ", 1)
    # compare's keyword for the window in time units is time_units=
    text = text.replace("steps= or time=", "steps= or time_units=")
    warnings.warn(WarmupWarning(text), stacklevel=3)


def _policies(policies, d, z) -> list[Policy]:
    """The Policies of ``compare``'s names (with the shared ``d`` and ``z``), checked:
    at least one, and each shared option taken by some policy given by name."""
    pols = [with_options(name, d, z) for name in policies]
    if not pols:
        raise ValueError("policies is empty: give at least one policy")
    named = [name for name in policies if not isinstance(name, Policy)]
    for key, value in (("d", d), ("z", z)):
        if value is not None and not any(key in option_names(name) for name in named):
            raise ValueError(
                f"{key}={value} applies to the policies given by name that take {key}, and "
                f"none of {', '.join(named) or 'them'} does"
            )
    return pols


def _mean_fields(model: Model, loads, limit) -> list | None:
    """The mean field of ``model`` at each load (under arrivals from a file: the
    constant-load start, the periodic regime comes after the run), or None where there
    is none; why not is a warning on the logger."""
    pol, source, theory = model.policy, model.arrivals, None
    if pol.mean_field_kind() != "none":
        try:
            theory = [
                mean_field(pol, lam, limit, with_quantiles=source is None, **_servers(model))
                for lam in loads
            ]
        # a solver that refuses this point (JIQ-Threshold, z >= 2), or a
        # model the mean field does not cover (jsew with pools)
        except (RuntimeError, NotImplementedError) as err:
            log(f"no mean field for {pol.label()} here: {err}", logging.WARNING)
    if theory is not None and source is not None and not isinstance(source, Profile):
        log(
            f"no mean field for {pol.label()} under {source.kind} arrivals: "
            "the periodic mean field takes a rate profile",
            logging.WARNING,
        )
    return theory


def _servers(model: Model) -> dict:
    """The model's servers as the mean field takes them: buffer, service law, pools."""
    return dict(buffer=model.buffer, service=model.service, pools=model.pools)


def _record_nominal(mf: Result | None, nominal) -> None:
    """Each pool of ``mf``'s settings with the fraction given beside the one solved at."""
    if mf is None or nominal is None:
        return
    for entry, (fraction, _, _) in zip(mf.settings.get("pools") or (), nominal):
        entry["nominal_fraction"] = fraction


def _periodic_theory(model: Model, res, limit) -> Result | None:
    """The periodic mean field of ``res``'s load under ``model``'s rate profile averaged
    over its measured window, or None (the reason a warning on the logger) where there
    is none."""
    pol, lam = model.policy, res.settings["load"]
    window = (float(res.settings["time_warmup"]), float(res.settings["time_measured"]))
    log(
        f"periodic mean field of {pol.label()} at load {lam:g} over t in "
        f"[{window[0]:g}, {window[0] + window[1]:g}]"
    )
    try:
        return mean_field(
            pol, lam, limit, arrivals=model.arrivals, window=window, **_servers(model)
        )
    # the periodic regime was not found, or a setting its solver does not cover
    except (RuntimeError, NotImplementedError) as err:
        log(f"no periodic mean field for {pol.label()} at load {lam:g}: {err}", logging.WARNING)
        return None
