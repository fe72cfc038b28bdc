"""Simulation beside mean-field theory, one row per (policy, load)."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Sequence

from jaxqueue.policies import make
from jaxqueue.driver import steps_per_time_unit, sweep

__all__ = ["compare"]


def _policy(name: str, d: int | None, z: int | None):
    fields = {f.name for f in dataclasses.fields(make(name)) if f.init}
    opts = {"d": d or 2} if "d" in fields else {}
    if "z" in fields:
        opts["z"] = 1 if z is None else z
    return make(name, **opts)


def compare(
    policies: Sequence[str],
    n_servers: int = 1000,
    ratio: float = 10.0,
    loads: Sequence[float] = (0.5, 0.7, 0.9, 0.95, 0.98),
    *,
    d: int | None = None,
    z: int | None = None,
    time_units: float = 300.0,
    warmup_time: float = 50.0,
    replicas: int = 16,
    seed: int = 0,
    progress: bool = False,
    log=None,
) -> list[dict]:
    """Simulated mean response time (95% CI) beside the mean-field value.

    Each policy runs all loads in one compiled batch, starting from the
    mean-field occupancy (empty for policies without a mean field), with
    ``warmup_time`` discarded and ``time_units`` measured (time units at the
    largest load; smaller loads get more). ``theory`` is None where there is
    no mean field (JIQ-Original, JIQ-Threshold).

    Args:
        policies: policy names (``d`` and ``z`` apply to those that take them,
            default 2 and 1).
        n_servers: ``N``; ``M = round(N / ratio)``.
        ratio: ``r = N / M``.
        loads: values of ``lambda``.

    Returns:
        A list of rows (dicts): policy, policy_label, n_servers, n_dispatchers,
        load, sim_mean, sim_ci95, theory, p0_sim, p0_theory, and the settings.
    """
    from jaxqueue import theory

    m = max(1, int(round(n_servers / ratio)))
    r = n_servers / m
    lmax = max(loads)
    per = steps_per_time_unit(n_servers, lmax)
    rows = []
    for name in policies:
        pol = make(name) if not isinstance(name, str) else _policy(name, d, z)
        if log is not None:
            print(f"[jaxqueue] simulating {pol.label()} at loads {list(loads)}", file=log, flush=True)
        results = sweep(
            pol, n_servers, m, loads, replicas=replicas, steps=int(math.ceil(time_units * per)),
            warmup=int(math.ceil(warmup_time * per)), seed=seed,
            init="empty" if pol.per_server else "mean-field", progress=progress,
        )  # fmt: skip
        for lam, res in zip(loads, results):
            try:
                mf = theory.mean_field(pol.name, lam, r, d=pol.options().get("d", 1))
            except NotImplementedError:  # JIQ-Original, JIQ-Threshold: no mean field
                mf = None
            rows.append(
                {
                    "policy": pol.name,
                    "policy_label": pol.label(),
                    "n_servers": n_servers,
                    "n_dispatchers": m,
                    "load": lam,
                    "sim_mean": res.mean_response_time.mean,
                    "sim_ci95": res.mean_response_time.ci95,
                    "theory": None if mf is None else float(mf.mean_response_time),
                    "p0_sim": res.p0.mean if res.p0 is not None else None,
                    "p0_theory": None if mf is None else _maybe(mf.p0),
                    "settings": res.settings,
                }
            )
    return rows


def _maybe(x):
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x
