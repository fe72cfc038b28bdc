"""Load-balancing policies as small units, and their registry.

Every policy here but JIQ-Original and JIQ-Threshold (which step on
per-server state, :mod:`jaxqueue.listed`) is exchangeable: servers are
interchangeable and so are dispatchers, so a replica's state is held as
occupancy tails (see :mod:`jaxqueue.engine`): ``tail[k]`` servers hold at
least ``k`` tasks and, for the JIQ family, ``iq_tail[j]`` dispatchers list at
least ``j`` idle servers.
Servers are thought of as sorted by queue length, longest first, so server
index ``i`` holds ``level_of(tail, i) = #{k >= 1: tail[k] > i}`` tasks and a
uniformly random server is a uniformly random index. The same holds for
dispatchers and their I-queue sizes.

An exchangeable policy names the random outcomes it decides on (its
:class:`Draw` objects: a random server's queue length, the shortest of ``d``
probes, a dispatcher's I-queue size, the I-queue of a random idle server) and
decides on them:

* :meth:`Policy.decide` -- an arrival: the chosen server's queue length, the
  size of the I-queue that loses a listed server, and the messages sent;
* :meth:`Policy.decide_join` -- a server just became idle: the size of the
  I-queue it joins (JIQ family only).

The simulator samples the draws exactly from random words
(:meth:`Policy.route`, :meth:`Policy.on_idle`); the generic mean field
(:mod:`jaxqueue.meanfield`) reads the same decision under the draws' limit
laws. Add a policy by writing one class and registering it with
:func:`register`.

Probes are always of *distinct* servers (or distinct I-queues for JIQ-SQ), as
in the papers: the minimum queue length among ``d`` distinct servers is the
queue length of the largest of ``d`` distinct indices, drawn exactly with
Floyd's algorithm.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from jaxqueue.config import System, check_int
from jaxqueue.rng import uniform_index

__all__ = [
    "Policy",
    "Route",
    "View",
    "Draw",
    "Servers",
    "Dispatchers",
    "ListedServer",
    "Random",
    "JSQ",
    "PowerOfD",
    "IdleOneFirst",
    "JIQ",
    "JIQPod",
    "JIQSQ",
    "JIQOriginal",
    "JIQThreshold",
    "make",
    "available",
    "register",
    "level_of",
    "MAX_PROBES",
]

#: Largest ``d`` for which distinct probes are drawn one by one (Floyd's
#: algorithm, O(d^2) per event); ``d = N`` is handled exactly as JSQ.
MAX_PROBES = 64


class View(NamedTuple):
    """What a policy sees of one replica (single-replica arrays).

    Attributes:
        tail: int32 ``(levels + 1,)``; ``tail[k]`` servers hold >= k tasks.
        iq_tail: int32 ``(iqueue_levels + 1,)``; ``iq_tail[j]`` dispatchers list
            >= j servers (shape ``(1,)`` when unused).
        iq_listed: int32, same shape; ``iq_listed[j]`` listed servers sit in
            I-queues of size >= j (``sum_{i >= j} i * #(I-queues of size i)``).
        idle: int32 scalar, number of idle servers.
    """

    tail: jax.Array
    iq_tail: jax.Array
    iq_listed: jax.Array
    idle: jax.Array


class Route(NamedTuple):
    """Where an arrival goes (single replica).

    Attributes:
        level: int32, tasks the chosen server holds before the arrival.
        iq_remove: int32, size of the I-queue that loses a listed server (0: none).
        deletes: int32, delete requests sent.
        probes: int32, probe messages sent.
    """

    level: jax.Array
    iq_remove: jax.Array
    deletes: jax.Array
    probes: jax.Array


_ZERO = jnp.int32(0)


def level_of(tail: jax.Array, index: jax.Array) -> jax.Array:
    """Queue length of the server (or I-queue size of the dispatcher) at ``index``.

    Items are sorted longest first; ``tail[k]`` of them have length >= k.
    """
    return jnp.sum(tail[1:] > index, dtype=jnp.int32)


def _random_index(words: jax.Array, n) -> jax.Array:
    return uniform_index(words[0], words[1], n)


def _max_of_distinct(words: jax.Array, n, d: int) -> jax.Array:
    """Largest element of a uniformly random ``d``-subset of ``[0, n)``.

    Floyd's algorithm: for ``j = n-d, ..., n-1`` draw ``t`` uniform on
    ``[0, j]`` and add ``t``, or ``j`` if ``t`` was already chosen. Uses ``2d``
    words. ``n >= d`` is required.
    """
    if d == 1:
        return _random_index(words, n)
    if d <= 8:  # unrolled: d(d-1)/2 comparisons
        chosen = []
        for i in range(d):
            j = n - d + i
            t = uniform_index(words[2 * i], words[2 * i + 1], j + 1)
            dup = jnp.bool_(False)
            for c in chosen:
                dup = dup | (c == t)
            chosen.append(jnp.where(dup, j, t))
        return functools.reduce(jnp.maximum, chosen)
    chosen = jnp.full((d,), -1, jnp.int32)

    def body(i, chosen):
        j = n - d + i
        t = uniform_index(words[2 * i], words[2 * i + 1], j + 1)
        pick = jnp.where(jnp.any(chosen == t), j, t)
        return chosen.at[i].set(pick)

    chosen = jax.lax.fori_loop(0, d, body, chosen)
    return jnp.max(chosen)


# ----------------------------------------------------------------------------
# Draws: the random outcomes a policy decides on
# ----------------------------------------------------------------------------


class Draw:
    """One random outcome a policy's decision depends on.

    A draw has two readings of the same rule: :meth:`sample` draws it exactly
    in a finite system from random words (the simulator), :meth:`law` gives
    its distribution in the mean-field limit from the occupancy fractions
    (the generic mean field of :mod:`jaxqueue.meanfield`). A policy's
    decision is written once, on the outcomes, and serves both.
    """

    def n_words(self, system: System) -> int:
        raise NotImplementedError

    def sample(self, view: View, words: jax.Array, system: System) -> jax.Array:
        raise NotImplementedError

    def law(self, view: View, system: System) -> jax.Array:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Servers(Draw):
    """Queue length of the shortest of ``d`` distinct uniformly random servers.

    ``d = 1``: a uniformly random server. ``exhaustive``: every server (JSQ),
    no randomness. In the limit the shortest of ``d`` has at least ``k`` tasks
    with probability ``s_k**d``; JSQ's is the shortest queue present.
    """

    d: int = 1
    exhaustive: bool = False

    def n_words(self, system):
        return 0 if self.exhaustive else 2 * self.d

    def sample(self, view, words, system):
        n = system.n_servers
        index = jnp.int32(n - 1) if self.exhaustive else _max_of_distinct(words, n, self.d)
        return level_of(view.tail, index)

    def law(self, view, system):
        s = view.tail
        if self.exhaustive:
            k = jnp.sum(s[1:] >= 1.0)
            return (jnp.arange(s.shape[0]) == k).astype(s.dtype)
        p = s**self.d
        return p - jnp.concatenate([p[1:], jnp.zeros_like(p[:1])])


@dataclasses.dataclass(frozen=True)
class Dispatchers(Draw):
    """I-queue size of the shortest of ``d`` distinct uniformly random dispatchers.

    With one dispatcher its I-queue holds every idle server. In the limit the
    shortest of ``d`` lists at least ``j`` servers with probability ``Q_j**d``;
    with one dispatcher the law is on {0: empty, 1: not empty}.
    """

    d: int = 1

    def n_words(self, system):
        return 0 if system.n_dispatchers == 1 else 2 * self.d

    def sample(self, view, words, system):
        if system.n_dispatchers == 1:
            return view.idle
        return level_of(view.iq_tail, _max_of_distinct(words, system.n_dispatchers, self.d))

    def law(self, view, system):
        if system.n_dispatchers == 1:
            busy = (view.idle <= 0).astype(view.tail.dtype)
            return jnp.stack([busy, 1.0 - busy])
        p = view.iq_tail**self.d
        return p - jnp.concatenate([p[1:], jnp.zeros_like(p[:1])])


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


@dataclasses.dataclass(frozen=True)
class Policy:
    """Base class of the exchangeable policies (frozen and hashable: static under jit).

    A policy names the random outcomes it needs (:meth:`draws`,
    :meth:`join_draws`) and decides on them (:meth:`decide`,
    :meth:`decide_join`); sampling and the mean-field laws come from the draws.
    """

    name: ClassVar[str] = ""
    uses_iqueues: ClassVar[bool] = False
    #: True for policies stepped on per-server state (:mod:`jaxqueue.listed`).
    per_server: ClassVar[bool] = False

    def validate(self, system: System) -> None:
        """Raise ValueError if the policy's options do not fit ``system``."""

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
        return _ZERO, _ZERO

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
        """The policy's options, e.g. ``{"d": 2}``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def label(self) -> str:
        """A short display name such as ``pod(d=2)``."""
        opts = ",".join(f"{k}={v}" for k, v in self.options().items())
        return f"{self.name}({opts})" if opts else self.name


def _server_draw(d: int, system: System) -> Servers:
    """Pod(d)'s draw; probing every server is JSQ."""
    return Servers(exhaustive=True) if d == system.n_servers and d > 1 else Servers(d)


def _check_d(d, system: System, what: str = "servers") -> None:
    upper = system.n_servers if what == "servers" else system.n_dispatchers
    check_int("d", d, 1, upper)
    if what == "servers" and MAX_PROBES < d < upper:
        raise ValueError(
            f"d={d} is out of range: distinct probes are drawn exactly for "
            f"1 <= d <= {MAX_PROBES} or d = n_servers ({upper}, which is JSQ)"
        )
    if what == "dispatchers" and d > MAX_PROBES:
        raise ValueError(f"d={d} is out of range: need 1 <= d <= min(n_dispatchers, {MAX_PROBES})")


# ----------------------------------------------------------------------------
# Server-side policies
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Random(Policy):
    """Random: each arrival joins a uniformly random server.

    The servers are independent M/M/1 queues; ``s_i = lambda**i``.
    """

    name: ClassVar[str] = "random"

    def draws(self, system):
        return (Servers(1),)

    def decide(self, view, outcomes, system):
        return Route(outcomes[0], _ZERO, _ZERO, _ZERO)


@dataclasses.dataclass(frozen=True)
class JSQ(Policy):
    """Join-the-Shortest-Queue: a shortest queue, ties uniform.

    Centralised (it knows every queue), so it sends no probe messages.
    """

    name: ClassVar[str] = "jsq"

    def draws(self, system):
        return (Servers(exhaustive=True),)

    def decide(self, view, outcomes, system):
        return Route(outcomes[0], _ZERO, _ZERO, _ZERO)


@dataclasses.dataclass(frozen=True)
class PowerOfD(Policy):
    """Power-of-d / JSQ(d) (Mitzenmacher; Vvedenskaya et al.).

    Probe ``d`` distinct servers uniformly at random and join the shortest,
    ties uniform. ``d = 1`` is Random, ``d = N`` is JSQ. Sends ``d`` probes
    per arrival when ``d >= 2``. Mean field: ``s_i = lambda**((d**i-1)/(d-1))``.
    """

    name: ClassVar[str] = "pod"
    d: int = 2

    def validate(self, system):
        _check_d(self.d, system)

    def draws(self, system):
        return (_server_draw(self.d, system),)

    def decide(self, view, outcomes, system):
        return Route(outcomes[0], _ZERO, _ZERO, jnp.int32(self.d if self.d >= 2 else 0))


@dataclasses.dataclass(frozen=True)
class IdleOneFirst(Policy):
    """Idle-One-First, I1F (Liu and Ying).

    An idle server if any, else a server with exactly one task if any, else a
    uniformly random server. Centralised: no probe messages.
    """

    name: ClassVar[str] = "i1f"

    def draws(self, system):
        return (Servers(1),)

    def decide(self, view, outcomes, system):
        tail = view.tail
        has_idle = view.idle > 0
        # servers with exactly one task (with one place per server, every busy one)
        has_one = (tail[1] - tail[2] if tail.shape[0] > 2 else tail[1]) > 0
        level = jnp.where(has_idle, 0, jnp.where(has_one, 1, outcomes[0]))
        return Route(jnp.asarray(level, jnp.int32), _ZERO, _ZERO, _ZERO)


# ----------------------------------------------------------------------------
# The JIQ family (I-queues hold exactly the idle servers)
# ----------------------------------------------------------------------------


def _jiq_decide(fallback, own, hit_iq, fallback_probes: int) -> Route:
    """JIQ routing given the fallback's queue length, the dispatcher's I-queue
    size and the I-queue size of the idle server a delete request would hit."""
    empty = own == 0
    level = jnp.where(empty, fallback, 0)
    hit_idle = empty & (fallback == 0)
    iq_remove = jnp.where(empty, jnp.where(hit_idle, hit_iq, 0), own)
    probes = jnp.where(empty, fallback_probes, 0)
    return Route(
        jnp.asarray(level, jnp.int32), jnp.asarray(iq_remove, jnp.int32),
        hit_idle.astype(jnp.int32), jnp.asarray(probes, jnp.int32),
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class JIQPod(Policy):
    """JIQ-Pod(d) (Wang, Feng, Cheng): JIQ whose empty-I-queue dispatchers use Pod(d).

    Semantics. Each dispatcher keeps an I-queue of idle servers; a server is
    listed in at most one I-queue, exactly while it is idle.

    * An arrival goes to a uniformly random dispatcher. If its I-queue is
      non-empty it sends the task to a uniformly random listed server, which
      leaves the I-queue.
    * Otherwise it probes ``d`` distinct uniformly random servers and sends the
      task to the shortest (``d = 1``: a uniformly random server). If that
      server was idle it is removed from its I-queue by a delete request.
    * A server that becomes idle joins a uniformly random I-queue (a join
      request).

    ``d = 1`` is JIQ. With one dispatcher (``M = 1``) it is the "idle server
    first, else JSQ(d)" scheme of Mukherjee et al.; ``d = N`` is then JSQ.
    Mean field: ``s_i = lambda * p0 * s_{i-1}**d`` for ``i >= 2``.
    """

    name: ClassVar[str] = "jiq-pod"
    uses_iqueues: ClassVar[bool] = True
    d: int = 2

    def validate(self, system):
        _check_d(self.d, system)

    def draws(self, system):
        # The fallback first: for d = 1 its words are the step's departure
        # draw, so XLA computes that queue length once.
        return (_server_draw(self.d, system), Dispatchers(1), ListedServer())

    def decide(self, view, outcomes, system):
        fallback, own, hit_iq = outcomes
        return _jiq_decide(fallback, own, hit_iq, self.d if self.d >= 2 else 0)

    def join_draws(self, system):
        return (Dispatchers(1),)

    def decide_join(self, view, outcomes, system):
        return outcomes[0], _ZERO


@dataclasses.dataclass(frozen=True)
class JIQ(JIQPod):
    """Distributed JIQ with delete requests (Wang, Feng, Cheng).

    JIQ-Pod with ``d = 1``: a dispatcher with an empty I-queue sends the task
    to a uniformly random server, and if that server was idle it leaves its
    I-queue by a delete request. Mean field: ``s_i = p0**(i-1) * lambda**i``,
    ``T = 1 / (1 - lambda * p0)``.
    """

    name: ClassVar[str] = "jiq"
    d: int = dataclasses.field(default=1, init=False)

    def options(self):
        return {}


@dataclasses.dataclass(frozen=True)
class IdleFirst(JIQPod):
    """Idle server first, else JSQ(d): the single-dispatcher scheme of Mukherjee et al.

    The dispatcher sends a task to an idle server if there is one, else to the
    shortest of ``d`` distinct uniformly probed servers (``d = N``: JSQ). It is
    JIQ-Pod(d) with ``M = 1``: the one I-queue lists exactly the idle servers.
    """

    name: ClassVar[str] = "idle-first"

    def validate(self, system):
        if system.n_dispatchers != 1:
            raise ValueError(
                f"n_dispatchers={system.n_dispatchers} is out of range: "
                "'idle-first' is the single-dispatcher scheme, need n_dispatchers = 1 "
                "(use 'jiq-pod' for several dispatchers)"
            )
        super().validate(system)


@dataclasses.dataclass(frozen=True)
class JIQSQ(Policy):
    """JIQ-SQ(d) (Mitzenmacher; Wang, Feng, Cheng).

    Dispatchers route as in JIQ (with delete requests), but a server that
    becomes idle probes ``d`` distinct uniformly random I-queues and joins the
    shortest (ties uniform), sending ``d`` probes per join when ``d >= 2``.
    ``d = 1`` is JIQ. Needs ``d <= M``.
    """

    name: ClassVar[str] = "jiq-sq"
    uses_iqueues: ClassVar[bool] = True
    d: int = 2

    def validate(self, system):
        _check_d(self.d, system, what="dispatchers")

    def draws(self, system):
        return (Servers(1), Dispatchers(1), ListedServer())

    def decide(self, view, outcomes, system):
        return _jiq_decide(*outcomes, 0)

    def join_draws(self, system):
        return (Dispatchers(self.d),)

    def decide_join(self, view, outcomes, system):
        probes = self.d if self.d >= 2 and system.n_dispatchers > 1 else 0
        return outcomes[0], jnp.int32(probes)


# ----------------------------------------------------------------------------
# JIQ variants whose I-queues can list busy servers (per-server state)
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JIQOriginal(Policy):
    """JIQ-Original (Lu et al. 2011), as compared by Wang, Feng and Cheng.

    Semantics (stepped on per-server state, :mod:`jaxqueue.listed`):

    * A server that becomes idle and is not listed joins a uniformly random
      I-queue (a join request). A server is listed at most once: one that
      becomes idle while still listed does not join again.
    * An arrival goes to a uniformly random dispatcher. If its I-queue is
      non-empty it sends the task to a uniformly random listed server, which
      leaves the I-queue, *even if that server is busy* (a stale pick, counted
      in ``stale_fraction``; a full server's task is blocked all the same).
    * Otherwise it sends the task to a uniformly random server. There are no
      delete requests: a listed server that gets a task this way stays listed.
    """

    name: ClassVar[str] = "jiq-original"
    uses_iqueues: ClassVar[bool] = True
    per_server: ClassVar[bool] = True

    @property
    def threshold(self) -> int:
        return 0


@dataclasses.dataclass(frozen=True)
class JIQThreshold(Policy):
    """JIQ-Threshold(z) (Wang, Feng, Cheng; Mitzenmacher): servers listed while holding <= z tasks.

    Semantics (stepped on per-server state, :mod:`jaxqueue.listed`): a server
    is listed, in exactly one I-queue, exactly while it holds at most ``z``
    tasks.

    * A server whose queue drops to ``z`` joins a uniformly random I-queue.
    * A dispatcher with a non-empty I-queue sends the task to a uniformly
      random listed server and removes it from its I-queue; if the server
      still holds at most ``z`` tasks it at once joins a uniformly random
      I-queue again (a join request).
    * A dispatcher with an empty I-queue sends the task to a uniformly random
      server; if that takes a listed server past ``z``, a delete request
      removes it from its I-queue.

    ``z = 0`` is JIQ (with delete requests).
    """

    name: ClassVar[str] = "jiq-threshold"
    uses_iqueues: ClassVar[bool] = True
    per_server: ClassVar[bool] = True
    z: int = 1

    def validate(self, system):
        check_int("z", self.z, 0, 10**6)

    @property
    def threshold(self) -> int:
        return self.z


# ----------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------

_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Add a policy class to the registry under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


for _cls in (Random, JSQ, PowerOfD, IdleOneFirst, JIQ, JIQPod, JIQSQ, IdleFirst, JIQOriginal,
             JIQThreshold):  # fmt: skip
    register(_cls)


def available() -> list[str]:
    """Names of the registered policies."""
    return sorted(_REGISTRY)


def make(name: str | Policy, **options) -> Policy:
    """Build a policy from its name and options.

    Options a policy does not take are an error, except ``None`` values (so
    that command lines can pass ``d=None``).

    Examples:
        >>> make("pod", d=2)
        PowerOfD(d=2)
        >>> make("jiq")
        JIQ()
    """
    if isinstance(name, Policy):
        return name
    if name not in _REGISTRY:
        raise ValueError(f"unknown policy {name!r}; valid names: {', '.join(available())}")
    cls = _REGISTRY[name]
    accepted = {f.name for f in dataclasses.fields(cls) if f.init}
    given = {k: v for k, v in options.items() if v is not None}
    unknown = set(given) - accepted
    if unknown:
        valid = ", ".join(sorted(accepted)) or "none"
        raise ValueError(
            f"policy {name!r} takes no option {', '.join(sorted(unknown))}; its options: {valid}"
        )
    return cls(**given)
