"""Initial states: an empty system, the mean-field occupancy, or a given occupancy."""

from __future__ import annotations

import numpy as np

from jaxqueue.core.system import System
from jaxqueue.policies.base import Policy
from jaxqueue.theory import mean_field

__all__ = ["initial_counts", "round_counts"]


def initial_counts(init, system: System, policy: Policy, load: float):
    """Occupancy counts, and I-queue counts where the state has them, of a start.

    Args:
        init: ``"empty"``, ``"mean-field"`` or an occupancy array (see :func:`jaxqueue.sim.runner.plan`).

    Returns:
        ``(counts, iq_counts)`` for :func:`jaxqueue.sim.state.init`; idle servers
        are spread over the I-queues as evenly as possible.
    """
    n, m, levels = system.n_servers, system.n_dispatchers, system.levels
    if isinstance(init, str):
        if init == "empty":
            counts = np.zeros(levels + 1, np.int64)
            counts[0] = n
        elif init == "mean-field":
            if policy.mean_field_kind() == "none":
                raise ValueError(
                    f"init='mean-field' needs a mean field, and {policy.name!r} has none "
                    f"({policy.no_mean_field}); start 'empty' or pass an occupancy array"
                )
            if system.service is not None and policy.mean_field_kind() == "tagged-server":
                raise ValueError(
                    f"init='mean-field': {policy.name!r} has no mean field with phase-type "
                    "service; start 'empty' or pass an occupancy array"
                )
            # with a phase-type law, the phase-type mean field (each level's
            # servers are then split over the phases by the law's in-service mix)
            mf = mean_field(policy, load, system.ratio, buffer=system.buffer,
                            service=system.service)  # fmt: skip
            occ = np.asarray(mf.occupancy, np.float64)
            beyond = occ[levels + 1 :].sum() * n
            if beyond >= 0.5:
                raise ValueError(
                    f"the mean-field start (init='auto' or 'mean-field') puts {beyond:.3g} "
                    f"servers past levels={levels} at load={load}; raise levels or pass "
                    "init='empty'"
                )
            return initial_counts(occ, system, policy, load)
        else:
            raise ValueError(f"init={init!r} is not valid: use 'empty', 'mean-field' or an array")
    else:
        occ = np.asarray(init, np.float64)
        if occ.ndim != 1 or occ.size == 0 or np.any(occ < 0) or occ.sum() <= 0:
            raise ValueError(
                "init must be a non-negative 1-D occupancy (fractions or counts of servers "
                "with exactly k tasks, k = 0, 1, ...)"
            )
        occ = occ / occ.sum()
        beyond = occ[levels + 1 :].sum()
        if beyond * n >= 0.5:
            raise ValueError(
                f"init puts {beyond * n:.3g} servers past levels={levels}; raise levels or "
                "give an occupancy with less mass past the bound"
            )
        full = np.zeros(levels + 1)
        full[: min(occ.size, levels + 1)] = occ[: levels + 1]
        counts = round_counts(full, n)
    iq_counts = None
    if policy.uses_iqueues and m > 1 and not policy.per_server:
        idle = int(counts[0])
        q, extra = divmod(idle, m)
        if q + (extra > 0) > system.iqueue_levels:
            raise ValueError(
                f"iqueue_levels={system.iqueue_levels} is too small for the initial state: "
                f"{idle} idle servers over {m} I-queues need at least {q + (extra > 0)}"
            )
        iq_counts = np.zeros(system.iqueue_levels + 1, np.int64)
        iq_counts[q] += m - extra
        if extra:
            iq_counts[q + 1] += extra
    return counts, iq_counts


def round_counts(frac: np.ndarray, n: int) -> np.ndarray:
    """Integer counts summing to ``n`` closest to ``n * frac`` (largest remainders)."""
    raw = frac / frac.sum() * n
    counts = np.floor(raw).astype(np.int64)
    short = n - counts.sum()
    order = np.argsort(-(raw - counts))
    counts[order[:short]] += 1
    return counts
