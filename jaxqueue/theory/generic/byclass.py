"""The mean field by class's model: its state, drift and sliding flow.

The state is ``[x[1..L, :].ravel(), Q_1..Q_J]``: ``x[k, c]`` the fraction of
servers with ``k`` tasks whose task in service is of class ``c`` (a pool and
a phase, :mod:`jaxqueue.theory.generic.classes`), then the I-queue tails. The
routing laws are those of :mod:`jaxqueue.theory.generic.exponential` on the
queue-length tails. Derivation: docs/theory.md, "The mean field by class".
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.system import System
from jaxqueue.policies import Policy
from jaxqueue.theory.generic.classes import ClassLaw
from jaxqueue.theory.generic.exponential import INSIDE, Rates, cut_at_full, kinked, rates

__all__ = [
    "FULL",
    "Sliding",
    "split_classes",
    "class_tails",
    "tail_of",
    "flat_state",
    "drift",
    "drift_and_rates",
    "joined",
    "class_drift",
    "sliding",
    "onto_full",
    "split_at_filling",
    "ode_drift",
    "iqueue_gap",
]


_TINY = 1e-100


def split_classes(x, L: int, P: int):
    """``x[1..L, :]`` as an ``(L, P)`` array, and ``Q_1..Q_J``."""
    return x[: L * P].reshape(L, P), x[L * P :]


def class_tails(X):
    """``s_1..s_L`` from the phase counts ``x[1..L, :]`` (a triangular product: cheaper
    to compile and differentiate than a cumulative sum)."""
    L = X.shape[0]
    above = jnp.arange(L)[:, None] >= jnp.arange(L)[None, :]  # level j counts in s_k, k <= j
    return jnp.sum(X, axis=1) @ above.astype(X.dtype)


def tail_of(X) -> np.ndarray:
    """``s_0..s_L`` (host float64) from the phase counts ``x[1..L, :]``."""
    X = np.asarray(X, np.float64)
    return np.concatenate([[1.0], np.cumsum(X.sum(axis=1)[::-1])[::-1]])


def flat_state(X, q):
    """The state of :mod:`jaxqueue.theory.generic.meanfield`: ``[s_1..s_L, Q_1..Q_J]``."""
    return jnp.concatenate([class_tails(X), q])


def drift(x, load, ratio, law: ClassLaw, policy: Policy, system: System) -> jax.Array:
    """``dx/dt`` of the mean field by class (``x = [x[1..L, :].ravel(), Q_1..Q_J]``).

    ``law`` holds the classes as arrays (:func:`law_arrays` of a law or of
    :class:`ServerClasses`): ``alpha``, the block-diagonal ``S`` at the pools'
    speeds, each pool's ``alpha`` and share, and ``mix``: the class given to a
    server chosen at a level that holds no mass, where the rule is 0/0 (the
    in-service mix ``alpha (-S)^-1``, normalised, weighted by the pools'
    shares); ``system`` a limit System
    (:func:`jaxqueue.theory.generic.meanfield.limit_system`). See the module docstring.
    """
    return drift_and_rates(x, load, ratio, law, policy, system)[0]


def joined(X, law: ClassLaw):
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


def drift_and_rates(x, load, ratio, law, policy, system):
    L = system.levels
    P = law.alpha.shape[0]
    X, q = split_classes(x, L, P)
    rt = rates(flat_state(X, q), policy, system)
    share, pick = joined(X, law)
    return class_drift(X, q, load, ratio, law, rt, share, pick), rt


def class_drift(X, q, load, ratio, law, rt, share, pick):
    """``dx/dt`` given the policy's routing law ``rt`` and where the server an
    arrival joins is (``share``, ``pick``: as :func:`joined`); affine in ``rt``."""
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
FULL = 1e-12


class Sliding(NamedTuple):
    """The drift by class at a state where JSQ-like routing may jump (:func:`sliding`).

    Attributes:
        drift: ``dx/dt``; its levels below a full level it slides on do not move.
        rates: the :class:`~jaxqueue.theory.generic.meanfield.Rates` of the arrivals (the mix of the two laws).
        share, pick: where the server an arrival joins is, as :func:`joined`,
            with the level just below a full one (or the idle servers below
            ``s_1 = 1``) read as the servers a completion has just put there.
        inside: the weight of the law read just below the full level.
        state, below: the queue-length state ``[s_1..s_L, Q_1..Q_J]`` read
            on the full level and just below it (as
            :class:`jaxqueue.theory.generic.meanfield.Sliding`).
    """

    drift: jax.Array
    rates: Rates
    share: jax.Array
    pick: jax.Array
    inside: jax.Array
    state: jax.Array
    below: jax.Array


def sliding(x, load, ratio, law: ClassLaw, policy: Policy, system: System) -> Sliding:
    """The drift by class of a JSQ-like policy, with the sliding motion along a full level.

    As :func:`jaxqueue.theory.generic.meanfield.sliding` (Filippov's convex
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
    X, q = split_classes(x, L, P)
    s = class_tails(X)
    top = jnp.sum(jnp.cumprod(s >= 1.0 - FULL))  # s_1 .. s_top are full
    on = top > 0
    k = jnp.maximum(top - 1, 0)  # s_top's index, X's row of level top
    idx = jnp.arange(L)
    at = jnp.concatenate([jnp.where(idx < top, 1.0, jnp.clip(s, 0.0, 1.0)), q])
    below = at.at[k].set(jnp.where(on, 1.0 - INSIDE, at[k]))
    r_at, r_below = rates(at, policy, system), rates(below, policy, system)
    # JSQ-like routing empties the lowest busy level at a finite rate: an RK4 stage can
    # overshoot it, and a level's share x[k, c] / n_k of mixed signs would be unbounded
    share, pick = joined(jnp.maximum(X, 0.0), law)
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
    f = class_drift(X, q, load, ratio, law, rt, share, pick)  # affine in the rates
    still = jnp.repeat(slide & (idx < k), P)  # the empty levels below the full one
    f = f.at[: L * P].set(jnp.where(still, 0.0, f[: L * P]))
    return Sliding(f, rt, share, pick, alpha, at, below)


def _fill(x, k, law: ClassLaw, L: int, P: int):
    """``x`` with ``s_{k+1}`` made exactly full: the servers left at levels
    ``1..k`` keep their class and join level ``k + 1``, and each pool's idle
    servers (or its excess, a small negative idle fraction) join it in the
    phases its ``alpha`` starts (or in the level's own mix of that pool). A
    step cut where a level fills ends at an error of order ``h**2`` from 1:
    this moves that much."""
    X, q = split_classes(x, L, P)
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


def onto_full(x, law: ClassLaw, L: int, P: int):
    """``x`` with the servers below its highest full level (``s_1 .. s_top``
    within :data:`FULL` of 1) moved onto it (:func:`_fill`): the state a
    step ends in, for JSQ-like routing. Where the levels below are empty
    (as the sliding drift keeps them) this moves rounding only. A level
    that empties as JSQ-like routing drains it has a class mix that
    changes ever faster (arrivals leave it at ``lambda x[k, c] / n_k`` a
    class), which an RK4 step at its end can overshoot: the clip at 0 then
    adds a little mass that this takes back."""
    s = class_tails(split_classes(x, L, P)[0])
    top = jnp.sum(jnp.cumprod(s >= 1.0 - FULL))
    return jnp.where(top > 0, _fill(x, jnp.maximum(top - 1, 0), law, L, P), x)


def split_at_filling(
    step, x, h, new, extra, slope, law: ClassLaw, L: int, P: int, fill_error: bool = False
):
    """An ODE step by class cut where it fills a level (as
    :func:`jaxqueue.theory.generic.exponential.split_at_filling`, with :func:`_fill`
    making the level exactly full)."""
    s, rises = (class_tails(split_classes(v, L, P)[0]) for v in (x, slope))
    fill = lambda y, k: _fill(jnp.clip(y, 0.0, 1.0), k, law, L, P)  # noqa: E731
    return cut_at_full(step, x, h, new, extra, s, rises, 1.0 - FULL, fill, fill_error)


def ode_drift(x, load, ratio, law: ClassLaw, policy: Policy, system: System) -> jax.Array:
    """The right-hand side the ODE by class is integrated with: :func:`sliding`
    for a JSQ-like policy (:func:`jaxqueue.theory.kinked`), else :func:`drift`."""
    if kinked(policy, system):
        return sliding(x, load, ratio, law, policy, system).drift
    return drift(x, load, ratio, law, policy, system)


def iqueue_gap(x, ratio, L: int, P: int):
    """``sum_j Q_j / r - (1 - s_1)`` by class (``s_1 = sum x``): zero where the
    I-queues list exactly the idle servers
    (:func:`jaxqueue.theory.generic.meanfield.iqueue_gap` of the exponential state)."""
    X, q = split_classes(x, L, P)
    return jnp.sum(q) / ratio - (1.0 - jnp.sum(X))
