"""A finished run's results: each load's sums, settings and intervals as a
:class:`~jaxqueue.results.simulation.SimulationResult` (:meth:`jaxqueue.sim.runner.Run.results`)."""

from __future__ import annotations

import numpy as np

from jaxqueue.core.arrivals import Trace
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.service import pool_laws
from jaxqueue.core.system import System
from jaxqueue.core.user_metrics import PER_ARRIVAL, metric_settings
from jaxqueue.core.versions import versions
from jaxqueue.results.simulation import LoadSums, SimulationResult, from_stats, samples
from jaxqueue.sim.classes import class_table

__all__ = ["load_results", "load_sums", "load_samples", "LEVEL_SUMS"]

#: The window sums indexed by queue length (last axis ``levels + 1``): a
#: load with its own buffer below the batch's reports its own levels.
LEVEL_SUMS = ("tail", "seen")


def load_sums(run, j: int, sums: dict | None = None) -> LoadSums:
    """Load ``j``'s window sums of a finished :class:`~jaxqueue.sim.runner.Run`
    (cut to its own levels) and the keywords of
    :func:`~jaxqueue.results.simulation.metric_samples`; ``sums``: the run's
    :meth:`~jaxqueue.sim.totals.Totals.sums`, if already taken."""
    p = run.plan
    if sums is None:
        sums = run.totals.sums()
        sums["overflow"], sums["iq_overflow"] = run.overflow[:, 0], run.overflow[:, 1]
    system, pol = p.system, p.policy
    laws = fractions = None
    if system.classes:  # each pool's law at its speed and first class
        table = class_table(system)
        laws = tuple(zip(pool_laws(table.pools), table.base))
    if system.pools is not None:  # each pool's share of the servers
        fractions = tuple(q.count / system.n_servers for q in system.pools)
    w, lam = run.windows[j], p.loads[j]
    part = {k: v[w.rows] for k, v in sums.items()}
    bpart = None
    if p.interval == "batch-means":
        bpart = {k: np.stack([b[k] for b in w.sums], axis=1) for k in w.sums[0]}
    own = p.load_system(j)
    if own.levels < system.levels:  # a load's own buffer: its levels, as alone
        part, bpart = (_own_levels(x, own.levels) for x in (part, bpart))
    keywords = dict(
        rate=system.service_rate if system.classes else None,
        step_rate=_sample_rate(system, lam),
        laws=laws,
        fractions=fractions,
        metrics=tuple((m.name, m.name + PER_ARRIVAL) for m in p.metrics),
    )
    load = p.load_vector()[w.rows].astype(np.float64)
    single = system.n_dispatchers == 1 and not pol.per_server
    return LoadSums(part, bpart, load, pol, single, keywords)


def load_samples(run, j: int, sums: dict | None = None) -> tuple[dict, dict | None]:
    """Load ``j``'s per-replica value of every metric and per batch
    (:func:`~jaxqueue.results.simulation.samples`)."""
    return samples(load_sums(run, j, sums))


def load_results(run, wall_seconds: float | None = None) -> list[SimulationResult]:
    """One result per load of a finished :class:`~jaxqueue.sim.runner.Run`."""
    p = run.plan
    sums = run.totals.sums()
    sums["overflow"], sums["iq_overflow"] = run.overflow[:, 0], run.overflow[:, 1]
    recorded = versions()
    results = []
    for j, (lam, w, (n, m)) in enumerate(zip(p.loads, run.windows, p.load_sizes())):
        settings = _settings(p, p.load_system(j), lam, w, n, m, wall_seconds, recorded)
        if p.metrics:  # what the user metrics were (reproducibility)
            settings["metrics"] = metric_settings(p.metrics)
        diagnostics = {"warmup_diagnostic": w.diagnostic}
        results.append(from_stats(load_sums(run, j, sums), settings, diagnostics))
    return results


def _own_levels(sums: dict | None, levels: int) -> dict | None:
    """``sums`` with the level sums cut to ``levels + 1`` entries (a load's own buffer)."""
    if sums is None:
        return None
    return {k: v[..., : levels + 1] if k in LEVEL_SUMS else v for k, v in sums.items()}


def _settings(p, own: System, lam, w, n: int, m: int, wall_seconds, recorded) -> dict:
    """What produced load ``lam``'s result (``own``: its System; ``w``: its window)."""
    system, pol = p.system, p.policy
    per_time = n * system.step_rate(lam)
    warm = w.warmup_end
    return {
        "policy": pol.name,
        "policy_label": pol.label(),
        "options": pol.options(),
        "n_servers": n,
        "n_dispatchers": m,
        "ratio": n / m,
        "load": lam,
        "buffer": own.buffer,
        "levels": own.levels,
        "iqueue_levels": system.iqueue_levels,
        "service": "exp" if system.service is None else system.service.to_dict(),
        "pools": None if system.pools is None else [_pool_setting(q) for q in system.pools],
        "arrivals": None if system.arrivals is None else system.arrivals.to_dict(),
        "replicas": p.replicas,
        "steps": w.measure_blocks * BLOCK,
        "warmup": warm * BLOCK,
        "time_measured": w.measure_blocks * BLOCK / per_time,
        "time_warmup": warm * BLOCK / per_time,
        "seed": p.seed,
        "init": p.init if isinstance(p.init, str) else "array",
        "interval": p.interval,
        "batches": w.batches,
        "devices": len(p.devices),
        "platform": p.devices[0].platform,
        "backend": p.backend,
        "backend_note": p.backend_note,
        "wall_seconds": wall_seconds,
        "versions": dict(recorded),
    }


def _pool_setting(q) -> dict:
    return {
        "servers": q.count,
        "speed": q.speed,
        "service": None if q.law is None else q.law.to_dict(),
    }


def _sample_rate(system: System, load: float) -> float:
    """The rate per server of the steps a run counts in ``steps``: all of them,
    or a trace's service candidates (:func:`jaxqueue.sim.blocks.time_sum_scale`)."""
    return system.service_rate if isinstance(system.arrivals, Trace) else system.step_rate(load)
