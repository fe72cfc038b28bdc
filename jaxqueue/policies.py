"""Load-balancing policies as small units, and their registry.

Every policy here is exchangeable: servers are interchangeable and so are
dispatchers, so a replica's state is held as occupancy tails (see
:mod:`jaxqueue.engine`): ``tail[k]`` servers hold at least ``k`` tasks and, for
the JIQ family, ``iq_tail[j]`` dispatchers list at least ``j`` idle servers.
Servers are thought of as sorted by queue length, longest first, so server
index ``i`` holds ``level_of(tail, i) = #{k >= 1: tail[k] > i}`` tasks and a
uniformly random server is a uniformly random index. The same holds for
dispatchers and their I-queue sizes.

A policy answers two questions, each from a fixed number of random words:

* :meth:`Policy.route` -- an arrival: which queue length does the chosen server
  have, which I-queue (by size) loses a listed server, and which messages
  were sent;
* :meth:`Policy.on_idle` -- a server just became idle: the size of the I-queue
  it joins (JIQ family only).

Add a policy by writing one class and registering it with :func:`register`.

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
    "Random",
    "JSQ",
    "PowerOfD",
    "IdleOneFirst",
    "JIQ",
    "JIQPod",
    "JIQSQ",
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


def _probe_words(d: int, n_servers: int) -> int:
    return 0 if d == n_servers and d > 1 else 2 * d


def _min_of_probes(view: View, words: jax.Array, d: int, n_servers: int) -> jax.Array:
    """Queue length of the shortest of ``d`` distinct uniformly probed servers."""
    if d == n_servers and d > 1:  # every server probed: exactly JSQ
        return level_of(view.tail, jnp.int32(n_servers - 1))
    return level_of(view.tail, _max_of_distinct(words, n_servers, d))


@dataclasses.dataclass(frozen=True)
class Policy:
    """Base class of the exchangeable policies (frozen and hashable: static under jit)."""

    name: ClassVar[str] = ""
    uses_iqueues: ClassVar[bool] = False

    def validate(self, system: System) -> None:
        """Raise ValueError if the policy's options do not fit ``system``."""

    def route_words(self, system: System) -> int:
        """Number of uint32 words :meth:`route` consumes."""
        raise NotImplementedError

    def idle_words(self, system: System) -> int:
        """Number of uint32 words :meth:`on_idle` consumes."""
        return 0

    def route(self, view: View, words: jax.Array, system: System) -> Route:
        """Choose the server (by queue length) for an arrival."""
        raise NotImplementedError

    def on_idle(self, view: View, words: jax.Array, system: System):
        """Size of the I-queue a newly idle server joins, and probes sent."""
        return _ZERO, _ZERO

    def options(self) -> dict:
        """The policy's options, e.g. ``{"d": 2}``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def label(self) -> str:
        """A short display name such as ``pod(d=2)``."""
        opts = ",".join(f"{k}={v}" for k, v in self.options().items())
        return f"{self.name}({opts})" if opts else self.name


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

    def route_words(self, system):
        return 2

    def route(self, view, words, system):
        level = level_of(view.tail, _random_index(words, system.n_servers))
        return Route(level, _ZERO, _ZERO, _ZERO)


@dataclasses.dataclass(frozen=True)
class JSQ(Policy):
    """Join-the-Shortest-Queue: a shortest queue, ties uniform.

    Centralised (it knows every queue), so it sends no probe messages.
    """

    name: ClassVar[str] = "jsq"

    def route_words(self, system):
        return 0

    def route(self, view, words, system):
        level = level_of(view.tail, jnp.int32(system.n_servers - 1))
        return Route(level, _ZERO, _ZERO, _ZERO)


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

    def route_words(self, system):
        return _probe_words(self.d, system.n_servers)

    def route(self, view, words, system):
        level = _min_of_probes(view, words, self.d, system.n_servers)
        probes = jnp.int32(self.d if self.d >= 2 else 0)
        return Route(level, _ZERO, _ZERO, probes)


@dataclasses.dataclass(frozen=True)
class IdleOneFirst(Policy):
    """Idle-One-First, I1F (Liu and Ying).

    An idle server if any, else a server with exactly one task if any, else a
    uniformly random server. Centralised: no probe messages.
    """

    name: ClassVar[str] = "i1f"

    def route_words(self, system):
        return 2

    def route(self, view, words, system):
        n = system.n_servers
        random_level = level_of(view.tail, _random_index(words, n))
        has_idle = view.tail[1] < n
        has_one = view.tail[2] < n if view.tail.shape[0] > 2 else jnp.bool_(False)
        level = jnp.where(has_idle, 0, jnp.where(has_one, 1, random_level))
        return Route(level.astype(jnp.int32), _ZERO, _ZERO, _ZERO)


# ----------------------------------------------------------------------------
# The JIQ family (I-queues hold exactly the idle servers)
# ----------------------------------------------------------------------------


def _dispatcher_iq_size(view: View, words: jax.Array, system: System) -> jax.Array:
    """I-queue size of a uniformly random dispatcher (2 words)."""
    if system.n_dispatchers == 1:
        return view.idle
    return level_of(view.iq_tail, _random_index(words, system.n_dispatchers))


def _iq_of_idle_server(view: View, words: jax.Array, system: System) -> jax.Array:
    """Size of the I-queue listing a uniformly random idle server (2 words).

    Listed servers are ordered by the size of their I-queue, largest first;
    ``iq_listed[j]`` of them sit in I-queues of size >= j, so the I-queue of
    the ``v``-th has size ``#{j >= 1: iq_listed[j] > v}``, ``v`` uniform on
    ``[0, idle)``.
    """
    if system.n_dispatchers == 1:
        return view.idle
    v = _random_index(words, view.idle)
    return level_of(view.iq_listed, v)


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

    def route_words(self, system):
        return 2 + max(_probe_words(self.d, system.n_servers), 2) + 2

    def idle_words(self, system):
        return 2

    def route(self, view, words, system):
        # Words: the fallback's probes first (for d = 1 the same index as the
        # step's departure draw, so XLA computes its queue length once), then
        # the dispatcher, then the idle server hit by a delete request.
        nw = self.route_words(system)
        fallback = _min_of_probes(view, words, self.d, system.n_servers)
        own = _dispatcher_iq_size(view, words[nw - 4 : nw - 2], system)
        empty = own == 0
        level = jnp.where(empty, fallback, 0)
        hit_idle = empty & (fallback == 0)
        hit_iq = _iq_of_idle_server(view, words[nw - 2 : nw], system)
        iq_remove = jnp.where(empty, jnp.where(hit_idle, hit_iq, 0), own)
        probes = jnp.where(empty, self.d if self.d >= 2 else 0, 0)
        return Route(level, iq_remove, hit_idle.astype(jnp.int32), probes.astype(jnp.int32))

    def on_idle(self, view, words, system):
        return _dispatcher_iq_size(view, words, system), _ZERO


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


_AS_JIQ = JIQ()


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

    def route_words(self, system):
        return _AS_JIQ.route_words(system)

    def route(self, view, words, system):
        return _AS_JIQ.route(view, words, system)

    def idle_words(self, system):
        return 2 * self.d

    def on_idle(self, view, words, system):
        if system.n_dispatchers == 1:
            return view.idle, _ZERO
        index = _max_of_distinct(words, system.n_dispatchers, self.d)
        probes = jnp.int32(self.d if self.d >= 2 else 0)
        return level_of(view.iq_tail, index), probes



# ----------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------

_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Add a policy class to the registry under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


for _cls in (Random, JSQ, PowerOfD, IdleOneFirst, JIQ, JIQPod, JIQSQ, IdleFirst):
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
