"""The JIQ family whose I-queues hold exactly the idle servers: JIQ, JIQ-Pod(d),
JIQ-SQ(d) and the single-dispatcher idle-first-else-JSQ(d) scheme."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from jaxqueue.policies.base import (
    ZERO,
    ClosedForm,
    Dispatchers,
    ListedServer,
    Policy,
    Route,
    Servers,
    check_d,
    server_draw,
)
from jaxqueue.policies.exact_rules import (
    Move,
    completion,
    delete_fallback,
    idle_pick,
    join_shortest,
    join_uniform,
    joined,
    shortest_server,
    uniform,
)

__all__ = ["JIQPod", "JIQ", "IdleFirst", "JIQSQ"]


def _jiq_decide(fallback, own, hit_iq, fallback_probes: int) -> Route:
    """JIQ routing given the fallback's queue length, the dispatcher's I-queue
    size and the I-queue size of the idle server a delete request would hit."""
    empty = own == 0
    level = jnp.where(empty, fallback, 0)
    hit_idle = empty & (fallback == 0)
    iq_remove = jnp.where(empty, jnp.where(hit_idle, hit_iq, 0), own)
    probes = jnp.where(empty, fallback_probes, 0)
    return Route(
        jnp.asarray(level, jnp.int32),
        jnp.asarray(iq_remove, jnp.int32),
        hit_idle.astype(jnp.int32),
        jnp.asarray(probes, jnp.int32),
    )


@dataclasses.dataclass(frozen=True)
class JIQPod(Policy):
    """JIQ-Pod(d) (Wang, Feng and Cheng, arXiv:1709.10119): JIQ whose empty-I-queue
    dispatchers use Pod(d).

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
    references: ClassVar[tuple] = ("wang2017", "mukherjee2015")
    uses_iqueues: ClassVar[bool] = True
    d: int = 2

    def validate(self, system):
        super().validate(system)
        check_d(self.d, system)

    def closed_form(self):
        return ClosedForm("jiq-pod", self.d)

    def exact_rule(self):
        return "jiq-pod", {"d": self.d}

    def exact_arrivals(self, state, dispatcher):
        picked = idle_pick(state, dispatcher)
        if picked:
            return picked
        if self.d == 1:
            return delete_fallback(state, uniform(range(state.n)), 0)
        return delete_fallback(state, shortest_server(state, self.d), self.d)

    def exact_departure(self, state, server):
        qn = completion(state, server)
        if qn[server] == 0:
            return joined(qn, join_uniform(state.l, server, state.m))
        return [Move(1.0, qn, state.l, state.pos)]

    def tail_bound(self):
        return self.d, True

    def draws(self, system):
        # The fallback first: for d = 1 its words are the step's departure
        # draw, so XLA computes that queue length once.
        return (server_draw(self.d, system), Dispatchers(1), ListedServer())

    def decide(self, view, outcomes, system):
        fallback, own, hit_iq = outcomes
        return _jiq_decide(fallback, own, hit_iq, self.d if self.d >= 2 else 0)

    def join_draws(self, system):
        return (Dispatchers(1),)

    def decide_join(self, view, outcomes, system):
        return outcomes[0], ZERO


@dataclasses.dataclass(frozen=True)
class JIQ(JIQPod):
    """Distributed JIQ with delete requests (Wang, Feng and Cheng, arXiv:1709.10119).

    JIQ-Pod with ``d = 1``: a dispatcher with an empty I-queue sends the task
    to a uniformly random server, and if that server was idle it leaves its
    I-queue by a delete request. Mean field: ``s_i = p0**(i-1) * lambda**i``,
    ``T = 1 / (1 - lambda * p0)``.
    """

    name: ClassVar[str] = "jiq"
    references: ClassVar[tuple] = ("wang2017",)
    d: int = dataclasses.field(default=1, init=False, repr=False)

    def exact_rule(self):
        return "jiq", {}


@dataclasses.dataclass(frozen=True)
class IdleFirst(JIQPod):
    """Idle server first, else JSQ(d): the single-dispatcher scheme of Mukherjee et al.
    ("Universality of load balancing schemes on the diffusion scale", arXiv:1510.02657).

    The dispatcher sends a task to an idle server if there is one, else to the
    shortest of ``d`` distinct uniformly probed servers, any ``1 <= d <= N``
    (``d = N``: JSQ). It is
    JIQ-Pod(d) with ``M = 1``: the one I-queue lists exactly the idle servers
    (use ``jiq-pod`` for several dispatchers). Mean field: the generic fixed
    point; exact CTMC: JIQ-Pod(d) with one dispatcher.
    """

    name: ClassVar[str] = "idle-first"
    references: ClassVar[tuple] = ("mukherjee2015",)
    single_dispatcher: ClassVar[bool] = True

    def closed_form(self):
        return None

    def idle_else_random(self) -> bool:
        return self.d == 1


@dataclasses.dataclass(frozen=True)
class JIQSQ(Policy):
    """JIQ-SQ(d) (Mitzenmacher, arXiv:1606.01833; Wang, Feng and Cheng, arXiv:1709.10119).

    Dispatchers route as in JIQ (with delete requests), but a server that
    becomes idle probes ``d`` distinct uniformly random I-queues and joins the
    shortest (ties uniform), sending ``d`` probes per join when ``d >= 2``.
    ``d = 1`` is JIQ. Any ``1 <= d <= M``. Mean field: the generic fixed point.
    """

    name: ClassVar[str] = "jiq-sq"
    references: ClassVar[tuple] = ("mitzenmacher2016", "wang2017")
    uses_iqueues: ClassVar[bool] = True
    d: int = 2

    def validate(self, system):
        super().validate(system)
        check_d(self.d, system, what="dispatchers")

    def exact_rule(self):
        return "jiq-sq", {"d": self.d}

    def exact_arrivals(self, state, dispatcher):
        return idle_pick(state, dispatcher) or delete_fallback(state, uniform(range(state.n)), 0)

    def exact_departure(self, state, server):
        qn = completion(state, server)
        if qn[server] == 0:
            joins = join_shortest(state.l, server, state.m, self.d)
            return joined(qn, joins, self.d if self.d >= 2 else 0)
        return [Move(1.0, qn, state.l, state.pos)]

    def tail_bound(self):
        return 1, True

    def draws(self, system):
        return (Servers(1), Dispatchers(1), ListedServer())

    def decide(self, view, outcomes, system):
        return _jiq_decide(*outcomes, 0)

    def join_draws(self, system):
        return (Dispatchers(self.d),)

    def decide_join(self, view, outcomes, system):
        probes = self.d if self.d >= 2 and system.n_dispatchers > 1 else 0
        return outcomes[0], jnp.int32(probes)
