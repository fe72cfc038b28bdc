"""The level bounds of a plan: the loads they are sized at (a source's peak and
trough), each size's bounds from :mod:`jaxqueue.runs.bounds`, and the
:class:`~jaxqueue.core.system.System` that covers every load of a run."""

from __future__ import annotations

from jaxqueue.core.arrivals import Trace
from jaxqueue.core.system import System, check_int
from jaxqueue.runs.bounds import (
    default_iqueue_levels,
    default_levels,
    phase_levels,
    required_levels,
    source_levels,
)

__all__ = ["bound_load", "trough_load", "level_bound", "iqueue_bound", "size_system"]


def bound_load(lmax: float, source, cap: float) -> float:
    """The load the default level bounds are computed for where the mean
    field does not size them under a source (:func:`~jaxqueue.runs.bounds.source_levels`:
    fewer than 100 servers, the per-server policies, ``jsew`` with pools).

    With a time-varying or trace source: the peak load (a profile's or an
    MMPP's), but at most halfway from the mean load to the capacity, and a
    trace's that halfway load. Queues build up while the rate is above its
    mean; an arrival that still finds a queue at the bound is an overflow,
    reported with advice (never clipped).
    """
    if source is None or lmax >= cap:
        return lmax
    halfway = 0.5 * (lmax + cap)
    return halfway if isinstance(source, Trace) else max(lmax, min(lmax * source.peak, halfway))


def trough_load(lmin: float, source) -> float:
    """The load the default I-queue bounds are computed for (idle servers
    gather in I-queues at low load): a profile's or an MMPP's lowest rate, a
    trace's half the mean, at least 0.01."""
    if source is None:
        return lmin
    low = 0.5 * lmin if isinstance(source, Trace) else lmin * float(source.shape.min())
    return max(0.01, low)


def phase_bound(pol, n, m, levels, lmax, law, pools) -> int:
    if levels is None:
        return phase_levels(pol, n, m, lmax, law, pools)
    check_int("levels", levels, 1, 10**6)
    return levels


def level_bound(
    pol, n, m, buffer, levels, lmax, law=None, pools=None, source=None, mean_load=None
) -> int:
    """The level bound: ``buffer``; ``levels`` checked; or the default at
    ``lmax`` (:func:`bound_load`), and under a source where the mean field
    applies the queues its stress path builds (:func:`~jaxqueue.runs.bounds.source_levels`)."""
    if buffer is not None:
        if levels is not None and levels != buffer:
            raise ValueError(f"levels={levels} must equal buffer={buffer} (or be omitted)")
        return buffer
    if source is not None and levels is None:
        found = source_levels(pol, n, m, mean_load, source, law, pools)
        if found is not None:
            return found
    if law is not None or pools is not None:
        return phase_bound(pol, n, m, levels, lmax, law, pools)
    need = required_levels(pol, n, m, lmax)
    if levels is None:
        return default_levels(pol, n, m, lmax)
    check_int("levels", levels, 1, 10**6)
    if levels < need:
        raise ValueError(
            f"levels={levels} is too small for load={lmax} under {pol.label()}: the "
            f"mean-field tail puts about one server at queue length {need} or more; "
            f"need levels >= {need} (default {default_levels(pol, n, m, lmax)})"
        )
    return levels


def iqueue_bound(pol, n, m, iqueue_levels, lmin) -> int:
    if not (pol.uses_iqueues and (m > 1 or pol.per_server)):
        return 0
    iq = iqueue_levels if iqueue_levels is not None else default_iqueue_levels(pol, n, m, lmin)
    check_int("iqueue_levels", iq, 1, n)
    return iq


def size_system(pol, loads, sizes, bare: System, n_dispatchers: int, buffer, levels, iqueue_levels):
    """The run's System: the largest ``N``, ``M`` and buffer, with level and
    I-queue bounds that cover every load at its own size (``sizes``: one per
    load, or None), the servers' laws and the arrivals of ``bare``."""
    n_servers, law, pool_set, source = bare.n_servers, bare.service, bare.pools, bare.arrivals
    pol.validate(System(n_servers, n_dispatchers, buffer, buffer or 1, 0))
    by_size = {}  # the loads of each size (one size without sizes); a buffer bounds its own
    for size, lam in zip(sizes or [(n_servers, n_dispatchers)] * len(loads), loads):
        by_size.setdefault(size[:2], []).append(lam)
    top = max(
        level_bound(
            pol,
            n,
            m,
            buffer,
            levels,
            bound_load(max(lams), source, bare.capacity),
            law,
            pool_set,
            source,
            max(lams),
        )
        for (n, m), lams in by_size.items()
    )
    iq = max(
        iqueue_bound(pol, n, m, iqueue_levels, trough_load(min(lams), source))
        for (n, m), lams in (
            by_size.items() if iqueue_levels is None else [((n_servers, n_dispatchers), loads)]
        )
    )
    system = System(n_servers, n_dispatchers, buffer, top, iq, law, pool_set, source)
    pol.validate(system)
    return system
