"""Simulation beside mean-field theory, one row per (policy, load)."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Sequence

from jaxqueue.policies import make
from jaxqueue.driver import steps_per_time_unit, sweep

__all__ = ["compare"]


def _policy(name: str, d: int | None):
    cls_fields = {f.name for f in dataclasses.fields(make(name))}
    return make(name, d=(d or 2)) if "d" in cls_fields and name != "jiq" else make(name)


def compare(
    policies: Sequence[str],
    n_servers: int = 1000,
    ratio: float = 10.0,
    loads: Sequence[float] = (0.5, 0.7, 0.9, 0.95, 0.98),
    *,
    d: int | None = None,
    time_units: float = 300.0,
    warmup_time: float = 50.0,
    replicas: int = 16,
    seed: int = 0,
    progress: bool = False,
    log=None,
) -> list[dict]:
    """Simulated mean response time (95% CI) beside the mean-field value.

    Each policy runs all loads in one compiled batch, starting from the
    mean-field occupancy, with ``warmup_time`` discarded and ``time_units``
    measured (time units at the largest load; smaller loads get more).

    Args:
        policies: policy names (``d`` applies to those that take it, default 2).
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
        pol = make(name) if not isinstance(name, str) else _policy(name, d)
        if log is not None:
            print(f"[jaxqueue] simulating {pol.label()} at loads {list(loads)}", file=log, flush=True)
        results = sweep(
            pol, n_servers, m, loads, replicas=replicas, steps=int(math.ceil(time_units * per)),
            warmup=int(math.ceil(warmup_time * per)), seed=seed, init="mean-field",
            progress=progress,
        )  # fmt: skip
        for lam, res in zip(loads, results):
            mf = theory.mean_field(pol.name, lam, r, d=pol.options().get("d", 1))
            rows.append(
                {
                    "policy": pol.name,
                    "policy_label": pol.label(),
                    "n_servers": n_servers,
                    "n_dispatchers": m,
                    "load": lam,
                    "sim_mean": res.mean_response_time.mean,
                    "sim_ci95": res.mean_response_time.ci95,
                    "theory": float(mf.mean_response_time),
                    "p0_sim": res.p0.mean if res.p0 is not None else None,
                    "p0_theory": _maybe(mf.p0),
                    "settings": res.settings,
                }
            )
    return rows


def _maybe(x):
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x
