"""The generic mean field with phase-type service (:class:`~jaxqueue.core.service.PhaseType`)
and server pools.

Model. ``N`` servers, ``M`` dispatchers, ``N, M -> infinity`` with
``r = N / M`` fixed, Poisson arrivals at rate ``lambda`` per server, FIFO
servers, and service times drawn from a phase-type law ``PH(alpha, S)``: a
task starts its service in phase ``p`` with probability ``alpha[p]``, moves to
phase ``q`` at rate ``S[p][q]`` and completes at the exit rate ``s_p = -sum_q
S[p][q]``. The policies are the exchangeable ones of
:mod:`jaxqueue.theory.meanfield` (Random, Pod(d), JSQ, I1F, the JIQ family
with I-queues that list exactly the idle servers): they route on queue lengths
only, so their routing laws are exactly those of the exponential mean field,
evaluated on the queue-length tails. The generic mean field follows
Mitzenmacher, "The power of two choices in randomized load balancing" (IEEE
TPDS 2001); the JIQ family with many dispatchers Wang, Feng and Cheng,
"Distributed Join-the-Idle-Queue for Low Latency Cloud Services",
arXiv:1709.10119.

State. A server's queue length alone is no longer Markov: what it will do next
depends on the phase of the task in service. So the state is

* ``x[k, p]`` (``k = 1..L``, ``p = 0..P-1``): the fraction of servers holding
  exactly ``k`` tasks whose task in service is in phase ``p``;
* for the JIQ family with many dispatchers, ``Q_j`` (``j = 1..J``): the
  fraction of dispatchers whose I-queue lists at least ``j`` servers.

The idle fraction is ``1 - sum x`` (not a coordinate), and the queue-length
tails are ``s_k = sum_{j >= k} sum_p x[j, p]`` (``s_0 = 1``). Flattened, the
state vector is ``[x[1..L, :] row by row, Q_1..Q_J]``.

Drift (per unit time; time in units of the law's own time, i.e. of the mean
service time for a mean-1 law, so ``lambda * mean`` is the load per server).
From the tails, :func:`jaxqueue.theory.meanfield.rates` evaluates the policy's
own decision rule on the law of its random outcomes: it gives ``level[k]``,
the probability that an arrival joins a server with ``k`` tasks (``level[L]``:
blocked by a finite buffer, or dropped by the truncation), and the I-queue
laws. Among the servers with ``k`` tasks the one chosen is uniformly random,
so its task in service is in phase ``p`` with probability ``x[k, p] / n_k``,
``n_k = sum_p x[k, p]``. Then:

* arrivals: ``lambda * level[0]`` per unit time start a service at an idle
  server, in phase ``a ~ alpha`` (``x[1, a]`` gains); ``lambda * level[k] *
  x[k, p] / n_k`` move servers from ``x[k, p]`` to ``x[k + 1, p]`` (the task
  in service keeps its phase), ``1 <= k < L``;
* phase changes: ``x[k, p] -> x[k, q]`` at rate ``S[p][q]`` per server;
* completions: at rate ``s_p`` per server ``x[k, p] -> x[k - 1, a]`` with
  ``a ~ alpha`` (the next task starts) for ``k >= 2``, and to idle for
  ``k = 1``;
* I-queues (JIQ family, ``M > 1``): servers become idle at rate ``sum_p s_p
  x[1, p]`` (with exponential service this is ``s_1 - s_2``); a newly idle
  server joins an I-queue and arrivals remove listed servers exactly as in
  :func:`jaxqueue.theory.meanfield.drift_from_rates`.

Summed over phases and levels ``>= k`` this is the exponential drift of
:mod:`jaxqueue.theory.meanfield` when ``P = 1`` and ``S = [[-1]]`` (tested).
With Random routing every server is an independent M/PH/1 queue, so the mean
response time is the Pollaczek-Khinchine value
(:func:`~jaxqueue.core.service.mph1_mean_response_time`; tested).

Fixed point. As in :func:`jaxqueue.theory.meanfield.fixed_point`: an RK4 run
of the ODE from the empty system (``warmup_time``, 20 by default; if Newton
fails from its end, the run goes on four times as long and Newton starts
again), then Newton (``jax.jacfwd`` of the drift, with backtracking), where
for the JIQ family with many dispatchers the conservation law ``sum_j Q_j /
r = 1 - s_1`` (the I-queues list exactly the idle servers) replaces the
``Q_1`` equation. With infinite buffers and
``levels=None`` the number of levels is adaptive: it starts at
:data:`~jaxqueue.theory.meanfield.DEFAULT_LEVELS` (for Random, at the level
where the M/PH/1 tail, decaying geometrically, falls below ``level_tol``) and,
while the tail mass at the bound ``s_L`` exceeds ``level_tol``, grows by the
decay rate read off the solved tail, then solves again from the previous
solution, extended geometrically (a new compilation each time; at most
:data:`MAX_STATE` state coordinates ``L * P``, then a warning). Where
routing is random (Random, the fallback of JIQ) a law with a large SCV has a
much longer, geometric tail than exponential service (Random with
``hyperexp:10`` at load 0.95 needs more than 1000 levels: pass ``levels``);
Pod(d) keeps a doubly exponential tail, which starts later.

The mean response time follows from Little's law: the mean queue length
``sum_k s_k`` over the accepted rate per server ``lambda (1 - blocking)``.

Server pools. With ``pools``, a fraction ``f_i`` of the servers serve at
speed ``v_i`` (with a law of their own, or the common one): a server's
*class* is its pool and the phase of its task (as in the simulator,
:mod:`jaxqueue.sim.classes`), and ``x[k, c]`` is the fraction of all
servers with ``k`` tasks in class ``c``; pool ``i`` has ``f_i - sum_k
sum_(c in i) x[k, c]`` idle servers. The policies still route on queue
lengths only, and break ties uniformly, so the law of the queue length an
arrival joins is the same rule evaluated on the tails of all servers, and
the server chosen at length ``k >= 1`` is of class ``c`` with probability
``x[k, c] / n_k``; an idle one is of pool ``i`` with probability (pool
``i``'s idle) / (all idle), and starts in a phase drawn from pool ``i``'s
``alpha``. A completion at ``k >= 2`` starts the next task in a phase drawn
from the same pool's ``alpha``. Phase changes and completions run at the
pool's rates (its law's times its speed). Newly idle servers join
I-queues as before: the I-queues list idle servers regardless of pool, and
a listed server leaves only when it is picked or gets a task, so the pool
mix of an I-queue is that of the idle servers. With one pool this is the
drift above; with pools all alike it is the exponential mean field (tested),
and with Random routing each pool's servers are M/PH/1 queues at their own
speed (tested). ``jsew`` routes by the pools' expected waits and is refused.
Infinite buffers need ``lambda`` below the capacity ``sum_i f_i v_i /
mean_i``; Random, whose servers do not share load, also needs every pool
below its own capacity.

JSQ-like routing above capacity. JSQ, I1F and an idle server first route on
whether some server has fewer than ``k`` tasks; past the capacity (a finite
buffer at a higher load, a load step, a profile's peak) the state reaches a
full level ``s_k = 1`` and slides along it, as in
:func:`jaxqueue.theory.meanfield.sliding`. By class, :func:`sliding` adds
where an arrival sent just below the full level goes: to a server that a
completion at level ``k`` has just left there (its pool, its next task in
a phase drawn from that pool's ``alpha``; for ``k = 1`` an idle server of
that pool), so the classes below the full level stand still. The fixed
point then comes from running the sliding ODE until it settles, as for
identical servers, and the response-time law from where the arrivals go on
the slide (``FixedPoint.seen_phase``, ``seen_idle``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.host import host_float64
from jaxqueue.core.service import PhaseType, as_law, exponential, pool_shares
from jaxqueue.core.status import Status
from jaxqueue.core.system import System, check_int, is_real
from jaxqueue.policies import Policy, available, make, policy_class
from jaxqueue.results.pools import pool_metrics, result_fields
from jaxqueue.results.response import (
    ph_mixture_quantiles,
    ph_response_mean,
    ph_response_quantiles,
)
from jaxqueue.results.schema import QUANTILES
from jaxqueue.theory import meanfield
from jaxqueue.theory.meanfield import (
    DEFAULT_LEVELS,
    LEVEL_TOL,
    MAX_DENSE_LEVELS,
    Rates,
    _policy_and_system,
    extend_levels,
    grown_levels,
    round8,
)
from jaxqueue.theory.result import MeanFieldResult, build

__all__ = [
    "FixedPoint",
    "Transient",
    "ServerClasses",
    "MAX_STATE",
    "LEVEL_TOL",
    "drift",
    "law_arrays",
    "server_classes",
    "fixed_point",
    "transient",
    "mph1_tail_decay",
    "sliding",
    "Sliding",
    "ode_drift",
]

#: Most state coordinates ``levels * phases`` the adaptive level count grows to.
MAX_STATE = 2048
_MAX_LEVELS = 10**6
#: Levels holding less mass than this choose the phase of their server from the in-service mix.
_TINY = 1e-100


class ServerClasses(NamedTuple):
    """The servers of the limit by pool (host side): one pool unless pools were given.

    Attributes:
        laws: each pool's service law at its speed (a server of speed ``v``
            completes a task of law ``L`` in ``L / v``).
        fractions: each pool's share of the servers (summing to 1).
        speeds: each pool's speed.
        base: each pool's first class: pool ``i`` owns the classes ``base[i]
            .. base[i] + laws[i].n_phases - 1``, one per phase (as the
            simulator's :func:`jaxqueue.sim.classes.class_table`).
        given: whether pools were given (their record goes into the settings).
    """

    laws: tuple
    fractions: tuple
    speeds: tuple
    base: tuple
    given: bool

    @property
    def n_classes(self) -> int:
        return sum(law.n_phases for law in self.laws)

    @property
    def capacity(self) -> float:
        """Tasks per server per unit time when every server is busy: ``sum_i f_i / mean_i``."""
        return sum(f / law.mean for f, law in zip(self.fractions, self.laws))


def server_classes(service=None, pools=None) -> ServerClasses:
    """The :class:`ServerClasses` of a service law and pools of the limit.

    Args:
        service: the servers' law (a :class:`~jaxqueue.core.service.PhaseType`
            or its command-line form; ``None``: exponential), the law of a pool
            that gives none of its own.
        pools: ``None`` (identical servers), ``"F1:S1,F2:S2"``, ``(fraction,
            speed)`` pairs, or :class:`~jaxqueue.core.service.Pool` objects
            (their shares of the servers are ``count / sum of counts``).
    """
    law = as_law(service) or exponential()
    shares = pool_shares(pools)
    if shares is None:
        return ServerClasses((law,), (1.0,), (1.0,), (0,), False)
    fracs = [f for f, _, _ in shares]
    speeds = [v for _, v, _ in shares]
    laws = [own or law for _, _, own in shares]
    laws = tuple(lw.scaled(lw.mean / v) for lw, v in zip(laws, speeds))
    base = tuple(int(b) for b in np.cumsum([0] + [lw.n_phases for lw in laws[:-1]]))
    return ServerClasses(laws, tuple(fracs), tuple(speeds), base, True)


class _Law(NamedTuple):
    """The server classes as arrays (traced: settings with as many classes share compilations).

    A class is a pool and a phase (one pool without pools: the phases of the law).
    """

    alpha: jax.Array  # (C,) the phase a task starts in, every pool in its share
    generator: jax.Array  # (C, C) sub-generator S, block-diagonal by pool, at the pools' speeds
    mix: jax.Array  # (C,) class of a level whose servers have vanished (in-service mix)
    starts: jax.Array  # (I, C) row i: pool i's alpha, on its classes
    member: jax.Array  # (C, I) one-hot: the pool of each class
    fractions: jax.Array  # (I,) each pool's share of the servers


def law_arrays(law) -> _Law:
    """The arrays :func:`drift` takes for a law (a :class:`~jaxqueue.core.service.PhaseType`)
    or for :class:`ServerClasses` (call with x64 on: ``with host_float64()``)."""
    classes = law if isinstance(law, ServerClasses) else server_classes(law)
    C, n_pools = classes.n_classes, len(classes.laws)
    starts = np.zeros((n_pools, C))
    member = np.zeros((C, n_pools))
    gen = np.zeros((C, C))
    mix = np.zeros(C)
    for i, (lw, b, f) in enumerate(zip(classes.laws, classes.base, classes.fractions)):
        P = lw.n_phases
        starts[i, b : b + P] = lw.alpha
        member[b : b + P, i] = 1.0
        gen[b : b + P, b : b + P] = lw.matrix
        mix[b : b + P] = f * lw.in_service_mix()
    f = np.asarray(classes.fractions)
    return _Law(
        *(
            jnp.asarray(v, jnp.float64)
            for v in (f @ starts, gen, mix / mix.sum(), starts, member, f)
        )
    )


def _split(x, L: int, P: int):
    """``x[1..L, :]`` as an ``(L, P)`` array, and ``Q_1..Q_J``."""
    return x[: L * P].reshape(L, P), x[L * P :]


def _tails(X):
    """``s_1..s_L`` from the phase counts ``x[1..L, :]`` (a triangular product: cheaper
    to compile and differentiate than a cumulative sum)."""
    L = X.shape[0]
    above = jnp.arange(L)[:, None] >= jnp.arange(L)[None, :]  # level j counts in s_k, k <= j
    return jnp.sum(X, axis=1) @ above.astype(X.dtype)


def tail_of(X) -> np.ndarray:
    """``s_0..s_L`` (host float64) from the phase counts ``x[1..L, :]``."""
    X = np.asarray(X, np.float64)
    return np.concatenate([[1.0], np.cumsum(X.sum(axis=1)[::-1])[::-1]])


def _flat(X, q):
    """The state of :mod:`jaxqueue.theory.meanfield`: ``[s_1..s_L, Q_1..Q_J]``."""
    return jnp.concatenate([_tails(X), q])


def drift(x, load, ratio, law: _Law, policy: Policy, system: System) -> jax.Array:
    """``dx/dt`` of the mean field by class (``x = [x[1..L, :].ravel(), Q_1..Q_J]``).

    ``law`` holds the classes as arrays (:func:`law_arrays` of a law or of
    :class:`ServerClasses`): ``alpha``, the block-diagonal ``S`` at the pools'
    speeds, each pool's ``alpha`` and share, and ``mix``: the class given to a
    server chosen at a level that holds no mass, where the rule is 0/0 (the
    in-service mix ``alpha (-S)^-1``, normalised, weighted by the pools'
    shares); ``system`` a limit System
    (:func:`jaxqueue.theory.meanfield.limit_system`). See the module docstring.
    """
    return _drift_and_rates(x, load, ratio, law, policy, system)[0]


def _joined(X, law: _Law):
    """Where an arrival's server is, given the level it joins: ``(share, pick)``.

    ``share[k - 1, c]``: the class in service at a server chosen among those
    with ``k`` tasks (``x[k, c] / n_k``; ``mix`` where a level holds no mass);
    ``pick[i]``: the pool of an idle server chosen (each pool's idle fraction
    over all idle servers; the pools' shares where none is idle).
    """
    n = jnp.sum(X, axis=1)
    filled = n > _TINY  # below, the 0/0 share's derivative (-x / n**2) would overflow
    share = jnp.where(filled[:, None], X / jnp.where(filled, n, 1.0)[:, None], law.mix[None, :])
    idle = jnp.maximum(law.fractions - jnp.sum(X, axis=0) @ law.member, 0.0)
    total = jnp.sum(idle)
    pick = jnp.where(total > _TINY, idle / jnp.where(total > _TINY, total, 1.0), law.fractions)
    return share, pick


def _drift_and_rates(x, load, ratio, law, policy, system):
    L = system.levels
    P = law.alpha.shape[0]
    X, q = _split(x, L, P)
    rt = meanfield.rates(_flat(X, q), policy, system)
    share, pick = _joined(X, law)
    return _class_drift(X, q, load, ratio, law, rt, share, pick), rt


def _class_drift(X, q, load, ratio, law, rt, share, pick):
    """``dx/dt`` given the policy's routing law ``rt`` and where the server an
    arrival joins is (``share``, ``pick``: as :func:`_joined`); affine in ``rt``."""
    L, P = X.shape
    J = q.shape[0]
    level = rt.level  # (L + 1,): level[k] an arrival joins a server with k tasks
    exits = -jnp.sum(law.generator, axis=1)  # s_p
    done = X @ exits  # (L,): completions per unit time at level k = 1..L
    none = jnp.zeros((1, P), X.dtype)
    up = load * level[1:L, None] * share[: L - 1]  # (L - 1, P): arrivals at k = 1..L-1
    if law.starts.shape[0] == 1:  # one pool: an idle server starts a task in phase ~ alpha
        start = load * level[0] * law.alpha[None, :]
        restart = done[1:, None] * law.alpha[None, :]  # the next task starts
    else:  # pools: the idle server is of pool i with probability (pool i's idle) / (idle)
        start = load * level[0] * (pick @ law.starts)[None, :]
        # the next task starts in the phase law of the pool of the class that completed
        restart = ((X[1:] * exits[None, :]) @ law.member) @ law.starts
    dX = (
        X @ law.generator  # phase changes; every completion leaves its (k, p)
        + jnp.concatenate([start, up])
        - jnp.concatenate([up, none])
        + jnp.concatenate([restart, none])
    )
    dx = dX.reshape(-1)
    if J:
        dq = ratio * (done[0] * rt.join[:J] - load * rt.iq_remove[1:])
        dx = jnp.concatenate([dx, dq])
    return dx


#: A level counts as full (``s_k = 1``) within this much: the state by class
#: holds ``s_k`` as a sum, which rounding keeps from being exactly 1.
_FULL = 1e-12


class Sliding(NamedTuple):
    """The drift by class at a state where JSQ-like routing may jump (:func:`sliding`).

    Attributes:
        drift: ``dx/dt``; its levels below a full level it slides on do not move.
        rates: the :class:`~jaxqueue.theory.meanfield.Rates` of the arrivals (the mix of the two laws).
        share, pick: where the server an arrival joins is, as :func:`_joined`,
            with the level just below a full one (or the idle servers below
            ``s_1 = 1``) read as the servers a completion has just put there.
        inside: the weight of the law read just below the full level.
        state, below: the queue-length state ``[s_1..s_L, Q_1..Q_J]`` read
            on the full level and just below it (as
            :class:`jaxqueue.theory.meanfield.Sliding`).
    """

    drift: jax.Array
    rates: Rates
    share: jax.Array
    pick: jax.Array
    inside: jax.Array
    state: jax.Array
    below: jax.Array


def sliding(x, load, ratio, law: _Law, policy: Policy, system: System) -> Sliding:
    """The drift by class of a JSQ-like policy, with the sliding motion along a full level.

    As :func:`jaxqueue.theory.meanfield.sliding` (Filippov's convex
    combination of the routing law read at ``s_k = 1`` and just below it,
    weighted to hold ``s_k`` at 1), with one thing the queue lengths alone
    do not say: which servers sit at level ``k - 1`` while level ``k`` is
    full. They have just completed a task at level ``k``: in the finite
    system each is refilled before anything else happens to it, so an
    arrival sent there finds the class a completion at level ``k`` leaves
    (the pool of the server that completed, the next task in a phase drawn
    from that pool's ``alpha``; for ``k = 1`` an idle server of that pool).
    That class, not the in-service mix of an empty level, is what such an
    arrival joins, and it makes every class below level ``k`` stand still.
    Off a full level this is :func:`drift`.
    """
    L = system.levels
    P = law.alpha.shape[0]
    X, q = _split(x, L, P)
    s = _tails(X)
    top = jnp.sum(jnp.cumprod(s >= 1.0 - _FULL))  # s_1 .. s_top are full
    on = top > 0
    k = jnp.maximum(top - 1, 0)  # s_top's index, X's row of level top
    idx = jnp.arange(L)
    at = jnp.concatenate([jnp.where(idx < top, 1.0, jnp.clip(s, 0.0, 1.0)), q])
    below = at.at[k].set(jnp.where(on, 1.0 - meanfield._INSIDE, at[k]))
    r_at, r_below = meanfield.rates(at, policy, system), meanfield.rates(below, policy, system)
    # JSQ-like routing empties the lowest busy level at a finite rate: an RK4 stage can
    # overshoot it, and a level's share x[k, c] / n_k of mixed signs would be unbounded
    share, pick = _joined(jnp.maximum(X, 0.0), law)
    exits = -jnp.sum(law.generator, axis=1)
    left = (X[k] * exits) @ law.member  # completions at level top, by pool
    total = jnp.sum(left)
    pools = jnp.where(total > _TINY, left / jnp.where(total > _TINY, total, 1.0), law.fractions)
    refill = (idx == top - 2)[:, None]  # the row of level top - 1 (none for top = 1)
    share = jnp.where(on & refill, (pools @ law.starts)[None, :], share)
    pick = jnp.where(on & (top == 1), pools, pick)
    # s_top moves by the arrivals that join a server with top - 1 tasks and the
    # completions at level top: its drift under the law below the level and at it
    done = X[k] @ exits
    a, b = load * r_below.level[k] - done, load * r_at.level[k] - done
    slide = on & (a > 0.0) & (b < 0.0)
    alpha = jnp.where(
        slide, -b / jnp.where(slide, a - b, 1.0), jnp.where(on & (a <= 0.0), 1.0, 0.0)
    )
    rt = jax.tree_util.tree_map(lambda u, v: alpha * u + (1.0 - alpha) * v, r_below, r_at)
    f = _class_drift(X, q, load, ratio, law, rt, share, pick)  # affine in the rates
    still = jnp.repeat(slide & (idx < k), P)  # the empty levels below the full one
    f = f.at[: L * P].set(jnp.where(still, 0.0, f[: L * P]))
    return Sliding(f, rt, share, pick, alpha, at, below)


def _fill(x, k, law: _Law, L: int, P: int):
    """``x`` with ``s_{k+1}`` made exactly full: the servers left at levels
    ``1..k`` keep their class and join level ``k + 1``, and each pool's idle
    servers (or its excess, a small negative idle fraction) join it in the
    phases its ``alpha`` starts (or in the level's own mix of that pool). A
    step cut where a level fills ends at an error of order ``h**2`` from 1:
    this moves that much."""
    X, q = _split(x, L, P)
    rows = jnp.arange(L)
    below = rows < k
    moved = jnp.sum(jnp.where(below[:, None], X, 0.0), axis=0)  # (P,)
    idle = law.fractions - jnp.sum(X, axis=0) @ law.member  # (I,) signed
    own = X[k][:, None] * law.member  # (P, I): the level's classes of each pool
    mass = jnp.sum(own, axis=0)
    mixes = jnp.where(mass > _TINY, own / jnp.where(mass > _TINY, mass, 1.0), law.starts.T)
    comp = jnp.where(idle[None, :] >= 0.0, law.starts.T, mixes)  # (P, I)
    row = X[k] + moved + comp @ idle
    X = jnp.where(below[:, None], 0.0, X).at[k].set(jnp.maximum(row, 0.0))
    return jnp.concatenate([X.reshape(-1), q])


def _onto_full(x, law: _Law, L: int, P: int):
    """``x`` with the servers below its highest full level (``s_1 .. s_top``
    within :data:`_FULL` of 1) moved onto it (:func:`_fill`): the state a
    step ends in, for JSQ-like routing. Where the levels below are empty
    (as the sliding drift keeps them) this moves rounding only. A level
    that empties as JSQ-like routing drains it has a class mix that
    changes ever faster (arrivals leave it at ``lambda x[k, c] / n_k`` a
    class), which an RK4 step at its end can overshoot: the clip at 0 then
    adds a little mass that this takes back."""
    s = _tails(_split(x, L, P)[0])
    top = jnp.sum(jnp.cumprod(s >= 1.0 - _FULL))
    return jnp.where(top > 0, _fill(x, jnp.maximum(top - 1, 0), law, L, P), x)


def _split_at_filling(step, x, h, new, extra, slope, law: _Law, L: int, P: int):
    """An RK4 step by class cut where it fills a level (as
    :func:`jaxqueue.theory.meanfield.split_at_filling`, with :func:`_fill`
    making the level exactly full)."""
    s = _tails(_split(x, L, P)[0])
    top = jnp.sum(jnp.cumprod(s >= 1.0 - _FULL))
    k = jnp.minimum(top, L - 1)
    gap, rise = 1.0 - s[k], h * _tails(_split(slope, L, P)[0])[k]
    crossed = (top < L) & (rise > gap)
    return meanfield.cut_step(
        step,
        x,
        h,
        new,
        extra,
        crossed,
        gap / jnp.maximum(rise, 1e-300),
        lambda y: _fill(jnp.clip(y, 0.0, 1.0), k, law, L, P),
    )


def ode_drift(x, load, ratio, law: _Law, policy: Policy, system: System) -> jax.Array:
    """The right-hand side the ODE by class is integrated with: :func:`sliding`
    for a JSQ-like policy (:func:`jaxqueue.theory.meanfield.kinked`), else :func:`drift`."""
    if meanfield.kinked(policy, system):
        return sliding(x, load, ratio, law, policy, system).drift
    return drift(x, load, ratio, law, policy, system)


def iqueue_gap(x, ratio, L: int, P: int):
    """``sum_j Q_j / r - (1 - s_1)`` by class (``s_1 = sum x``): zero where the
    I-queues list exactly the idle servers
    (:func:`jaxqueue.theory.meanfield.iqueue_gap` of the exponential state)."""
    X, q = _split(x, L, P)
    return jnp.sum(q) / ratio - (1.0 - jnp.sum(X))


def _residual(x, load, ratio, law, policy, system):
    """The drift with, for the JIQ family with many dispatchers, the conservation
    law in place of the ``Q_1`` equation; and the :class:`Rates` at ``x``."""
    f, rt = _drift_and_rates(x, load, ratio, law, policy, system)
    if system.iqueue_levels:
        L, P = system.levels, law.alpha.shape[0]
        # the I-queues list exactly the idle servers: replaces the Q_1 equation
        f = f.at[L * P].set(iqueue_gap(x, ratio, L, P))
    return f, rt


#: RK4 as stages ``(weight in the step, weight of the stage's slope in the sum)``.
_RK4_STAGES = ((0.0, 1.0 / 6.0), (0.5, 1.0 / 3.0), (0.5, 1.0 / 3.0), (1.0, 1.0 / 6.0))


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _advance(x, n_steps, h, load, ratio, law, policy, system):
    """``n_steps`` RK4 steps of size ``h`` (both traced: one compilation for all runs).

    The four stages are a loop over :data:`_RK4_STAGES`, so the drift is
    compiled once rather than four times. JSQ-like routing integrates the
    sliding drift and cuts a step where it fills a level (:func:`_split_at_filling`).
    """
    at, weight = (jnp.asarray(v, x.dtype) for v in zip(*_RK4_STAGES))
    coefs = jnp.stack([at, weight], axis=1)
    kinked = meanfield.kinked(policy, system)
    L, P = system.levels, law.alpha.shape[0]

    def step(y, dt):
        def stage(carry, coef):
            slope, total = carry
            k = ode_drift(y + coef[0] * dt * slope, load, ratio, law, policy, system)
            return (k, total + coef[1] * k), k

        (_, total), slopes = jax.lax.scan(stage, (jnp.zeros_like(y), jnp.zeros_like(y)), coefs)
        return y + dt * total, slopes[0]

    def body(_, y):
        new, slope = step(y, h)
        if kinked:
            new, _ = _split_at_filling(
                lambda z, dt: (step(z, dt)[0], None), y, h, new, None, slope, law, L, P
            )
            return _onto_full(jnp.clip(new, 0.0, 1.0), law, L, P)
        return jnp.clip(new, 0.0, 1.0)

    return jax.lax.fori_loop(0, n_steps, body, x)


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _linearize(x, load, ratio, law, policy, system):
    """The residual at ``x``, its Jacobian and the policy's :class:`Rates` there
    (the linear solve is on the host: cheaper to compile)."""

    def g(y):
        f, rt = _residual(y, load, ratio, law, policy, system)
        return f, (f, rt)

    jac, (f, rt) = jax.jacfwd(g, has_aux=True)(x)
    return f, jac, rt


def _newton_step(x, load, ratio, law, policy, system):
    f, jac, rt = _linearize(x, load, ratio, law, policy, system)
    f, jac = np.asarray(f), np.asarray(jac)
    try:
        dx = np.linalg.solve(jac, -f)
    except np.linalg.LinAlgError:
        dx = np.full_like(f, np.nan)
    return f, dx, rt


class FixedPoint(NamedTuple):
    """The phase-type mean-field fixed point and its metrics (host values, float64).

    Attributes:
        tail: ``(L + 1,)`` ``s_0..s_L``: the fraction of servers with at least ``k`` tasks.
        phase_counts: ``(L + 1, P)``: ``x[k, p]``, servers with exactly ``k``
            tasks whose task in service is in phase ``p`` (row 0 is zero: the
            idle fraction is ``1 - tail[1]``).
        iq_tail: ``(J + 1,)`` ``Q_0..Q_J`` for the JIQ family with many
            dispatchers, else None.
        mean_queue_length: ``sum_k k * P(k tasks) = sum_{k >= 1} s_k``.
        mean_response_time: Little's law, ``mean_queue_length / (lambda (1 - blocking))``,
            in the law's time unit (mean service times for a mean-1 law).
        p0: the probability that an arrival's dispatcher has an empty I-queue
            (JIQ family: ``1 - Q_1``, or with one dispatcher 1.0 if no server
            is idle else 0.0), else None.
        blocking_probability: ``level[L]`` with a finite buffer, else 0.0.
        status: a :class:`~jaxqueue.core.status.Status` (``CONVERGED``,
            ``MAX_ITERATIONS`` or ``NON_FINITE``), as the exponential fixed point.
        residual: max-norm of the residual (drift, with the conservation law) there.
        iterations: Newton iterations (residual evaluations) at the final level count.
        truncated: ``(s_L, Q_J)`` (``s_L`` with infinite buffers, else 0.0;
            ``Q_J`` 0.0 without I-queues): the mass at the bounds.
        levels: ``L``, the largest queue length represented.
        rates: the :class:`~jaxqueue.theory.meanfield.Rates` at the fixed point.
        service: the :class:`~jaxqueue.core.service.PhaseType` law (None with pools).
        pools: the :class:`ServerClasses` with pools, else None. Then the
            classes are pool and phase (``phase_counts`` has a column per
            class: pool ``i``'s phases from ``pools.base[i]``).
        seen_phase, seen_idle: where accepted arrivals find their servers,
            when it is not what ``phase_counts`` and ``rates`` give at a fixed
            point (averages over a periodic regime,
            :mod:`jaxqueue.theory.periodic`; a fixed point on a full level,
            where arrivals sent just below it join what completions leave,
            :func:`sliding`): ``seen_phase[k - 1, c]`` the
            fraction that join a server with ``k`` tasks (``k = 1..L-1``)
            whose task in service is of class ``c``, ``seen_idle[i]`` the
            fraction that join an idle server of pool ``i``. None: at a fixed
            point, from the state (the class in service is that of a uniformly
            chosen server of the level; an idle server's pool that of a
            uniformly chosen idle server). With them, :func:`as_result`'s
            mean response time is the mean of the response-time law they
            give (Little's law with the mean load holds over whole periods
            only).
    """

    tail: np.ndarray
    phase_counts: np.ndarray
    iq_tail: np.ndarray | None
    mean_queue_length: float
    mean_response_time: float
    p0: float | None
    blocking_probability: float
    status: Status
    residual: float
    iterations: int
    truncated: tuple
    levels: int
    rates: Rates
    service: PhaseType | None
    pools: ServerClasses | None = None
    seen_phase: np.ndarray | None = None
    seen_idle: np.ndarray | None = None


class Transient(NamedTuple):
    """The phase-type mean-field ODE at given times (host float64 arrays).

    Attributes:
        times: ``(T,)`` as given.
        tails: ``(T, L + 1)``: ``s_0..s_L`` at each time.
        phase_counts: ``(T, L + 1, P)``: ``x[k, p]`` at each time (row 0 zero).
        iq_tails: ``(T, J + 1)``: ``Q_0..Q_J`` (JIQ family with many
            dispatchers), else None.
    """

    times: np.ndarray
    tails: np.ndarray
    phase_counts: np.ndarray
    iq_tails: np.ndarray | None


# -- inputs -------------------------------------------------------------------


def _service(service) -> PhaseType:
    law = as_law(service)
    if law is None:
        raise TypeError("service must be a PhaseType or a string such as 'erlang:3', got None")
    return law


def _random_only(pol: Policy) -> bool:
    """Routing that ignores queue lengths: every server is its own M/PH/1 queue."""
    return pol.tail_bound() == (1, False) and not pol.uses_iqueues


def _check(policy, load, service, ratio, d, buffer, levels, pools=None):
    """Validated ``(classes, policy, load)``; errors name the parameter.

    ``service`` may be None with ``pools`` (exponential service at the pools' speeds).
    """
    classes = server_classes(_service(service) if pools is None else service, pools)
    pol = make(policy, d=d)
    if pol.per_server:
        exchangeable = [n for n in available() if policy_class(n).engine != "per-server"]
        what = "server pools" if pools is not None else "phase-type service"
        raise ValueError(
            f"policy {pol.name!r} is a per-server policy (its I-queues may list busy servers, so "
            f"its state is not exchangeable): {what} covers the exchangeable policies "
            f"({', '.join(exchangeable)})"
        )
    if pools is not None and pol.routes_by_speed and len({lw.mean for lw in classes.laws}) > 1:
        raise NotImplementedError(
            f"no mean field for {pol.name!r} with pools of different mean service times: it "
            "routes by expected wait, which the mean field of queue lengths does not cover"
        )
    if not is_real(load):
        raise TypeError(f"load must be a real number, got {load!r}")
    lam = float(load)
    if not (math.isfinite(lam) and 0.0 < lam <= 1e6):
        raise ValueError(f"load={load!r} is out of range: need 0 < load <= 1e6")
    if buffer is not None:
        check_int("buffer", buffer, 1, _MAX_LEVELS)
        if buffer * classes.n_classes > MAX_DENSE_LEVELS:
            raise ValueError(
                f"buffer={buffer} is out of range for the mean field by class: its state has "
                f"buffer x classes = {buffer * classes.n_classes} coordinates, solved densely "
                f"up to {MAX_DENSE_LEVELS}; need buffer <= {MAX_DENSE_LEVELS // classes.n_classes}"
                " (or simulate from init='empty')"
            )
    if levels is not None:
        check_int("levels", levels, 1, _MAX_LEVELS)
    if (
        buffer is None and lam >= classes.capacity
    ):  # capacity sum_i f_i / mean_i (one law: 1 / mean)
        need = (
            f"the load per server load * service mean = {lam * classes.laws[0].mean:.6g} "
            "must be < 1"
            if pools is None
            else "it must be below the pools' capacity "
            f"sum_i fraction_i * speed_i / mean_i = {classes.capacity:.6g}"
        )
        raise ValueError(
            f"load={load} is out of range: with infinite buffers {need} "
            "(give a finite buffer otherwise)"
        )
    worst = max(lam * lw.mean for lw in classes.laws)
    if buffer is None and _random_only(pol) and worst >= 1.0:  # (with one pool: caught above)
        raise ValueError(
            f"load={load} is out of range for {pol.name!r} with pools: routing at random "
            f"loads a pool's servers to {worst:.6g} >= 1 (its queues grow without bound; "
            "give a finite buffer otherwise)"
        )
    if ratio is not None:
        try:
            r = float(ratio)
        except (TypeError, ValueError):
            raise TypeError(f"ratio must be a number or None, got {ratio!r}") from None
        if not r > 0:  # also NaN
            raise ValueError(f"ratio={ratio!r} is out of range: need ratio > 0 (or None)")
    return classes, pol, lam


def _dt(classes: ServerClasses, lam: float, pol: Policy, system: System, ratio) -> float:
    """An RK4 step with ``h * (largest total rate out of a coordinate) <= 1.25``.

    The Jacobian's Gershgorin discs are centred at ``-a`` with radius about
    ``a`` (rates out balance rates in), and RK4 is stable on the disc of centre
    ``-c`` and radius ``c`` for ``c <= 1.3``: this covers the defective
    Erlang chains (a Jordan block, whose pseudospectrum fills that disc), which
    a step of ``2.5 / rate`` would not.
    """
    d = int(pol.options().get("d", 1) or 1)
    fastest = max(lw.rate for lw in classes.laws) + lam * (d + 1)
    if system.iqueue_levels:  # I-queue sizes move at about r (lambda + 1) per unit time
        fastest += float(ratio) * (lam + 1.0)
    return min(0.1, 1.25 / fastest)


def mph1_tail_decay(load: float, law: PhaseType) -> float:
    """The geometric decay rate ``eta`` of the M/PH/1 queue-length tail, ``P(Q >= k) ~ C eta**k``,
    at arrival rate ``load`` (``load * law.mean < 1``).

    ``eta = lambda / (lambda + theta)`` with ``theta > 0`` the root of
    ``E[exp(theta X)] = 1 + theta / lambda`` (the pole of the queue-length
    generating function of the M/G/1 queue), found by bisection below the
    decay rate of ``S``.
    """
    S, a = law.matrix, np.asarray(law.alpha)
    exits = law.exit_rates
    P = law.n_phases
    top = -float(np.max(np.linalg.eigvals(S).real))

    def excess(theta):
        mgf = a @ np.linalg.solve(-S - theta * np.eye(P), exits)
        return mgf - 1.0 - theta / load

    lo, hi = 0.0, top * (1.0 - 1e-12)
    if excess(hi) <= 0:
        theta = top
    else:
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
        theta = 0.5 * (lo + hi)
    return load / (load + theta)


def _initial_levels(pol: Policy, lam: float, classes: ServerClasses, level_tol: float) -> int:
    """The first level count of the adaptive search (infinite buffers)."""
    if _random_only(pol):  # Random: M/PH/1 queues (one per pool)
        eta = max(mph1_tail_decay(lam, lw) for lw in classes.laws)
        need = math.log(level_tol) / math.log(eta) + 16 if 0 < eta < 1 else DEFAULT_LEVELS
        return max(DEFAULT_LEVELS, round8(need))
    return DEFAULT_LEVELS


def _empty_start(L: int, P: int, system: System, ratio) -> np.ndarray:
    """All servers idle; with many dispatchers, ``r`` idle servers listed per I-queue."""
    J = system.iqueue_levels
    x = np.zeros(L * P + J)
    if J:
        r = float(ratio)
        whole = min(int(r), J)
        x[L * P : L * P + whole] = 1.0
        if whole < J:
            x[L * P + whole] = r - int(r)
    return x


# -- solving ------------------------------------------------------------------


def _newton(x, lam, r, lawa, pol, system, tol, max_newton):
    """Newton with backtracking on the max-norm of the residual; x stays in [0, 1]."""
    status, it = Status.MAX_ITERATIONS, 0
    x = np.asarray(x, np.float64)
    f, dx, rt = _newton_step(x, lam, r, lawa, pol, system)
    res = float(np.max(np.abs(f)))
    for it in range(1, max_newton + 1):  # noqa: B007 (the count is returned)
        if not (math.isfinite(res) and np.all(np.isfinite(dx))):
            status = Status.NON_FINITE
            break
        if res < tol:
            status = Status.CONVERGED
            break
        step = 1.0
        while True:
            y = np.clip(x + step * dx, 0.0, 1.0)
            fy, dy, ry_rates = _newton_step(y, lam, r, lawa, pol, system)
            ry = float(np.max(np.abs(fy)))
            if ry < res or step < 1.0 / 64 or not math.isfinite(ry):
                break
            step *= 0.5
        x, f, dx, res, rt = y, fy, dy, ry, ry_rates
    else:
        if res < tol:
            status = Status.CONVERGED
    return x, status, it, res, Rates(*(np.asarray(v, np.float64) for v in rt))


def _solve(lawa, lam, r, pol, system, ratio, start, warmup_time, dt, tol, max_newton):
    """Newton from ``start``, or from the end of an ODE run from the empty system;
    if Newton fails from there, the ODE runs four times as long again and Newton
    restarts from its end. JSQ-like routing whose run ends on a full level
    (above capacity, with a finite buffer) has no zero of Newton's drift there:
    the sliding flow settles on the fixed point instead (:func:`_settle`), as it
    does where Newton fails."""
    if start is not None:
        return _newton(jnp.asarray(start, jnp.float64), lam, r, lawa, pol, system, tol, max_newton)
    L, P = system.levels, int(lawa.alpha.shape[0])
    kinked = meanfield.kinked(pol, system)
    x = jnp.asarray(_empty_start(L, P, system, ratio), jnp.float64)
    out = None
    for run in (warmup_time, 4.0 * warmup_time):
        steps = int(math.ceil(run / dt))
        if steps > 0:
            x = _advance(x, steps, jnp.float64(run / steps), lam, r, lawa, pol, system)
        if kinked and float(jnp.sum(x[: L * P])) >= 1.0 - _FULL:  # on a full level
            return _settle(x, lam, r, lawa, pol, system, dt, tol)
        out = _newton(x, lam, r, lawa, pol, system, tol, max_newton)
        if out[1] is Status.CONVERGED or steps == 0:
            break
    if kinked and out[1] is not Status.CONVERGED:
        return _settle(x, lam, r, lawa, pol, system, dt, tol)
    return out


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _sliding_at(x, load, ratio, law, policy, system):
    """:func:`sliding` compiled, with the max-norm of its drift."""
    sl = sliding(x, load, ratio, law, policy, system)
    return sl, jnp.max(jnp.abs(sl.drift))


#: Time units per ODE run of :func:`_settle`, and the most runs.
_SETTLE_TIME, _SETTLE_RUNS = 100.0, 20


def _settle(x, lam, r, lawa, pol, system, dt, tol):
    """Run the sliding ODE until its drift is below ``tol``: what :func:`_newton`
    returns (``MAX_ITERATIONS`` if it does not settle; the count is of runs)."""
    steps = int(math.ceil(_SETTLE_TIME / dt))
    res, status, it = math.inf, Status.MAX_ITERATIONS, 0
    for it in range(1, _SETTLE_RUNS + 1):  # noqa: B007 (the count is returned)
        x = _advance(x, steps, jnp.float64(_SETTLE_TIME / steps), lam, r, lawa, pol, system)
        sl, res = _sliding_at(x, lam, r, lawa, pol, system)
        res = float(res)
        if res < tol:
            status = Status.CONVERGED
            break
    return (
        np.asarray(x, np.float64),
        status,
        it,
        res,
        Rates(*(np.asarray(v, np.float64) for v in sl.rates)),
    )


def _seen_on_level(x, lam, r, lawa, pol, system):
    """``(seen_phase, seen_idle)`` of :class:`FixedPoint` for JSQ-like routing on a
    full level, where the arrivals sent just below it join the classes completions
    leave there (:func:`sliding`), not those of the level's (empty) state; None
    off a full level (or for other policies), where the state says."""
    L, P = system.levels, int(lawa.alpha.shape[0])
    if not meanfield.kinked(pol, system) or float(np.sum(x[: L * P])) < 1.0 - _FULL:
        return None, None
    sl, _ = _sliding_at(jnp.asarray(x, jnp.float64), lam, r, lawa, pol, system)
    level = np.asarray(sl.rates.level, np.float64)
    seen = level[:L] / level[:L].sum()
    share, pick = np.asarray(sl.share, np.float64), np.asarray(sl.pick, np.float64)
    return seen[1:, None] * share[: L - 1], seen[0] * pick


def fixed_point(
    policy,
    load: float,
    service,
    ratio: float | None = None,
    *,
    d: int | None = None,
    buffer: int | None = None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    tol: float = 1e-12,
    level_tol: float = LEVEL_TOL,
    warmup_time: float = 20.0,
    dt: float | None = None,
    max_newton: int = 50,
    pools=None,
) -> FixedPoint:
    """Fixed point of the phase-type mean field (float64: x64 is switched on for the call).

    Args:
        policy: an exchangeable policy's name or :class:`~jaxqueue.policies.Policy`
            (options via ``d``); the per-server JIQ-Original and JIQ-Threshold
            are refused.
        load: ``lambda``, arrivals per server per unit time (``> 0``; the load
            per server ``lambda * service.mean`` must be ``< 1`` unless
            ``buffer`` is given).
        service: a :class:`~jaxqueue.core.service.PhaseType`, or its
            command-line form for :func:`~jaxqueue.core.service.parse_service`
            (``"erlang:3"``, ``"hyperexp:4"``, ...).
        ratio: ``r = N / M`` for the JIQ family; None (or inf) for one dispatcher.
        d: probes (``pod``, ``jiq-pod``, ``jiq-sq``, ``idle-first``).
        buffer: places per server, or None (infinite buffers).
        levels: the largest queue length represented (tails ``s_0..s_levels``).
            None: ``buffer`` with a finite buffer, else adaptive (module
            docstring): grown until ``s_levels <= level_tol`` or the state
            would pass :data:`MAX_STATE` coordinates (then a warning).
        iqueue_levels: the largest I-queue size represented (default
            :func:`jaxqueue.theory.meanfield.default_iqueue_levels`); its mass ``Q_J``
            is reported in ``truncated``.
        tol: residual at which Newton stops.
        level_tol: the tail mass at the bound the adaptive level count aims below.
        warmup_time, dt: the ODE run (RK4) that gives Newton its start (if
            Newton fails from there, the run goes on for ``4 * warmup_time``
            and Newton starts again; ``warmup_time=0``: Newton from the empty
            system). ``dt`` default: about ``1.25 / (largest rate)``, at most 0.1.
        max_newton: Newton steps at most (per level count).
        pools: servers of several speeds (and laws): ``"F1:S1,F2:S2"``,
            ``(fraction, speed)`` pairs or :class:`~jaxqueue.core.service.Pool`
            objects (see :func:`server_classes`; the module docstring, "Server
            pools"). ``service`` may then be None (exponential service).
            Infinite buffers need ``load`` below the pools' capacity.

    Raises:
        ValueError: an invalid ``service``, ``load``, ``ratio``, ``buffer``,
            ``levels`` or ``pools``, or a per-server policy.
        TypeError: a ``service`` that is neither a PhaseType nor a string.
        NotImplementedError: a policy without a mean field, or one that routes
            by the pools' speeds (``jsew``).
    """
    classes, pol, lam = _check(policy, load, service, ratio, d, buffer, levels, pools)
    P = classes.n_classes
    adaptive = levels is None and buffer is None
    if adaptive:
        levels = _initial_levels(pol, lam, classes, level_tol)
        levels = max(1, min(levels, MAX_STATE // P))
    pol, system = _policy_and_system(pol, ratio, d, buffer, levels, iqueue_levels)
    one_r = float(ratio) if system.iqueue_levels else 1.0
    start = None
    with host_float64():
        lawa = law_arrays(classes)
        lam64, r64 = jnp.float64(lam), jnp.float64(one_r)
        while True:
            step = _dt(classes, lam, pol, system, one_r) if dt is None else float(dt)
            x, status, it, res, rt = _solve(
                lawa, lam64, r64, pol, system, ratio, start, warmup_time, step, tol, max_newton
            )
            if start is not None and status is not Status.CONVERGED:  # the extension failed
                x, status, it, res, rt = _solve(
                    lawa, lam64, r64, pol, system, ratio, None, warmup_time, step, tol, max_newton
                )
            L = system.levels
            X = np.asarray(x[: L * P]).reshape(L, P)
            tail = tail_of(X)
            if not adaptive or status is not Status.CONVERGED or tail[L] <= level_tol:
                break
            grown = min(grown_levels(tail, L, level_tol), MAX_STATE // P)
            if grown <= L:
                warnings.warn(
                    f"phases.fixed_point: the tail mass at levels={L} is {tail[L]:.3g} > "
                    f"level_tol={level_tol:g}, and more levels would pass MAX_STATE={MAX_STATE} "
                    f"coordinates ({P} classes); pass levels to choose",
                    stacklevel=2,
                )
                break
            start = extend_levels(np.asarray(x), L, grown, P, system.iqueue_levels)
            pol, system = _policy_and_system(pol, ratio, d, buffer, grown, iqueue_levels)
        q = np.asarray(x[L * P :], np.float64)
        seen = _seen_on_level(np.asarray(x, np.float64), lam64, r64, lawa, pol, system)
    return _summarize(pol, lam, classes, system, X, tail, q, rt, buffer, status, res, it, seen)


def _fixed_point_of(
    classes: ServerClasses,
    pol: Policy,
    lam: float,
    ratio,
    system: System,
    tol: float = 1e-12,
    warmup_time: float = 20.0,
    max_newton: int = 50,
) -> FixedPoint:
    """The fixed point on ``system``'s bounds, for validated settings (no level
    search): the start of the periodic solver (:mod:`jaxqueue.theory.periodic`)."""
    one_r = float(ratio) if system.iqueue_levels else 1.0
    L, P = system.levels, classes.n_classes
    with host_float64():
        lawa = law_arrays(classes)
        step = _dt(classes, lam, pol, system, one_r)
        lam64, r64 = jnp.float64(lam), jnp.float64(one_r)
        x, status, it, res, rt = _solve(
            lawa, lam64, r64, pol, system, ratio, None, warmup_time, step, tol, max_newton
        )
        x = np.asarray(x, np.float64)
        seen = _seen_on_level(x, lam64, r64, lawa, pol, system)
    X = x[: L * P].reshape(L, P)
    tail = tail_of(X)
    return _summarize(
        pol, lam, classes, system, X, tail, x[L * P :], rt, system.buffer, status, res, it, seen
    )


def _summarize(
    pol,
    lam,
    classes: ServerClasses,
    system,
    X,
    tail,
    q,
    rt,
    buffer,
    status,
    res,
    it,
    seen=(None, None),
) -> FixedPoint:
    L, J = system.levels, system.iqueue_levels
    counts = np.concatenate([np.zeros((1, X.shape[1])), X], axis=0)
    iq_tail = np.concatenate([[1.0], q]) if J else None
    blocked = float(rt.level[L]) if buffer is not None else 0.0
    mql = float(tail[1:].sum())
    accepted = lam * (1.0 - blocked)
    mrt = mql / accepted if accepted > 0 else math.inf
    if J:
        p0 = float(1.0 - q[0])
    elif pol.uses_iqueues:  # one dispatcher: its I-queue is empty iff no server is idle,
        p0 = float(1.0 - rt.level[0])  # so p0 is the share of arrivals that join none
    else:
        p0 = None
    truncated = (float(tail[L]) if buffer is None else 0.0, float(q[-1]) if J else 0.0)
    return FixedPoint(
        tail,
        counts,
        iq_tail,
        mql,
        mrt,
        p0,
        blocked,
        Status(status),
        float(res),
        int(it),
        truncated,
        L,
        rt,
        classes.laws[0] if not classes.given else None,
        classes if classes.given else None,
        *seen,
    )


def transient(
    policy,
    load: float,
    service,
    ratio: float | None = None,
    *,
    times,
    start=None,
    d: int | None = None,
    buffer: int | None = None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    dt: float | None = None,
    pools=None,
) -> Transient:
    """The phase-type mean-field ODE by RK4, recorded at ``times``.

    Arguments as for :func:`fixed_point`, except:

    Args:
        times: non-decreasing times ``>= 0`` (a sequence or 1-D array); each
            interval is split into equal RK4 steps of at most ``dt``, so the
            states are at exactly these times.
        start: None (the empty system: every server idle, ``r`` idle servers
            listed per I-queue), a :class:`FixedPoint` of the same setting, or
            the flat state ``[x[1..L, :].ravel(), Q_1..Q_J]``.
        levels: the largest queue length represented (no adaptivity here):
            default ``buffer``, else the first level count of
            :func:`fixed_point`'s search (or the FixedPoint's given as ``start``).

    Returns:
        A :class:`Transient`.
    """
    classes, pol, lam = _check(policy, load, service, ratio, d, buffer, levels, pools)
    P = classes.n_classes
    t = np.asarray(times, np.float64)
    if (
        t.ndim != 1
        or t.size == 0
        or not np.all(np.isfinite(t))
        or np.any(t < 0)
        or np.any(np.diff(t) < 0)
    ):
        raise ValueError(
            "times must be a non-empty 1-D sequence of finite, non-decreasing times >= 0"
        )
    if isinstance(start, FixedPoint) and levels is None and buffer is None:
        levels = start.levels
    if levels is None and buffer is None:
        levels = min(_initial_levels(pol, lam, classes, LEVEL_TOL), max(1, MAX_STATE // P))
    pol, system = _policy_and_system(pol, ratio, d, buffer, levels, iqueue_levels)
    L, J = system.levels, system.iqueue_levels
    one_r = float(ratio) if J else 1.0
    dim = L * P + J
    if start is None:
        x0 = _empty_start(L, P, system, ratio)
    elif isinstance(start, FixedPoint):
        if (
            start.phase_counts.shape != (L + 1, P)
            or (start.iq_tail is None) != (J == 0)
            or (J and start.iq_tail.size != J + 1)
        ):
            raise ValueError(
                f"start: a FixedPoint with levels={start.levels} and "
                f"{start.phase_counts.shape[1]} phases does not match levels={L}, "
                f"{P} phases, iqueue_levels={J}"
            )
        x0 = np.concatenate(
            [start.phase_counts[1:].reshape(-1), start.iq_tail[1:] if J else np.zeros(0)]
        )
    else:
        x0 = np.asarray(start, np.float64)
        if x0.shape != (dim,):
            raise ValueError(
                f"start must have shape ({dim},) (levels * phases + iqueue_levels), got {x0.shape}"
            )
    step = _dt(classes, lam, pol, system, one_r) if dt is None else float(dt)
    out = np.empty((t.size, dim))
    with host_float64():
        lawa = law_arrays(classes)
        lam64, r64 = jnp.float64(lam), jnp.float64(one_r)
        x, now = jnp.asarray(x0, jnp.float64), 0.0
        for i, ti in enumerate(t):
            n = int(math.ceil((ti - now) / step - 1e-9)) if ti > now else 0
            if n:
                x = _advance(x, n, jnp.float64((ti - now) / n), lam64, r64, lawa, pol, system)
            now = ti
            out[i] = np.asarray(x)
    X = out[:, : L * P].reshape(t.size, L, P)
    counts = np.concatenate([np.zeros((t.size, 1, P)), X], axis=1)
    occ = X.sum(axis=2)
    tails = np.concatenate([np.ones((t.size, 1)), np.cumsum(occ[:, ::-1], axis=1)[:, ::-1]], axis=1)
    iq = np.concatenate([np.ones((t.size, 1)), out[:, L * P :]], axis=1) if J else None
    return Transient(t, tails, counts, iq)


def as_result(
    fp: FixedPoint, policy, load: float, ratio: float | None, *, buffer: int | None = None
) -> MeanFieldResult:
    """A :class:`~jaxqueue.theory.result.MeanFieldResult` from a phase-type fixed point.

    ``arrival_seen[k]`` is the law of the tasks an accepted arrival finds. The
    server it joins, given ``k >= 1``, is in phase ``p`` with probability
    ``x[k, p] / sum_p x[k, p]``, which gives the joint law of ``(k, p)`` and
    so the whole response-time law (the residual of the phase in service,
    ``k - 1`` services, its own; :func:`jaxqueue.results.response.ph_response_terms`)
    and its quantiles. The mean is Little's; the settings record the law.
    The diagnostic ``phase_occupancy`` is ``x`` itself, ``(L + 1, P)``: the
    fraction of servers with ``k`` tasks whose task is in phase ``p`` (a
    simulation's mean-field start splits each level's servers by it).

    With pools, ``phase_occupancy`` has a column per class (pool and phase),
    the response law is the mixture over the pools (each with its law at its
    speed), the settings record ``pools`` as ``{"fraction", "speed",
    "service"}`` (``service``: the law the pool's servers follow, at speed
    1), and the pools' metrics are filled in
    (:func:`jaxqueue.results.pools.pool_metrics`): ``pool_occupancy``,
    ``(pools, L + 1)``, the fraction of each pool's servers with exactly
    ``k`` tasks, and each pool's share of the arrivals, utilization, mean
    queue length, mean response time, waiting probability and response-time
    quantiles.
    """
    pol = make(policy)
    law, rt = fp.service, fp.rates
    s = np.asarray(fp.tail, np.float64)
    L = s.size - 1
    level = np.asarray(rt.level, np.float64)
    seen = level[:L] / level[:L].sum()
    counts = np.asarray(fp.phase_counts, np.float64)
    if fp.seen_phase is None:
        x = counts[1:L]  # k = 1..L-1
        share = np.divide(
            x,
            x.sum(axis=1, keepdims=True),
            out=np.zeros_like(x),
            where=x.sum(axis=1, keepdims=True) > 0,
        )
        seen_phase = seen[1:, None] * share
    else:
        seen_phase = np.asarray(fp.seen_phase, np.float64)
    if fp.pools is None:
        quantiles = ph_response_quantiles(law, seen, seen_phase, QUANTILES)
    else:
        quantiles, by_pool = _pool_response(fp.pools, seen, seen_phase, counts, fp.seen_idle)
    mean_response = fp.mean_response_time
    if fp.seen_phase is not None:  # averages over a window's arrivals: the mixture's mean
        if fp.pools is None:
            mean_response = float(ph_response_mean(law, seen, seen_phase))
        else:
            share = np.asarray(by_pool["pool_arrival_share"], np.float64)
            times = np.asarray(by_pool["pool_mean_response_time"], np.float64)
            mean_response = float(np.sum(np.where(share > 0, share * times, 0.0)))
    seen_all = np.append(seen, 0.0)
    occupancy = s - np.concatenate([s[1:], [0.0]])
    q = fp.iq_tail
    accepted = load * (1.0 - fp.blocking_probability)
    join = accepted * seen[0] if pol.uses_iqueues else 0.0  # servers that become idle
    result = build(
        pol,
        load=load,
        ratio=ratio,
        d=int(pol.options().get("d", 1)),
        buffer=buffer,
        tail=s,
        occupancy=occupancy,
        arrival_seen=seen_all,
        mean_queue_length=fp.mean_queue_length,
        mean_response_time=mean_response,
        waiting_probability=1.0 - seen[0],
        blocking_probability=fp.blocking_probability,
        p0=fp.p0,
        iqueue_distribution=(q - np.concatenate([q[1:], [0.0]])) if q is not None else None,
        join_rate=join,
        delete_rate=load * float(rt.deletes),
        probe_rate=load * float(rt.probes) + join * float(rt.join_probes),
        response_quantiles=quantiles,
        status=fp.status,
        tail_remainder=fp.truncated[0],
        iqueue_remainder=fp.truncated[1],
    )
    # x[k, c]: the joint law of (queue length, class in service), what a simulation starts from
    result.diagnostics["phase_occupancy"] = counts.tolist()
    if fp.pools is None:
        result.settings["service"] = law.to_dict()
    else:
        result.settings["pools"] = [
            {"fraction": f, "speed": v, "service": lw.scaled(lw.mean * v).to_dict()}
            for f, v, lw in zip(fp.pools.fractions, fp.pools.speeds, fp.pools.laws)
        ]
        result = dataclasses.replace(result, **result_fields(by_pool))
    return result


def _pool_response(pools: ServerClasses, seen, seen_phase, counts, seen_idle=None):
    """Response-time quantiles with pools, and each pool's metrics.

    An accepted arrival that finds ``k >= 1`` tasks joins class ``c`` with
    probability ``seen[k] * x[k, c] / n_k`` (``seen_phase``); one that finds
    none joins an idle server of pool ``i`` with probability ``seen[0] *
    idle_i / idle`` (or ``seen_idle[i]`` where given). Each pool's part is the
    response law of its own law at its speed
    (:func:`jaxqueue.results.response.ph_mixture_quantiles`).

    Returns:
        ``(quantiles, metrics)``: the pools' metrics
        (:func:`jaxqueue.results.pools.pool_metrics`); ``pool_occupancy``
        ``(pools, L + 1)``, row ``i`` the fraction of pool ``i``'s servers
        with exactly ``k`` tasks.
    """
    fracs = np.asarray(pools.fractions)
    busy = np.array(
        [counts[1:, b : b + lw.n_phases].sum(axis=1) for b, lw in zip(pools.base, pools.laws)]
    )  # (I, L) fractions of all servers
    idle = np.maximum(fracs - busy.sum(axis=1), 0.0)
    occupancy = np.concatenate([idle[:, None], busy], axis=1) / fracs[:, None]
    components = []
    for i, (b, lw) in enumerate(zip(pools.base, pools.laws)):
        if seen_idle is not None:
            first = float(seen_idle[i])
        else:
            first = seen[0] * idle[i] / idle.sum() if idle.sum() > 0 else 0.0
        phase = seen_phase[:, b : b + lw.n_phases]  # (L - 1, P_i): k = 1..L-1
        found = np.concatenate([[first], phase.sum(axis=1)])
        components.append((float(found.sum()), lw, found, phase))
    total = sum(c[0] for c in components)
    components = [(w / total, lw, f, p) for w, lw, f, p in components]
    return ph_mixture_quantiles(components, QUANTILES), pool_metrics(components, occupancy)
