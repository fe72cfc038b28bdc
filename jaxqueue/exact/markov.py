"""The exact chain with exp(1) service (:class:`Chain`): labelled per-server
states, their keys under the symmetry lumping, and the transitions the
policy's exact rule gives (docs/exact.md).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from jaxqueue.policies.base import Policy
from jaxqueue.policies.exact_rules import ExactState
from jaxqueue.policies.registry import make, option_names

__all__ = [
    "Chain",
    "rule_policy",
    "LOST",
    "JOIN",
    "DELETE",
    "PROBE",
    "STALE",
    "N_FIXED_REWARDS",
]

# Layout of the per-state reward vector (rates of events, per unit time): the
# fixed entries, then the rate of accepted arrivals that find k = 0..cap-1 tasks.
LOST, JOIN, DELETE, PROBE, STALE = range(5)
N_FIXED_REWARDS = 5


def rule_policy(rule, d=None, z=None, order=None) -> Policy:
    """The policy whose exact rule a chain runs: ``rule`` itself if a
    :class:`~jaxqueue.policies.base.Policy`, else the registered policy of
    that name with those of ``d``, ``z``, ``order`` it takes."""
    if isinstance(rule, Policy):
        return rule
    taken = option_names(rule)
    return make(rule, **{k: v for k, v in dict(d=d, z=z, order=order).items() if k in taken})


class Chain:
    """Per-server CTMC of one policy's exact rule: states, transitions and event rewards.

    Transitions are computed on a labelled state: lists ``q`` (queue length of
    each server) and ``l`` (the I-queue listing each server, or -1), and for
    FIFO I-queues ``pos`` (each listed server's place in its I-queue, 0 the
    head). States are stored by the key :meth:`canon` gives; :meth:`decode`
    returns a labelled representative of a key. Where an arrival goes, and
    what a completion does to the I-queues, is the policy's
    (``Policy.exact_arrivals``, ``Policy.exact_departure``).

    Args:
        rule: a :class:`~jaxqueue.policies.base.Policy`, or a policy name
            (``Policy.exact_rule()``'s) resolved with :func:`rule_policy`.
        n, m: servers and dispatchers.
        lam: arrival rate per server.
        d, z, order: the options of a rule given by name (those it takes).
        cap: the largest queue length (the buffer, or the truncation bound);
            an arrival at a server holding ``cap`` tasks is lost.
        symmetry: store states by their orbit under relabelling servers and
            dispatchers (exact lumping); else the labelled chain.
    """

    #: :meth:`expand` returns the reward vector dense (a ``{index: rate}`` dict if True)
    sparse_rewards = False

    def __init__(self, rule, n, m, lam, d, z, cap, symmetry, order="random"):
        self.policy = rule_policy(rule, d, z, order)
        self.rule = rule if isinstance(rule, str) else self.policy.exact_rule()[0]
        self.n, self.m, self.lam, self.cap, self.symmetry = n, m, lam, cap, symmetry
        self.listed = self.policy.uses_iqueues
        #: FIFO I-queues: the labelled state also holds each listed server's place
        self.fifo = self.policy.fifo
        self.n_rewards = N_FIXED_REWARDS + cap  # + accepted arrivals seeing k = 0..cap-1
        if self.listed:  # arrivals by dispatcher
            self.dispatchers, self.rate = range(m), lam * n / m
        else:  # the dispatcher does not matter
            self.dispatchers, self.rate = range(1), lam * n

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

    def labelled(self, key):
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
            return self.labelled(key)[:2]
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
        """The key of the empty system (idle servers listed round-robin in the JIQ family)."""
        listing = [i % self.m if self.listed else -1 for i in range(self.n)]
        places = [i // self.m for i in range(self.n)] if self.fifo else None
        return self.canon([0] * self.n, listing, places)

    # ---- events -----------------------------------------------------------
    def expand(self, state):
        """Outgoing rates ``{target: rate}`` (no self-loops) and the reward vector."""
        q, l, pos = self.labelled(state)
        view = ExactState(q, l, pos, self.n, self.m, self.cap)
        out = defaultdict(float)
        rew = np.zeros(self.n_rewards)
        canon, policy = self.canon, self.policy
        for j in self.dispatchers:
            for move in policy.exact_arrivals(view, j):
                r = self.rate * move.prob
                if move.found >= 0:
                    rew[N_FIXED_REWARDS + move.found] += r
                else:
                    rew[LOST] += r
                rew[JOIN] += r * move.joins
                rew[DELETE] += r * move.deletes
                rew[PROBE] += r * move.probes
                rew[STALE] += r * move.stale
                t = canon(move.q, move.l, move.pos)
                if t != state:
                    out[t] += r
        for i in range(self.n):
            if q[i] > 0:
                for move in policy.exact_departure(view, i):
                    rew[JOIN] += move.prob * move.joins
                    rew[PROBE] += move.prob * move.probes
                    t = canon(move.q, move.l, move.pos)
                    if t != state:
                        out[t] += move.prob
        return out, rew
