"""Default bounds on the tracked queue lengths and I-queue sizes.

The simulator tracks queue lengths ``0..levels`` and I-queue sizes
``0..iqueue_levels``; passing a bound is an overflow that is counted and, by
default, fails the run with advice. The defaults come from the mean-field tail
of each policy (an upper bound where the policy has no closed form), with a
margin for finite-``N`` fluctuations, so that an overflow is very unlikely;
:func:`horizon_levels` bounds a transient's queues over a finite horizon instead.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from jaxqueue.core.arrivals import MMPP, Profile, Trace
from jaxqueue.core.config import Bounds
from jaxqueue.core.host import host_float64
from jaxqueue.core.rng import BLOCK
from jaxqueue.core.service import capacity, exponential
from jaxqueue.policies.base import Policy
from jaxqueue.policies.classic import Random
from jaxqueue.theory import mean_field
from jaxqueue.theory.baselines.mph1 import mph1_tail
from jaxqueue.theory.closed.p0 import host_p0, iqueue_distribution
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.profiles import periodic

__all__ = [
    "mean_field_tail_bound",
    "required_levels",
    "default_levels",
    "horizon_levels",
    "default_iqueue_levels",
    "phase_levels",
    "class_mean_field",
    "stress_path",
    "source_levels",
]

_MAX_SEARCH = 100_000


def _jiq_p0(load: float, ratio: float, d: int) -> float:
    p0, status = host_p0(load, ratio, d)  # float64: the theory's compiled solver
    if not 0.0 < p0 <= 1.0 or status != 0:
        return 1.0  # the bound p0 <= 1 is always safe
    return p0


def mean_field_tail_bound(policy: Policy, n_servers: int, n_dispatchers: int, load: float):
    """A function ``i -> log s_i`` bounding the mean-field tail of ``policy``.

    The policy names the bound (:meth:`~jaxqueue.policies.Policy.tail_bound`):
    Pod(d)'s ``lambda**((d**i - 1)/(d - 1))`` (Random: ``d = 1``), times
    JIQ-Pod(d)'s ``p0**((d**(i-1) - 1)/(d - 1))`` where the policy says so and
    there are several dispatchers. (JSQ and I1F are bounded by Pod(2), JIQ-SQ
    by JIQ, a single dispatcher's JIQ-Pod(d) by Pod(d).)
    """
    lam = float(load)
    d, with_p0 = policy.tail_bound()
    if d >= n_servers and n_servers > 1:
        d = max(2, min(d, 64))
    log_p0 = 0.0
    if with_p0 and n_dispatchers > 1:
        log_p0 = math.log(_jiq_p0(lam, n_servers / n_dispatchers, d))

    def log_tail(i: int) -> float:
        if i == 0:
            return 0.0
        if d == 1:
            return i * math.log(lam) + (i - 1) * log_p0
        # d**i past a float (a large d): the tail is 0 there anyway
        big = i * math.log(d) > 700.0
        e_lam = (d**i - 1) / (d - 1) if i < 60 and not big else math.inf
        e_p0 = (d ** (i - 1) - 1) / (d - 1) if i < 61 and not big else math.inf
        return e_lam * math.log(lam) + (e_p0 * log_p0 if log_p0 else 0.0)

    return log_tail


def _first_level(log_tail, threshold_log: float) -> int:
    for i in range(1, _MAX_SEARCH):
        if log_tail(i) < threshold_log:
            return i
    raise ValueError("the load is too close to 1 for a tracked level bound below 100000")


def required_levels(policy: Policy, n_servers: int, n_dispatchers: int, load: float) -> int:
    """Smallest level bound the mean field allows: fewer than one server is expected past it.

    Idle-first with ``d = 1`` (one dispatcher) has a mean field with no server
    holding two tasks below capacity (every arrival finds an idle server), so
    any bound of at least 2 is allowed; its default stays Random's tail, which
    bounds its stationary queues, and an explicit smaller bound (for a finite
    horizon: :func:`horizon_levels`) is guarded by the overflow detector.
    """
    if policy.idle_else_random() and load < 1.0:
        return 2
    log_tail = mean_field_tail_bound(policy, n_servers, n_dispatchers, load)
    return _first_level(log_tail, -math.log(n_servers))


def horizon_levels(
    policy: Policy, n_servers: int, load: float, horizon: float, start_top: int = 1
) -> int | None:
    """A level bound for a transient of ``horizon`` time units from a start whose
    longest queue is ``start_top``, or None where the policy's routing gives none.

    For idle-first with ``d = 1`` (exponential servers of rate 1): fewer than
    ``1e-6`` servers are expected to pass it, at any step the transient runs
    (its steps past ``horizon``, the uniformized chain's Poisson tail, included).
    """
    if not policy.idle_else_random():
        return None
    # Server j's queue grows past 1 only by tasks sent while no server is idle,
    # each to a uniform server. Let every arrival pick a uniform server (used
    # only then): from the last time j held at most one task (or the start),
    # its queue is at most max(q_j(0), 1) + A_j, A_j the arrivals that pick j.
    # Over K steps of the uniformized chain (rate N (lambda + 1)), A_j is
    # Binomial(K, lambda / ((lambda + 1) N)) of mean m, and Chernoff's bound
    # P(A_j >= k) <= e^-m (e m / k)^k holds for k > m. The union over the N
    # servers needs N P(A_j >= k) < 1e-6. K covers the transient's steps: its
    # Poisson tail past rate * horizon (sim.transient: 8 sqrt + 40), to a block.
    rate = n_servers * (float(load) + 1.0)
    steps = rate * horizon + 12.0 * math.sqrt(rate * horizon) + 64.0 + 2 * BLOCK
    m = steps * float(load) / rate
    threshold = math.log(1e-6 / n_servers)
    k = max(1, math.floor(m) + 1)
    while -m + k * (1.0 + math.log(m / k)) >= threshold:
        k += 1
    level = max(int(start_top), 1) + k - 1
    return int(4 * math.ceil(level / 4))


#: Below this many servers the mean field is no guide to the largest queues
#: (random fallbacks make the tails geometric), so defaults use Random's tail.
SMALL_SYSTEM = 100


def default_levels(policy: Policy, n_servers: int, n_dispatchers: int, load: float) -> int:
    """Default level bound: ``N * s_L < 1e-6`` plus a quarter, to a multiple of 4.

    ``s_L`` is the policy's mean-field tail bound for ``N >= 100`` and Random's
    tail ``lambda**L`` for smaller systems.
    """
    if n_servers < SMALL_SYSTEM:
        policy = Random()
    log_tail = mean_field_tail_bound(policy, n_servers, n_dispatchers, load)
    base = _first_level(log_tail, -math.log(n_servers) + math.log(1e-6))
    return int(4 * math.ceil((base + max(4, base // 4)) / 4))


def default_iqueue_levels(policy: Policy, n_servers: int, n_dispatchers: int, load: float) -> int:
    """Default I-queue size bound (JIQ family with several dispatchers).

    From the mean-field I-queue size law of JIQ at ``load`` (JIQ-Pod's for
    JIQ-Pod): ``M * P(size >= J) < 1e-6``, plus half again; at least one more
    than the ``ceil(N / M)`` of an empty start, at most ``N``.
    """
    ratio = n_servers / n_dispatchers
    if policy.per_server and n_dispatchers == 1:
        return n_servers  # the one I-queue may list every server
    d = min(policy.tail_bound()[0], 64)
    p0 = _jiq_p0(float(load), ratio, d)
    start = int(math.ceil(ratio)) + 1
    jmax = max(64, int(8 * ratio + 64))
    with host_float64():
        dist = np.asarray(iqueue_distribution(p0, float(load), ratio, d, jmax), np.float64)
    surv = np.cumsum(dist[::-1])[::-1]
    below = np.nonzero(n_dispatchers * surv < 1e-6)[0]
    base = int(below[0]) if below.size else jmax
    bound = base + max(4, base // 2)
    if policy.per_server:  # lists also hold busy servers (stale or below the threshold)
        bound = 2 * bound + int(math.ceil(ratio))
    return int(min(n_servers, max(start, 4 * math.ceil(bound / 4))))


def phase_levels(
    policy: Policy, n_servers: int, n_dispatchers: int, load: float, law, pools=None
) -> int:
    """Default level bound with a phase-type law or pools: ``N * s_L < 1e-6`` plus a quarter.

    For the exchangeable policies with ``N >= 100`` (but ``jsew`` with pools),
    ``s_L`` is the mean-field tail with the law and the pools
    (:func:`jaxqueue.theory.generic.phases.fixed_point`). Otherwise (or if that fails
    to converge):

    ``s_L`` is the largest over the pools of the M/PH/1 tail (:func:`mph1_tail`)
    of a server of the pool under Random routing (arrival rate ``lambda``):
    Random's exact tail, which bounds the tails of the policies that route
    better. A pool that Random would overload gets the tail at the system's
    utilization ``lambda / capacity`` instead (only load-aware policies are
    stable there; an overflow says to raise ``levels``).
    """
    base = exponential() if law is None else law
    if n_servers >= SMALL_SYSTEM and policy.has_queue_length_ode(pools):
        # the mean field's tail (Pod's stays doubly exponential)
        tail = _phase_mean_field_tail(policy, n_servers, n_dispatchers, load, base, pools)
        if tail is not None:
            below = np.nonzero(n_servers * tail < 1e-6)[0]
            if below.size:
                level = int(below[0])
                return int(4 * math.ceil((level + max(4, level // 4)) / 4))
    laws, util = [base], [load * base.mean]
    if pools is not None:
        laws = [(p.law or base) for p in pools]
        laws = [lw.scaled(lw.mean / p.speed) for lw, p in zip(laws, pools)]
        system_util = load / capacity(law, pools, n_servers)
        util = [load * lw.mean if load * lw.mean < 1 else system_util for lw in laws]
    return max(_mph1_levels(n_servers, u / lw.mean, lw) for lw, u in zip(laws, util))


def _phase_mean_field_tail(policy, n_servers, n_dispatchers, load, law, pools=None):
    """The mean-field tail with a law and pools (:mod:`jaxqueue.theory.generic.phases`), or None
    if there is none (a load the pools' mean field does not cover) or it fails."""
    try:
        mf = class_mean_field(policy, float(load), n_servers, n_dispatchers, None, law, pools)
    except (ValueError, RuntimeError):
        return None
    return np.asarray(mf.tail)


@functools.lru_cache(maxsize=32)
def class_mean_field(
    policy: Policy, load: float, n_servers: int, n_dispatchers: int, buffer, law, pools
):
    """:func:`jaxqueue.theory.mean_field` of a system with a law or pools, cached: a run's
    default level bound and its mean-field start share one solve (callers only read it).

    The ratio is ``N / M`` for the JIQ family with several dispatchers, else
    None (one I-queue, or none).
    """
    return mean_field(
        policy,
        load,
        limit_ratio(policy, n_servers, n_dispatchers),
        buffer=buffer,
        service=law,
        pools=pools,
    )


def limit_ratio(policy: Policy, n_servers: int, n_dispatchers: int) -> float | None:
    """The ratio the mean field of ``N`` servers and ``M`` dispatchers is solved at.

    ``N / M`` for the JIQ family with several dispatchers, and for the
    per-server policies (JIQ-Original, JIQ-Threshold: their mean fields are
    the many-dispatcher ones); else None: one I-queue listing every idle
    server, or none. (With ``M = 1`` the ratio ``N`` would ask for the
    many-dispatcher limit at ``r = N``: about ``4N`` I-queue levels, and not
    the single-dispatcher system.)
    """
    several = (
        policy.uses_iqueues
        and not policy.single_dispatcher
        and (n_dispatchers > 1 or policy.per_server)
    )
    return n_servers / n_dispatchers if several else None


def _mph1_levels(n_servers: int, rate: float, law) -> int:
    size = 64
    while True:
        tail = mph1_tail(rate, law, size)
        below = np.nonzero(n_servers * tail < 1e-6)[0]
        if below.size:
            base = int(below[0])
            return int(4 * math.ceil((base + max(4, base // 4)) / 4))
        if size >= _MAX_SEARCH:
            raise ValueError("the load is too close to 1 for a tracked level bound below 100000")
        size *= 4


#: An MMPP's stress path stays in its busiest state for the sojourn exceeded with this chance.
SOJOURN_QUANTILE = 1e-6

#: A trace's stress path: its arrivals counted in bins of this many time units...
TRACE_BIN = 0.5
#: ... over at most this many time units (2^14 steps of the ODE), ending where
#: the trace's fluid backlog peaks.
TRACE_WINDOW = 1638.4

#: The I-queue bound of the stress path's ODE (:func:`jaxqueue.theory.profiles.periodic.largest_tail`).
STRESS_IQUEUE_LEVELS = 16


def stress_path(source, load: float, n_servers: int) -> list[tuple[float, float]]:
    """The load path, ``[(load per server, duration), ...]``, whose queues size
    the default level bound under an arrival source at mean load ``load``.

    A profile: two periods (a run starts at the mean load's fixed point, and
    the period map contracts fast). An MMPP: its busiest state for the
    sojourn there exceeded with chance :data:`SOJOURN_QUANTILE`
    (``-ln(1e-6) / q`` for exit rate ``q``): a long burst. A trace: one pass,
    its arrivals per server counted in bins of :data:`TRACE_BIN` time units
    (the trace scaled to ``load * N`` arrivals per time unit, as a run plays it);
    of a longer trace the :data:`TRACE_WINDOW` time units that end where its
    fluid backlog ``W`` peaks (``W`` grows by the bins' rate above 1 and stays
    at least 0; the busiest bin where it never grows).
    """
    if isinstance(source, Profile):
        return list(zip((load * source.shape).tolist(), source.durations.tolist())) * 2
    if isinstance(source, MMPP):
        top = int(np.argmax(source.shape))
        exit_rate = float(-source.matrix[top, top])
        stay = -math.log(SOJOURN_QUANTILE) / exit_rate if exit_rate > 0 else 1e4
        return [(load * float(source.shape[top]), stay)]
    if isinstance(source, Trace):
        at = np.cumsum(source.gaps) / (load * n_servers)  # time units
        rates = np.bincount((at / TRACE_BIN).astype(np.int64)) / (n_servers * TRACE_BIN)
        keep = int(TRACE_WINDOW / TRACE_BIN)
        if rates.size > keep:
            backlog, peak, end = 0.0, 0.0, int(np.argmax(rates))
            for i, excess in enumerate(((rates - 1.0) * TRACE_BIN).tolist()):
                backlog = max(0.0, backlog + excess)
                if backlog > peak:
                    peak, end = backlog, i
            rates = rates[max(0, end + 1 - keep) : end + 1]
        return [(float(c), TRACE_BIN) for c in rates]
    raise TypeError(f"arrivals of type {type(source).__name__} have no stress path")


@functools.lru_cache(maxsize=32)  # a run repeated (other seeds, replicas) solves it once
def source_levels(
    policy: Policy, n_servers: int, n_dispatchers: int, load: float, source, law=None, pools=None
) -> int | None:
    """Default level bound under an arrival source: ``N * s_L < 1e-6`` plus a
    quarter, ``s_L`` the largest tail of the mean-field ODE along the
    source's :func:`stress_path` from the fixed point at ``load``
    (:func:`jaxqueue.theory.profiles.periodic.largest_tail`), and at least the
    constant-load default at ``load``.

    None where that mean field does not apply (fewer than
    :data:`SMALL_SYSTEM` servers, a policy without the generic mean field,
    ``jsew`` with pools) or its solve fails: the caller falls back to the
    bound at a raised load (:func:`jaxqueue.runs.planner.bound_load`).
    """
    if n_servers < SMALL_SYSTEM or not policy.has_queue_length_ode(pools):
        return None
    ratio = limit_ratio(policy, n_servers, n_dispatchers)
    try:
        tail = periodic.largest_tail(
            Limit(policy, ratio, service=law, pools=pools),
            float(load),
            stress_path(source, float(load), n_servers),
            bounds=Bounds(iqueue_levels=STRESS_IQUEUE_LEVELS if ratio else None),
        )
    except (ValueError, RuntimeError, NotImplementedError):
        return None
    below = np.nonzero(n_servers * tail < 1e-6)[0]
    if below.size:
        level = int(below[0])
    else:  # a large N: on along the tail's decay at its end
        decay = min(float(tail[-1] / tail[-2]), 0.95) if tail[-2] > 0 else 0.5
        level = tail.size - 1 + math.ceil(math.log(1e-6 / n_servers / tail[-1]) / math.log(decay))
    bound = int(4 * math.ceil((level + max(4, level // 4)) / 4))
    if law is None and pools is None:
        return max(bound, default_levels(policy, n_servers, n_dispatchers, load))
    return max(bound, phase_levels(policy, n_servers, n_dispatchers, load, law, pools))
