"""The policy interface: draws, a decision, and what the rest of the package needs to know.

A policy names the random outcomes it decides on (:class:`Draw`) and decides
on them (:meth:`Policy.decide`); the simulator samples the draws, the generic
mean field reads their limit laws, and the exact solver asks the policy's
exact rule. The declarations, and how to add a policy: docs/policies.md.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.rng import uniform_index
from jaxqueue.core.system import System, as_int
from jaxqueue.policies.exact_rules import ExactState, Move, completion
from jaxqueue.policies.probes import (
    MAX_PROBES,
    MAX_TAIL_ITEMS,
    distinct_tail,
    max_of_distinct,
    shortest_by_tail,
)

__all__ = [
    "Policy",
    "ClosedForm",
    "Route",
    "View",
    "Draw",
    "Servers",
    "Dispatchers",
    "ListedServer",
    "level_of",
    "check_d",
    "server_draw",
    "ZERO",
    "MAX_PROBES",
    "ENGINES",
    "PER_SERVER_MEAN_FIELDS",
]

#: The simulator paths: occupancy tails (exchangeable policies) or per-server state.
ENGINES = ("occupancy", "per-server")

#: The mean-field kinds of the per-server policies (:meth:`Policy.mean_field_kind`):
#: host-side solvers, for infinite buffers and exponential service only.
PER_SERVER_MEAN_FIELDS = ("tagged-server", "composition")


class View(NamedTuple):
    """What a policy sees of one replica (single-replica arrays).

    Attributes:
        tail: int32 ``(levels + 1,)``; ``tail[k]`` servers hold >= k tasks.
        iq_tail: int32 ``(iqueue_levels + 1,)``; ``iq_tail[j]`` dispatchers list
            >= j servers (shape ``(1,)`` when unused).
        iq_listed: int32, same shape; ``iq_listed[j]`` listed servers sit in
            I-queues of size >= j (``sum_{i >= j} i * #(I-queues of size i)``).
        idle: int32 scalar, number of idle servers.
        classes: int32 ``(levels + 1, C)``, servers by queue length and class
            (pool and phase), with server classes; ``None`` otherwise. Only a
            policy defined on speeds looks at it (``jsew``).
        n_servers, n_dispatchers: int32 scalars, this replica's ``N`` and
            ``M`` where they differ across the batch (a sweep's points of
            other sizes stepping together); ``None``: the System's.
    """

    tail: jax.Array
    iq_tail: jax.Array
    iq_listed: jax.Array
    idle: jax.Array
    classes: jax.Array | None = None
    n_servers: jax.Array | None = None
    n_dispatchers: jax.Array | None = None

    def servers(self, system: System):
        """``N``: this replica's, or the System's."""
        return system.n_servers if self.n_servers is None else self.n_servers

    def dispatchers(self, system: System):
        """``M``: this replica's, or the System's."""
        return system.n_dispatchers if self.n_dispatchers is None else self.n_dispatchers


class Route(NamedTuple):
    """Where an arrival goes (single replica).

    Attributes:
        level: int32, tasks the chosen server holds before the arrival.
        iq_remove: int32, size of the I-queue that loses a listed server (0: none).
        deletes: int32, delete requests sent.
        probes: int32, probe messages sent.
        server_class: int32, the class of the chosen server, for a policy
            that picks a server by class (``jsew`` with pools); ``None``: a
            uniform server of its level (:mod:`jaxqueue.sim.classes`).
    """

    level: jax.Array
    iq_remove: jax.Array
    deletes: jax.Array
    probes: jax.Array
    server_class: jax.Array | None = None


#: A zero count (a NumPy scalar: a literal when traced, so a Pallas kernel captures no constant).
ZERO = np.int32(0)


#: The longest reduction a level search does at once, and the most such runs
#: it writes out one by one (see :func:`level_of`).
_RUN, _MAX_RUNS = 32, 8


def level_of(tail, index: jax.Array) -> jax.Array:
    """Queue length of the server (or I-queue size of the dispatcher) at ``index``.

    Items are sorted longest first; ``tail[k]`` of them have length >= k.
    ``tail`` is one replica's array, or the register layout of a block of
    replicas (a tuple of per-level vectors, :mod:`jaxqueue.sim.registers`),
    where the lookup is a sum of compares.
    """
    if isinstance(tail, tuple):
        return sum((t > index).astype(jnp.int32) for t in tail[1:])
    # in runs of at most 32 levels: XLA's CPU compiler rewrites a longer
    # reduction into a reduce-window and a reduce over a stored intermediate
    # (its tree reduction), which made a step with 33 levels 2-3x slower than one with 32
    levels = tail.shape[0] - 1
    runs = -(-levels // _RUN)
    if runs <= _MAX_RUNS:
        return sum(
            jnp.sum(tail[1 + i * _RUN : 1 + (i + 1) * _RUN] > index, dtype=jnp.int32)
            for i in range(runs)
        )
    # many levels: the runs as rows of a zero-padded view (0 > index never holds),
    # so the program does not grow with the levels
    rows = jnp.pad(tail[1:], (0, runs * _RUN - levels)).reshape(runs, _RUN)
    return jnp.sum(jnp.sum(rows > index, axis=1, dtype=jnp.int32), dtype=jnp.int32)


def _random_index(words: jax.Array, n) -> jax.Array:
    return uniform_index(words[0], words[1], n)


def _shortest(tail, words, n, d: int, by_tail: bool) -> jax.Array:
    """Level of the shortest of ``d`` distinct uniform items of ``n`` (:mod:`.probes`)."""
    if by_tail or d > MAX_PROBES:
        return shortest_by_tail(tail, n, d, words)
    return level_of(tail, max_of_distinct(words, n, d))


# ----------------------------------------------------------------------------
# Draws: the random outcomes a policy decides on
# ----------------------------------------------------------------------------


class Draw:
    """One random outcome a policy's decision depends on.

    A draw has two readings of the same rule: :meth:`sample` draws it exactly
    in a finite system from random words (the simulator), :meth:`law` gives
    its distribution in the mean-field limit from the occupancy fractions
    (the generic mean field of :mod:`jaxqueue.theory.generic.meanfield`). A policy's
    decision is written once, on the outcomes, and serves both.
    """

    def n_words(self, system: System) -> int:
        raise NotImplementedError

    def sample(self, view: View, words: jax.Array, system: System) -> jax.Array:
        raise NotImplementedError

    def law(self, view: View, system: System) -> jax.Array:
        raise NotImplementedError

    def finite_law(self, view: View, system: System, inv_servers, inv_dispatchers) -> jax.Array:
        """The law in a system of ``N`` servers and ``M`` dispatchers with the same fractions.

        A smooth function of ``1 / N`` (``inv_servers``) and ``1 / M``
        (``inv_dispatchers``) that equals :meth:`law` at ``0``; the refined
        mean field (:mod:`jaxqueue.theory.finite_n.refined`) differentiates it there,
        since its ``1 / N`` term enters the finite system's drift. The default
        is :meth:`law` itself: right for a draw of one uniformly random item,
        whose law depends on the fractions only.
        """
        return self.law(view, system)

    def smooth(self, system: System) -> bool:
        """Whether :meth:`law` is a differentiable function of the fractions.

        False for a law that switches on whether a count is zero (JSQ's
        shortest queue, the one I-queue of a single dispatcher); the refined
        mean field does not apply to a policy with such a draw.
        """
        return True


@dataclasses.dataclass(frozen=True)
class Servers(Draw):
    """Queue length of the shortest of ``d`` distinct uniformly random servers.

    ``d = 1``: a uniformly random server. ``exhaustive``: every server (JSQ),
    no randomness. Servers are indexed longest first (:func:`level_of`), so
    the shortest of ``d`` is the server at the largest of ``d`` distinct
    uniform indices, drawn exactly by Floyd's algorithm for ``d <=
    MAX_PROBES``; a larger ``d`` (or ``by_tail``) reads the level off the
    tail by its inverse CDF (:func:`jaxqueue.policies.probes.shortest_by_tail`,
    two words). In the limit the shortest of ``d`` has at least ``k`` tasks
    with probability ``s_k**d``; JSQ's is the shortest queue present.
    """

    d: int = 1
    exhaustive: bool = False
    by_tail: bool = dataclasses.field(default=False, repr=False)

    @property
    def from_tail(self) -> bool:
        """Whether the draw reads the level off the tail (past ``MAX_PROBES``, or forced)."""
        return not self.exhaustive and (self.by_tail or self.d > MAX_PROBES)

    def n_words(self, system):
        if self.exhaustive:
            return 0
        return 2 if self.from_tail else 2 * self.d

    def sample(self, view, words, system):
        n = view.servers(system)
        if self.exhaustive:
            return level_of(view.tail, jnp.int32(n - 1))
        return _shortest(view.tail, words, n, self.d, self.by_tail)

    def law(self, view, system):
        s = view.tail
        if self.exhaustive:
            k = jnp.sum(s[1:] >= 1.0)
            return (jnp.arange(s.shape[0]) == k).astype(s.dtype)
        p = s**self.d
        return p - jnp.concatenate([p[1:], jnp.zeros_like(p[:1])])

    def finite_law(self, view, system, inv_servers, inv_dispatchers):
        if self.exhaustive or self.d == 1:
            return self.law(view, system)
        p = distinct_tail(view.tail, self.d, inv_servers)
        return p - jnp.concatenate([p[1:], jnp.zeros_like(p[:1])])

    def smooth(self, system):
        return not self.exhaustive


@dataclasses.dataclass(frozen=True)
class Dispatchers(Draw):
    """I-queue size of the shortest of ``d`` distinct uniformly random dispatchers.

    With one dispatcher its I-queue holds every idle server. In the limit the
    shortest of ``d`` lists at least ``j`` servers with probability ``Q_j**d``;
    with one dispatcher the law is on {0: empty, 1: not empty}. Drawn as
    :class:`Servers` draws (Floyd's algorithm, or the tail past ``MAX_PROBES``).
    """

    d: int = 1
    by_tail: bool = dataclasses.field(default=False, repr=False)

    @property
    def from_tail(self) -> bool:
        """Whether the draw reads the size off the I-queue tail (as :class:`Servers`)."""
        return self.by_tail or self.d > MAX_PROBES

    def n_words(self, system):
        if system.n_dispatchers == 1:
            return 0
        return 2 if self.from_tail else 2 * self.d

    def sample(self, view, words, system):
        if system.n_dispatchers == 1:
            return view.idle
        m = view.dispatchers(system)
        return _shortest(view.iq_tail, words, m, self.d, self.by_tail)

    def law(self, view, system):
        if system.n_dispatchers == 1:
            busy = (view.idle <= 0).astype(view.tail.dtype)
            return jnp.stack([busy, 1.0 - busy])
        p = view.iq_tail**self.d
        return p - jnp.concatenate([p[1:], jnp.zeros_like(p[:1])])

    def finite_law(self, view, system, inv_servers, inv_dispatchers):
        if system.n_dispatchers == 1 or self.d == 1:
            return self.law(view, system)
        p = distinct_tail(view.iq_tail, self.d, inv_dispatchers)
        return p - jnp.concatenate([p[1:], jnp.zeros_like(p[:1])])

    def smooth(self, system):
        return system.n_dispatchers > 1


@dataclasses.dataclass(frozen=True)
class ListedServer(Draw):
    """Size of the I-queue that lists a uniformly random idle server.

    Listed servers are ordered by the size of their I-queue, largest first;
    ``iq_listed[j]`` of them sit in I-queues of size >= j, so the I-queue of
    the ``v``-th has size ``#{j >= 1: iq_listed[j] > v}``, ``v`` uniform on
    ``[0, idle)``. In the limit: size-biased, ``j (Q_j - Q_{j+1}) / sum``.
    """

    def n_words(self, system):
        return 0 if system.n_dispatchers == 1 else 2

    def sample(self, view, words, system):
        if system.n_dispatchers == 1:
            return view.idle
        return level_of(view.iq_listed, _random_index(words, view.idle))

    def law(self, view, system):
        if system.n_dispatchers == 1:
            return jnp.array([0.0, 1.0], view.tail.dtype)
        q = view.iq_tail
        mass = jnp.arange(q.shape[0]) * (q - jnp.concatenate([q[1:], jnp.zeros_like(q[:1])]))
        total = jnp.sum(mass)
        return jnp.where(total > 0, mass / jnp.where(total > 0, total, 1.0), 0.0)


def _sample_all(draws, view, words, system):
    outcomes, at = [], 0
    for draw in draws:
        n = draw.n_words(system)
        outcomes.append(draw.sample(view, words[at : at + n], system))
        at += n
    return tuple(outcomes)


class ClosedForm(NamedTuple):
    """A mean-field closed form (see :mod:`jaxqueue.theory.closed.closed_forms`).

    Attributes:
        family: ``"pod"`` (Pod(d); Random is ``d = 1``), ``"jsq"`` or
            ``"jiq-pod"`` (JIQ-Pod(d); JIQ is ``d = 1``).
        d: the probes of the family's formula.
    """

    family: str
    d: int


@dataclasses.dataclass(frozen=True)
class Policy:
    """Base class of all policies (frozen and hashable: static under jit).

    An exchangeable policy names the random outcomes it needs (:meth:`draws`,
    :meth:`join_draws`) and decides on them (:meth:`decide`,
    :meth:`decide_join`); sampling and the mean-field laws come from the
    draws. The class attributes and the methods after ``decide_join`` say how
    the rest of the package treats the policy (docs/policies.md).
    """

    #: Registry and command-line name.
    name: ClassVar[str] = ""
    #: Keys of :data:`jaxqueue.policies.references.REFERENCES` the rule comes from.
    references: ClassVar[tuple] = ()
    #: Whether dispatchers keep I-queues (JIQ family).
    uses_iqueues: ClassVar[bool] = False
    #: The simulator path, one of :data:`ENGINES`.
    engine: ClassVar[str] = "occupancy"
    #: Whether a dispatcher can pick a listed server that is busy (reports ``stale_fraction``).
    stale_picks: ClassVar[bool] = False
    #: Whether the policy is defined for one dispatcher only.
    single_dispatcher: ClassVar[bool] = False
    #: Why the policy has no mean field (``None``: it has one, closed-form or generic).
    no_mean_field: ClassVar[str | None] = None
    #: Whether routing looks at the servers' speeds with pools (``jsew``): the mean
    #: field of queue lengths then does not cover it.
    routes_by_speed: ClassVar[bool] = False
    #: Whether a dispatcher picks the head of its I-queue (FIFO I-queues).
    fifo: ClassVar[bool] = False
    #: Whether the exact chain takes phase-type service and pools for this policy.
    exact_phases: ClassVar[bool] = True

    @property
    def per_server(self) -> bool:
        """True for policies stepped on per-server state."""
        return self.engine == "per-server"

    def validate(self, system: System) -> None:
        """Raise ValueError if the policy's options do not fit ``system``."""
        if self.single_dispatcher and system.n_dispatchers != 1:
            raise ValueError(
                f"n_dispatchers={system.n_dispatchers} is out of range: {self.name!r} is a "
                "single-dispatcher scheme, need n_dispatchers = 1"
            )

    def draws(self, system: System) -> tuple:
        """The draws an arrival's routing depends on."""
        raise NotImplementedError

    def decide(self, view: View, outcomes: tuple, system: System) -> Route:
        """Route an arrival given its draws' outcomes (broadcasts over outcome arrays)."""
        raise NotImplementedError

    def join_draws(self, system: System) -> tuple:
        """The draws a newly idle server's choice of I-queue depends on."""
        return ()

    def decide_join(self, view: View, outcomes: tuple, system: System):
        """Size of the I-queue a newly idle server joins, and probes sent."""
        return ZERO, ZERO

    def mean_field_kink(self, system: System) -> str | None:
        """Why the limit drift of this policy is not differentiable in ``system``, or None.

        The refined mean field (:mod:`jaxqueue.theory.finite_n.refined`) needs a drift
        with a Taylor expansion at the fixed point. A policy that routes on
        whether some count is zero (JSQ's shortest queue, an idle server first
        with one dispatcher) has a drift that jumps where that count reaches
        zero; its fixed point sits on that set (``s_2 = 0``, or ``s_1 = 1``
        with a finite buffer and ``lambda >= 1``). The default finds such draws
        (:meth:`Draw.smooth`); a policy whose :meth:`decide` itself switches on
        the state overrides this method.
        """
        for draw in self.draws(system) + self.join_draws(system):
            if not draw.smooth(system):
                return (
                    f"{self.label()} routes on whether a count is zero ({draw!r} with "
                    f"N={system.n_servers}, M={system.n_dispatchers}): JSQ-like routing, "
                    "whose drift is not differentiable at its fixed point"
                )
        return None

    # ---- how the package treats the policy ------------------------------------

    def closed_form(self) -> ClosedForm | None:
        """The mean-field closed form this policy is, or None (generic or no mean field)."""
        return None

    def mean_field_kind(self) -> str:
        """``"closed-form"``, ``"generic"`` (:mod:`jaxqueue.theory.generic.meanfield`), ``"none"``,
        ``"tagged-server"`` (:mod:`jaxqueue.theory.per_server.tagged_server`, JIQ without delete
        requests) or ``"composition"`` (:mod:`jaxqueue.theory.per_server.threshold`,
        JIQ-Threshold); a policy returns the last two by overriding this method.
        Both are host-side solvers for infinite buffers and exponential service
        (:data:`PER_SERVER_MEAN_FIELDS`)."""
        if self.closed_form() is not None:
            return "closed-form"
        return "generic" if self.no_mean_field is None else "none"

    def has_queue_length_ode(self, pools=None) -> bool:
        """Whether the mean-field ODE of queue lengths (generic, or a closed
        form) covers this policy; with server pools not a policy that routes
        by the pools' speeds (``jsew``), which that ODE does not see."""
        kind = self.mean_field_kind()
        return kind in ("generic", "closed-form") and not (
            pools is not None and self.routes_by_speed
        )

    def exact_rule(self) -> tuple[str, dict]:
        """``(rule, options)``: the name of the exact chain that is this policy
        (the policy of that name with those options routes the same way) and
        its options; the chain itself asks :meth:`exact_arrivals`."""
        raise NotImplementedError(f"policy {self.name!r} declares no exact CTMC rule")

    def exact_arrivals(self, state: ExactState, dispatcher: int) -> list[Move]:
        """The branches of an arrival at ``dispatcher`` in the exact chain
        (:mod:`jaxqueue.exact`): where the task goes given the labelled state,
        with probabilities, and the messages sent."""
        raise NotImplementedError(f"policy {self.name!r} declares no exact CTMC rule")

    def exact_departure(self, state: ExactState, server: int) -> list[Move]:
        """The branches of a completion at busy ``server`` in the exact chain:
        by default one task fewer and the I-queues as they are."""
        return [Move(1.0, completion(state, server), state.l, state.pos)]

    def exact_server_types(self, bound: int, m: int, n_phases: int = 1) -> int:
        """How many values one server's entry of the exact state can take with
        queues bounded by ``bound``: queue length and phase (``n_phases``), and
        the I-queue listing it when idle."""
        return bound * n_phases + (m if self.uses_iqueues else 1)

    def idle_else_random(self) -> bool:
        """Whether the policy sends a task to an idle server where there is one and
        else to a uniform server (one dispatcher): its queues past the busy level
        only grow at load 1 or more, and a transient's bound follows its horizon
        (:func:`jaxqueue.runs.bounds.horizon_levels`)."""
        return False

    def tail_bound(self) -> tuple[int, bool]:
        """``(d, with_p0)``: the mean-field tail of Pod(d) (times JIQ-Pod(d)'s ``p0``
        factors when ``with_p0`` and there are several dispatchers) bounds this
        policy's; used for the default level bounds."""
        return 1, False

    # ---- sampling ----------------------------------------------------------------

    def route_words(self, system: System) -> int:
        """Number of uint32 words :meth:`route` consumes."""
        return sum(d.n_words(system) for d in self.draws(system))

    def idle_words(self, system: System) -> int:
        """Number of uint32 words :meth:`on_idle` consumes."""
        return sum(d.n_words(system) for d in self.join_draws(system))

    def route(self, view: View, words: jax.Array, system: System) -> Route:
        """Sample the draws from ``words`` and route an arrival."""
        return self.decide(view, _sample_all(self.draws(system), view, words, system), system)

    def on_idle(self, view: View, words: jax.Array, system: System):
        """Sample the join draws from ``words``: I-queue size joined, probes sent."""
        outcomes = _sample_all(self.join_draws(system), view, words, system)
        return self.decide_join(view, outcomes, system)

    def options(self) -> dict:
        """The policy's options, e.g. ``{"d": 2}`` (only those a user can set)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def label(self) -> str:
        """A short display name such as ``pod(d=2)``."""
        opts = ",".join(f"{k}={v}" for k, v in self.options().items())
        return f"{self.name}({opts})" if opts else self.name


def server_draw(d: int, system: System) -> Servers:
    """Pod(d)'s draw; probing every server is JSQ."""
    return Servers(exhaustive=True) if d == system.n_servers and d > 1 else Servers(d)


def check_d(d, system: System, what: str = "servers") -> None:
    """Check ``d`` distinct probes of servers (or of dispatchers) against ``system``.

    Valid: ``1 <= d <= n`` (``n`` the servers or the dispatchers probed);
    ``d = n_servers`` is JSQ. Past ``MAX_PROBES`` (and below ``n``) the draw
    needs ``n <= MAX_TAIL_ITEMS``. A refusal states the range.
    """
    upper = system.n_servers if what == "servers" else system.n_dispatchers
    d = as_int(d)
    if isinstance(d, bool) or not isinstance(d, int):
        raise TypeError(f"d must be an int, got {d!r}")
    if not 1 <= d <= upper:
        raise ValueError(
            f"d={d} is out of range: it probes {what}, need 1 <= d <= n_{what} ({upper})"
        )
    if MAX_PROBES < d < upper and upper > MAX_TAIL_ITEMS:
        raise ValueError(
            f"d={d} is out of range: it probes {what}, need 1 <= d <= {MAX_PROBES} or "
            f"d = n_{what} ({upper}) with more than {MAX_TAIL_ITEMS} {what} (the draw of "
            f"more probes counts the {what} in float32)"
        )
