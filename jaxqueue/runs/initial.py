"""Initial states: an empty system, the mean-field state, or a given occupancy.

A mean-field start takes from the mean field everything the state holds: the
servers per queue length and, for the JIQ family with several dispatchers,
the dispatchers per I-queue size (and, for JIQ-Original, which busy servers
are still listed). An even spread of the idle servers over the I-queues
instead leaves too few of them empty: at N = 10^4, r = 10, load 0.6 JIQ's
``p0`` then averages 0.033 below its mean field over the first 5 time units,
and takes about 10 to settle (docs/simulation.md, "Warm-up").
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from jaxqueue.core.system import System
from jaxqueue.policies.base import PER_SERVER_MEAN_FIELDS, Policy
from jaxqueue.runs.bounds import class_mean_field, limit_ratio
from jaxqueue.sim.classes import split_classes
from jaxqueue.sim.per_server import even_sizes
from jaxqueue.theory import mean_field

__all__ = [
    "ListedStart",
    "initial_state",
    "initial_counts",
    "initial_classes",
    "iqueue_counts",
    "listed_counts",
    "round_counts",
    "mean_field_of",
]


class ListedStart(NamedTuple):
    """The I-queue part of a per-server start (JIQ-Original, JIQ-Threshold)."""

    by_length: np.ndarray  # (levels + 1,): listed servers with exactly k tasks
    by_size: np.ndarray  # (iqueue_levels + 1,): dispatchers listing exactly j servers


def initial_state(init, system: System, policy: Policy, load: float):
    """A load's start, ``(counts, classes)``: :func:`initial_counts` and
    :func:`initial_classes` (the ``start`` of a :class:`~jaxqueue.sim.runner.Plan`)."""
    counts = initial_counts(init, system, policy, load)
    return counts, initial_classes(init, system, policy, load, counts[0])


def initial_counts(init, system: System, policy: Policy, load: float):
    """Occupancy counts, and the I-queue part where the state has one, of a start.

    Args:
        init: ``"empty"``, ``"mean-field"`` or an occupancy array (see :func:`jaxqueue.runs.planner.plan`).

    Returns:
        ``(counts, iq_counts)`` for :func:`jaxqueue.sim.state.core_from_counts`:
        the servers with exactly k tasks, and

        * for the exchangeable JIQ family with several dispatchers, the
          dispatchers listing exactly j idle servers: from the mean field's
          I-queue law (:func:`iqueue_counts`) at a mean-field start, else as
          evenly spread as possible;
        * for the per-server variants, a :class:`ListedStart` from the mean
          field (JIQ-Original: busy servers listed too), or ``None``: every
          server with at most ``z`` tasks listed, spread evenly;
        * ``None`` otherwise.
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
            if system.service is not None and policy.mean_field_kind() in PER_SERVER_MEAN_FIELDS:
                raise ValueError(
                    f"init='mean-field': {policy.name!r} has no mean field with phase-type "
                    "service; start 'empty' or pass an occupancy array"
                )
            # with a phase-type law, the phase-type mean field (initial_classes
            # then splits each level's servers over the phases by its joint law)
            mf = mean_field_of(policy, float(load), system)
            occ = np.asarray(mf.occupancy, np.float64)
            beyond = occ[levels + 1 :].sum() * n
            if beyond >= 0.5:
                raise ValueError(
                    f"the mean-field start (init='auto' or 'mean-field') puts {beyond:.3g} "
                    f"servers past levels={levels} at load={load}; raise levels or pass "
                    "init='empty'"
                )
            counts, iq_counts = initial_counts(occ, system, policy, load)
            if mf.iqueue_distribution is None or system.n_dispatchers == 1:
                return counts, iq_counts
            if policy.per_server:
                listed = listed_counts(counts, occ, mf.diagnostics["listed_occupancy"])
                total = int(listed.sum())
            else:
                listed, total = None, int(counts[0])
            by_size = iqueue_counts(mf.iqueue_distribution, system, total)
            return counts, (by_size if listed is None else ListedStart(listed, by_size))
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
    if policy.uses_iqueues and m > 1 and not policy.per_server:  # the idle servers, evenly
        sizes = even_sizes(int(counts[0]), system)
        iq_counts = np.bincount(sizes, minlength=system.iqueue_levels + 1).astype(np.int64)
    return counts, iq_counts


def initial_classes(init, system: System, policy: Policy, load: float, counts: np.ndarray):
    """Class counts of a start (phase-type service or pools), or ``None`` without classes.

    A mean-field start with a phase-type law splits each level's servers over
    the phases by the mean field's joint law of (queue length, phase), and
    with pools over the pools by the mean field's law of (queue length, pool)
    first; any other start in proportion to the pools' sizes and by each law's
    in-service mix (:func:`jaxqueue.sim.classes.split_classes`).
    The in-service mix is far from the joint law where phases differ much: a
    hyperexponential law's long queues are mostly in its slow phase.
    """
    if not system.classes:
        return None
    share = pool_share = None
    if (
        isinstance(init, str)
        and init == "mean-field"
        and (system.service is not None or system.pools is not None)
    ):
        mf = mean_field_of(policy, float(load), system)
        share = mf.diagnostics.get("phase_occupancy")
        if system.pools is not None:  # each pool's share of every level
            fractions = np.array([p.count for p in system.pools], np.float64) / system.n_servers
            pool_share = (np.asarray(mf.pool_occupancy) * fractions[:, None]).T
    return split_classes(counts, system, share, pool_share)


@functools.lru_cache(maxsize=16)
def mean_field_of(policy: Policy, load: float, system: System):
    """The mean field a start follows (with a phase-type law or pools, the one by class,
    solved once with the default level bound's)."""
    if system.service is not None or system.pools is not None:
        if not policy.per_server:
            return class_mean_field(
                policy,
                load,
                system.n_servers,
                system.n_dispatchers,
                system.buffer,
                system.service,
                system.pools,
            )
    ratio = limit_ratio(policy, system.n_servers, system.n_dispatchers)
    return mean_field(
        policy, load, ratio, buffer=system.buffer, service=system.service, pools=system.pools
    )


def round_counts(frac: np.ndarray, n: int) -> np.ndarray:
    """Integer counts summing to ``n`` closest to ``n * frac`` (largest remainders)."""
    raw = frac / frac.sum() * n
    counts = np.floor(raw).astype(np.int64)
    short = n - counts.sum()
    order = np.argsort(-(raw - counts))
    counts[order[:short]] += 1
    return counts


def iqueue_counts(law, system: System, listed: int) -> np.ndarray:
    """Dispatchers per I-queue size, close to ``M * law``, listing ``listed`` servers in all.

    Args:
        law: the mean-field law of an I-queue's size, ``j = 0, 1, ...``.
        listed: the servers the I-queues hold (idle ones for JIQ).

    Returns:
        int ``(iqueue_levels + 1,)`` summing to ``M``, with ``sum_j j c_j =
        listed``: the largest-remainder rounding of ``M * law``, then moved a
        dispatcher at a time to the next size up (or down), each time the
        move that adds least to the squared distance from ``M * law``, until
        the listed servers add up.

    Raises:
        ValueError: if ``iqueue_levels`` cannot hold ``listed`` servers.
    """
    m, cap = system.n_dispatchers, system.iqueue_levels
    even_sizes(listed, system)  # raises if iqueue_levels cannot hold them
    target = np.zeros(cap + 1)
    law = np.maximum(np.asarray(law, np.float64)[: cap + 1], 0.0)
    target[: law.size] = law / law.sum() * m
    counts = round_counts(target, m)
    sizes = np.arange(cap + 1)
    gap = listed - int(sizes @ counts)
    while gap:
        # one dispatcher one size up (or down): from the size most over its
        # target to the one next to it most under, the least squared miss
        step = 1 if gap > 0 else -1
        excess = counts - target
        gain = np.full(cap + 1, -np.inf)
        src = slice(0, cap) if step > 0 else slice(1, cap + 1)
        dst = slice(1, cap + 1) if step > 0 else slice(0, cap)
        gain[src] = np.where(counts[src] > 0, excess[src] - excess[dst], -np.inf)
        j = int(np.argmax(gain))
        counts[j] -= 1
        counts[j + step] += 1
        gap -= step
    return counts


def listed_counts(counts: np.ndarray, occupancy, listed) -> np.ndarray:
    """How many of each level's servers a per-server mean-field start lists.

    Args:
        counts: servers with exactly k tasks, ``k = 0..levels``.
        occupancy: the mean-field fraction of servers with k tasks.
        listed: the mean-field fraction of servers listed with k tasks
            (at most ``occupancy``, level by level).

    Returns:
        ``round(counts[k] * listed[k] / occupancy[k])`` per level (0 where the
        mean field has no servers), so never more than ``counts[k]``.
    """
    counts = np.asarray(counts, np.int64)
    occ, share = np.zeros(counts.size), np.zeros(counts.size)
    occ_in = np.asarray(occupancy, np.float64)[: counts.size]
    share_in = np.asarray(listed, np.float64)[: counts.size]
    occ[: occ_in.size], share[: share_in.size] = occ_in, share_in
    frac = np.divide(share, occ, out=np.zeros(counts.size), where=occ > 0)
    return np.minimum(np.rint(counts * np.clip(frac, 0.0, 1.0)).astype(np.int64), counts)
