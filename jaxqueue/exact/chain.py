"""The per-server Markov chains of the exact solver: one rule per policy.

The continuous-time Markov chain of the whole system is written down literally,
with a *per-server* state: the queue length of every server and, for the JIQ
family, which I-queue (if any) lists it. :func:`enumerate_states` finds the
reachable states by breadth-first search from the empty system and returns the
generator's transitions and each state's event rates. Nothing here shares code
with the simulator (which works on occupancy counts or its own per-server
arrays), so the two can check each other.

Model (docs/theory.md): ``N`` FIFO servers with exp(1) service, Poisson
arrivals of rate ``lambda * N``, each to a uniformly chosen one of ``M``
dispatchers, routed by the rule. The rules (:data:`RULES`; the policies of
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

Symmetry. All the rules treat servers alike and dispatchers alike, so the
generator is invariant under relabelling servers and relabelling dispatchers.
By default (``symmetry=True``) a state is stored by its orbit invariant under
both relabellings (the sorted queue lengths of the unlisted servers, and the
sorted list of I-queues, each the sorted queue lengths of the servers it
lists; for FIFO I-queues the queue lengths in I-queue order, head first, since
the order is part of the state); transitions are still computed on a labelled
per-server representative. This lumping is exact (strong lumpability under a
symmetry group) and every reported quantity is symmetric, so nothing changes
but the state count. ``symmetry=False`` keeps the full labelled chain (the tests check
that both agree).

State counts grow like ``C(T + N - 1, N)`` (JIQ family: up to ``/ M!``) with
``T`` the per-server types (:func:`estimate_states`): ``B + 1`` for the
policies without I-queues, ``B + M`` for JIQ, JIQ-Pod, JIQ-SQ,
``M + (M + 1) B`` for JIQ-Original (times ``ceil(N / M)!`` for FIFO order),
``(z + 1) M + B - z`` for JIQ-Threshold, ``B`` the queue bound. Enumeration
is pure Python, roughly 50 us per state.
"""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import combinations

import numpy as np

__all__ = [
    "RULES", "JIQ_FAMILY", "Chain", "estimate_states", "enumerate_states", "LOST", "JOIN",
    "DELETE", "PROBE", "STALE", "N_FIXED_REWARDS",
]  # fmt: skip

#: The exact rules, one per chain (``Policy.exact_rule()`` names one of them).
RULES = (
    "random",
    "jsq",
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
        if pol == "jsq":
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


def estimate_states(rule, n, m, z, bound, symmetry, order="random"):
    """Rough count of reachable states of ``rule`` with queue bound ``bound`` (for budgeting)."""
    if rule in ("jiq", "jiq-pod", "jiq-sq"):
        t = bound + m
    elif rule == "jiq-original":
        t = m + (m + 1) * bound
    elif rule == "jiq-threshold":
        low = min(z, bound) + 1
        t = low * m + (bound + 1 - low)
    else:
        t = bound + 1
    if not symmetry:
        return t**n
    est = math.comb(t + n - 1, n)
    if rule in JIQ_FAMILY:
        est //= math.factorial(m)
    if rule == "jiq-original" and order == "fifo":  # the orders of a full I-queue
        est *= math.factorial(-(-n // m))
    return est


def enumerate_states(chain, max_states):
    """Breadth-first search from the empty system.

    Returns:
        ``(states, rows, cols, vals, rewards)``: the state keys (state 0 is the
        empty system), the transitions ``rows[i] -> cols[i]`` at rate
        ``vals[i]`` (int64, int64, float64; no self-loops), and the per-state
        reward vectors ``(S, chain.n_rewards)`` (event rates, see
        :data:`N_FIXED_REWARDS`).

    Raises:
        ValueError: more than ``max_states`` reachable states.
    """
    init = chain.initial()
    index = {init: 0}
    states = [init]
    rows, cols, vals, rewards = [], [], [], []
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
        rewards.append(rew)
        ptr += 1
    return (
        states,
        np.asarray(rows, dtype=np.int64),
        np.asarray(cols, dtype=np.int64),
        np.asarray(vals, dtype=np.float64),
        np.asarray(rewards),
    )
