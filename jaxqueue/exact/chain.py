"""The per-server Markov chains of the exact solver: one rule per policy.

The continuous-time Markov chain of the whole system is written down literally,
with a *per-server* state: the queue length of every server and, for the JIQ
family, which I-queue (if any) lists it. :func:`enumerate_states` finds the
reachable states by breadth-first search from the empty system and returns the
generator's transitions and each state's event rates. Nothing here shares code
with the simulator (which works on occupancy counts or its own per-server
arrays), so the two can check each other.

Model (docs/theory.md): ``N`` FIFO servers with exp(1) service (:class:`Chain`)
or phase-type service, possibly in pools of their own speeds and laws
(:class:`PhaseChain`, below), Poisson arrivals of rate
``lambda * N``, each to a uniformly chosen one of ``M`` dispatchers, routed
by the rule. The rules (:data:`RULES`; the policies of
:mod:`jaxqueue.policies` name theirs with ``Policy.exact_rule``, see
docs/policies.md):

=================  ==========================================================
``random``         a uniformly random server
``jsq``            a shortest queue, ties uniform
``pod``            probe ``d`` distinct uniform servers, join the shortest
                   (ties uniform); ``d`` probes per arrival when ``d >= 2``
``i1f``            an idle server if any, else one with exactly one task if
                   any, else a uniformly random server (all uniform)
``jiq``            own I-queue non-empty: a uniform listed (idle) server, which
                   leaves it. Empty: a uniform server; if it was listed a delete
                   request removes it. A server becoming idle joins a uniform
                   I-queue.
``jiq-pod``        as ``jiq``, but an empty-I-queue dispatcher applies Pod(d)
                   (with ``M = 1``: idle server first, else JSQ(d))
``jiq-sq``         as ``jiq``, but a server becoming idle joins the shortest of
                   ``d`` distinct uniform I-queues (ties uniform), ``d`` probes
                   per join when ``d >= 2``
``jiq-original``   no delete requests: a listed server stays listed when it gets
                   a task from elsewhere; a pick from a non-empty I-queue goes to
                   a uniform listed server (``order="random"``) or the head of
                   the I-queue (``order="fifo"``), even if busy (a *stale*
                   pick), and it leaves the list; a server that is not listed
                   joins when a completion leaves it with ``<= z`` tasks, a
                   uniform I-queue (``d = 1``) or the shortest of ``d`` distinct
                   uniform I-queues (ties uniform, ``d`` probes per join when
                   ``d >= 2``)
``jiq-threshold``  listed exactly while holding ``<= z`` tasks; joins a uniform
                   I-queue when its queue drops to ``z``; a picked server leaves
                   its I-queue and rejoins a uniform one at once (a join) if it
                   still holds ``<= z``; a fallback task that takes a listed
                   server past ``z`` triggers a delete request. ``z = 0`` is JIQ.
=================  ==========================================================

Sources. Random, Pod(d), JIQ, JIQ-Pod(d), JIQ-SQ(d) and JIQ-Threshold(z) as
in Wang, Feng and Cheng, "Distributed Join-the-Idle-Queue for Low Latency
Cloud Services", arXiv:1709.10119; Pod(d) after Mitzenmacher, "The power of
two choices in randomized load balancing" (IEEE TPDS 12(10), 2001); JIQ-SQ(d)
after Mitzenmacher, "Analyzing Distributed Join-Idle-Queue: A Fluid Limit
Approach", arXiv:1606.01833; JSQ and I1F as in Liu and Ying, "On Universal
Scaling of Distributed Queues under Load Balancing", arXiv:1912.11904;
JIQ-Pod(d) with one dispatcher is the idle-first-else-JSQ(d) scheme of
Mukherjee, Borst, van Leeuwaarden and Whiting, "Universality of load
balancing schemes on the diffusion scale", arXiv:1510.02657; JIQ-Original is
Lu et al., "Join-Idle-Queue: A novel load balancing algorithm for dynamically
scalable web services" (Performance Evaluation 68(11), 2011), its options
(FIFO I-queues, the threshold ``z``, joins to the shortest of ``d``) after
Mitzenmacher, arXiv:1606.01833.

Phase-type service. :class:`PhaseChain` takes a service law ``PH(alpha, S)``
(:class:`~jaxqueue.core.service.PhaseType`: a task starts in phase ``a``
with probability ``alpha[a]``, moves from phase ``p`` to ``b`` at rate
``S[p][b]`` and completes at rate ``s[p] = -sum_b S[p][b]``) for the rules of
:data:`PHASE_RULES` (all but ``jiq-original`` and ``jiq-threshold``). Each
server's entry becomes the pair ``(queue length, phase of the task in
service)``, phase 0 when idle; the rules route on queue lengths only, so their
arrival and departure branches are those of :class:`Chain`, with the phases
carried along: a task that finds its server idle starts in phase ``a`` with
probability ``alpha[a]``, a completion in phase ``p`` happens at rate ``s[p]``
(its joins and probes too) and the next task starts in phase ``a`` with
probability ``alpha[a]``. The chain is still exact (a finite CTMC, truncated
only at the queue bound); phases are tracked per server, so a law with ``P``
phases multiplies the types of a busy server by ``P``.

Pools. :class:`PhaseChain` also takes pools of servers
(:class:`~jaxqueue.core.service.Pool`): pool ``i`` holds ``count_i``
servers of speed ``v_i`` and law ``L_i`` (its own, or the chain's law), and
a server of speed ``v`` runs its law's rates times ``v`` (completion in
phase ``p`` at ``v s[p]``, phase change at ``v S[p][b]``). A server's entry
is then the triple ``(pool, queue length, phase)``, its pool fixed. The rules
still see queue lengths only (their branches are unchanged: a server's pool
does not change where a task goes), and an idle server of any pool joins an
I-queue as usual (JIQ family).

Symmetry. All the rules treat servers alike and dispatchers alike, so the
generator is invariant under relabelling servers and relabelling dispatchers.
By default (``symmetry=True``) a state is stored by its orbit invariant under
both relabellings (the sorted queue lengths of the unlisted servers, and the
sorted list of I-queues, each the sorted queue lengths of the servers it
lists; with phases the sorted ``(queue length, phase)`` pairs, with pools
the sorted ``(pool, queue length, phase)`` triples; for FIFO I-queues the
queue lengths in I-queue order, head first, since the order is part of the
state); transitions are still computed on a labelled per-server
representative. With pools the servers of different pools are not alike,
and the pool listed first in each server's entry keeps them apart: states
are lumped only under relabelling servers within a pool (and dispatchers),
the group that leaves the generator invariant. This lumping is exact (strong
lumpability under a symmetry group) and every reported quantity is
symmetric, so nothing changes but the state count. ``symmetry=False`` keeps
the full labelled chain (the tests check that both agree).

State counts grow like ``C(T + N - 1, N)`` (JIQ family: up to ``/ M!``) with
``T`` the per-server types (:func:`estimate_states`): ``B + 1`` for the
policies without I-queues, ``B + M`` for JIQ, JIQ-Pod, JIQ-SQ,
``M + (M + 1) B`` for JIQ-Original (times ``ceil(N / M)!`` for FIFO order),
``(z + 1) M + B - z`` for JIQ-Threshold, ``B`` the queue bound; with a
``P``-phase law ``P B + 1`` and ``P B + M`` (the JIQ family count is then
about twice the estimate); with pools about the product over the pools of
``C(T_i + count_i - 1, count_i)``, ``T_i`` the types of a server of pool
``i`` (``P_i B + 1`` or ``P_i B + M``, ``P_i`` the phases of its law).
Enumeration is pure Python, roughly 50 us per state (exp(1) service) and
200-300 us with phases or pools (more transitions per state):
with Erlang-2 service and ``B = 12``, Pod(2) with ``N = 3`` has 2925 states
(0.3 s), JIQ with ``N = 3``, ``M = 2`` 2950 (0.5 s), with ``N = 4``, ``M = 2``
20 801 (7 s).
"""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import combinations

import numpy as np

__all__ = [
    "RULES",
    "JIQ_FAMILY",
    "PHASE_RULES",
    "Chain",
    "PhaseChain",
    "SparseRewards",
    "estimate_states",
    "enumerate_states",
    "LOST",
    "JOIN",
    "DELETE",
    "PROBE",
    "STALE",
    "N_FIXED_REWARDS",
]

#: The exact rules, one per chain (``Policy.exact_rule()`` names one of them).
RULES = (
    "random",
    "jsq",
    "jsew",
    "pod",
    "i1f",
    "jiq",
    "jiq-pod",
    "jiq-sq",
    "jiq-original",
    "jiq-threshold",
)
#: The rules whose dispatchers keep I-queues.
JIQ_FAMILY = frozenset({"jiq", "jiq-pod", "jiq-sq", "jiq-original", "jiq-threshold"})
#: The rules with a phase-type chain (:class:`PhaseChain`).
PHASE_RULES = ("random", "jsq", "jsew", "pod", "i1f", "jiq", "jiq-pod", "jiq-sq")

# Layout of the per-state reward vector (rates of events, per unit time): the
# fixed entries, then the rate of accepted arrivals that find k = 0..cap-1 tasks.
LOST, JOIN, DELETE, PROBE, STALE = range(5)
N_FIXED_REWARDS = 5


class Chain:
    """Per-server CTMC of one rule: states, transitions and event rewards.

    Transitions are computed on a labelled state: lists ``q`` (queue length of
    each server) and ``l`` (the I-queue listing each server, or -1). States are
    stored by the key :meth:`canon` gives (see there); :meth:`decode` returns a
    labelled representative of a key.

    Args:
        rule: one of :data:`RULES`.
        n, m: servers and dispatchers.
        lam: arrival rate per server.
        d: probes (``pod``, ``jiq-pod``: servers; ``jiq-sq``, ``jiq-original``:
            I-queues); unused otherwise.
        z: threshold of ``jiq-threshold`` and ``jiq-original``; unused otherwise.
        cap: the largest queue length (the buffer, or the truncation bound);
            an arrival at a server holding ``cap`` tasks is lost.
        symmetry: store states by their orbit under relabelling (see the module docstring).
        order: ``"random"`` or ``"fifo"``, the pick order of ``jiq-original``'s
            I-queues; unused otherwise.
    """

    #: :meth:`expand` returns the reward vector dense (a ``{index: rate}`` dict if True)
    sparse_rewards = False

    def __init__(self, rule, n, m, lam, d, z, cap, symmetry, order="random"):
        self.rule, self.n, self.m, self.lam = rule, n, m, lam
        self.d, self.z, self.cap, self.symmetry = d, z, cap, symmetry
        self.listed = rule in JIQ_FAMILY
        #: FIFO I-queues: the labelled state also holds each listed server's place
        self.fifo = rule == "jiq-original" and order == "fifo"
        self.server_subsets = (
            list(combinations(range(n), d)) if rule in ("pod", "jiq-pod") else None
        )
        sq = rule == "jiq-sq" or (rule == "jiq-original" and d >= 2)
        self.iq_subsets = list(combinations(range(m), d)) if sq else None
        self.n_rewards = N_FIXED_REWARDS + cap  # + accepted arrivals seeing k = 0..cap-1

    # ---- canonical form -------------------------------------------------
    # With symmetry, a state's key is its orbit invariant under relabelling
    # servers and dispatchers: the sorted queue lengths of the unlisted servers,
    # and the sorted list of I-queues, each the sorted queue lengths of the
    # servers it lists (FIFO I-queues: the queue lengths in I-queue order, head
    # first, not sorted). Two labelled states have the same key iff one is a
    # relabelling of the other.
    def canon(self, q, l, pos=None):
        """The key of the labelled state ``(q, l)``; FIFO I-queues also need ``pos``,
        each listed server's place in its I-queue (0: the head; -1: unlisted)."""
        if self.fifo:
            return self._canon_fifo(q, l, pos)
        if not self.symmetry:
            return tuple(zip(q, l))
        if not self.listed:
            return tuple(sorted(q))
        groups = [[] for _ in range(self.m + 1)]  # groups[-1]: unlisted
        for a, b in zip(q, l):
            groups[b].append(a)
        free = groups.pop()
        for g in groups:
            g.sort()
        groups.sort()
        free.sort()
        return (tuple(free), tuple(map(tuple, groups)))

    def _canon_fifo(self, q, l, pos):
        if not self.symmetry:
            return tuple(zip(q, l, pos))
        groups = [[] for _ in range(self.m)]
        free = []
        for a, b, c in zip(q, l, pos):
            if b < 0:
                free.append(a)
            else:
                groups[b].append((c, a))
        ordered = sorted(tuple(a for _, a in sorted(g)) for g in groups)
        free.sort()
        return (tuple(free), tuple(ordered))

    def _labelled(self, key):
        """A labelled representative ``(q, l, pos)`` of a state key (``pos``: None but FIFO)."""
        if not self.fifo:
            return (*self.decode(key), None)
        if not self.symmetry:
            return [a for a, _, _ in key], [b for _, b, _ in key], [c for _, _, c in key]
        free, groups = key
        q, l, pos = list(free), [-1] * len(free), [-1] * len(free)
        for j, g in enumerate(groups):
            q.extend(g)
            l.extend([j] * len(g))
            pos.extend(range(len(g)))
        return q, l, pos

    def decode(self, key):
        """A labelled representative ``(q, l)`` of a state key (lists)."""
        if self.fifo:
            return self._labelled(key)[:2]
        if not self.symmetry:
            return [a for a, _ in key], [b for _, b in key]
        if not self.listed:
            return list(key), [-1] * self.n
        free, groups = key
        q, l = list(free), [-1] * len(free)
        for j, g in enumerate(groups):
            q.extend(g)
            l.extend([j] * len(g))
        return q, l

    def initial(self):
        listing = [i % self.m if self.listed else -1 for i in range(self.n)]
        places = [i // self.m for i in range(self.n)] if self.fifo else None
        return self.canon([0] * self.n, listing, places)

    # ---- routing helpers -------------------------------------------------
    def _uniform(self, idx):
        p = 1.0 / len(idx)
        return [(p, i) for i in idx]

    @staticmethod
    def _shortest_of(subsets, size):
        """Law of the shortest of a uniformly random subset (ties uniform): ``{item: p}``."""
        dist = defaultdict(float)
        w = 1.0 / len(subsets)
        for sub in subsets:
            best = min(size[i] for i in sub)
            ties = [i for i in sub if size[i] == best]
            for i in ties:
                dist[i] += w / len(ties)
        return dist

    def _pod(self, q):
        """Law of the server picked by Pod(d): d distinct servers, shortest, ties uniform."""
        return list((p, i) for i, p in self._shortest_of(self.server_subsets, q).items())

    def _plain_targets(self, q):
        pol, n = self.rule, self.n
        if pol == "random" or (pol == "pod" and self.d == 1):
            return self._uniform(range(n))
        if pol in ("jsq", "jsew"):  # (jsew with identical servers is JSQ; pools: PhaseChain)
            best = min(q)
            return self._uniform([i for i in range(n) if q[i] == best])
        if pol == "pod":
            return self._pod(q)
        if pol == "i1f":
            idle = [i for i in range(n) if q[i] == 0]
            if idle:
                return self._uniform(idle)
            ones = [i for i in range(n) if q[i] == 1]
            if ones:
                return self._uniform(ones)
            return self._uniform(range(n))
        raise AssertionError(pol)

    def _join_uniform(self, l, i):
        """Server ``i`` joins a uniformly random I-queue: list of (prob, new listing)."""
        out = []
        for j in range(self.m):
            ln = list(l)
            ln[i] = j
            out.append((1.0 / self.m, ln))
        return out

    def _join_sq(self, l, i):
        """JIQ-SQ(d): join the shortest of d distinct uniform I-queues (ties uniform)."""
        sizes = [0] * self.m
        for b in l:
            if b >= 0:
                sizes[b] += 1
        out = []
        for j, p in self._shortest_of(self.iq_subsets, sizes).items():
            ln = list(l)
            ln[i] = j
            out.append((p, ln))
        return out

    # ---- events -----------------------------------------------------------
    def _arrivals(self, q, l, pos, j):
        """Branches of one arrival at dispatcher ``j``.

        Yields ``(prob, q_new, l_new, pos_new, k, joins, deletes, probes, stale)``
        with ``k`` the queue length the task finds (``-1``: lost); ``pos`` is
        ``None`` but for FIFO I-queues (see :meth:`canon`).
        """
        pol, cap, n, d = self.rule, self.cap, self.n, self.d
        if not self.listed:
            probes = d if (pol == "pod" and d >= 2) else 0
            for p, i in self._plain_targets(q):
                if q[i] >= cap:
                    yield p, q, l, None, -1, 0, 0, probes, 0
                else:
                    qn = list(q)
                    qn[i] += 1
                    yield p, qn, l, None, q[i], 0, 0, probes, 0
            return

        mine = [i for i in range(n) if l[i] == j]

        if pol == "jiq-original":
            if mine:
                if self.fifo:  # the head of the I-queue, and the others move up
                    picks = [(1.0, next(i for i in mine if pos[i] == 0))]
                else:
                    picks = self._uniform(mine)
                for p, i in picks:
                    ln = list(l)
                    ln[i] = -1  # leaves the list whether or not it is still idle
                    posn = None
                    if self.fifo:
                        posn = [c - 1 if b == j else c for b, c in zip(l, pos)]
                        posn[i] = -1
                    stale = 1 if q[i] > 0 else 0
                    if q[i] >= cap:
                        yield p, q, ln, posn, -1, 0, 0, 0, stale
                    else:
                        qn = list(q)
                        qn[i] += 1
                        yield p, qn, ln, posn, q[i], 0, 0, 0, stale
            else:
                for p, i in self._uniform(range(n)):  # no delete request: stays listed
                    if q[i] >= cap:
                        yield p, q, l, pos, -1, 0, 0, 0, 0
                    else:
                        qn = list(q)
                        qn[i] += 1
                        yield p, qn, l, pos, q[i], 0, 0, 0, 0
            return

        if pol == "jiq-threshold":
            z = self.z
            if mine:
                for p, i in self._uniform(mine):
                    ln = list(l)
                    ln[i] = -1
                    if q[i] >= cap:
                        qn, k = q, -1
                    else:
                        qn = list(q)
                        qn[i] += 1
                        k = q[i]
                    if qn[i] <= z:  # still at most z tasks: joins a uniform I-queue again
                        for pj, lj in self._join_uniform(ln, i):
                            yield p * pj, qn, lj, None, k, 1, 0, 0, 0
                    else:
                        yield p, qn, ln, None, k, 0, 0, 0, 0
            else:
                for p, i in self._uniform(range(n)):
                    if q[i] >= cap:
                        yield p, q, l, None, -1, 0, 0, 0, 0
                        continue
                    qn = list(q)
                    qn[i] += 1
                    if l[i] >= 0 and qn[i] > z:  # taken past z: delete request
                        ln = list(l)
                        ln[i] = -1
                        yield p, qn, ln, None, q[i], 0, 1, 0, 0
                    else:
                        yield p, qn, l, None, q[i], 0, 0, 0, 0
            return

        # jiq, jiq-pod, jiq-sq: I-queues hold exactly the idle servers.
        if mine:
            for p, i in self._uniform(mine):
                assert q[i] == 0, "JIQ invariant: listed servers are idle"
                qn = list(q)
                qn[i] = 1
                ln = list(l)
                ln[i] = -1
                yield p, qn, ln, None, 0, 0, 0, 0, 0
            return
        if pol == "jiq-pod" and d >= 2:
            targets, probes = self._pod(q), d
        else:
            targets, probes = self._uniform(range(n)), 0
        for p, i in targets:
            if q[i] >= cap:
                yield p, q, l, None, -1, 0, 0, probes, 0
                continue
            qn = list(q)
            qn[i] += 1
            if l[i] >= 0:  # an idle listed server got a task: delete request
                ln = list(l)
                ln[i] = -1
                yield p, qn, ln, None, q[i], 0, 1, probes, 0
            else:
                yield p, qn, l, None, q[i], 0, 0, probes, 0

    def _departure(self, q, l, pos, i):
        """Branches of a service completion at busy server ``i``:
        ``(prob, q, l, pos, joins, probes)``."""
        pol = self.rule
        qn = list(q)
        qn[i] -= 1
        joins = None
        if pol in ("jiq", "jiq-pod") and qn[i] == 0:
            joins = self._join_uniform(l, i)
        elif pol == "jiq-sq" and qn[i] == 0:
            probes = self.d if self.d >= 2 else 0
            return [(p, qn, ln, None, 1, probes) for p, ln in self._join_sq(l, i)]
        elif pol == "jiq-original" and qn[i] <= self.z and l[i] < 0:
            # not listed, and at most z tasks left: a join request
            if self.d >= 2:
                joins, probes = self._join_sq(l, i), self.d
            else:
                joins, probes = self._join_uniform(l, i), 0
            out = []
            for p, ln in joins:
                posn = None
                if self.fifo:  # at the tail of the I-queue it joins
                    posn = list(pos)
                    posn[i] = sum(1 for b in l if b == ln[i])
                out.append((p, qn, ln, posn, 1, probes))
            return out
        elif pol == "jiq-threshold" and qn[i] == self.z:
            joins = self._join_uniform(l, i)
        if joins is None:
            return [(1.0, qn, l, pos, 0, 0)]
        return [(p, qn, ln, None, 1, 0) for p, ln in joins]

    def expand(self, state):
        """Outgoing rates ``{target: rate}`` (no self-loops) and the reward vector."""
        q, l, pos = self._labelled(state)
        out = defaultdict(float)
        rew = np.zeros(self.n_rewards)
        canon = self.canon
        if self.listed:
            dispatchers, rate = range(self.m), self.lam * self.n / self.m
        else:  # the dispatcher does not matter
            dispatchers, rate = range(1), self.lam * self.n
        for j in dispatchers:
            for p, qn, ln, posn, k, joins, deletes, probes, stale in self._arrivals(q, l, pos, j):
                r = rate * p
                if k >= 0:
                    rew[N_FIXED_REWARDS + k] += r
                else:
                    rew[LOST] += r
                rew[JOIN] += r * joins
                rew[DELETE] += r * deletes
                rew[PROBE] += r * probes
                rew[STALE] += r * stale
                t = canon(qn, ln, posn)
                if t != state:
                    out[t] += r
        for i in range(self.n):
            if q[i] > 0:
                for p, qn, ln, posn, joins, probes in self._departure(q, l, pos, i):
                    rew[JOIN] += p * joins
                    rew[PROBE] += p * probes
                    t = canon(qn, ln, posn)
                    if t != state:
                        out[t] += p
        return out, rew


class PhaseChain(Chain):
    """The chain of :class:`Chain` with phase-type service ``PH(alpha, S)``,
    and optionally pools of servers of their own speeds and laws.

    A server's entry in the labelled state is the pair ``(q, phase)``: its
    queue length and the phase of the task in service (0 when idle); with
    ``pools``, the triple ``(pool, q, phase)``, its pool first (fixed for the
    server: nothing changes it). The base :meth:`Chain.canon` and
    :meth:`Chain.decode` sort and group these tuples as they sort plain queue
    lengths, so the symmetry lumping is unchanged (relabelling servers and
    dispatchers); with pools, the pool listed first keeps the pools apart, so
    states are lumped only under relabelling servers within a pool (and
    dispatchers), which is still exact. Routing never looks at phases or pools:
    the rules' :meth:`Chain._arrivals` and :meth:`Chain._departure` run on the
    plain queue lengths and the phases are mapped onto their branches (see
    :meth:`expand`). Only the rules of :data:`PHASE_RULES` are allowed.

    The reward vector is that of :class:`Chain` followed, without pools, by
    the rate of accepted arrivals that find ``k = 1..cap-1`` tasks at a server
    whose task in service is in phase ``p`` (index :attr:`seen_phase_offset`
    ``+ (k - 1) P + p``): the joint law the response time of an arrival
    depends on. With pools it is the rate of accepted arrivals at a server of
    pool ``i`` that find ``k = 0..cap-1`` tasks, the one in service (if any)
    in phase ``p`` (index :attr:`seen_phase_offset` ``+ (i cap + k) P + p``;
    ``p = 0`` for ``k = 0``), ``P`` the most phases of the pools' laws. It
    grows with the queue bound, so :meth:`expand` returns it sparse, as a dict
    ``{index: rate}`` (:attr:`sparse_rewards`; :func:`enumerate_states` then
    returns a :class:`SparseRewards`).

    Args:
        law: the service law (:class:`~jaxqueue.core.service.PhaseType`);
            with ``pools``, the law of the pools whose ``law`` is ``None``.
        pools: ``None`` (identical servers of law ``law``), or a sequence of
            :class:`~jaxqueue.core.service.Pool` (``count`` servers of speed
            ``speed`` and law ``law``, or this ``law`` if ``None``; the counts
            sum to ``n``): a server of speed ``v`` completes in phase ``p`` at
            rate ``v s[p]`` and moves to phase ``b`` at rate ``v S[p][b]``.
            Servers ``0..count_0-1`` of the initial labelled state form pool
            0, and so on.
        The other arguments as for :class:`Chain` (``order`` is not taken:
        FIFO I-queues belong to ``jiq-original``, which is not allowed).
    """

    sparse_rewards = True

    def __init__(self, rule, n, m, lam, d, z, cap, symmetry, law, pools=None):
        if rule not in PHASE_RULES:
            raise ValueError(
                f"rule {rule!r} has no phase-type chain; the rules with one are {PHASE_RULES}"
            )
        super().__init__(rule, n, m, lam, d, z, cap, symmetry)
        self.law = law
        self.pools = None if pools is None else tuple(pools)
        if self.pools is None:
            specs = [(law, 1.0)]
        else:
            if sum(p.count for p in self.pools) != n:
                held = sum(p.count for p in self.pools)
                raise ValueError(f"the pools hold {held} servers, not n={n}")
            specs = [(law if p.law is None else p.law, float(p.speed)) for p in self.pools]
            if any(x is None for x, _ in specs):
                raise ValueError("a pool without a law needs law (the system's law)")
        #: per pool: ``(phase, probability)`` of a task that starts service
        self.pool_starts = []
        #: per pool: ``moves[p]``, the ``(phase, rate)`` of the jumps out of phase ``p``
        self.pool_moves = []
        #: per pool: ``exits[p]``, the completion rate in phase ``p``
        self.pool_exits = []
        for x, v in specs:
            s = x.matrix
            self.pool_starts.append([(a, float(y)) for a, y in enumerate(x.alpha) if y > 0.0])
            if v == 1.0:  # identical servers: the law's rates as they are
                moves = [
                    [(b, float(s[a, b])) for b in range(x.n_phases) if b != a and s[a, b] > 0.0]
                    for a in range(x.n_phases)
                ]
                exits = [max(float(y), 0.0) for y in x.exit_rates]
            else:
                moves = [
                    [(b, v * float(s[a, b])) for b in range(x.n_phases) if b != a and s[a, b] > 0.0]
                    for a in range(x.n_phases)
                ]
                exits = [max(v * float(y), 0.0) for y in x.exit_rates]
            self.pool_moves.append(moves)
            self.pool_exits.append(exits)
        #: the most phases of a law (the phases of the one law without pools)
        self.n_phases = p_count = max(x.n_phases for x, _ in specs)
        # the one law's tables, as before pools existed
        self.starts, self.moves, self.exits = (
            self.pool_starts[0],
            self.pool_moves[0],
            self.pool_exits[0],
        )
        self.seen_phase_offset = N_FIXED_REWARDS + cap
        if self.pools is None:
            self.n_rewards = self.seen_phase_offset + (cap - 1) * p_count
        else:
            self.n_rewards = self.seen_phase_offset + len(self.pools) * cap * p_count
        #: per pool: mean service time over speed (jsew's expected wait per task)
        self.pool_wait = [x.mean / v for x, v in specs]
        self._labels = None  # the pools of the state being expanded (jsew)
        #: the pool of each server of the initial labelled state
        self.pool_of = (
            None
            if self.pools is None
            else [i for i, p in enumerate(self.pools) for _ in range(p.count)]
        )

    def initial(self):
        listing = [i % self.m if self.listed else -1 for i in range(self.n)]
        if self.pools is None:
            return self.canon([(0, 0)] * self.n, listing)
        return self.canon([(g, 0, 0) for g in self.pool_of], listing)

    def _key(self, q, ph, l):
        return self.canon(list(zip(q, ph)), l)

    def expand(self, state):
        """Outgoing rates ``{target: rate}`` (no self-loops) and the reward vector
        (sparse: ``{index: rate}``).

        Arrivals: the rule's branches on the queue lengths; a task that finds
        its server idle starts in phase ``a`` with probability ``alpha[a]``, one
        that finds it busy leaves the phase as it is, a lost one changes
        nothing. Busy server ``i`` in phase ``p``: to phase ``b != p`` at rate
        ``S[p][b]`` (nothing else changes, no reward); completion at rate
        ``s[p]``, the rule's departure branches (joins, probes) times ``s[p]``,
        and the next task, if any, starts in phase ``a`` with probability
        ``alpha[a]``; a server left idle is in phase 0. With pools, ``alpha``
        and ``S`` are those of the server's pool, and its rates are ``speed``
        times the law's.
        """
        entries, l, _ = self._labelled(state)
        if self.pools is None:
            q = [a for a, _ in entries]
            ph = [b for _, b in entries]
            pl = None
            key = self._key
        else:
            pl = [c for c, _, _ in entries]
            q = [a for _, a, _ in entries]
            ph = [b for _, _, b in entries]
            canon = self.canon

            def key(q_, ph_, l_):
                return canon(list(zip(pl, q_, ph_)), l_)

        self._labels = pl
        n, p_count, cap = self.n, self.n_phases, self.cap
        out = defaultdict(float)
        rew = defaultdict(float)  # sparse: index -> rate (see enumerate_states)
        if self.listed:
            dispatchers, rate = range(self.m), self.lam * self.n / self.m
        else:
            dispatchers, rate = range(1), self.lam * self.n
        for j in dispatchers:
            for p, qn, ln, _, k, joins, deletes, probes, stale in self._arrivals(q, l, None, j):
                r = rate * p
                if joins:
                    rew[JOIN] += r * joins
                if deletes:
                    rew[DELETE] += r * deletes
                if probes:
                    rew[PROBE] += r * probes
                if stale:
                    rew[STALE] += r * stale
                if k < 0:
                    rew[LOST] += r
                    targets = [(1.0, key(q, ph, ln))]
                else:
                    rew[N_FIXED_REWARDS + k] += r
                    i = next(x for x in range(n) if qn[x] != q[x])
                    if pl is not None:  # by pool: (pool, k, phase of the one in service)
                        at = self.seen_phase_offset + (pl[i] * cap + k) * p_count
                        rew[at + (ph[i] if k > 0 else 0)] += r
                    if k == 0:  # starts service
                        targets = []
                        for a, pa in self.pool_starts[pl[i] if pl else 0]:
                            phn = list(ph)
                            phn[i] = a
                            targets.append((pa, key(qn, phn, ln)))
                    else:  # waits behind the task in service, in phase ph[i]
                        if pl is None:
                            rew[self.seen_phase_offset + (k - 1) * p_count + ph[i]] += r
                        targets = [(1.0, key(qn, ph, ln))]
                for pa, t in targets:
                    if t != state:
                        out[t] += r * pa
        for i in range(n):
            if q[i] == 0:
                continue
            g = pl[i] if pl else 0
            cur = ph[i]
            for b, r in self.pool_moves[g][cur]:
                phn = list(ph)
                phn[i] = b
                t = key(q, phn, l)
                if t != state:
                    out[t] += r
            s_p = self.pool_exits[g][cur]
            if s_p <= 0.0:
                continue
            for p, qn, ln, _, joins, probes in self._departure(q, l, None, i):
                r = s_p * p
                if joins:
                    rew[JOIN] += r * joins
                if probes:
                    rew[PROBE] += r * probes
                phn = list(ph)
                if qn[i] > 0:  # the next task starts service
                    for a, pa in self.pool_starts[g]:
                        phn[i] = a
                        t = key(qn, phn, ln)
                        if t != state:
                            out[t] += r * pa
                else:
                    phn[i] = 0
                    t = key(qn, phn, ln)
                    if t != state:
                        out[t] += r
        return out, rew

    def _plain_targets(self, q):
        """As :meth:`Chain._plain_targets`; ``jsew`` with pools weighs each
        server's ``q + 1`` by its pool's mean service time over speed, among
        the servers with room (equal within ``WAIT_TIE``: ties, uniform)."""
        if self.rule != "jsew" or self._labels is None:
            return super()._plain_targets(q)
        from jaxqueue.sim.classes import WAIT_TIE

        waits = [(q[i] + 1) * self.pool_wait[self._labels[i]] for i in range(self.n)]
        room = [i for i in range(self.n) if q[i] < self.cap] or list(range(self.n))
        best = min(waits[i] for i in room)
        return self._uniform([i for i in room if waits[i] <= best * (1 + WAIT_TIE)])

    def queue_lengths(self, decoded_q):
        """The plain queue lengths of a decoded state's server entries."""
        if self.pools is None:
            return [a for a, _ in decoded_q]
        return [a for _, a, _ in decoded_q]

    def pool_labels(self, decoded_q):
        """The pool of each of a decoded state's server entries (chains with pools)."""
        return [c for c, _, _ in decoded_q]


def estimate_states(rule, n, m, z, bound, symmetry, order="random", n_phases=1, pools=None):
    """Rough count of reachable states of ``rule`` with queue bound ``bound`` (for budgeting).

    ``n_phases``: phases of the service law (:class:`PhaseChain`, rules of
    :data:`PHASE_RULES` only): a busy server at each level has that many types.
    ``pools``: ``None``, or ``(count, n_phases)`` per pool (:class:`PhaseChain`
    with pools): the servers of a pool have that many phases, and the servers
    of different pools are told apart, so the count is about the product over
    the pools of the count of a system of ``count`` servers (``n_phases``
    is then not used). Exact for the rules without I-queues; for the JIQ
    family it is not divided by ``M!`` (the relabelling of dispatchers is
    shared by the pools), and overestimates the count, by 10-50% with
    ``M = 2`` and about twice with ``M = 3`` in the cases tried.
    """
    if pools is not None:
        est = 1
        for count, ph in pools:
            t = bound * ph + (m if rule in ("jiq", "jiq-pod", "jiq-sq") else 1)
            est *= t**count if not symmetry else math.comb(t + count - 1, count)
        return est
    ph = n_phases
    if rule in ("jiq", "jiq-pod", "jiq-sq"):
        t = bound * ph + m
    elif rule == "jiq-original":
        t = m + (m + 1) * bound
    elif rule == "jiq-threshold":
        low = min(z, bound) + 1
        t = low * m + (bound + 1 - low)
    else:
        t = bound * ph + 1
    if not symmetry:
        return t**n
    est = math.comb(t + n - 1, n)
    if rule in JIQ_FAMILY:
        est //= math.factorial(m)
    if rule == "jiq-original" and order == "fifo":  # the orders of a full I-queue
        est *= math.factorial(-(-n // m))
    return est


class SparseRewards:
    """Per-state reward vectors in coordinate form: state ``rows[i]`` earns
    ``vals[i]`` in entry ``cols[i]`` (what :func:`enumerate_states` returns for
    a chain with ``sparse_rewards``, whose reward vectors are long and mostly 0).

    ``pi @ rewards`` gives the expected reward vector, as for a dense
    ``(S, n_rewards)`` array.
    """

    __array_ufunc__ = None  # ``pi @ self`` calls __rmatmul__

    def __init__(self, rows, cols, vals, n_states, n_rewards):
        self.rows = np.asarray(rows, dtype=np.int64)
        self.cols = np.asarray(cols, dtype=np.int64)
        self.vals = np.asarray(vals, dtype=np.float64)
        self.shape = (n_states, n_rewards)

    def __rmatmul__(self, pi):
        pi = np.asarray(pi, dtype=np.float64)
        return np.bincount(self.cols, weights=pi[self.rows] * self.vals, minlength=self.shape[1])

    def toarray(self):
        out = np.zeros(self.shape)
        np.add.at(out, (self.rows, self.cols), self.vals)
        return out


def enumerate_states(chain, max_states):
    """Breadth-first search from the empty system.

    Returns:
        ``(states, rows, cols, vals, rewards)``: the state keys (state 0 is the
        empty system), the transitions ``rows[i] -> cols[i]`` at rate
        ``vals[i]`` (int64, int64, float64; no self-loops), and the per-state
        reward vectors ``(S, chain.n_rewards)`` (event rates, see
        :data:`N_FIXED_REWARDS`): a float64 array, or a :class:`SparseRewards`
        for a chain with ``sparse_rewards`` (:class:`PhaseChain`).

    Raises:
        ValueError: more than ``max_states`` reachable states.
    """
    init = chain.initial()
    index = {init: 0}
    states = [init]
    rows, cols, vals, rewards = [], [], [], []
    sparse = chain.sparse_rewards
    r_rows, r_cols, r_vals = [], [], []
    ptr = 0
    while ptr < len(states):
        out, rew = chain.expand(states[ptr])
        for t, rate in out.items():
            k = index.get(t)
            if k is None:
                k = len(states)
                if k >= max_states:
                    raise ValueError(
                        f"more than max_states={max_states} reachable states; use a smaller "
                        "n_servers, n_dispatchers, buffer or queue_bound, or raise max_states"
                    )
                index[t] = k
                states.append(t)
            rows.append(ptr)
            cols.append(k)
            vals.append(rate)
        if sparse:
            r_rows.extend([ptr] * len(rew))
            r_cols.extend(rew.keys())
            r_vals.extend(rew.values())
        else:
            rewards.append(rew)
        ptr += 1
    if sparse:
        rewards = SparseRewards(r_rows, r_cols, r_vals, len(states), chain.n_rewards)
    return (
        states,
        np.asarray(rows, dtype=np.int64),
        np.asarray(cols, dtype=np.int64),
        np.asarray(vals, dtype=np.float64),
        rewards if sparse else np.asarray(rewards),
    )
