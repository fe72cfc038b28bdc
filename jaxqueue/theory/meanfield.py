"""Generic mean field, derived from the policies' own rules.

A policy routes on a few random outcomes (its :class:`~jaxqueue.policies.Draw`
objects) through one decision function (``decide``). The simulator samples
the outcomes exactly from random words; here, in the limit ``N, M -> infinity``
with ``r = N / M`` fixed, each outcome has a law given by the occupancy
fractions, and the *same* decision function, evaluated on the grid of all
outcomes, gives the law of where an arrival goes. So the drift cannot drift
apart from the simulator.

State: ``s_k`` (k = 1..L), the fraction of servers with at least ``k`` tasks,
and, for the JIQ family with many dispatchers, ``Q_j`` (j = 1..J), the fraction
of dispatchers listing at least ``j`` servers. ``L`` is ``levels``, the largest
queue length represented (as the simulator's ``System.levels``), so tails have
``L + 1`` entries ``s_0..s_L``. Time is in units of the mean service time
(:data:`jaxqueue.core.system.SERVICE_RATE` is 1, so a server with tasks
completes one at rate 1). Per unit time:

* ``ds_k/dt = lambda * P(an arrival is accepted at a server with k-1 tasks)
  - (s_k - s_{k+1})``;
* ``dQ_j/dt = r * [(s_1 - s_2) * P(a newly idle server joins an I-queue of
  size j-1) - lambda * P(an arrival takes a listed server from an I-queue of
  size j)]``.

The fixed point is found by damped Newton with ``jax.jacobian`` from the end
of an ODE run (RK4), with the conservation law of the JIQ family (the
I-queues list exactly the idle servers, ``sum_j Q_j / r = 1 - s_1``) in place
of one equation. JIQ-SQ(d) with several dispatchers starts Newton instead
from its fixed point reduced to one unknown, ``p0`` (:func:`_jiq_sq_start`):
the ODE run is unstable there past ``r`` of about 30, and Newton from its
end crawled one I-queue level per step (not converging past ``r`` of about
500 at ``lambda = 0.9``). :func:`transient` integrates the ODE itself. For
the closed forms of :mod:`jaxqueue.theory.closed_forms` this reproduces them (tested); it
also gives JIQ-SQ(d) (whose fluid limit Mitzenmacher studies in "Analyzing
Distributed Join-Idle-Queue: A Fluid Limit Approach", arXiv:1606.01833), I1F,
idle-first-else-JSQ(d) and finite buffers. :func:`as_result` turns a fixed
point into a :class:`~jaxqueue.theory.result.MeanFieldResult`.

JSQ-like policies (:func:`kinked`: JSQ, I1F, an idle server first with one
dispatcher) route on whether some server has fewer than ``k`` tasks, so
their drift jumps where ``s_k`` reaches 1. Above capacity (a load step or a
profile's peak past 1, or ``lambda >= 1`` with a finite buffer) the state
slides along that full level: :func:`sliding` gives the drift there (the
mix of the two routings that holds ``s_k`` at 1), the ODE integrators use
it, and a step that fills a level is cut where it fills
(:func:`split_at_filling`). A fixed point on a full level is not a zero of
Newton's drift; :func:`fixed_point` then runs the sliding ODE until it
settles. Where neither converges the status says so
(``Status.MAX_ITERATIONS`` or ``Status.NON_FINITE``) rather than giving a
wrong answer.

Within :mod:`jaxqueue.theory` this module depends on
:mod:`jaxqueue.theory.result` only, never on the closed forms:
:func:`jaxqueue.theory.mean_field` chooses between the two.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from jaxqueue.core.host import host_float64
from jaxqueue.core.status import Status
from jaxqueue.core.system import MAX_SERVERS, System, check_int
from jaxqueue.policies import JIQSQ, Dispatchers, Policy, View, make
from jaxqueue.results.response import erlang_mixture_mean, erlang_mixture_quantile
from jaxqueue.results.schema import QUANTILES
from jaxqueue.theory.result import MeanFieldResult, build

__all__ = [
    "Rates",
    "FixedPoint",
    "Sliding",
    "DEFAULT_LEVELS",
    "LEVEL_TOL",
    "MAX_AUTO_LEVELS",
    "MAX_DENSE_LEVELS",
    "limit_system",
    "drift",
    "drift_from_rates",
    "rates",
    "arrival_law",
    "kinked",
    "sliding",
    "ode_drift",
    "fixed_point",
    "transient",
    "as_result",
    "iqueue_gap",
    "round8",
    "grown_levels",
    "extend_levels",
    "default_iqueue_levels",
    "working_bytes",
    "check_work",
    "MAX_WORKING_BYTES",
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


def _split(x, system: System):
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


def _marginal(outcomes_law, *functions):
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


def _law_of(outcomes_law, values, size):
    """Law of an integer function of independent outcomes: segment-sum of weights."""
    one = jnp.ones((), outcomes_law[0].dtype)
    values = jnp.asarray(values, jnp.int32)
    return _contract(_marginal(outcomes_law, values), values, one, size)


def _expect(outcomes_law, values):
    """Expectation of a function of independent outcomes."""
    values = jnp.asarray(values, outcomes_law[0].dtype)
    return _contract(_marginal(outcomes_law, values), jnp.zeros((), jnp.int32), values, 1)[0]


def _grid(draws, view, system, population=None):
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


def _view(x, system: System) -> View:
    s, q = _split(x, system)
    return View(tail=s, iq_tail=q, iq_listed=None, idle=1.0 - s[1])


def rates(x, policy: Policy, system: System, population=None) -> Rates:
    """The arrival and join laws of ``policy`` at state ``x`` in the limit.

    ``population``: ``None`` (the limit), or ``(1 / N, 1 / M)``: the laws of
    a system of ``N`` servers and ``M`` dispatchers at the same fractions
    (probes of distinct servers or I-queues; used by
    :mod:`jaxqueue.theory.refined` for the ``1 / N`` term of the drift).
    """
    view = _view(x, system)
    L, J = system.levels, system.iqueue_levels
    laws, outs = _grid(policy.draws(system), view, system, population)
    route = policy.decide(view, outs, system)
    expect = functools.partial(_expect, laws)
    level = _law_of(laws, jnp.minimum(route.level, L), L + 1)
    iq_remove = _law_of(laws, jnp.minimum(route.iq_remove, J), J + 1)
    jlaws, jouts = _grid(policy.join_draws(system), view, system, population)
    if jlaws:
        size, jprobes = policy.decide_join(view, jouts, system)
        join = _law_of(jlaws, jnp.minimum(size, J), J + 1)
        join_probes = _expect(jlaws, jprobes)
    else:
        join, join_probes = jnp.zeros(J + 1, x.dtype), jnp.zeros((), x.dtype)
    return Rates(level, iq_remove, join, expect(route.deletes), expect(route.probes), join_probes)


def arrival_law(x, policy: Policy, system: System, population=None) -> jax.Array:
    """Joint law of an arrival's ``(level, iq_remove)`` at state ``x``: ``(L + 1, J + 1)``.

    Its row sums are ``rates(...).level`` and its column sums
    ``rates(...).iq_remove`` (the same outcome grid); the joint law gives the
    jumps of the population process (:mod:`jaxqueue.theory.refined`), where
    one arrival can move both an ``s`` and a ``Q`` coordinate.
    """
    view = _view(x, system)
    L, J = system.levels, system.iqueue_levels
    laws, outs = _grid(policy.draws(system), view, system, population)
    route = policy.decide(view, outs, system)
    joint = jnp.minimum(route.level, L) * (J + 1) + jnp.minimum(route.iq_remove, J)
    return _law_of(laws, joint, (L + 1) * (J + 1)).reshape(L + 1, J + 1)


def drift(x, load, ratio, policy: Policy, system: System, population=None) -> jax.Array:
    """``dx/dt`` of the mean-field ODE (``x = [s_1..s_L, Q_1..Q_J]``).

    ``population``: ``None`` for the limit, or ``(1 / N, 1 / M)`` for the
    drift of a finite system at the same fractions (see :func:`rates`).
    """
    return drift_from_rates(x, load, ratio, rates(x, policy, system, population), system)


def drift_from_rates(x, load, ratio, rt: Rates, system: System) -> jax.Array:
    """:func:`drift` given the :class:`Rates` at ``x`` (for callers that need both)."""
    s, _ = _split(x, system)
    L, J = system.levels, system.iqueue_levels
    s_next = jnp.concatenate([s[1:], jnp.zeros((1,), x.dtype)])
    ds = load * rt.level[:L] - (s[1:] - s_next[1:])  # arrivals at level k-1 < L are accepted
    if not J:
        return ds
    idle_rate = s[1] - s[2] if L >= 2 else s[1]
    dq = ratio * (idle_rate * rt.join[:J] - load * rt.iq_remove[1:])
    return jnp.concatenate([ds, dq])


#: How far below 1 a full level is read to get the law "a server below it exists".
_INSIDE = 2.0**-40


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
    below = y.at[k].set(jnp.where(on, 1.0 - _INSIDE, y[k]))
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


def split_at_filling(step, x, h, new, extra, slope, system: System):
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
    single ``step``, which compiles it once rather than twice.
    """
    L = system.levels
    top = jnp.sum(jnp.cumprod(x[:L] >= 1.0))  # s_1 .. s_top are 1
    k = jnp.minimum(top, L - 1)
    gap, rise = 1.0 - x[k], h * slope[k]
    crossed = (top < L) & (rise > gap)
    return cut_step(
        step,
        x,
        h,
        new,
        extra,
        crossed,
        gap / jnp.maximum(rise, 1e-300),
        lambda y: jnp.clip(y, 0.0, 1.0).at[k].set(1.0),
    )


def cut_step(step, x, h, new, extra, crossed, theta, fill):
    """``(new, extra)``, or where ``crossed`` the step from ``x`` cut at
    ``theta * h`` (clipped to [0, 1]): ``step`` up to there, ``fill`` of the
    state it reaches (the level set full), ``step`` on to ``h``, their
    ``extra`` summed (:func:`split_at_filling`; ``extra`` None: nothing
    integrated besides the state). The two parts are one loop over a single
    ``step``, which compiles it once rather than twice."""
    theta = jnp.clip(theta, 0.0, 1.0)
    none = extra is None
    extra = jnp.zeros((), x.dtype) if none else extra

    def part(carry, first):
        y, total = carry
        end, more = step(y, jnp.where(first, theta * h, (1.0 - theta) * h))
        end = jnp.where(first, fill(end), end)
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


def _residual(x, load, ratio, policy, system):
    f = drift(x, load, ratio, policy, system)
    if system.iqueue_levels:
        # the I-queues list exactly the idle servers: replaces the Q_1 equation
        f = f.at[system.levels].set(iqueue_gap(x, ratio, system))
    return f


def _rk4_step(x, load, ratio, dt, policy, system):
    """One RK4 step of the mean-field ODE (cut where it fills a level for
    JSQ-like routing: :func:`split_at_filling`), clipped to [0, 1]."""

    def f(x):
        return ode_drift(x, load, ratio, policy, system)

    def step(x, h):
        k1 = f(x)
        k2 = f(x + 0.5 * h * k1)
        k3 = f(x + 0.5 * h * k2)
        k4 = f(x + h * k3)
        return x + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4), None, k1

    new, _, slope = step(x, dt)
    if kinked(policy, system):
        new, _ = split_at_filling(lambda y, h: step(y, h)[:2], x, dt, new, None, slope, system)
    return jnp.clip(new, 0.0, 1.0)


@functools.partial(jax.jit, static_argnames=("policy", "system", "steps"))
def _rk4(x, load, ratio, dt, policy, system, steps):
    """``(x after steps, the state after each step)``: ``steps`` RK4 steps of ``dt``."""

    def body(x, _):
        x = _rk4_step(x, load, ratio, dt, policy, system)
        return x, x

    return jax.lax.scan(body, x, None, length=steps)


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _rk4_end(x, load, ratio, dt, steps, policy, system):
    """The state after ``steps`` RK4 steps of ``dt`` (both traced: the fixed
    point's start, the sliding flow's runs and any other length share one
    compiled program per policy and system, and no trajectory is kept)."""
    return jax.lax.fori_loop(
        0, steps, lambda _, y: _rk4_step(y, load, ratio, dt, policy, system), x
    )


#: :func:`rates` compiled, for the host side (not op by op: each op would compile on its own).
_rates_at = jax.jit(rates, static_argnames=("policy", "system"))


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _newton_step(x, load, ratio, policy, system):
    f = _residual(x, load, ratio, policy, system)
    jac = jax.jacobian(lambda y: _residual(y, load, ratio, policy, system))(x)
    dx = jnp.linalg.solve(jac, -f)
    return f, dx


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _sliding_rates(x, load, ratio, policy, system):
    return sliding(x, load, ratio, policy, system).rates


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _sliding_residual(x, load, ratio, policy, system):
    return jnp.max(jnp.abs(sliding(x, load, ratio, policy, system).drift))


#: Time units per ODE run of :func:`_settle`, and the most runs.
_SETTLE_TIME, _SETTLE_RUNS = 100.0, 20


def _settle(x, load, ratio, dt, policy, system, tol):
    """Run the sliding ODE until its drift is below ``tol``:
    ``(x, status, residual)`` (``MAX_ITERATIONS`` if it does not settle)."""
    steps = int(math.ceil(_SETTLE_TIME / dt))
    x = jnp.asarray(x, jnp.float64)
    res = math.inf
    for _ in range(_SETTLE_RUNS):
        x = _rk4_end(x, load, ratio, jnp.float64(dt), steps, policy, system)
        res = float(_sliding_residual(x, load, ratio, policy, system))
        if res < tol:
            return np.asarray(x), Status.CONVERGED, res
    return np.asarray(x), Status.MAX_ITERATIONS, res


def _empty_start(system: System, ratio) -> np.ndarray:
    x = np.zeros(system.levels + system.iqueue_levels)
    if system.iqueue_levels:  # all servers idle, r listed per I-queue
        x[system.levels : system.levels + min(int(ratio), system.iqueue_levels)] = 1.0
    return x


def _jiq_sq_tails(p0: float, load: float, L: int) -> tuple:
    """JIQ-SQ's tails ``s_1..s_L`` at a given ``p0`` (the truncated model: arrivals
    at a server with ``L`` tasks are left out) and ``s_1 - s_2``.

    An arrival takes a listed (idle) server with probability ``1 - p0``, else a
    random one, so ``s_k - s_{k+1} = (lambda p0)^(k-1) (s_1 - s_2)`` and the
    arrivals accepted at level 0 give ``s_1 - s_2 = lambda / (1 + lambda p0 S)``,
    ``S = sum_{k<L} (lambda p0)^k`` (JIQ's ``s_k = lambda^k p0^(k-1)`` as ``L``
    grows)."""
    a = float(load) * p0
    powers = a ** np.arange(L)
    e1 = float(load) / (1.0 + a * powers.sum())
    return np.cumsum((e1 * powers)[::-1])[::-1], e1


def _jiq_sq_iqueues(log_p0: float, c: float, ratio: float, d: int, J: int) -> np.ndarray:
    """JIQ-SQ(d)'s I-queue tails ``Q_0..Q_J`` at ``p0 = 1 - Q_1 = exp(log_p0)``.

    The flux across each cut ``j - 1 | j`` balances: joins to the shortest of
    ``d`` at rate ``r (s_1 - s_2) (Q_{j-1}^d - Q_j^d)`` against removals at
    rate ``r lambda (Q_j - Q_{j+1}) (1 + p0 j / r)`` (an arrival at its own
    I-queue, or a delete request that hits one of its ``j`` servers). With
    ``c = (s_1 - s_2) / lambda``, ``delta_j = Q_{j-1} - Q_j`` grows by
    ``c sum_i Q_{j-1}^i Q_j^(d-1-i) / (1 + p0 j / r)``, about ``d``, per level:
    summed from ``p0`` up, in logarithms (no cancellation, and no underflow:
    ``p0`` is about ``d^-(r (1 - lambda))``, 3e-25 at ``r = 800``, ``lambda =
    0.9``, far below the spacing of float64 near 1) while ``Q_j`` is large;
    past the drop the flux summed to infinity, ``Q_j = c Q_{j-1}^d / (1 + p0 j / r)`` (up to
    ``p0 / r`` times the tail beyond), which the forward sum would lose to
    cancellation.
    """
    p0 = math.exp(log_p0)  # 0 below 1e-308: then 1 - Q_j is too, until delta_j grows
    Q = np.zeros(J + 1)
    Q[0], Q[1] = 1.0, 1.0 - p0
    gone, log_delta, j = p0, log_p0, 1
    while j < J and Q[j] > 0.25:
        g = sum(Q[j - 1] ** i * Q[j] ** (d - 1 - i) for i in range(d))
        log_delta += math.log(c * g / (1.0 + p0 * j / ratio))
        gone += math.exp(log_delta)
        j += 1
        Q[j] = 1.0 - gone
    for j in range(j + 1, J + 1):  # noqa: B020 (continues after the loop above)
        Q[j] = c * max(Q[j - 1], 0.0) ** d / (1.0 + p0 * j / ratio)
    return Q


def _jiq_sq_start(pol: Policy, system: System, load, ratio) -> np.ndarray | None:
    """Newton's start for JIQ-SQ(d) with several dispatchers (any ``d``, load and
    buffer), or None for other policies and one dispatcher.

    The fixed point in one unknown, ``p0``: the tails given ``p0``
    (:func:`_jiq_sq_tails`, :func:`_jiq_sq_iqueues`) must list exactly the idle
    servers, ``sum_j Q_j = r (1 - s_1)``; the sum falls as ``p0`` grows (the
    I-queue sizes drop from near 1 to near 0 about ``log_d(1 / p0)`` levels
    up), so bisection on ``log p0`` finds it (to about 1e-8 in the state: the
    tail's ``p0 / r`` term is left out; Newton polishes). Instead of the ODE
    run: its RK4 steps are unstable where ``dt lambda r`` passes about 2.8
    (the I-queue equations are ``r`` times faster than the servers'), so past
    ``r`` of about 30 it ends at an arbitrary state (at ``r = 500``: ``s_1 = 0,
    s_2 = 1``, alternating ``Q_j`` in {0, 1}), from which Newton, its steps
    clipped to [0, 1], moved the I-queues' drop about one level a step (16
    steps at ``r = 100``, 49 of the 50 allowed at ``r = 500`` with a residual
    of ``lambda r`` meanwhile, none converging at ``r = 800`` or 1000); at
    ``r = 500`` the run also took 156 of the solve's 210 s.
    """
    if not (
        isinstance(pol, JIQSQ)
        and system.iqueue_levels
        and float(load) > 0.0
        and not kinked(pol, system)
    ):
        return None
    lam, r, L, J, d = float(load), float(ratio), system.levels, system.iqueue_levels, pol.d

    def excess(log_p0):
        s, e1 = _jiq_sq_tails(math.exp(log_p0), lam, L)
        q = _jiq_sq_iqueues(log_p0, e1 / lam, r, d, J)
        return q[1:].sum() - r * (1.0 - s[0]), s, q

    # 1 - Q_j grows at most d-fold a level: at this p0 the I-queues stay full past J
    lo, hi = -(J + 2) * math.log(d + 1.0) - 50.0, 0.0
    if excess(lo)[0] <= 0.0:  # not expected: J levels cannot hold r (1 - s_1) per I-queue
        return None
    while hi - lo > 1e-14 * max(1.0, -lo):
        mid = 0.5 * (lo + hi)
        if excess(mid)[0] > 0.0:
            lo = mid
        else:
            hi = mid
    _, s, q = excess(lo)
    return np.concatenate([s, q[1:]])


class FixedPoint(NamedTuple):
    """The generic mean-field fixed point and its metrics (host values).

    Attributes:
        tail: ``(L + 1,)`` ``s_0..s_L``.
        iq_tail: ``(J + 1,)`` ``Q_0..Q_J`` (``(1,)`` without I-queues).
        rates: the :class:`Rates` at the fixed point.
        residual: max-norm of the drift there.
        status: a :class:`~jaxqueue.core.status.Status`: ``CONVERGED``,
            ``MAX_ITERATIONS`` (Newton did not converge) or ``NON_FINITE`` (a
            non-finite Newton step); see the module notes.
        iterations: Newton steps taken.
        truncated: ``s_L`` (infinite buffers) and ``Q_J``: the mass at the bounds.
    """

    tail: np.ndarray
    iq_tail: np.ndarray
    rates: Rates
    residual: float
    status: Status
    iterations: int
    truncated: tuple


#: The first ``levels`` of the generic mean field's adaptive count (infinite buffers).
DEFAULT_LEVELS = 40
#: Default tail mass at the bound below which the adaptive level count stops growing.
LEVEL_TOL = 1e-12
#: Most levels the adaptive count of the exponential fixed point grows to.
MAX_AUTO_LEVELS = 2048
#: Most levels of a finite buffer's fixed point where the queues fill it (dense
#: Newton: a Jacobian of this order); below capacity only the levels the queues
#: reach are solved, whatever the buffer.
MAX_DENSE_LEVELS = 4096


def round8(n: float) -> int:
    """``n`` rounded up to a multiple of 8 (level counts share compiled shapes)."""
    return int(8 * math.ceil(n / 8))


def grown_levels(tail: np.ndarray, L: int, level_tol: float) -> int:
    """More levels for a solved tail ``s_0..s_L`` whose mass at the bound passes
    ``level_tol``, from its decay near (not at) the bound."""
    hi, lo = max(1, L - 4), max(1, L - 12)
    eta = (tail[hi] / tail[lo]) ** (1.0 / (hi - lo)) if tail[lo] > 0 and hi > lo else 0.0
    if not 0.0 < eta < 1.0:
        return 2 * L
    more = math.log(level_tol / max(tail[L], 1e-300)) / math.log(eta)
    return round8(L + max(8.0, 1.25 * more + 8))


def extend_levels(x, L_old: int, L_new: int, P: int, J: int) -> np.ndarray:
    """A state ``[x[1..L_old, :P].ravel(), Q_1..Q_J]`` at ``L_old`` levels (by
    class, ``P`` classes; ``P = 1`` is the tails ``s_1..s_L``) extended to
    ``L_new`` levels by its geometric tail decay: the start of a solve with more levels."""
    X = np.asarray(x[: L_old * P]).reshape(L_old, P)
    q = np.asarray(x[L_old * P :])
    base = max(1, L_old - 3)  # the last levels are distorted by the truncation
    n = X.sum(axis=1)
    lo = max(0, base - 1 - 4)
    eta = (n[base - 1] / n[lo]) ** (1.0 / (base - 1 - lo)) if n[lo] > 0 and base - 1 > lo else 0.5
    eta = min(max(eta, 0.0), 0.999)
    out = np.zeros((L_new, P))
    out[:base] = X[:base]
    k = np.arange(base, L_new) - (base - 1)
    out[base:] = X[base - 1][None, :] * (eta**k)[:, None]
    return np.concatenate([out.reshape(-1), q[:J]])


def _policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels):
    """The policy (``make(policy, d=d)``, with a mean field) and the limit System.

    Raises ValueError, before anything is compiled, for a policy that is not
    valid with the limit's one dispatcher (``ratio=None``: JIQ-SQ(d) with
    ``d >= 2``) and for a System whose working memory :func:`working_bytes`
    estimates past :data:`MAX_WORKING_BYTES`.
    """
    pol = make(policy, d=d)
    if pol.no_mean_field is not None:
        raise NotImplementedError(f"no mean field for policy {pol.name!r}: {pol.no_mean_field}")
    if pol.mean_field_kind() != "generic" and pol.closed_form() is None:
        raise NotImplementedError(
            f"policy {pol.name!r} has no generic mean field: its mean "
            f"field is {pol.mean_field_kind()!r}"
        )
    if "d" in pol.options():
        check_int("d", pol.options()["d"], 1, MAX_SERVERS)
    if levels is None:
        levels = DEFAULT_LEVELS if buffer is None else buffer
    elif buffer is not None and levels != buffer:
        raise ValueError(f"levels={levels} must equal buffer={buffer} for finite buffers")
    if iqueue_levels is None:
        iqueue_levels = default_iqueue_levels(pol, ratio)
    system = limit_system(pol, ratio, levels, iqueue_levels, buffer)
    if pol.uses_iqueues and system.n_dispatchers == 1:
        _check_one_dispatcher(pol, ratio, buffer)
    _check_work(pol, system, ratio)
    return pol, system


def _check_one_dispatcher(pol: Policy, ratio, buffer) -> None:
    """Refuse a policy of the JIQ family that is not valid with one dispatcher (the limit
    of ``ratio=None``) with the simulator's own message: JIQ-SQ(d) probes ``d`` distinct
    I-queues, so ``d >= 2`` needs ``M >= d`` (JIQ-Pod(d) with ``M = 1`` is idle-first)."""
    # d servers and one dispatcher: any bound on probes of servers holds (d <= N, or
    # d = N, JSQ), so only a bound on the dispatchers can fail
    n = max(1, int(pol.options().get("d", 1)))
    try:
        pol.validate(System(n, 1, buffer, buffer if buffer is not None else 1, 0))
    except ValueError as err:
        raise ValueError(
            f"{pol.label()} with ratio={ratio!r} is not valid: ratio=None (or inf) is one "
            f"dispatcher (M = 1), and {err}; give a ratio r = N / M for several dispatchers, "
            f"or d=1"
        ) from None


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


#: The most working memory (bytes) a generic mean-field solve may be estimated
#: to take before it is refused, before anything is compiled (raise it on a
#: machine with more). See :func:`working_bytes`. JIQ-SQ(2) at ``lambda = 0.9``
#: (40 levels) passes it up to ``r`` of about 790; measured on 2 CPU cores
#: (from :func:`_jiq_sq_start`), ``r = 500`` solves in 4 s, ``r = 780`` in 6 s,
#: and past the bound ``r = 1000`` in 10 s (1.9 GB peak, 1.6 GiB estimated) and
#: ``r = 2000`` in 30 s (6.5 GB peak). (From the ODE run, before: 3.5 min at
#: ``r = 500``, and no convergence at 800 or 1000 after 6 and 9 min.)
MAX_WORKING_BYTES = 2**30


def _grid_entries(policy: Policy, system: System) -> int:
    """The most entries of an outcome grid :func:`rates` walks: the product of the
    law sizes of the arrival's draws, or of the join's (shapes only: nothing runs)."""
    n = system.levels + system.iqueue_levels
    x = jax.ShapeDtypeStruct((n,), jnp.float32)
    most = 1
    for draws in (policy.draws(system), policy.join_draws(system)):
        entries = 1
        for draw in draws:
            shape = jax.eval_shape(lambda y, draw=draw: draw.law(_view(y, system), system), x)
            entries *= max(1, math.prod(shape.shape))
        most = max(most, entries)
    return most


def working_bytes(policy: Policy, system: System) -> int:
    """Estimated working memory of the generic mean field on ``system``, in bytes.

    Every drift evaluation sums the policy's decision over the grid of its
    draws' outcomes (:func:`rates`): for the JIQ family ``(L + 1)(J + 1)^2``
    entries (a random server's queue length, the dispatcher's I-queue size,
    the I-queue of the idle server a delete request hits), so with ``J``
    growing with the ratio the memory grows as ``L r^2``. A Newton step
    takes about 38 bytes an entry (the grid's float64 weights and int32 keys,
    and the derivative's pass keyed by outcome), the ODE's steps 12, and the
    dense Jacobian and its solve ``24 (L + J + 1)^2``: XLA's own count for
    the compiled Newton step (``memory_analysis``) is 37.4 to 37.9 bytes an
    entry for JIQ-SQ(2) at ``(L, J) = (40, 130), (40, 330), (200, 130)``, and
    24.0 ``(L + 1)^2`` for Pod(2) at ``L = 2000``. Peak RSS of JIQ-SQ(2) at
    ``r = 1000`` (``J = 1030``): 1.9 GB, against 1.6 GiB here (plus the
    interpreter's 0.3 GB). At ``J = 40010`` (``r = 10^4`` with ``J = 4 r +
    10``) XLA asked for one buffer of 788 GB.
    """
    L, J = system.levels, system.iqueue_levels
    return 38 * _grid_entries(policy, system) + 24 * (L + J + 1) ** 2


def _check_work(pol: Policy, system: System, ratio) -> None:
    """Refuse, before compiling, a solve estimated past :data:`MAX_WORKING_BYTES`."""
    need = working_bytes(pol, system)
    if need > MAX_WORKING_BYTES:
        if system.iqueue_levels:
            grows = "; the I-queue levels grow with the ratio, the grid as ratio^2"
            advice = "use a smaller ratio (r = N / M)"
        else:
            grows, advice = "", "give fewer levels"
        shown = "None" if ratio is None else f"{float(ratio):g}"
        raise ValueError(
            f"the mean field of {pol.label()} at ratio={shown} with levels={system.levels} "
            f"and iqueue_levels={system.iqueue_levels} would take about {need / 2**30:.1f} GiB "
            f"of working memory (its outcome grid has {_grid_entries(pol, system):.3g} "
            f"entries{grows}), more than MAX_WORKING_BYTES = {MAX_WORKING_BYTES / 2**30:.1f} "
            f"GiB; {advice}, simulate from init='empty', or raise "
            f"jaxqueue.theory.meanfield.MAX_WORKING_BYTES on a machine with more memory"
        )


def check_work(
    policy,
    ratio: float | None = None,
    *,
    d: int | None = None,
    buffer: int | None = None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
) -> int:
    """The working memory (bytes) :func:`fixed_point` is estimated to take at its first
    level count (:func:`working_bytes`), or a ValueError past :data:`MAX_WORKING_BYTES`
    (also one for a policy not valid with one dispatcher at ``ratio=None``), without
    compiling or solving anything: a simulation's ``init='auto'`` asks it first."""
    pol, system = _policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels)
    return working_bytes(pol, system)


def fixed_point(
    policy,
    load: float,
    ratio: float | None = None,
    *,
    d: int | None = None,
    buffer: int | None = None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    tol: float = 1e-12,
    warmup_time: float = 50.0,
    dt: float = 0.1,
    max_newton: int = 50,
    start=None,
    level_tol: float = LEVEL_TOL,
) -> FixedPoint:
    """Fixed point of the generic mean field (float64: x64 is switched on for the call).

    With infinite buffers and ``levels`` left to it, the level count is
    adaptive: from :data:`DEFAULT_LEVELS`, grown (the solution extended by
    its tail's decay as Newton's start) until the mass at the bound
    ``s_levels`` is at most ``level_tol``, up to :data:`MAX_AUTO_LEVELS`
    (past that a warning, and ``truncated`` says what is left out). Heavy
    loads need hundreds of levels: JIQ-SQ(2) at ``lambda = 0.99``, ``r = 1``
    takes 1168.

    A finite ``buffer`` above :data:`DEFAULT_LEVELS` at a load below 1 is
    solved the same way, on the levels its queues reach (at most the
    buffer), and is zero above them (``truncated`` holds the at most
    ``level_tol`` at the last level solved); where the queues fill more,
    on all ``buffer`` levels, which must then be at most
    :data:`MAX_DENSE_LEVELS` (a ``ValueError`` otherwise).

    Args:
        policy: name or Policy (options via ``d``).
        load: ``lambda`` (> 0; < 1 unless ``buffer`` is given).
        ratio: ``r = N / M`` for the JIQ family; None (or inf) for one dispatcher.
        buffer: places per server, or None (then ``levels`` bounds the tail).
        levels: the largest queue length represented (tails ``s_0..s_levels``);
            default adaptive (above), or ``buffer`` (which it must equal for
            finite buffers). A given ``levels`` with infinite buffers solves
            the truncated model: arrivals to a server at the bound are left
            out, and ``truncated`` holds the mass there.
        iqueue_levels: the largest I-queue size represented (default
            :func:`default_iqueue_levels`: ``max(30, 4 r + 10)``, or
            ``max(30, r + 30)`` where idle servers join the shortest of
            ``d >= 2`` I-queues); the mass at both bounds is reported.
        tol: residual at which Newton stops.
        warmup_time, dt: the ODE run (RK4) that gives Newton its start: from
            the empty system, or at a load of 1 or more with a buffer from the
            full one (overload fills the buffer at ``load - 1`` tasks per unit
            time: from empty, a buffer of 100 would take 500). Not used for
            JIQ-SQ(d) with several dispatchers: Newton starts from its fixed
            point reduced to ``p0`` (:func:`_jiq_sq_start`; the ODE's RK4 steps
            are unstable past ``r`` of about 30). There ``1 - Q_j`` below
            about 1e-16 (``p0`` is about ``d^-(r (1 - lambda))``: 3e-25 at
            ``r = 800``, ``lambda = 0.9``) is 0 in float64, as is ``p0 = 1 -
            Q_1`` past ``r`` of about 520 there (``s_2``, about ``lambda^2
            p0``, keeps it), and the residual Newton reaches grows as about
            ``r`` times 2e-16 (4e-13 at ``r = 2000``): ``tol`` is met up to
            ``r`` of a few thousand, past the memory bound
            (:data:`MAX_WORKING_BYTES`).
        start: ``[s_1..s_L, Q_1..Q_J]`` to start Newton from instead of the
            ODE run (e.g. a closed form's fixed point); its length must match
            ``levels`` (:data:`DEFAULT_LEVELS` with infinite buffers unless
            given: no adaptive count then) plus ``iqueue_levels``.
        level_tol: the adaptive level count's target mass at the bound.

    Raises:
        NotImplementedError: for a policy without a mean field (with the reason).
        ValueError: before anything is compiled, for JIQ-SQ(d >= 2) at ``ratio=None``
            (one dispatcher; it probes ``d`` I-queues), and where the working memory
            :func:`working_bytes` estimates passes :data:`MAX_WORKING_BYTES` (the
            JIQ family's outcome grid grows as ``r^2``: JIQ-SQ at large ratios).
    """
    if buffer is not None and start is None and buffer > DEFAULT_LEVELS:
        check_int("buffer", buffer, 1, 10**6)
        # a buffer far above the queues the load builds: the fixed point on the levels
        # the queues reach (at most level_tol at their bound), zero above
        if float(load) < 1.0:
            pol, system = _policy_and_system(policy, ratio, d, None, None, iqueue_levels)
            fp, system = _grow(
                pol,
                system,
                load,
                ratio,
                d,
                iqueue_levels,
                tol,
                warmup_time,
                dt,
                max_newton,
                level_tol,
                min(buffer, MAX_AUTO_LEVELS),
            )
            if fp.status == Status.CONVERGED and fp.tail[system.levels] <= level_tol:
                return _padded(fp, buffer)
        if buffer > MAX_DENSE_LEVELS:
            why = (
                "at a load of 1 or more the queues fill it"
                if float(load) >= 1.0
                else f"the queues reach past {min(buffer, MAX_AUTO_LEVELS)} places"
            )
            raise ValueError(
                f"buffer={buffer} is too large for the mean field at load={load}: {why}, and a "
                f"finite buffer's fixed point is solved on at most {MAX_DENSE_LEVELS} levels; "
                f"give a buffer of at most {MAX_DENSE_LEVELS} (or simulate from init='empty')"
            )
    adaptive = levels is None and buffer is None and start is None
    pol, system = _policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels)
    dim = system.levels + system.iqueue_levels
    if start is not None and np.shape(start) != (dim,):
        raise ValueError(
            f"start must have shape ({dim},) (levels + iqueue_levels), got {np.shape(start)}"
        )
    if not adaptive:
        return _solve_on(pol, system, load, ratio, tol, warmup_time, dt, max_newton, start)
    fp, system = _grow(
        pol,
        system,
        load,
        ratio,
        d,
        iqueue_levels,
        tol,
        warmup_time,
        dt,
        max_newton,
        level_tol,
        MAX_AUTO_LEVELS,
    )
    L = system.levels
    if fp.status == Status.CONVERGED and fp.tail[L] > level_tol:
        warnings.warn(
            f"meanfield.fixed_point: the tail mass at levels={L} is {fp.tail[L]:.3g} > "
            f"level_tol={level_tol:g}, and more levels would pass MAX_AUTO_LEVELS="
            f"{MAX_AUTO_LEVELS}; pass levels to choose",
            stacklevel=2,
        )
    return fp


def _grow(
    pol, system, load, ratio, d, iqueue_levels, tol, warmup_time, dt, max_newton, level_tol, cap
) -> tuple:
    """The adaptive level count (infinite buffers): ``(fixed point, system)`` with at most
    ``level_tol`` at the bound, or at ``cap`` levels with more (or not converged)."""
    start = None
    while True:
        fp = _solve_on(pol, system, load, ratio, tol, warmup_time, dt, max_newton, start)
        if start is not None and fp.status != Status.CONVERGED:  # the extension failed
            fp = _solve_on(pol, system, load, ratio, tol, warmup_time, dt, max_newton, None)
        L = system.levels
        if fp.status != Status.CONVERGED or fp.tail[L] <= level_tol:
            return fp, system
        grown = min(grown_levels(fp.tail, L, level_tol), cap)
        if grown <= L:
            return fp, system
        x = np.concatenate([fp.tail[1:], fp.iq_tail[1:]])
        start = extend_levels(x, L, grown, 1, system.iqueue_levels)
        pol, system = _policy_and_system(pol, ratio, d, None, grown, iqueue_levels)


def _padded(fp: FixedPoint, buffer: int) -> FixedPoint:
    """A fixed point on ``L < buffer`` levels as the finite buffer's: zero above ``L``
    (nothing is blocked; ``truncated`` keeps the at most ``level_tol`` at ``L``)."""
    L = fp.tail.size - 1
    pad = np.zeros(buffer - L)
    rates = fp.rates._replace(level=np.concatenate([fp.rates.level, pad]))
    return fp._replace(tail=np.concatenate([fp.tail, pad]), rates=rates)


def _solve_on(pol, system, load, ratio, tol, warmup_time, dt, max_newton, start) -> FixedPoint:
    """The fixed point on ``system``'s bounds: Newton from ``start`` or from an ODE run."""
    buffer = system.buffer
    with host_float64():
        lam = jnp.float64(load)
        r = jnp.float64(ratio if system.iqueue_levels else 1.0)
        if start is None:
            start = _jiq_sq_start(pol, system, load, ratio)
        if start is None:
            if buffer is not None and float(load) >= 1.0:  # every place taken, none listed
                x0 = jnp.asarray(np.r_[np.ones(system.levels), np.zeros(system.iqueue_levels)])
            else:
                x0 = jnp.asarray(_empty_start(system, ratio or 1.0), jnp.float64)
            steps = int(math.ceil(warmup_time / dt))
            x = _rk4_end(x0, lam, r, jnp.float64(dt), steps, pol, system)
            x0_run = x
        else:
            x = jnp.asarray(start, jnp.float64)
        x = np.asarray(x, np.float64)  # the Newton loop's host side in NumPy: nothing to compile
        status, it, res = Status.MAX_ITERATIONS, 0, math.inf
        # the ODE run ended on a full level (JSQ-like routing above capacity): Newton's drift
        # jumps there, so the sliding flow settles on the fixed point instead (below)
        on_level = kinked(pol, system) and start is None and x[0] >= 1.0
        for it in range(1, 0 if on_level else max_newton + 1):  # noqa: B007 (the count is returned)
            f, dx = (np.asarray(v, np.float64) for v in _newton_step(x, lam, r, pol, system))
            res = float(np.max(np.abs(f)))
            if not np.all(np.isfinite(dx)):
                status = Status.NON_FINITE
                break
            if res < tol:
                status = Status.CONVERGED
                break
            x = np.clip(x + dx, 0.0, 1.0)
        if kinked(pol, system):
            if status != Status.CONVERGED and start is None:
                x, status, res = _settle(np.asarray(x0_run), lam, r, dt, pol, system, tol)
            rt = Rates(*(np.asarray(v, np.float64) for v in _sliding_rates(x, lam, r, pol, system)))
        else:
            rt = Rates(*(np.asarray(v, np.float64) for v in _rates_at(x, pol, system)))
    s, q = _split(x, system)
    truncated = (float(s[-1]) if buffer is None else 0.0, float(q[-1]) if q.size > 1 else 0.0)
    return FixedPoint(s, q, rt, res, status, it, truncated)


def transient(
    policy,
    load: float,
    ratio: float | None = None,
    *,
    d: int | None = None,
    buffer: int | None = None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    t_end: float = 50.0,
    dt: float = 0.1,
    x0=None,
):
    """The mean-field ODE from ``x0`` (default: empty system), by RK4.

    Arguments as for :func:`fixed_point`; ``x0`` is ``[s_1..s_L, Q_1..Q_J]``.

    Returns:
        ``(times, tails, iq_tails)``: ``(T,)``, ``(T, L + 1)``, ``(T, J + 1)``.
    """
    pol, system = _policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels)
    steps = int(math.ceil(t_end / dt))
    with host_float64():
        start = _empty_start(system, ratio or 1.0) if x0 is None else np.asarray(x0)
        _, xs = _rk4(
            jnp.asarray(start, jnp.float64),
            jnp.float64(load),
            jnp.float64(ratio if system.iqueue_levels else 1.0),
            jnp.float64(dt),
            pol,
            system,
            steps,
        )
        xs = np.asarray(xs)
    L = system.levels
    ones = np.ones((steps, 1))
    tails = np.concatenate([ones, xs[:, :L]], axis=1)
    iq = np.concatenate([ones, xs[:, L:]], axis=1)
    return dt * np.arange(1, steps + 1), tails, iq


def as_result(
    fp: FixedPoint,
    policy,
    load: float,
    ratio: float | None,
    *,
    buffer: int | None = None,
    with_quantiles: bool = True,
) -> MeanFieldResult:
    """A :class:`~jaxqueue.theory.result.MeanFieldResult` from a generic fixed point.

    ``arrival_seen[k]`` is the law of the tasks an *accepted* arrival finds
    (0 at ``k = levels``: an arrival there is blocked, or left out of the
    truncated model); the response time is its Erlang(``k + 1``, 1) mixture,
    in units of the mean service time.

    Args:
        fp: the fixed point of ``policy`` at ``load`` and ``ratio``.
        policy: name or Policy, as given to :func:`fixed_point`.
        ratio: ``r`` as given (recorded in the settings).
        buffer: as given to :func:`fixed_point` (``None``: infinite buffers).
        with_quantiles: False leaves the response-time quantiles NaN, for
            :func:`jaxqueue.theory.result.fill_quantiles`.
    """
    pol = make(policy)
    s, q, rt = fp.tail, fp.iq_tail, fp.rates
    L = s.size - 1
    occupancy = s - np.concatenate([s[1:], [0.0]])
    blocked = float(rt.level[L]) if buffer is not None else 0.0
    seen = rt.level[:L] / max(1e-300, 1.0 - blocked) if buffer is not None else rt.level[:L]
    seen = np.append(seen / seen.sum(), 0.0)
    quantiles = (
        erlang_mixture_quantile(seen, np.array(QUANTILES))
        if with_quantiles
        else [math.nan] * len(QUANTILES)
    )
    idle_rate = float(s[1] - (s[2] if L >= 2 else 0.0))
    iq = q.size > 1
    join = idle_rate if pol.uses_iqueues else 0.0
    if iq:
        p0 = float(1.0 - q[1])
    elif pol.uses_iqueues:  # one dispatcher: its I-queue is empty iff no server is idle,
        # so p0 is the share of arrivals that join no idle server (on a full level s_1 = 1 the
        # servers a completion leaves idle are refilled: 1 - level[0] there, not 1)
        p0 = float(1.0 - rt.level[0])
    else:
        p0 = None
    return build(
        pol,
        load=load,
        ratio=ratio,
        d=int(pol.options().get("d", 1)),
        buffer=buffer,
        tail=s,
        occupancy=occupancy,
        arrival_seen=seen,
        mean_queue_length=float(s[1:].sum()),
        mean_response_time=erlang_mixture_mean(seen),
        waiting_probability=1.0 - seen[0],
        blocking_probability=blocked,
        p0=p0,
        iqueue_distribution=(q - np.concatenate([q[1:], [0.0]])) if iq else None,
        join_rate=join,
        delete_rate=load * rt.deletes,
        probe_rate=load * rt.probes + join * rt.join_probes,
        response_quantiles=quantiles,
        status=fp.status,
        tail_remainder=fp.truncated[0],
        iqueue_remainder=fp.truncated[1],
    )
