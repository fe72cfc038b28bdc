"""The classic policies: Random, JSQ, Power-of-d and Idle-One-First."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from jaxqueue.core.classes import WAIT_TIE, shortest_expected_wait
from jaxqueue.policies.base import ZERO, ClosedForm, Policy, Route, Servers, check_d, server_draw
from jaxqueue.policies.exact_rules import send, shortest_server, uniform

__all__ = ["Random", "JSQ", "JSEW", "PowerOfD", "IdleOneFirst"]


@dataclasses.dataclass(frozen=True)
class Random(Policy):
    """Random: each arrival joins a uniformly random server.

    The baseline of Wang, Feng and Cheng (arXiv:1709.10119). The servers are
    independent M/M/1 queues; ``s_i = lambda**i``. Sends no messages.
    """

    name: ClassVar[str] = "random"
    references: ClassVar[tuple] = ("wang2017",)

    def closed_form(self):
        return ClosedForm("pod", 1)

    def exact_rule(self):
        return "random", {}

    def exact_arrivals(self, state, dispatcher):
        return send(state, uniform(range(state.n)))

    def draws(self, system):
        return (Servers(1),)

    def decide(self, view, outcomes, system):
        return Route(outcomes[0], ZERO, ZERO, ZERO)


@dataclasses.dataclass(frozen=True)
class JSQ(Policy):
    """Join-the-Shortest-Queue: a shortest queue, ties uniform.

    As studied by Liu and Ying (arXiv:1912.11904). Centralised (it knows
    every queue), so it sends no probe messages. Mean-field limit:
    ``s_1 = lambda``, ``s_i = 0`` for ``i >= 2``.
    """

    name: ClassVar[str] = "jsq"
    references: ClassVar[tuple] = ("liu2019",)

    def closed_form(self):
        return ClosedForm("jsq", 1)

    def exact_rule(self):
        return "jsq", {}

    def exact_arrivals(self, state, dispatcher):
        q = state.q
        best = min(q)
        return send(state, uniform([i for i in range(state.n) if q[i] == best]))

    def tail_bound(self):
        return 2, False

    def draws(self, system):
        return (Servers(exhaustive=True),)

    def decide(self, view, outcomes, system):
        return Route(outcomes[0], ZERO, ZERO, ZERO)


@dataclasses.dataclass(frozen=True)
class JSEW(JSQ):
    """Join the Shortest Expected Wait: JSQ that sees the servers' speeds.

    Known as shortest expected delay routing (Whitt, "Deciding which queue
    to join: some counterexamples", Operations Research 34(1), 1986, shows
    that neither it nor JSQ is optimal in general). An arrival joins a server with the least ``(k + 1) * m / v`` (``k`` its
    queue length, ``v`` its pool's speed, ``m`` its pool's mean service
    time: the expected time until the new task completes, counting each
    task as a full service), ties uniform; with a finite buffer, among the
    servers with room (all full: blocked). With identical servers it is JSQ
    (the same draws and decisions, bit for bit). Centralised, no messages.
    """

    name: ClassVar[str] = "jsew"
    references: ClassVar[tuple] = ("whitt1986",)
    routes_by_speed: ClassVar[bool] = True

    def exact_rule(self):
        return "jsew", {}

    def exact_arrivals(self, state, dispatcher):
        """With pools, the least ``(q + 1) * mean / speed`` among the servers
        with room (all full: among all), equal within ``WAIT_TIE``; else JSQ."""
        if state.waits is None:
            return super().exact_arrivals(state, dispatcher)
        q, n = state.q, state.n
        waits = [(q[i] + 1) * state.waits[i] for i in range(n)]
        room = [i for i in range(n) if q[i] < state.cap] or list(range(n))
        best = min(waits[i] for i in room)
        return send(state, uniform([i for i in room if waits[i] <= best * (1 + WAIT_TIE)]))

    def route_words(self, system):
        return 2 if system.pools is not None else super().route_words(system)

    def route(self, view, words, system):
        if system.pools is None:
            return super().route(view, words, system)
        level, cls = shortest_expected_wait(view.classes, words, system)
        return Route(level, ZERO, ZERO, ZERO, cls)


@dataclasses.dataclass(frozen=True)
class PowerOfD(Policy):
    """Power-of-d / JSQ(d) (Mitzenmacher, "The power of two choices in randomized
    load balancing", IEEE TPDS 2001), as compared by Wang, Feng and Cheng
    (arXiv:1709.10119).

    Probe ``d`` distinct servers uniformly at random and join the shortest,
    ties uniform; any ``1 <= d <= N`` (past ``MAX_PROBES`` the shortest is
    drawn from the occupancy tail, :mod:`jaxqueue.policies.probes`). ``d = 1``
    is Random, ``d = N`` is JSQ. Sends ``d`` probes per arrival when ``d >=
    2``. Mean field: ``s_i = lambda**((d**i-1)/(d-1))``.
    """

    name: ClassVar[str] = "pod"
    references: ClassVar[tuple] = ("mitzenmacher2001", "wang2017")
    d: int = 2

    def validate(self, system):
        super().validate(system)
        check_d(self.d, system)

    def closed_form(self):
        return ClosedForm("pod", self.d)

    def exact_rule(self):
        return "pod", {"d": self.d}

    def exact_arrivals(self, state, dispatcher):
        if self.d == 1:
            return send(state, uniform(range(state.n)))
        return send(state, shortest_server(state, self.d), self.d)

    def tail_bound(self):
        return self.d, False

    def draws(self, system):
        return (server_draw(self.d, system),)

    def decide(self, view, outcomes, system):
        return Route(outcomes[0], ZERO, ZERO, jnp.int32(self.d if self.d >= 2 else 0))


@dataclasses.dataclass(frozen=True)
class IdleOneFirst(Policy):
    """Idle-One-First, I1F (Liu and Ying, arXiv:1912.11904).

    An idle server if any, else a server with exactly one task if any, else a
    uniformly random server. Centralised: no probe messages. Mean field: the
    generic fixed point.
    """

    name: ClassVar[str] = "i1f"
    references: ClassVar[tuple] = ("liu2019",)

    def exact_rule(self):
        return "i1f", {}

    def exact_arrivals(self, state, dispatcher):
        q, n = state.q, state.n
        idle = [i for i in range(n) if q[i] == 0]
        if idle:
            return send(state, uniform(idle))
        ones = [i for i in range(n) if q[i] == 1]
        return send(state, uniform(ones or range(n)))

    def tail_bound(self):
        return 2, False

    def draws(self, system):
        return (Servers(1),)

    def mean_field_kink(self, system):
        return (
            f"{self.label()} routes on whether an idle server, or a server with one task, "
            "exists: JSQ-like routing, whose drift is not differentiable at its fixed point"
        )

    def decide(self, view, outcomes, system):
        tail = view.tail
        has_idle = view.idle > 0
        # servers with exactly one task (with one place per server, every busy one)
        has_one = (tail[1] - tail[2] if len(tail) > 2 else tail[1]) > 0
        level = jnp.where(has_idle, 0, jnp.where(has_one, 1, outcomes[0]))
        return Route(jnp.asarray(level, jnp.int32), ZERO, ZERO, ZERO)
