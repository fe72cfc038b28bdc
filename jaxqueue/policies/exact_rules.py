"""What a policy tells the exact solver: the branches of an arrival (and of a
completion) on a labelled per-server state, and the helpers they are written with.

A policy's ``exact_arrivals`` and ``exact_departure`` (:class:`~jaxqueue.policies.base.Policy`)
return :class:`Move` records; the chain of :mod:`jaxqueue.exact` owns the
state space, the rates and the rewards (docs/exact.md).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from itertools import combinations
from typing import NamedTuple

__all__ = [
    "Move",
    "ExactState",
    "uniform",
    "shortest_of",
    "shortest_law",
    "subsets",
    "shortest_server",
    "send",
    "idle_pick",
    "delete_fallback",
    "completion",
    "join_uniform",
    "join_shortest",
    "joined",
]


class Move(NamedTuple):
    """One branch of an event: its probability and the labelled state after it.

    Attributes:
        prob: the branch's probability given the event.
        q: queue length of each server after it.
        l: the I-queue listing each server after it (-1: none).
        pos: each listed server's place in its I-queue (0: the head; -1:
            unlisted) when the I-queues are FIFO, else ``None``.
        found: tasks an arrival found at its server (-1: lost); not used for
            a completion.
        joins, deletes, probes: join requests, delete requests and probes sent.
        stale: 1 if a dispatcher picked a listed server that was busy.
    """

    prob: float
    q: list
    l: list
    pos: list | None = None
    found: int = -1
    joins: int = 0
    deletes: int = 0
    probes: int = 0
    stale: int = 0


class ExactState(NamedTuple):
    """A labelled state as a rule sees it.

    Attributes:
        q, l, pos: as in :class:`Move`, before the event.
        n, m: servers and dispatchers.
        cap: the most tasks a server holds (an arrival at a full server is lost).
        waits: per server, its pool's mean service time over its speed (with
            pools; ``None`` otherwise).
    """

    q: list
    l: list
    pos: list | None
    n: int
    m: int
    cap: int
    waits: list | None = None


def uniform(idx):
    """``(prob, item)`` of a uniform pick from ``idx``."""
    p = 1.0 / len(idx)
    return [(p, i) for i in idx]


@functools.lru_cache(maxsize=256)
def subsets(n: int, d: int) -> tuple:
    """The ``d``-subsets of ``range(n)``, in lexicographic order."""
    return tuple(combinations(range(n), d))


def shortest_of(groups, size):
    """Law of the shortest of a uniformly random one of ``groups`` (ties uniform): ``{item: p}``."""
    dist = defaultdict(float)
    w = 1.0 / len(groups)
    for sub in groups:
        best = min(size[i] for i in sub)
        ties = [i for i in sub if size[i] == best]
        for i in ties:
            dist[i] += w / len(ties)
    return dist


#: Most ``d``-subsets :func:`shortest_law` enumerates; past it, the closed form.
MAX_SUBSETS = 4096


def shortest_law(size, d: int):
    """Law of the shortest of ``d`` distinct uniform items (ties uniform): ``{item: p}``.

    Enumerates the ``d``-subsets where there are at most :data:`MAX_SUBSETS`;
    otherwise an item of size ``s`` is chosen with probability
    ``(C(above + ties, d) - C(above, d)) / (ties C(n, d))``, ``above`` the
    items longer than ``s`` and ``ties`` those of size ``s`` (itself included):
    the chance the shortest probed size is ``s``, shared by the tied items.
    """
    n = len(size)
    if math.comb(n, d) <= MAX_SUBSETS:
        return shortest_of(subsets(n, d), size)
    total = math.comb(n, d)
    out = {}
    for i in range(n):
        above = sum(1 for s in size if s > size[i])
        ties = sum(1 for s in size if s == size[i])
        p = (math.comb(above + ties, d) - math.comb(above, d)) / (ties * total)
        if p > 0:
            out[i] = p
    return out


def shortest_server(state: ExactState, d: int):
    """``(prob, server)`` of Pod(d): ``d`` distinct uniform servers, the shortest, ties uniform."""
    return list((p, i) for i, p in shortest_law(state.q, d).items())


def send(state: ExactState, targets, probes: int = 0):
    """The moves of a task sent to server ``i`` with probability ``p`` for ``(p, i)``
    in ``targets``, the listing unchanged (lost at a full server)."""
    q, cap = state.q, state.cap
    out = []
    for p, i in targets:
        if q[i] >= cap:
            out.append(Move(p, q, state.l, state.pos, -1, probes=probes))
        else:
            qn = list(q)
            qn[i] += 1
            out.append(Move(p, qn, state.l, state.pos, q[i], probes=probes))
    return out


def idle_pick(state: ExactState, j: int):
    """JIQ (I-queues hold exactly the idle servers): the moves of a task sent
    to a uniform server of dispatcher ``j``'s I-queue, which leaves it; ``[]``
    if the I-queue is empty."""
    q, l = state.q, state.l
    mine = [i for i in range(state.n) if l[i] == j]
    if not mine:
        return []
    out = []
    for p, i in uniform(mine):
        assert q[i] == 0, "JIQ invariant: listed servers are idle"
        qn = list(q)
        qn[i] = 1
        ln = list(l)
        ln[i] = -1
        out.append(Move(p, qn, ln, None, 0))
    return out


def delete_fallback(state: ExactState, targets, probes: int):
    """JIQ's fallback: the moves of a task sent to server ``i`` with
    probability ``p`` for ``(p, i)`` in ``targets``; a listed (idle) server
    that gets it leaves its I-queue by a delete request."""
    q, l, cap = state.q, state.l, state.cap
    out = []
    for p, i in targets:
        if q[i] >= cap:
            out.append(Move(p, q, l, None, -1, probes=probes))
            continue
        qn = list(q)
        qn[i] += 1
        if l[i] >= 0:
            ln = list(l)
            ln[i] = -1
            out.append(Move(p, qn, ln, None, q[i], deletes=1, probes=probes))
        else:
            out.append(Move(p, qn, l, None, q[i], probes=probes))
    return out


def completion(state: ExactState, i: int):
    """The queue lengths after a completion at server ``i``."""
    qn = list(state.q)
    qn[i] -= 1
    return qn


def join_uniform(l, i: int, m: int):
    """Server ``i`` joins a uniformly random one of ``m`` I-queues: ``(prob, new listing)``."""
    out = []
    for j in range(m):
        ln = list(l)
        ln[i] = j
        out.append((1.0 / m, ln))
    return out


def join_shortest(l, i: int, m: int, d: int):
    """Server ``i`` joins the shortest of ``d`` distinct uniform I-queues of
    ``m`` (ties uniform): ``(prob, new listing)``."""
    sizes = [0] * m
    for b in l:
        if b >= 0:
            sizes[b] += 1
    out = []
    for j, p in shortest_law(sizes, d).items():
        ln = list(l)
        ln[i] = j
        out.append((p, ln))
    return out


def joined(qn, joins, probes: int = 0):
    """The moves of a completion that leaves queue lengths ``qn`` and sends a
    join request to the I-queues of ``joins`` (``(prob, new listing)``)."""
    return [Move(p, qn, ln, None, joins=1, probes=probes) for p, ln in joins]
