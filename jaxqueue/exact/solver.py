"""Exact stationary metrics of a small system: :func:`solve_exact`.

Resolves the policy (:func:`jaxqueue.policies.make`) and the service law
(:func:`jaxqueue.core.service.parse_service`) and validates every input
before any work, builds the policy's chain (:mod:`jaxqueue.exact.chain`, the
rule ``Policy.exact_rule()`` names), solves it (:mod:`jaxqueue.exact.linalg`),
checks Little's law against the response time computed from what arrivals
find, and returns an :class:`~jaxqueue.exact.result.ExactResult`.

Service. By default (``service=None``, or a law that is exponential with rate
1) service is exp(1) and the chain is :class:`~jaxqueue.exact.chain.Chain`.
Any other phase-type law ``PH(alpha, S)`` solves
:class:`~jaxqueue.exact.chain.PhaseChain` (each server's state also holds
the phase of its task in service), for the rules of
:data:`~jaxqueue.exact.chain.PHASE_RULES` (every policy but JIQ-Original and
JIQ-Threshold). Every metric is then still exact up to the truncation of
infinite buffers: the queue-length laws, blocking, messages and the I-queue
law from the stationary law, the mean response time by Little's law, and the
response-time law as a mixture of phase-type laws. A task that finds ``k = 0``
tasks stays ``PH(alpha, S)``; one that finds ``k >= 1``, the one in service in
phase ``p``, stays the residual ``PH(e_p, S)``, ``k - 1`` services and its
own (FIFO), so the chain also records the joint law of ``(k, p)`` seen by
accepted arrivals. Its quantiles are found by bisection on the survival
function, computed by uniformization. With exp(1) service the response time
is the Erlang mixture of ``arrival_seen``; with phases, ``arrival_seen`` no
longer determines it (nor the mean: ``sum_k (k + 1) arrival_seen[k]`` holds
for exp(1) service only, and the Little's-law check uses the ``(k, p)`` form).

Pools. ``pools`` (:func:`jaxqueue.core.service.make_pools`: ``"F1:S1,F2:S2"``,
``(fraction, speed)`` pairs or :class:`~jaxqueue.core.service.Pool`
objects) splits the ``N`` servers into pools: pool ``i`` has ``count_i``
servers of speed ``v_i`` and law ``L_i`` (the pool's law, else ``service``,
else exp(1)), and a server of speed ``v`` runs ``L_i``'s rates times ``v``.
The policies see queue lengths only (their routing is unchanged), an idle
server of any pool joins an I-queue as usual, and only the rules of
:data:`~jaxqueue.exact.chain.PHASE_RULES` take pools. The chain is
:class:`~jaxqueue.exact.chain.PhaseChain` with each server's entry
``(pool, queue length, phase)`` (lumped only within pools), even for
exponential laws, and every metric is exact as with phases: the tails,
occupancy and ``arrival_seen`` are over all servers, the mean response time
is by Little's law (checked against the mean over the ``(pool, k, phase)``
an accepted arrival finds), and the response-time law is the mixture over
the pools of the phase-type mixtures above, each with the pool's law at its
speed, ``PH(alpha_i, v_i S_i)``, weighted by the share of accepted arrivals
the pool gets. Each pool's occupancy, share of the arrivals, utilization,
mean queue length, mean response time, waiting probability and
response-time quantiles are reported (``pool_occupancy``,
:data:`~jaxqueue.results.schema.POOL_METRICS`, ``pool_response_quantiles``).
Infinite buffers need ``load < capacity``, the tasks per server per unit
time the servers complete when all are busy
(:func:`~jaxqueue.core.service.capacity`).

Infinite buffers are truncated at ``queue_bound``: an arrival that would pass
it is dropped (reported as ``truncation_loss``, not as blocking), and
``truncated_mass`` is the stationary probability that some server is at the
bound. Without ``queue_bound`` the bound is chosen adaptively so that
``truncated_mass <= tol`` (1e-9), within ``default_max_states`` states; if
that budget is not enough a :class:`UserWarning` says so, and past
``REFUSED_MASS`` (1e-4) the solve is refused (a ``RuntimeError``: that is no
exact answer). ``max_states`` (default 200 000) is a hard cap.

Cost. With ``N = 4``, ``M = 2`` and queue bound 12: 1820 states (no
I-queues), about 1900 (JIQ, JIQ-Pod, JIQ-SQ), 2098 (JIQ-Threshold, z = 1),
0.05-0.15 s each; JIQ-Original has 23 283 states (about 2 s). Phases multiply
the count by up to ``P^N`` (idle servers have no phase): Erlang-2 service with
``N = 4`` and queue bound 12 has 20 475 states (Pod(2)) and 20 801 (JIQ,
``M = 2``), 6-7 s each; with
``N = 3`` at load 0.7 the automatic bound gives 10 660 states for Pod(2)
(about 1 s) and 20 874 for JIQ with ``M = 2`` (about 4 s, truncated mass
1.6e-7: the default budget is just short). Pools tell servers apart: two
exponential pools of speeds 2 and 1 (``N = 4``, ``M = 2``, buffer 3) give 137
states for JIQ (46 for identical servers); with ``N = 3`` at load 0.7 and
pools ``(1/3, 2), (2/3, 1)`` the automatic bound gives 2601 states for Pod(2)
(0.2 s).

Time scale: the chain is written in units of the mean service time
``1 / SERVICE_RATE`` (:mod:`jaxqueue.core.system`); times are divided by
``SERVICE_RATE`` and rates multiplied by it (both exact no-ops while it is 1).
A phase-type law is taken in that unit as it is (the helpers of
:mod:`jaxqueue.core.service` have mean 1; a law of mean ``m`` makes the load
``lambda * m``), and so are the pools' laws and speeds (no rescaling: the
capacity need not be 1).

Example:
    >>> from jaxqueue.exact import solve_exact
    >>> res = solve_exact("jsq", 0.5, 1, queue_bound=40)
    >>> round(res.mean_response_time, 6)  # M/M/1: 1 / (1 - lambda)
    2.0
    >>> res = solve_exact("random", 0.5, 1, service="erlang:2")
    >>> round(res.mean_response_time, 6)  # M/E2/1, Pollaczek-Khinchine: 1 + 0.5 * 1.5 / 1
    1.75
"""

from __future__ import annotations

import math
import operator
import warnings

import numpy as np

from jaxqueue.core.config import Model, split_keywords
from jaxqueue.core.service import (
    PhaseType,
    as_law,
    capacity,
    exponential,
    make_pools,
    pool_laws,
)
from jaxqueue.core.system import SERVICE_RATE, System, check_load
from jaxqueue.core.versions import versions
from jaxqueue.exact import linalg
from jaxqueue.exact.chain import (
    DELETE,
    JOIN,
    LOST,
    N_FIXED_REWARDS,
    PHASE_RULES,
    PROBE,
    RULES,
    STALE,
    Chain,
    PhaseChain,
    enumerate_states,
    estimate_states,
)
from jaxqueue.exact.result import ExactResult
from jaxqueue.policies.base import Policy
from jaxqueue.policies.registry import available, make
from jaxqueue.results.pools import pool_metrics, result_fields
from jaxqueue.results.response import (
    erlang_mixture_quantile,
    ph_mixture_quantiles,
    ph_response_mean,
    ph_response_quantiles,
)
from jaxqueue.results.schema import QUANTILES

__all__ = ["solve_exact"]


# --------------------------------------------------------------------------
# validation


def _as_int(name, value):
    """``value`` as a Python int (numpy integers too); TypeError naming ``name`` otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def _check_at_least(name, value, lo):
    value = _as_int(name, value)
    if value < lo:
        raise ValueError(f"{name}={value} is out of range: need {lo} <= {name}")
    return value


def _phase_policies():
    """The registered policies whose exact rule has a phase-type chain."""
    return [name for name in available() if make(name).exact_rule()[0] in PHASE_RULES]


def _resolve(
    policy,
    load,
    n_servers,
    n_dispatchers,
    d,
    z,
    buffer,
    queue_bound,
    order=None,
    service=None,
    pools=None,
):
    """Check every input, in order, before any work.

    Returns:
        ``(policy, rule, rule_options, load, n, m, buffer, queue_bound, law,
        phases, pools)``, the counts as Python ints; ``law`` is the service law
        (``None`` if not given), ``phases`` whether it needs the phase-type
        chain (a law that is not exponential with rate 1), and ``pools`` the
        tuple of :class:`~jaxqueue.core.service.Pool` of
        :func:`~jaxqueue.core.service.make_pools` (``None``: identical servers).
    """
    n = _as_int("n_servers", n_servers)
    m = _as_int("n_dispatchers", n_dispatchers)
    if buffer is not None:
        buffer = _as_int("buffer", buffer)
    d = None if d is None else _as_int("d", d)
    z = None if z is None else _as_int("z", z)
    policy = make(policy, d=d, z=z, order=order)  # unknown policy or option: ValueError
    system = System(n, m, buffer, buffer or 1, 0)  # n_servers, n_dispatchers, buffer
    policy.validate(system)  # d, z, order, single-dispatcher schemes
    try:
        rule, options = policy.exact_rule()
    except NotImplementedError as err:
        raise ValueError(str(err)) from None
    if rule not in RULES:
        raise ValueError(f"policy {policy.name!r} names exact rule {rule!r}, not one of {RULES}")
    law = as_law(service)
    phases = law is not None and not law.is_unit_exponential
    if phases and rule not in PHASE_RULES:
        raise ValueError(
            f"service={law.label!r}: policy {policy.label()!r} (exact rule {rule!r}) is solved "
            "with exponential service only; the policies that take a phase-type service law "
            f"are {', '.join(_phase_policies())} (use service=None or 'exp' here)"
        )
    if pools is not None:
        if rule not in PHASE_RULES:
            raise ValueError(
                f"pools={pools!r}: policy {policy.label()!r} (exact rule {rule!r}) is solved "
                "with identical servers only; the policies that take pools are "
                f"{', '.join(_phase_policies())} (use pools=None here)"
            )
        try:
            pools = make_pools(pools, n)
        except ValueError as err:
            if "pools" in str(err):
                raise
            raise ValueError(f"pools={pools!r}: {err}") from None
        except TypeError:
            raise TypeError(
                f"pools must be None, a string 'F1:S1,F2:S2', (fraction, speed) pairs or Pool "
                f"objects, got {pools!r}"
            ) from None
    if load is None:
        raise ValueError("load is required: the arrival rate per server, load > 0")
    if pools is not None:  # stability is load < capacity: check_load checks the rest
        load = check_load(load, 1 if buffer is None else buffer)
        cap = capacity(law, pools, n)
        if buffer is None and load >= cap:
            raise ValueError(
                f"load={load} is out of range with pools {_pools_label(pools, law)}: infinite "
                f"buffers need load < capacity = {cap:.6g} (tasks per server per unit time when "
                "all are busy: the sum over the pools of count * speed / mean, over n_servers); "
                "give a finite buffer for a heavier load"
            )
    elif not phases:
        load = check_load(load, buffer)
    else:  # stability is load * mean < 1: check_load checks the rest (a buffer lifts its < 1)
        load = check_load(load, 1 if buffer is None else buffer)
        if buffer is None and load * law.mean >= 1.0:
            raise ValueError(
                f"load={load} is out of range with service={law.label!r} of mean {law.mean:.6g}: "
                f"infinite buffers need load * mean < 1 (here {load * law.mean:.6g}); give a "
                "finite buffer for a heavier load"
            )
    if queue_bound is not None:
        if buffer is not None:
            raise ValueError(
                "queue_bound applies to infinite buffers only; with buffer="
                f"{buffer} the queues are bounded by the buffer (leave queue_bound=None)"
            )
        queue_bound = _check_at_least("queue_bound", queue_bound, 1)
    return policy, rule, options, load, n, m, buffer, queue_bound, law, phases, pools


def _pools_label(pools, law):
    """``"2 x speed 2 (erlang:2), 1 x speed 1 (exp)"``: the pools, for messages."""
    return ", ".join(
        f"{p.count} x speed {p.speed:g} ({(p.law or law or exponential()).label})" for p in pools
    )


# --------------------------------------------------------------------------
# one bounded chain


def _solve_bounded(
    rule, n, m, lam, d, z, buffer, cap, symmetry, max_states, order="random", law=None, pools=None
):
    """Solve the chain with queues bounded by ``cap``; returns ``(metrics, diagnostics)``.

    ``law``: ``None`` for exp(1) service (:class:`Chain`), else the phase-type
    law (:class:`PhaseChain`); then ``metrics`` also holds ``"_seen_phase"``,
    the ``(cap - 1, P)`` joint law of the tasks ``k >= 1`` an accepted arrival
    finds and the phase of the one in service (for the response-time
    quantiles; :func:`_result` takes it out). ``pools``: ``None``, or the
    :class:`~jaxqueue.core.service.Pool` tuple (:class:`PhaseChain` with
    pools; ``law`` is then the law of the pools without one, ``None`` for
    exp(1)); ``"_seen_phase"`` is then the ``(pools, cap, P)`` joint law of
    the pool, the tasks ``k >= 0`` and the phase (0 for ``k = 0``), and
    ``"_pool_occupancy"`` each pool's. Everything is in the time unit of the
    chain's rates here (the mean service time for exp(1) service).
    """
    if pools is not None:
        chain = PhaseChain(rule, n, m, lam, d, z, cap, symmetry, law or exponential(), pools)
    elif law is None:
        chain = Chain(rule, n, m, lam, d, z, cap, symmetry, order=order)
    else:
        chain = PhaseChain(rule, n, m, lam, d, z, cap, symmetry, law)
    states, rows, cols, vals, rewards = enumerate_states(chain, max_states)
    n_states = len(states)
    linalg.check_irreducible(n_states, rows, cols)
    pi = linalg.stationary(n_states, rows, cols, vals)

    decoded = [chain.decode(s) for s in states]
    if not chain.sparse_rewards:  # Chain
        qs = np.array([q for q, _ in decoded], dtype=np.int64)  # (S, N)
        counts = np.stack([(qs == k).sum(axis=1) for k in range(cap + 1)], axis=1)  # (S, K+1)
        occupancy = pi @ counts / n
    else:  # PhaseChain: server entries are (queue length, phase), with pools (pool, queue
        # length, phase); bounds run higher: no (S, K+1) array
        qs = np.array([chain.queue_lengths(q) for q, _ in decoded], dtype=np.int64)
        occupancy = np.bincount(qs.ravel(), weights=np.repeat(pi, n), minlength=cap + 1) / n
    pool_occupancy = None
    if pools is not None:  # per pool: the fraction of its servers with exactly k tasks
        labels = np.array([chain.pool_labels(q) for q, _ in decoded], dtype=np.int64)
        weights = np.broadcast_to(pi[:, None], qs.shape)
        pool_occupancy = np.stack(
            [
                np.bincount(qs[labels == i], weights=weights[labels == i], minlength=cap + 1)
                / p.count
                for i, p in enumerate(pools)
            ]
        )
    tail = np.cumsum(occupancy[::-1])[::-1]
    mean_q = float(np.arange(cap + 1) @ occupancy)

    ev = pi @ rewards  # expected event rates (rewards: an array, or SparseRewards with phases)
    arrival_rate = lam * n
    seen_rate = ev[N_FIXED_REWARDS : N_FIXED_REWARDS + cap]  # (PhaseChain: more follow)
    accepted = float(seen_rate.sum())
    arrival_seen = seen_rate / accepted  # k = 0..cap-1: an accepted arrival never finds cap
    lost = float(ev[LOST]) / arrival_rate
    t_little = n * mean_q / accepted
    if pools is not None:
        # Pools: as with phases (below), per pool, with the pool's law at its
        # speed; the law of (pool, k, p) seen by accepted arrivals.
        seen_phase = ev[chain.seen_phase_offset :].reshape(len(pools), cap, chain.n_phases)
        seen_phase = seen_phase / accepted
        t_pasta = sum(
            float(sp.sum()) * float(ph_response_mean(x, sp[:, 0], sp[1:, : x.n_phases]))
            for x, sp in zip(pool_laws(pools, law), seen_phase)
            if sp.sum() > 0
        )
    elif law is None:
        # exp(1) service: a task that finds k tasks stays k + 1 mean services
        seen_phase = None
        t_pasta = float(np.arange(1, cap + 1) @ arrival_seen)
    else:
        # Phase-type service: the response time of a task that finds k >= 1 tasks
        # at a server whose task in service is in phase p is the residual service
        # from p, r_p = (e_p (-S)^-1 1), then k - 1 full services, then its own
        # (FIFO: later arrivals do not matter). So the mean of the law of
        # (k, p) seen by accepted arrivals (rewards of the chain, exact) must
        # give Little's mean; sum_k (k + 1) arrival_seen[k] would not hold here.
        # (:func:`~jaxqueue.results.response.ph_response_mean`)
        seen_phase = ev[chain.seen_phase_offset :].reshape(cap - 1, law.n_phases) / accepted
        t_pasta = float(ph_response_mean(law, arrival_seen, seen_phase))
    if abs(t_little - t_pasta) > 1e-6 * max(1.0, t_pasta):
        raise RuntimeError(
            f"Little's law ({t_little!r}) and PASTA ({t_pasta!r}) response times disagree"
        )

    if chain.listed:
        ls = np.array([l for _, l in decoded], dtype=np.int64)
        sizes = np.stack([(ls == j).sum(axis=1) for j in range(m)], axis=1)  # (S, M)
        hist = np.stack([(sizes == k).sum(axis=1) for k in range(n + 1)], axis=1) / m
        iq_dist = pi @ hist
        p0 = float(iq_dist[0])
    else:
        iq_dist = p0 = None

    at_bound = (qs == cap).any(axis=1)
    metrics = dict(
        tail=tail,
        occupancy=occupancy,
        arrival_seen=np.concatenate([arrival_seen, [0.0]]),
        iqueue_distribution=iq_dist,
        mean_queue_length=mean_q,
        mean_response_time=t_little,
        waiting_probability=float(1.0 - arrival_seen[0]),
        blocking_probability=lost if buffer is not None else 0.0,
        p0=p0,
        join_rate=float(ev[JOIN]) / n,
        delete_rate=float(ev[DELETE]) / n,
        probe_rate=float(ev[PROBE]) / n,
        stale_fraction=float(ev[STALE]) / arrival_rate,
    )
    if law is not None or pools is not None:
        metrics["_seen_phase"] = seen_phase
    diagnostics = dict(
        truncated_mass=float(pi @ at_bound) if buffer is None else 0.0,
        truncation_loss=lost if buffer is None else 0.0,
        n_states=n_states,
    )
    if pools is not None:
        metrics["_pool_occupancy"] = pool_occupancy
    return metrics, diagnostics


def _result(
    policy,
    rule,
    n,
    m,
    lam,
    buffer,
    cap,
    symmetry,
    metrics,
    diagnostics,
    law=None,
    phases=False,
    pools=None,
):
    """The :class:`ExactResult` of a solved chain, in the package's time unit.

    ``law``: the service law given (``None``: none given); ``phases``: whether
    it was solved with :class:`PhaseChain` (then ``metrics`` holds ``"_seen_phase"``);
    ``pools``: the pools (``None``: identical servers; else ``"_seen_phase"``
    is by pool, see :func:`_solve_bounded`).
    """
    seen = metrics["arrival_seen"]
    seen_phase = metrics.pop("_seen_phase", None)
    if pools is not None:
        components = [
            (float(sp.sum()), x, sp[:, 0], sp[1:, : x.n_phases])
            for x, sp in zip(pool_laws(pools, law), seen_phase)
        ]
        quantiles = ph_mixture_quantiles(components, QUANTILES) / SERVICE_RATE
        metrics.update(result_fields(pool_metrics(components, metrics.pop("_pool_occupancy"))))
    elif phases:
        quantiles = ph_response_quantiles(law, seen[:-1], seen_phase, QUANTILES) / SERVICE_RATE
    else:
        quantiles = erlang_mixture_quantile(seen, np.array(QUANTILES)) / SERVICE_RATE
    for name in ("join_rate", "delete_rate", "probe_rate"):
        metrics[name] = metrics[name] * SERVICE_RATE
    metrics["mean_response_time"] = metrics["mean_response_time"] / SERVICE_RATE
    if not policy.stale_picks:
        metrics["stale_fraction"] = None
    settings = dict(
        policy=policy.name,
        policy_label=policy.label(),
        options=policy.options(),
        n_servers=n,
        n_dispatchers=m,
        ratio=n / m,
        load=lam,
        buffer=buffer,
        levels=len(metrics["tail"]) - 1,
        queue_bound=None if buffer is not None else cap,
        symmetry=symmetry,
        rule=rule,
        versions=versions(),
    )
    if law is not None:
        settings["service"] = law.to_dict()
    if pools is not None:
        settings["pools"] = [
            {
                "servers": p.count,
                "speed": p.speed,
                "service": None if p.law is None else p.law.to_dict(),
            }
            for p in pools
        ]
    return ExactResult(
        **metrics,
        response_quantiles={q: float(t) for q, t in zip(QUANTILES, quantiles)},
        settings=settings,
        diagnostics=diagnostics,
    )


# --------------------------------------------------------------------------
# adaptive truncation


#: An automatic bound that leaves more than this mass at the bound is refused, not warned of.
REFUSED_MASS = 1e-4


def _search_bound(solve, estimate, tol, budget, z):
    """Grow the queue bound until the mass at the bound is ``<= tol``, within ``budget`` states.

    Args:
        solve: ``bound -> (metrics, diagnostics)``.
        estimate: ``bound -> rough state count`` (:func:`~jaxqueue.exact.chain.estimate_states`).
        tol: target truncated mass.
        budget: state budget (counts are extrapolated from the last solve).
        z: the threshold (the first bound is above it).

    Returns:
        ``(bound, metrics, diagnostics, reached)``: the last solve, and whether
        it reached ``tol``.
    """

    def largest_bound(b0, n0):
        e0 = estimate(b0)
        b = b0
        while n0 * estimate(b + 1) / e0 <= budget:
            b += 1
            if b >= 1_000_000:
                break
        return b

    bound = max(8, z + 2)
    while bound > 1 and estimate(bound) > budget:
        bound -= 1
    history = []
    for _ in range(12):
        metrics, diag = solve(bound)
        solved = bound
        mass = diag["truncated_mass"]
        if mass <= tol:
            return solved, metrics, diag, True
        # The mass at the bound decays about geometrically in the bound:
        # extrapolate, with the decay rate from the last two solves, or at
        # first from the middle of the tail (its last steps are bent by the bound).
        history.append((bound, mass))
        if len(history) >= 2 and history[-2][1] > mass > 0:
            (b1, m1), (b2, m2) = history[-2:]
            ratio = (m2 / m1) ** (1.0 / (b2 - b1))
        else:
            s = metrics["tail"]
            lo, hi = max(1, bound // 2), bound - 1
            ratio = (s[hi] / s[lo]) ** (1.0 / (hi - lo)) if hi > lo and s[hi] > 0 else 0.5
        ratio = min(max(ratio, 1e-6), 0.999)
        extra = math.ceil(math.log(tol / mass) / math.log(ratio)) + 2
        new = min(largest_bound(bound, diag["n_states"]), bound + max(2, extra))
        if new <= bound:
            break
        bound = new
    return solved, metrics, diag, False


# --------------------------------------------------------------------------
# the entry point


def solve_exact(
    policy: str | Policy | Model,
    load: float,
    n_servers: int | None = None,
    n_dispatchers: int = 1,
    *,
    d: int | None = None,
    z: int | None = None,
    order: str | None = None,
    buffer: int | None = None,
    queue_bound: int | None = None,
    service: str | PhaseType | None = None,
    pools: str | tuple | list | None = None,
    symmetry: bool = True,
    tol: float = 1e-9,
    max_states: int = 200_000,
    default_max_states: int = 20_000,
) -> ExactResult:
    """Exact stationary metrics of a small system, by solving its Markov chain.

    Args:
        policy: a registered policy name (:func:`jaxqueue.policies.available`)
            or a :class:`~jaxqueue.policies.Policy`; resolved with
            ``make(policy, d=d, z=z, order=order)``. Its ``exact_rule()`` names
            the chain. Or a :class:`~jaxqueue.core.config.Model`, which then
            holds the sizes, ``d``, ``z``, ``order``, ``buffer``, ``service``
            and ``pools`` (Poisson arrivals; giving one of them beside it is
            an error).
        load: ``lambda > 0``, arrivals per server per unit time; ``< 1`` when
            ``buffer`` is ``None`` (with a service law or pools: below the
            capacity, ``1 / mean`` or :func:`~jaxqueue.core.service.capacity`).
        n_servers: ``N >= 1``.
        n_dispatchers: ``1 <= M <= N``.
        d: probes of ``pod``, ``jiq-pod``, ``idle-first`` (``1 <= d <= N``)
            or sampled I-queues of ``jiq-sq``, ``jiq-original`` (``1 <= d <= M``);
            ``None``: the policy's default (2; ``jiq-original``: 1). An error for
            a policy without ``d``.
        z: threshold of ``jiq-threshold`` (``z >= 0``; ``None``: 1) and
            ``jiq-original`` (``None``: 0). An error for any other policy.
        order: pick order of ``jiq-original``'s I-queues, ``"random"``
            (default) or ``"fifo"``. An error for any other policy.
        buffer: places per server (``>= 1``), or ``None`` for infinite.
        queue_bound: truncation level for infinite buffers (``>= 1``); by
            default chosen so that ``truncated_mass <= tol`` within
            ``default_max_states`` states (a warning says if it cannot).
        service: the service law: ``None`` (exponential, rate 1), a
            :class:`~jaxqueue.core.service.PhaseType`, or a string for
            :func:`~jaxqueue.core.service.parse_service` (``"exp"``,
            ``"erlang:K"``, ``"hyperexp:SCV"``, ``"fit:SCV"``,
            ``"ph:FILE.json"``). A law that is exponential with rate 1 solves
            the same chain as ``None``; any other law solves the phase-type
            chain (:class:`~jaxqueue.exact.chain.PhaseChain`), for the
            policies whose rule is in :data:`~jaxqueue.exact.chain.PHASE_RULES`
            (not ``jiq-original``, ``jiq-threshold``), and infinite buffers
            then need ``load * mean < 1``. Times are in the unit of the law's
            rates; the law is recorded as ``settings["service"]``
            (:meth:`~jaxqueue.core.service.PhaseType.to_dict`) when given.
        pools: heterogeneous servers (see the module docstring): ``None``
            (identical servers), ``"F1:S1,F2:S2"``, ``(fraction, speed)``
            pairs or :class:`~jaxqueue.core.service.Pool` objects, resolved
            with :func:`~jaxqueue.core.service.make_pools`. Pool ``i`` has
            ``count_i`` servers of speed ``v_i`` whose rates are ``v_i``
            times those of the pool's law (``Pool.law``, else ``service``,
            else exp(1)). For the policies of
            :data:`~jaxqueue.exact.chain.PHASE_RULES` only; infinite buffers
            then need ``load <`` :func:`~jaxqueue.core.service.capacity`.
            Recorded as ``settings["pools"]``, a list of ``{"servers",
            "speed", "service"}`` (``service``: the pool's own law's
            ``to_dict()``, or ``None``); the result has the pools' metrics
            (``pool_occupancy`` and :data:`~jaxqueue.results.schema.POOL_METRICS`).
        symmetry: lump states by server and dispatcher relabelling (exact).
        tol: target truncated mass when ``queue_bound`` is chosen here.
        max_states: hard cap on the reachable state count.
        default_max_states: state budget of the automatic ``queue_bound``.

    Returns:
        :class:`~jaxqueue.exact.result.ExactResult`.

    Raises:
        ValueError: a parameter out of range (the message names it and the
            valid range), an unknown policy, an option the policy does not
            take, an invalid service law or one the policy does not take,
            invalid pools or pools for a policy that does not take them, a
            load at or above the capacity with infinite buffers, or too many
            states. Raised before any work, but for the state count.
        TypeError: a count that is not an int, a load that is not a number,
            a service that is not None, a PhaseType or a string, pools that
            are not a string or a sequence.

        RuntimeError: the automatic ``queue_bound`` leaves more than
            :data:`REFUSED_MASS` at the bound within ``default_max_states`` states.

    Warns:
        UserWarning: the automatic ``queue_bound`` could not reach ``tol``
            within ``default_max_states`` states, but the mass at it is at most
            :data:`REFUSED_MASS` (the result is returned, with its ``truncated_mass``).

    Example:
        >>> res = solve_exact("jiq", 0.6, 4, 2, queue_bound=10)
        >>> res.n_states, round(res.p0, 4)
        (1068, 0.4648)
    """
    given = {
        k: v
        for k, v in dict(d=d, z=z, order=order, buffer=buffer, service=service, pools=pools).items()
        if v is not None
    }
    model = split_keywords(
        policy, n_servers, n_dispatchers, given, where="solve_exact", run_keys=()
    )[0]
    if model.arrivals is not None:
        raise ValueError(
            "solve_exact: the model has arrivals, and the exact chain is that of "
            "Poisson arrivals; use arrivals=None"
        )
    policy, rule, options, lam, n, m, buffer, queue_bound, law, phases, pool_set = _resolve(
        model.policy,
        load,
        model.n_servers,
        model.n_dispatchers,
        model.d,
        model.z,
        model.buffer,
        queue_bound,
        model.order,
        model.service,
        model.pools,
    )
    max_states = _check_at_least("max_states", max_states, 1)
    default_max_states = _check_at_least("default_max_states", default_max_states, 1)
    if not (isinstance(tol, (int, float)) and 0.0 < tol < 1.0):
        raise ValueError(f"tol={tol!r} is out of range: need 0 < tol < 1")
    rule_d, rule_z = options.get("d", 1), options.get("z", 0)
    rule_order = options.get("order", "random")
    chain_law = law if phases or pool_set is not None else None
    n_phases = law.n_phases if phases else 1
    pool_phases = None
    if pool_set is not None:
        pool_phases = [(p.count, (p.law or law or exponential()).n_phases) for p in pool_set]

    def solve(cap):
        return _solve_bounded(
            rule,
            n,
            m,
            lam,
            rule_d,
            rule_z,
            buffer,
            cap,
            symmetry,
            max_states,
            rule_order,
            chain_law,
            pool_set,
        )

    def result(cap, metrics, diagnostics):
        return _result(
            policy,
            rule,
            n,
            m,
            lam,
            buffer,
            cap,
            symmetry,
            metrics,
            diagnostics,
            law,
            phases,
            pool_set,
        )

    if buffer is not None or queue_bound is not None:
        cap = buffer if buffer is not None else queue_bound
        # refused before the enumeration (which takes minutes past 10^5 states): the estimate
        # over m! (it does not divide out the relabelling of dispatchers) is below the count
        count = estimate_states(
            rule, n, m, rule_z, cap, symmetry, rule_order, n_phases, pool_phases
        )
        if count // math.factorial(m) > max_states:
            raise ValueError(
                f"{'buffer' if buffer is not None else 'queue_bound'}={cap}: about "
                f"{count:.3g} reachable states, more than max_states={max_states}; "
                "use a smaller n_servers, n_dispatchers, buffer or queue_bound, "
                "or raise max_states"
            )
        return result(cap, *solve(cap))

    budget = min(max_states, default_max_states)
    bound, metrics, diag, reached = _search_bound(
        solve,
        lambda b: estimate_states(
            rule, n, m, rule_z, b, symmetry, rule_order, n_phases, pool_phases
        ),
        tol,
        budget,
        rule_z,
    )
    if not reached:
        what = (
            f"solve_exact({policy.label()!r}, load={lam}, N={n}, M={m}): truncated_mass="
            f"{diag['truncated_mass']:.3g} > tol={tol:g} at queue_bound={bound}, the largest "
            f"within default_max_states={default_max_states}"
        )
        if diag["truncated_mass"] > REFUSED_MASS:
            raise RuntimeError(
                f"{what}: more than {REFUSED_MASS:g} of the mass is cut off, so this is no exact "
                "answer; use fewer servers, a finite buffer, or pass queue_bound (and "
                "max_states) explicitly to solve the truncated chain anyway"
            )
        warnings.warn(
            f"{what}; pass queue_bound (and max_states) explicitly to go further", stacklevel=2
        )
    return result(bound, metrics, diag)
