"""The exponential mean field's model: its state, routing laws, drift and sliding flow.

The state is ``[s_1..s_L, Q_1..Q_J]`` (tails of the queue lengths, then of the
I-queue sizes); the laws of where an arrival goes are the policy's own
decision rule summed over the law of its random outcomes. Derivation:
docs/theory.md, "The generic mean field".
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from jaxqueue.core.system import System
from jaxqueue.policies import Dispatchers, Policy, View

__all__ = [
    "Rates",
    "Sliding",
    "INSIDE",
    "limit_system",
    "split_state",
    "marginal",
    "law_of",
    "expect",
    "outcome_grid",
    "view_of",
    "rates",
    "arrival_law",
    "drift",
    "drift_from_rates",
    "kinked",
    "sliding",
    "split_at_filling",
    "cut_step",
    "cut_at_full",
    "ode_drift",
    "iqueue_gap",
    "default_iqueue_levels",
]

#: The stand-in N of the limit's System: it only has to make M = N / r valid.
_LIMIT_SERVERS = (2**31 - 1) // 256


def limit_system(
    policy: Policy, ratio: float | None, levels: int, iqueue_levels: int, buffer: int | None = None
) -> System:
    """A stand-in System for the limit: many servers, one or many dispatchers.

    ``ratio = None`` or ``inf`` means one dispatcher (its I-queue holds every
    idle server), as does a single-dispatcher policy or one without I-queues.
    Several dispatchers are always ``N // 2`` of them, whatever the ratio: the
    limit's laws only ask whether there is one dispatcher or several (the
    ratio enters the computations as a traced value), so every ratio shares
    one compiled program.
    """
    single = (
        ratio is None or math.isinf(ratio) or not policy.uses_iqueues or policy.single_dispatcher
    )
    n = _LIMIT_SERVERS
    m = 1 if single else n // 2
    iq = 0 if single else iqueue_levels
    return System(n, m, buffer, buffer if buffer is not None else levels, iq)


def split_state(x, system: System):
    """The state ``x`` as the tails ``(s, q)``, each with its leading 1; in
    NumPy for a NumPy ``x`` (the host side of :func:`fixed_point`), else in jnp."""
    xp = np if isinstance(x, np.ndarray) else jnp
    L, J = system.levels, system.iqueue_levels
    one = xp.ones((1,), x.dtype)
    s = xp.concatenate([one, x[:L]])
    q = xp.concatenate([one, x[L : L + J]]) if J else one
    return s, q


class Rates(NamedTuple):
    """Laws and rates at one state (fractions; per server per unit time)."""

    level: jax.Array  # (L + 1,) law of the queue length an arrival's server has
    iq_remove: jax.Array  # (J + 1,) law of the size of the I-queue losing a listed server
    join: jax.Array  # (J + 1,) law of the size of the I-queue a newly idle server joins
    deletes: jax.Array  # expected delete requests per arrival
    probes: jax.Array  # expected probes per arrival
    join_probes: jax.Array  # expected probes per join


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _contract(laws, keys, values, size):
    """``sum`` over the outcome grid of ``prod(laws) * values``, by integer key (``size`` keys).

    Multilinear in the laws. Its JVP (below) is not pushed through the grid
    once per tangent: the derivative in law ``i`` is the matrix of the same
    sums keyed by ``(key, outcome i)``, one pass over the grid for any number
    of tangents, times the tangents. So ``jax.jacfwd`` of the drift costs a
    few passes over the grid instead of one per state coordinate, and second
    derivatives (the refined mean field) a few more: the rule applies to itself.
    """
    shape = jnp.broadcast_shapes(jnp.shape(keys), jnp.shape(values), *(w.shape for w in laws))
    w = functools.reduce(jnp.multiply, laws, values)
    w = jnp.broadcast_to(w, shape).reshape(-1)
    k = jnp.broadcast_to(keys, shape).reshape(-1)
    return jax.ops.segment_sum(w, k, num_segments=size)


def _contract_jvp(size, primals, tangents):
    laws, keys, values = primals
    out = _contract(laws, keys, values, size)
    dout = jnp.zeros_like(out)
    for i, (law, dlaw) in enumerate(zip(laws, tangents[0])):
        if isinstance(dlaw, SymbolicZero):
            continue
        n = law.size
        which = jnp.arange(n, dtype=jnp.int32).reshape(law.shape)  # outcome i on the grid
        others = tuple(laws[:i]) + tuple(laws[i + 1 :])
        m = _contract(others, keys * n + which, values, size * n).reshape(size, n)
        dout = dout + m @ dlaw.reshape(n)
    return out, dout


_contract.defjvp(_contract_jvp, symbolic_zeros=True)


def marginal(outcomes_law, *functions):
    """The laws with each outcome that none of ``functions`` depends on summed out.

    The outcome arrays are broadcast (outcome ``i`` along axis ``i``), so a
    function of them has size 1 along the axes of the outcomes it ignores.
    Summing such a law first (its total, kept as a size-1 law) shrinks the
    grid :func:`_contract` walks: JIQ's level law, for one, needs the server
    and dispatcher outcomes but not the listed server a delete request hits.
    """
    k = len(outcomes_law)
    dep = jnp.broadcast_shapes(*(jnp.shape(f) for f in functions))
    dep = (1,) * (k - len(dep)) + tuple(dep)
    return tuple(
        law if dep[i] > 1 or law.size == 1 else jnp.sum(law).reshape((1,) * k)
        for i, law in enumerate(outcomes_law)
    )


def law_of(outcomes_law, values, size):
    """Law of an integer function of independent outcomes: segment-sum of weights."""
    one = jnp.ones((), outcomes_law[0].dtype)
    values = jnp.asarray(values, jnp.int32)
    return _contract(marginal(outcomes_law, values), values, one, size)


def expect(outcomes_law, values):
    """Expectation of a function of independent outcomes."""
    values = jnp.asarray(values, outcomes_law[0].dtype)
    return _contract(marginal(outcomes_law, values), jnp.zeros((), jnp.int32), values, 1)[0]


def outcome_grid(draws, view, system, population=None):
    """The outcome grid of a policy's draws: outcome arrays and their laws, broadcast.

    ``population``: ``None`` for the limit laws, or ``(1 / N, 1 / M)`` for the
    laws of a finite system (:meth:`~jaxqueue.policies.Draw.finite_law`).
    """
    laws, outs = [], []
    k = len(draws)
    for i, draw in enumerate(draws):
        if population is None:
            law = draw.law(view, system)
        else:
            law = draw.finite_law(view, system, *population)
        shape = [1] * k
        shape[i] = law.shape[0]
        laws.append(law.reshape(shape))
        outs.append(jnp.arange(law.shape[0], dtype=jnp.int32).reshape(shape))
    return laws, tuple(outs)


def view_of(x, system: System) -> View:
    s, q = split_state(x, system)
    return View(tail=s, iq_tail=q, iq_listed=None, idle=1.0 - s[1])


def rates(x, policy: Policy, system: System, population=None) -> Rates:
    """The arrival and join laws of ``policy`` at state ``x`` in the limit.

    ``population``: ``None`` (the limit), or ``(1 / N, 1 / M)``: the laws of
    a system of ``N`` servers and ``M`` dispatchers at the same fractions
    (probes of distinct servers or I-queues; used by
    :mod:`jaxqueue.theory.finite_n.refined` for the ``1 / N`` term of the drift).
    """
    view = view_of(x, system)
    L, J = system.levels, system.iqueue_levels
    laws, outs = outcome_grid(policy.draws(system), view, system, population)
    route = policy.decide(view, outs, system)
    mean = functools.partial(expect, laws)
    level = law_of(laws, jnp.minimum(route.level, L), L + 1)
    iq_remove = law_of(laws, jnp.minimum(route.iq_remove, J), J + 1)
    jlaws, jouts = outcome_grid(policy.join_draws(system), view, system, population)
    if jlaws:
        size, jprobes = policy.decide_join(view, jouts, system)
        join = law_of(jlaws, jnp.minimum(size, J), J + 1)
        join_probes = expect(jlaws, jprobes)
    else:
        join, join_probes = jnp.zeros(J + 1, x.dtype), jnp.zeros((), x.dtype)
    return Rates(level, iq_remove, join, mean(route.deletes), mean(route.probes), join_probes)


def arrival_law(x, policy: Policy, system: System, population=None) -> jax.Array:
    """Joint law of an arrival's ``(level, iq_remove)`` at state ``x``: ``(L + 1, J + 1)``.

    Its row sums are ``rates(...).level`` and its column sums
    ``rates(...).iq_remove`` (the same outcome grid); the joint law gives the
    jumps of the population process (:mod:`jaxqueue.theory.finite_n.refined`), where
    one arrival can move both an ``s`` and a ``Q`` coordinate.
    """
    view = view_of(x, system)
    L, J = system.levels, system.iqueue_levels
    laws, outs = outcome_grid(policy.draws(system), view, system, population)
    route = policy.decide(view, outs, system)
    joint = jnp.minimum(route.level, L) * (J + 1) + jnp.minimum(route.iq_remove, J)
    return law_of(laws, joint, (L + 1) * (J + 1)).reshape(L + 1, J + 1)


def drift(x, load, ratio, policy: Policy, system: System, population=None) -> jax.Array:
    """``dx/dt`` of the mean-field ODE (``x = [s_1..s_L, Q_1..Q_J]``).

    ``population``: ``None`` for the limit, or ``(1 / N, 1 / M)`` for the
    drift of a finite system at the same fractions (see :func:`rates`).
    """
    return drift_from_rates(x, load, ratio, rates(x, policy, system, population), system)


def drift_from_rates(x, load, ratio, rt: Rates, system: System) -> jax.Array:
    """:func:`drift` given the :class:`Rates` at ``x`` (for callers that need both)."""
    s, _ = split_state(x, system)
    L, J = system.levels, system.iqueue_levels
    s_next = jnp.concatenate([s[1:], jnp.zeros((1,), x.dtype)])
    ds = load * rt.level[:L] - (s[1:] - s_next[1:])  # arrivals at level k-1 < L are accepted
    if not J:
        return ds
    idle_rate = s[1] - s[2] if L >= 2 else s[1]
    dq = ratio * (idle_rate * rt.join[:J] - load * rt.iq_remove[1:])
    return jnp.concatenate([ds, dq])


#: How far below 1 a full level is read to get the law "a server below it exists".
INSIDE = 2.0**-40


def kinked(policy: Policy, system: System) -> bool:
    """Whether ``policy`` routes on whether a count is zero in ``system``
    (:meth:`~jaxqueue.policies.Policy.mean_field_kink`): its drift jumps where
    a level fills, and the ODE slides along that boundary (:func:`sliding`)."""
    return policy.mean_field_kink(system) is not None


class Sliding(NamedTuple):
    """The drift at a state where the routing may jump (see :func:`sliding`).

    Attributes:
        drift: ``dx/dt``; its component along a boundary it slides on is 0.
        rates: the :class:`Rates` of the arrivals (the mix of the two laws).
        inside: the weight ``alpha`` of the law read just below the boundary.
        state: the state (clipped to ``[0, 1]``), read as on the boundary.
        below: the same state with the boundary's level read as below 1.
    """

    drift: jax.Array
    rates: Rates
    inside: jax.Array
    state: jax.Array
    below: jax.Array


def sliding(x, load, ratio, policy: Policy, system: System) -> Sliding:
    """The drift of a JSQ-like policy, with the sliding motion along a full level.

    A policy that routes on whether some server has fewer than ``k`` tasks
    (JSQ's shortest queue, an idle server first, I1F's server with one task)
    has a drift that jumps where ``s_k`` reaches 1. In the finite system the
    number of servers with fewer than ``k`` tasks is then a fast birth-death
    process: it grows as servers at level ``k`` finish a task and shrinks as
    arrivals are sent there. In the limit it is positive a fraction
    ``alpha`` of the time, the one that holds ``s_k`` at 1:
    ``alpha * a + (1 - alpha) * b = 0`` with ``a > 0`` the drift of ``s_k``
    under the law read just below 1 and ``b < 0`` under the law at 1
    (Filippov's convex combination). Arrivals follow the mix of the two laws
    in these proportions. With ``a <= 0`` the state leaves the boundary (the
    law below 1 applies); off the boundary this is :func:`drift`. ``k`` is
    the highest full level (``s_1 = .. = s_k = 1``): below it no server can
    appear while level ``k`` is full.

    Without this, an explicit integrator alternates between the two laws
    from step to step and the clip at 1 drops the arrivals of the steps that
    overshoot: a peak of the load above 1 then builds far shorter queues than
    the system does.
    """
    L = system.levels
    y = jnp.clip(x, 0.0, 1.0)
    top = jnp.sum(jnp.cumprod(y[:L] >= 1.0))  # s_1 .. s_top are 1
    on = top > 0
    k = jnp.maximum(top - 1, 0)
    below = y.at[k].set(jnp.where(on, 1.0 - INSIDE, y[k]))
    r_at, r_below = rates(y, policy, system), rates(below, policy, system)
    f_at = drift_from_rates(y, load, ratio, r_at, system)
    f_below = drift_from_rates(y, load, ratio, r_below, system)
    a, b = f_below[k], f_at[k]
    slide = on & (a > 0.0) & (b < 0.0)
    alpha = jnp.where(
        slide, -b / jnp.where(slide, a - b, 1.0), jnp.where(on & (a <= 0.0), 1.0, 0.0)
    )
    rt = jax.tree_util.tree_map(lambda u, v: alpha * u + (1.0 - alpha) * v, r_below, r_at)
    f = alpha * f_below + (1.0 - alpha) * f_at  # the drift is affine in the rates
    f = jnp.where(slide, f.at[k].set(0.0), f)
    return Sliding(f, rt, alpha, y, below)


def split_at_filling(step, x, h, new, extra, slope, system: System, fill_error: bool = False):
    """An ODE step of a JSQ-like policy, cut where it fills a level.

    ``step(y, h) -> (y', extra)`` is one unclipped RK4 step of length ``h``
    (``extra``: what it integrates besides the state, or ``None``); ``new``
    and ``extra`` are its result from ``x``, ``slope`` the drift at ``x``.
    Where the lowest level that is not full (``s_k < 1``) reaches 1 within
    the step, the sliding drift takes over part way: a whole step would mix
    the two regimes in its stages, and clipping its end at 1 would drop the
    arrivals beyond it (an error of order ``h`` each time a level fills).
    The step is instead cut at the time the level reaches 1 along ``slope``:
    one step up to it, the level set to 1, one step on, their ``extra``
    summed (an error of order ``h**2``). The two parts are one loop over a
    single ``step``, which compiles it once rather than twice. ``fill_error``:
    ``extra`` is the step's error estimate, and what setting the level to 1
    moves counts in it (a cut time read off ``slope`` that is too far off
    then shortens the step, :func:`jaxqueue.theory.generic.solvers.integrate`).
    """
    L = system.levels
    fill = lambda y, k: jnp.clip(y, 0.0, 1.0).at[k].set(1.0)  # noqa: E731
    return cut_at_full(step, x, h, new, extra, x[:L], slope, 1.0, fill, fill_error)


def cut_at_full(step, x, h, new, extra, tails, slopes, full, fill, fill_error: bool):
    """:func:`cut_step` where the lowest level that is not full fills within the step
    (:func:`split_at_filling`'s arguments): ``tails`` ``s_1..s_L`` at ``x``,
    ``slopes`` their drift (a level is full from ``full``), ``fill(y, k)``: ``y``
    with ``s_{k+1}`` set full (this module's and :mod:`~jaxqueue.theory.generic.byclass`'s
    steps)."""
    L = tails.size
    top = jnp.sum(jnp.cumprod(tails >= full))  # s_1 .. s_top are full
    k = jnp.minimum(top, L - 1)
    gap, rise = 1.0 - tails[k], h * slopes[k]
    crossed = (top < L) & (rise > gap)
    cut = gap / jnp.maximum(rise, 1e-300)
    return cut_step(step, x, h, new, extra, crossed, cut, lambda y: fill(y, k), fill_error)


def cut_step(step, x, h, new, extra, crossed, theta, fill, fill_error: bool = False):
    """``(new, extra)``, or where ``crossed`` the step from ``x`` cut at
    ``theta * h`` (clipped to [0, 1]): ``step`` up to there, ``fill`` of the
    state it reaches (the level set full), ``step`` on to ``h``, their
    ``extra`` summed (:func:`split_at_filling`; ``extra`` None: nothing
    integrated besides the state). The two parts are one loop over a single
    ``step``, which compiles it once rather than twice. ``fill_error``: what
    ``fill`` moves is added to ``extra`` (an error estimate)."""
    theta = jnp.clip(theta, 0.0, 1.0)
    none = extra is None
    extra = jnp.zeros((), x.dtype) if none else extra

    def part(carry, first):
        y, total = carry
        end, more = step(y, jnp.where(first, theta * h, (1.0 - theta) * h))
        filled = jnp.where(first, fill(end), end)
        if fill_error:
            more = more + jnp.abs(filled - end)
        end = filled
        return (end, jax.tree_util.tree_map(jnp.add, total, 0.0 if none else more)), None

    def split(_):
        return jax.lax.scan(
            part, (x, jax.tree_util.tree_map(jnp.zeros_like, extra)), jnp.array([True, False])
        )[0]

    new, extra = jax.lax.cond(crossed, split, lambda _: (new, extra), None)
    return new, None if none else extra


def ode_drift(x, load, ratio, policy: Policy, system: System) -> jax.Array:
    """The right-hand side the ODE is integrated with: :func:`sliding` for a
    JSQ-like policy (:func:`kinked`), else :func:`drift`."""
    if kinked(policy, system):
        return sliding(x, load, ratio, policy, system).drift
    return drift(x, load, ratio, policy, system)


def iqueue_gap(x, ratio, system: System):
    """``sum_j Q_j / r - (1 - s_1)``: zero where the I-queues list exactly the idle
    servers (the JIQ family's conservation law, which the drift keeps)."""
    return jnp.sum(x[system.levels :]) / ratio - (1.0 - x[0])


def default_iqueue_levels(policy: Policy, ratio) -> int:
    """The largest I-queue size represented when none is given.

    ``max(30, 4 r + 10)``: a JIQ I-queue's size is about geometric with mean
    ``r (1 - lambda)``. Where a newly idle server joins the shortest of
    ``d >= 2`` I-queues (JIQ-SQ(d), the policy's own join draws say so) the
    sizes are balanced: none passes the ``r`` each I-queue holds at the
    empty start by more than a few, and above the mean the tail falls
    doubly exponentially, so ``max(30, r + 30)`` (the same fixed point to
    1e-15 at ``r = 100``, ten times faster: the outcome grid grows as
    ``J^2``). The mass at the bound is reported either way (``truncated``).
    """
    if ratio is None or math.isinf(float(ratio)):
        return 30  # one dispatcher: no I-queue levels (limit_system)
    r = float(ratio)
    balanced = False
    if policy.uses_iqueues:
        joins = policy.join_draws(limit_system(policy, r, 1, 1))
        balanced = bool(joins) and all(isinstance(j, Dispatchers) and j.d >= 2 for j in joins)
    return max(30, int(r) + 30) if balanced else max(30, int(4 * r) + 10)
