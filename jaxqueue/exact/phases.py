"""The exact chain with phase-type service and pools of servers (:class:`PhaseChain`):
each server's entry carries the phase of its task in service, and its pool
(docs/exact.md).
"""

from __future__ import annotations

from collections import defaultdict

from jaxqueue.exact.markov import DELETE, JOIN, LOST, N_FIXED_REWARDS, PROBE, STALE, Chain
from jaxqueue.policies.exact_rules import ExactState

__all__ = ["PhaseChain"]


def _law_tables(law, v):
    """``(starts, moves, exits)`` of a law run at speed ``v``: the ``(phase,
    probability)`` a task starts in, per phase the ``(phase, rate)`` jumps out,
    and per phase the completion rate."""
    s = law.matrix
    starts = [(a, float(y)) for a, y in enumerate(law.alpha) if y > 0.0]
    if v == 1.0:  # identical servers: the law's rates as they are
        moves = [
            [(b, float(s[a, b])) for b in range(law.n_phases) if b != a and s[a, b] > 0.0]
            for a in range(law.n_phases)
        ]
        exits = [max(float(y), 0.0) for y in law.exit_rates]
    else:
        moves = [
            [(b, v * float(s[a, b])) for b in range(law.n_phases) if b != a and s[a, b] > 0.0]
            for a in range(law.n_phases)
        ]
        exits = [max(v * float(y), 0.0) for y in law.exit_rates]
    return starts, moves, exits


class PhaseChain(Chain):
    """The chain of :class:`~jaxqueue.exact.markov.Chain` with phase-type
    service ``PH(alpha, S)``, and optionally pools of servers of their own
    speeds and laws.

    A server's entry in the labelled state is the pair ``(q, phase)`` (phase 0
    when idle); with ``pools`` the triple ``(pool, q, phase)``, its pool first
    and fixed. The symmetry keys of :class:`Chain` sort these tuples as they
    sort queue lengths, so states are lumped within pools only. The policy
    routes on the queue lengths (and, for ``jsew``, its servers' expected
    waits); the phases are mapped onto its branches. Only the policies with
    ``exact_phases`` are allowed.

    Rewards (sparse, ``{index: rate}``): those of :class:`Chain`, then from
    :attr:`seen_phase_offset` the rate of accepted arrivals by what they find,
    without pools ``(k - 1) P + p`` for ``k = 1..cap-1`` tasks, the one in
    service in phase ``p``; with pools ``(i cap + k) P + p`` at a server of
    pool ``i``, ``k = 0..cap-1`` (``p = 0`` for ``k = 0``); ``P`` the most
    phases of a law.

    Args:
        law: the service law (:class:`~jaxqueue.core.service.PhaseType`);
            with ``pools``, the law of the pools whose ``law`` is ``None``.
        pools: ``None``, or a sequence of :class:`~jaxqueue.core.service.Pool`
            whose counts sum to ``n``: a server of speed ``v`` runs its law's
            rates times ``v``. Servers ``0..count_0-1`` of the initial
            labelled state form pool 0, and so on.
        The other arguments as for :class:`Chain` (no ``order``: FIFO
        I-queues belong to ``jiq-original``, which is not allowed).
    """

    sparse_rewards = True

    def __init__(self, rule, n, m, lam, d, z, cap, symmetry, law, pools=None):
        super().__init__(rule, n, m, lam, d, z, cap, symmetry)
        if not self.policy.exact_phases:
            raise ValueError(f"rule {self.rule!r} has no phase-type chain")
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
        tables = [_law_tables(x, v) for x, v in specs]
        #: per pool: ``(phase, probability)`` of a task that starts service
        self.pool_starts = [t[0] for t in tables]
        #: per pool: ``moves[p]``, the ``(phase, rate)`` of the jumps out of phase ``p``
        self.pool_moves = [t[1] for t in tables]
        #: per pool: ``exits[p]``, the completion rate in phase ``p``
        self.pool_exits = [t[2] for t in tables]
        #: the most phases of a law (the phases of the one law without pools)
        self.n_phases = p_count = max(x.n_phases for x, _ in specs)
        self.seen_phase_offset = N_FIXED_REWARDS + cap
        if self.pools is None:
            self.n_rewards = self.seen_phase_offset + (cap - 1) * p_count
        else:
            self.n_rewards = self.seen_phase_offset + len(self.pools) * cap * p_count
        #: per pool: mean service time over speed (jsew's expected wait per task)
        self.pool_wait = [x.mean / v for x, v in specs]
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

    def expand(self, state):
        """Outgoing rates ``{target: rate}`` (no self-loops) and the sparse reward vector.

        Arrivals: the policy's branches on the queue lengths; a task that finds
        its server idle starts in phase ``a`` with probability ``alpha[a]``,
        one that finds it busy leaves the phase as it is. Busy server ``i`` in
        phase ``p``: to phase ``b`` at rate ``S[p][b]``; completion at rate
        ``s[p]`` times the policy's departure branches, the next task (if any)
        starting in phase ``a`` with probability ``alpha[a]``. With pools, the
        server's pool's law at its speed.
        """
        entries, l, _ = self.labelled(state)
        if self.pools is None:
            q = [a for a, _ in entries]
            ph = [b for _, b in entries]
            pl, waits = None, None

            def key(q_, ph_, l_):
                return self.canon(list(zip(q_, ph_)), l_)

        else:
            pl = [c for c, _, _ in entries]
            q = [a for _, a, _ in entries]
            ph = [b for _, _, b in entries]
            waits = [self.pool_wait[g] for g in pl]
            canon = self.canon

            def key(q_, ph_, l_):
                return canon(list(zip(pl, q_, ph_)), l_)

        view = ExactState(q, l, None, self.n, self.m, self.cap, waits)
        out = defaultdict(float)
        rew = defaultdict(float)  # sparse: index -> rate (see enumerate_states)
        self._arrivals(state, view, ph, pl, key, out, rew)
        self._services(state, view, ph, pl, key, out, rew)
        return out, rew

    def _arrivals(self, state, view, ph, pl, key, out, rew):
        """Add the arrivals' rates to ``out`` and their rewards to ``rew``."""
        q, p_count, cap = view.q, self.n_phases, self.cap
        for j in self.dispatchers:
            for move in self.policy.exact_arrivals(view, j):
                r = self.rate * move.prob
                for at, count in (
                    (JOIN, move.joins),
                    (DELETE, move.deletes),
                    (PROBE, move.probes),
                    (STALE, move.stale),
                ):
                    if count:
                        rew[at] += r * count
                k, qn, ln = move.found, move.q, move.l
                if k < 0:
                    rew[LOST] += r
                    targets = [(1.0, key(q, ph, ln))]
                else:
                    rew[N_FIXED_REWARDS + k] += r
                    i = next(x for x in range(self.n) if qn[x] != q[x])
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

    def _services(self, state, view, ph, pl, key, out, rew):
        """Add the phase changes' and completions' rates to ``out``, their rewards to ``rew``."""
        q, l = view.q, view.l
        for i in range(self.n):
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
            for move in self.policy.exact_departure(view, i):
                r = s_p * move.prob
                if move.joins:
                    rew[JOIN] += r * move.joins
                if move.probes:
                    rew[PROBE] += r * move.probes
                qn, ln = move.q, move.l
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

    def queue_lengths(self, decoded_q):
        """The plain queue lengths of a decoded state's server entries."""
        if self.pools is None:
            return [a for a, _ in decoded_q]
        return [a for _, a, _ in decoded_q]

    def pool_labels(self, decoded_q):
        """The pool of each of a decoded state's server entries (chains with pools)."""
        return [c for c, _, _ in decoded_q]
