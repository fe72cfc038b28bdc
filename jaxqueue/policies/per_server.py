"""JIQ variants whose I-queues can list busy servers: JIQ-Original and JIQ-Threshold(z).

Their state is not exchangeable (a listed server's queue length matters), so
they step on per-server state (:mod:`jaxqueue.sim.per_server`). JIQ-Original's
mean field follows one tagged server through its listed and unlisted phases
(:mod:`jaxqueue.theory.per_server.tagged_server`); JIQ-Threshold's follows the
composition of one I-queue (:mod:`jaxqueue.theory.per_server.threshold`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxqueue.core.system import check_int
from jaxqueue.policies.base import Policy, check_d
from jaxqueue.policies.exact_rules import (
    Move,
    completion,
    join_shortest,
    join_uniform,
    joined,
    send,
    uniform,
)

__all__ = ["JIQOriginal", "JIQThreshold"]


@dataclasses.dataclass(frozen=True)
class JIQOriginal(Policy):
    """JIQ-Original (Lu et al., "Join-Idle-Queue", Performance Evaluation 2011), as
    compared by Wang, Feng and Cheng (arXiv:1709.10119), with the options of
    Mitzenmacher's fluid-limit analysis ("Analyzing Distributed Join-Idle-Queue:
    A Fluid Limit Approach", arXiv:1606.01833).

    Semantics (stepped on per-server state, :mod:`jaxqueue.sim.per_server`):

    * A server that is not listed sends a join request when a service
      completion leaves it with at most ``z`` tasks (``z = 0``: when it becomes
      idle). The request goes to a uniformly random dispatcher (``d = 1``) or
      to the shortest of ``d`` distinct uniformly random I-queues, ties uniform
      (``d`` probes per join when ``d >= 2``). A server is listed at most once:
      one still listed does not join again, and a picked server joins again
      only after a later completion leaves it with at most ``z`` tasks.
    * An arrival goes to a uniformly random dispatcher. If its I-queue is
      non-empty it sends the task to a listed server, a uniformly random one
      (``order="random"``) or the one at the head of the I-queue
      (``order="fifo"``, first in, first out), which leaves the I-queue *even
      if that server is busy* (a stale pick, counted in ``stale_fraction``; a
      full server's task is blocked all the same).
    * Otherwise it sends the task to a uniformly random server. There are no
      delete requests: a listed server that gets a task this way stays listed.

    The defaults are Lu et al.'s scheme as we read Wang et al.'s simulation of it.
    Mitzenmacher's JIQ is ``order="fifo"``, his threshold variant adds
    ``z = 1`` and his JIQ-SQ(2) is ``order="fifo", d=2``.

    Attributes:
        order: ``"random"`` or ``"fifo"``: which listed server a dispatcher picks.
        z: join when a completion leaves an unlisted server with at most ``z``
            tasks (``0 <= z <= 10**6``).
        d: I-queues probed per join (``1 <= d <= min(n_dispatchers, 64)``).
    """

    name: ClassVar[str] = "jiq-original"
    references: ClassVar[tuple] = ("lu2011", "wang2017", "mitzenmacher2016")
    uses_iqueues: ClassVar[bool] = True
    engine: ClassVar[str] = "per-server"
    stale_picks: ClassVar[bool] = True
    exact_phases: ClassVar[bool] = False
    #: A fallback task that lands on a listed server sends no delete request.
    delete_requests: ClassVar[bool] = False
    #: The values of ``order``.
    ORDERS: ClassVar[tuple] = ("random", "fifo")
    order: str = "random"
    z: int = 0
    d: int = 1

    def validate(self, system):
        super().validate(system)
        if self.order not in self.ORDERS:
            raise ValueError(f"order={self.order!r} is not valid: use 'random' or 'fifo'")
        check_int("z", self.z, 0, 10**6)
        check_d(self.d, system, what="dispatchers")

    @property
    def threshold(self) -> int:
        """``z``: a completion that leaves an unlisted server with at most ``z`` tasks lists it."""
        return self.z

    @property
    def fifo(self) -> bool:
        """Whether a dispatcher picks the head of its I-queue (else a uniform listed server)."""
        return self.order == "fifo"

    @property
    def join_choices(self) -> int:
        """I-queues probed per join request (the shortest is joined)."""
        return self.d

    def label(self) -> str:
        """``jiq-original``, with the options that differ from their defaults."""
        opts = ",".join(
            f"{f.name}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if f.init and getattr(self, f.name) != f.default
        )
        return f"{self.name}({opts})" if opts else self.name

    def mean_field_kind(self) -> str:
        """``"tagged-server"``: :mod:`jaxqueue.theory.per_server.tagged_server` (infinite buffers)."""
        return "tagged-server"

    def exact_rule(self):
        return "jiq-original", {"order": self.order, "z": self.z, "d": self.d}

    def exact_arrivals(self, state, dispatcher):
        """A listed server of ``dispatcher``'s I-queue (uniform, or its head),
        busy or not, leaves it; an empty I-queue: a uniform server, no delete."""
        q, l, pos = state.q, state.l, state.pos
        mine = [i for i in range(state.n) if l[i] == dispatcher]
        if not mine:
            return send(state, uniform(range(state.n)))
        picks = [(1.0, next(i for i in mine if pos[i] == 0))] if self.fifo else uniform(mine)
        out = []
        for p, i in picks:
            ln = list(l)
            ln[i] = -1
            posn = None
            if self.fifo:  # the others move up
                posn = [c - 1 if b == dispatcher else c for b, c in zip(l, pos)]
                posn[i] = -1
            stale = 1 if q[i] > 0 else 0
            if q[i] >= state.cap:
                out.append(Move(p, q, ln, posn, -1, stale=stale))
            else:
                qn = list(q)
                qn[i] += 1
                out.append(Move(p, qn, ln, posn, q[i], stale=stale))
        return out

    def exact_departure(self, state, server):
        """A server not listed that is left with at most ``z`` tasks joins
        (FIFO: at the tail of its I-queue)."""
        qn, l = completion(state, server), state.l
        if qn[server] > self.z or l[server] >= 0:
            return [Move(1.0, qn, l, state.pos)]
        if self.d >= 2:
            joins, probes = join_shortest(l, server, state.m, self.d), self.d
        else:
            joins, probes = join_uniform(l, server, state.m), 0
        out = []
        for p, ln in joins:
            posn = None
            if self.fifo:
                posn = list(state.pos)
                posn[server] = sum(1 for b in l if b == ln[server])
            out.append(Move(p, qn, ln, posn, joins=1, probes=probes))
        return out

    def exact_server_types(self, bound, m, n_phases=1):
        return m + (m + 1) * bound

    def tail_bound(self):
        return 1, True


@dataclasses.dataclass(frozen=True)
class JIQThreshold(Policy):
    """JIQ-Threshold(z) (Wang, Feng and Cheng, arXiv:1709.10119): servers listed
    while holding at most ``z`` tasks.

    Semantics (stepped on per-server state, :mod:`jaxqueue.sim.per_server`): a server
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

    ``z = 0`` is JIQ (with delete requests). Mitzenmacher's threshold variant
    (arXiv:1606.01833) differs: FIFO I-queues and no delete requests; it is
    ``jiq-original`` with ``order="fifo", z=1``.
    """

    name: ClassVar[str] = "jiq-threshold"
    references: ClassVar[tuple] = ("wang2017",)
    uses_iqueues: ClassVar[bool] = True
    engine: ClassVar[str] = "per-server"
    exact_phases: ClassVar[bool] = False
    #: A fallback task that takes a listed server past ``z`` sends a delete request.
    delete_requests: ClassVar[bool] = True
    #: Its I-queues are unordered (a uniformly random listed server is picked).
    fifo: ClassVar[bool] = False
    #: A join goes to one uniformly random I-queue.
    join_choices: ClassVar[int] = 1
    z: int = 1

    def validate(self, system):
        super().validate(system)
        check_int("z", self.z, 0, 10**6)

    @property
    def threshold(self) -> int:
        """Servers are listed exactly while holding at most this many tasks."""
        return self.z

    def mean_field_kind(self) -> str:
        """``"composition"``: :mod:`jaxqueue.theory.per_server.threshold` (infinite buffers)."""
        return "composition"

    def exact_rule(self):
        return "jiq-threshold", {"z": self.z}

    def exact_arrivals(self, state, dispatcher):
        """A listed server leaves its I-queue and rejoins a uniform one if it
        still holds at most ``z``; a fallback task that takes a listed server
        past ``z`` sends a delete request."""
        mine = [i for i in range(state.n) if state.l[i] == dispatcher]
        return self._exact_pick(state, mine) if mine else self._exact_fallback(state)

    def _exact_pick(self, state, mine):
        q, l = state.q, state.l
        out = []
        for p, i in uniform(mine):
            ln = list(l)
            ln[i] = -1
            qn, k = q, -1
            if q[i] < state.cap:
                qn = list(q)
                qn[i] += 1
                k = q[i]
            if qn[i] <= self.z:  # still at most z tasks: joins a uniform I-queue again
                for pj, lj in join_uniform(ln, i, state.m):
                    out.append(Move(p * pj, qn, lj, None, k, joins=1))
            else:
                out.append(Move(p, qn, ln, None, k))
        return out

    def _exact_fallback(self, state):
        q, l = state.q, state.l
        out = []
        for p, i in uniform(range(state.n)):
            if q[i] >= state.cap:
                out.append(Move(p, q, l, None, -1))
                continue
            qn = list(q)
            qn[i] += 1
            if l[i] >= 0 and qn[i] > self.z:  # taken past z: delete request
                ln = list(l)
                ln[i] = -1
                out.append(Move(p, qn, ln, None, q[i], deletes=1))
            else:
                out.append(Move(p, qn, l, None, q[i]))
        return out

    def exact_departure(self, state, server):
        qn = completion(state, server)
        if qn[server] == self.z:
            return joined(qn, join_uniform(state.l, server, state.m))
        return [Move(1.0, qn, state.l, state.pos)]

    def exact_server_types(self, bound, m, n_phases=1):
        low = min(self.z, bound) + 1
        return low * m + (bound + 1 - low)

    def tail_bound(self):
        return 1, True
