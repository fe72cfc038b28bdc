"""Exact stationary solutions of small load-balancing systems (the test oracle).

The continuous-time Markov chain of the whole system is written down literally,
with a *per-server* state: the queue length of every server and, for the JIQ
family, which I-queue (if any) lists it. Its reachable states are enumerated by
breadth-first search from the empty system, the generator ``Q`` is assembled,
and ``pi Q = 0, sum(pi) = 1`` is solved. Nothing here shares code with
the simulator (which works on occupancy counts), so the two can check each other.

Model (see ``NOTES.md``): ``N`` FIFO servers with exp(1) service, Poisson
arrivals of rate ``lambda * N``, each to a uniformly chosen one of ``M``
dispatchers, routed by the policy's rule. The rules, one per policy name:

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
``jiq-sq``         as ``jiq``, but a server becoming idle joins the shortest of
                   ``d`` distinct uniform I-queues (ties uniform), ``d`` probes
                   per join when ``d >= 2``
``jiq-original``   no delete requests: a listed server stays listed when it gets
                   a task from elsewhere; a pick from a non-empty I-queue goes to
                   that server even if busy (a *stale* pick) and it leaves the
                   list; a server becoming idle joins a uniform I-queue only if it
                   is not listed already
``jiq-threshold``  listed exactly while holding ``<= z`` tasks; joins a uniform
                   I-queue when its queue drops to ``z``; a picked server leaves
                   its I-queue and rejoins a uniform one at once (a join) if it
                   still holds ``<= z``; a fallback task that takes a listed
                   server past ``z`` triggers a delete request. ``z = 0`` is JIQ.
=================  ==========================================================

Symmetry. All the rules treat servers alike and dispatchers alike, so the
generator is invariant under relabelling servers and relabelling dispatchers.
By default (``symmetry=True``) a state is stored by its orbit invariant under
both relabellings (the sorted queue lengths of the unlisted servers, and the
sorted list of I-queues, each the sorted queue lengths of the servers it
lists); transitions are still computed on a labelled per-server
representative. This lumping is exact (strong lumpability under a symmetry
group) and every reported quantity is symmetric, so nothing changes but the
state count. ``symmetry=False`` solves the full labelled chain (the tests check
that both agree).

Solver. The reachable set is checked to be one closed class (every state
leads back to the empty system), so the stationary law is unique. Up to 2000
states the sparse LU of scipy solves ``pi Q = 0`` with ``pi`` fixed at the
empty state; above that (where LU fill-in gets slow) GMRES with an
incomplete-LU preconditioner, falling back to LU. Without scipy, dense numpy up
to :data:`DENSE_STATE_LIMIT` states. The balance residual is checked, and the
mean response time by Little's law is checked against the PASTA one.

Limits. The solver is for small systems: state counts grow like
``C(T + N - 1, N)`` (JIQ family: up to ``/ M!``) with ``T`` the per-server
types (``B + 1`` for the policies without I-queues, ``B + M`` for JIQ,
JIQ-Pod, JIQ-SQ, ``M + (M + 1) B`` for JIQ-Original, ``(z + 1) M + B - z`` for
JIQ-Threshold, ``B`` the queue bound). With ``N = 4``, ``M = 2``, ``B = 12``:
1820 states (no I-queues), about 1900 (JIQ, JIQ-Pod, JIQ-SQ), 2098
(JIQ-Threshold, z = 1), 0.05-0.15 s each; JIQ-Original has 23 283 states
(about 2 s). Enumeration is pure Python, roughly 50 us per state.
``max_states`` (default 200 000) is a hard cap.

Infinite buffers are truncated at ``queue_bound``: an arrival that would pass
it is dropped (reported as ``truncation_loss``, not as blocking), and
``truncated_mass`` is the stationary probability that some server is at the
bound. Without ``queue_bound`` the bound is chosen adaptively so that
``truncated_mass <= tol`` (1e-9), within ``default_max_states`` states; if
that budget is not enough a :class:`UserWarning` says so.

Example:
    >>> from jaxqueue.exact import solve_exact
    >>> res = solve_exact("jsq", 1, load=0.5, queue_bound=40)
    >>> round(res.mean_response_time, 6)  # M/M/1: 1 / (1 - lambda)
    2.0
"""

from __future__ import annotations

import dataclasses
import math
import operator
import warnings
from collections import defaultdict
from itertools import combinations

import numpy as np

try:  # optional: sparse LU for speed
    import scipy.sparse as _sp
    import scipy.sparse.linalg as _spla
except ImportError:  # pragma: no cover - exercised only without scipy
    _sp = None
    _spla = None

__all__ = ["ExactResult", "solve_exact", "POLICIES", "DENSE_STATE_LIMIT"]

#: Policy names accepted by :func:`solve_exact`.
POLICIES = (
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
_JIQ_FAMILY = frozenset({"jiq", "jiq-pod", "jiq-sq", "jiq-original", "jiq-threshold"})

#: Largest state count solved with dense numpy when scipy is not importable.
DENSE_STATE_LIMIT = 3000

# Layout of the per-state reward vector (rates of events, per unit time).
_LOST, _JOIN, _DELETE, _PROBE, _STALE = range(5)
_N_FIXED_REWARDS = 5


@dataclasses.dataclass(frozen=True)
class ExactResult:
    """Stationary metrics of one small system (field names as the simulator's).

    Arrays are indexed by queue length ``k = 0..K`` where ``K`` is ``buffer``
    (finite buffers) or the queue bound used (infinite buffers).

    Attributes:
        policy, n_servers, n_dispatchers, load, d, z, buffer: the settings.
        queue_bound: the truncation level used (``None`` for finite buffers).
        tail: shape ``(K + 1,)``; ``tail[i]`` = expected fraction of servers
            with ``>= i`` tasks (``tail[0] = 1``).
        occupancy: shape ``(K + 1,)``; expected fraction with exactly ``k``.
        mean_queue_length: expected tasks per server.
        mean_response_time: mean sojourn time of accepted tasks (Little's law
            on the accepted throughput; checked against
            ``sum_k (k + 1) arrival_seen[k]``).
        waiting_probability: probability that an accepted arrival finds its
            server busy, ``1 - arrival_seen[0]``.
        blocking_probability: probability that an arrival is blocked (finite
            buffers; 0 for infinite buffers, see ``truncation_loss``).
        arrival_seen: shape ``(K,)``; law of the number of tasks an accepted
            arrival finds at its server (PASTA).
        p0: expected fraction of empty I-queues (JIQ family; NaN otherwise).
        iqueue_distribution: shape ``(N + 1,)``; expected fraction of I-queues
            holding exactly ``j`` servers (JIQ family; NaN otherwise).
        join_rate, delete_rate, probe_rate: messages per server per unit time
            (join-I-queue requests, delete requests, probes).
        stale_fraction: JIQ-Original: fraction of all assignments (arrivals)
            sent to a listed server that was no longer idle; NaN otherwise.
        truncated_mass: probability that some server is at the queue bound
            (infinite buffers; 0 for finite buffers).
        truncation_loss: probability that an arrival is dropped at the bound
            (infinite buffers; 0 for finite buffers).
        n_states: number of (symmetry-reduced, if ``symmetry``) states solved.
        symmetry: whether states were lumped by server/dispatcher relabelling.
    """

    policy: str
    n_servers: int
    n_dispatchers: int
    load: float
    d: int
    z: int
    buffer: int | None
    queue_bound: int | None
    tail: np.ndarray
    occupancy: np.ndarray
    mean_queue_length: float
    mean_response_time: float
    waiting_probability: float
    blocking_probability: float
    arrival_seen: np.ndarray
    p0: float
    iqueue_distribution: np.ndarray
    join_rate: float
    delete_rate: float
    probe_rate: float
    stale_fraction: float
    truncated_mass: float
    truncation_loss: float
    n_states: int
    symmetry: bool = True

    @property
    def ratio(self) -> float:
        """``r = N / M``."""
        return self.n_servers / self.n_dispatchers


# --------------------------------------------------------------------------
# validation


def _as_int(name, value):
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def _check_range(name, value, lo, hi=None):
    value = _as_int(name, value)
    if value < lo or (hi is not None and value > hi):
        rng = f"{lo} <= {name}" + (f" <= {hi}" if hi is not None else "")
        raise ValueError(f"{name}={value} is out of range: need {rng}")
    return value


def _validate(policy, n_servers, n_dispatchers, load, d, z, buffer, queue_bound):
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid policies: {', '.join(POLICIES)}")
    n = _check_range("n_servers", n_servers, 1)
    m = _check_range("n_dispatchers", n_dispatchers, 1, n)
    # d and z are checked in full where the policy uses them
    if policy == "jiq-sq":
        d = _check_range("d", d, 1, m)  # d distinct I-queues: d <= n_dispatchers
    elif policy in ("pod", "jiq-pod"):
        d = _check_range("d", d, 1, n)  # d distinct servers: d <= n_servers
    else:
        d = _check_range("d", d, 1)
    z = _check_range("z", z, 0)
    if buffer is not None:
        buffer = _check_range("buffer", buffer, 1)
    if load is None:
        raise ValueError("load is required: the arrival rate per server, load > 0")
    try:
        lam = float(load)
    except (TypeError, ValueError):
        raise TypeError(f"load must be a number, got {load!r}") from None
    if not math.isfinite(lam) or lam <= 0.0:
        raise ValueError(f"load={load} is out of range: need load > 0")
    if buffer is None and lam >= 1.0:
        raise ValueError(
            f"load={load} is out of range: infinite buffers (buffer=None) need 0 < load < 1"
        )
    if queue_bound is not None:
        if buffer is not None:
            raise ValueError(
                "queue_bound applies to infinite buffers only; with buffer="
                f"{buffer} the queues are bounded by the buffer (leave queue_bound=None)"
            )
        queue_bound = _check_range("queue_bound", queue_bound, 1)
    return policy, n, m, lam, d, z, buffer, queue_bound


# --------------------------------------------------------------------------
# the chain


class _Chain:
    """Per-server CTMC of one policy: states, transitions and event rewards.

    Transitions are computed on a labelled state: lists ``q`` (queue length of
    each server) and ``l`` (the I-queue listing each server, or -1). States are
    stored by the key :meth:`canon` gives (see there); :meth:`decode` returns a
    labelled representative of a key.
    """

    def __init__(self, policy, n, m, lam, d, z, cap, symmetry):
        self.policy, self.n, self.m, self.lam = policy, n, m, lam
        self.d, self.z, self.cap, self.symmetry = d, z, cap, symmetry
        self.listed = policy in _JIQ_FAMILY
        self.server_subsets = (
            list(combinations(range(n), d)) if policy in ("pod", "jiq-pod") else None
        )
        self.iq_subsets = list(combinations(range(m), d)) if policy == "jiq-sq" else None
        self.n_rewards = _N_FIXED_REWARDS + cap  # + accepted arrivals seeing k = 0..cap-1

    # ---- canonical form -------------------------------------------------
    # With symmetry, a state's key is its orbit invariant under relabelling
    # servers and dispatchers: the sorted queue lengths of the unlisted servers,
    # and the sorted list of I-queues, each the sorted queue lengths of the
    # servers it lists. Two labelled states have the same key iff one is a
    # relabelling of the other.
    def canon(self, q, l):
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

    def decode(self, key):
        """A labelled representative ``(q, l)`` of a state key (lists)."""
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
        return self.canon([0] * self.n, listing)

    # ---- routing helpers -------------------------------------------------
    def _uniform(self, idx):
        p = 1.0 / len(idx)
        return [(p, i) for i in idx]

    def _pod(self, q):
        """Law of the server picked by Pod(d): d distinct servers, shortest, ties uniform."""
        dist = defaultdict(float)
        w = 1.0 / len(self.server_subsets)
        for sub in self.server_subsets:
            best = min(q[i] for i in sub)
            ties = [i for i in sub if q[i] == best]
            for i in ties:
                dist[i] += w / len(ties)
        return list((p, i) for i, p in dist.items())

    def _plain_targets(self, q):
        pol, n = self.policy, self.n
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
        dist = defaultdict(float)
        w = 1.0 / len(self.iq_subsets)
        for sub in self.iq_subsets:
            best = min(sizes[j] for j in sub)
            ties = [j for j in sub if sizes[j] == best]
            for j in ties:
                dist[j] += w / len(ties)
        out = []
        for j, p in dist.items():
            ln = list(l)
            ln[i] = j
            out.append((p, ln))
        return out

    # ---- events -----------------------------------------------------------
    def _arrivals(self, q, l, j):
        """Branches of one arrival at dispatcher ``j``.

        Yields ``(prob, q_new, l_new, k, joins, deletes, probes, stale)`` with
        ``k`` the queue length the task finds (``-1``: lost).
        """
        pol, cap, n, d = self.policy, self.cap, self.n, self.d
        if not self.listed:
            probes = d if (pol == "pod" and d >= 2) else 0
            for p, i in self._plain_targets(q):
                if q[i] >= cap:
                    yield p, q, l, -1, 0, 0, probes, 0
                else:
                    qn = list(q)
                    qn[i] += 1
                    yield p, qn, l, q[i], 0, 0, probes, 0
            return

        mine = [i for i in range(n) if l[i] == j]

        if pol == "jiq-original":
            if mine:
                for p, i in self._uniform(mine):
                    ln = list(l)
                    ln[i] = -1  # leaves the list whether or not it is still idle
                    stale = 1 if q[i] > 0 else 0
                    if q[i] >= cap:
                        yield p, q, ln, -1, 0, 0, 0, stale
                    else:
                        qn = list(q)
                        qn[i] += 1
                        yield p, qn, ln, q[i], 0, 0, 0, stale
            else:
                for p, i in self._uniform(range(n)):  # no delete request: stays listed
                    if q[i] >= cap:
                        yield p, q, l, -1, 0, 0, 0, 0
                    else:
                        qn = list(q)
                        qn[i] += 1
                        yield p, qn, l, q[i], 0, 0, 0, 0
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
                            yield p * pj, qn, lj, k, 1, 0, 0, 0
                    else:
                        yield p, qn, ln, k, 0, 0, 0, 0
            else:
                for p, i in self._uniform(range(n)):
                    if q[i] >= cap:
                        yield p, q, l, -1, 0, 0, 0, 0
                        continue
                    qn = list(q)
                    qn[i] += 1
                    if l[i] >= 0 and qn[i] > z:  # taken past z: delete request
                        ln = list(l)
                        ln[i] = -1
                        yield p, qn, ln, q[i], 0, 1, 0, 0
                    else:
                        yield p, qn, l, q[i], 0, 0, 0, 0
            return

        # jiq, jiq-pod, jiq-sq: I-queues hold exactly the idle servers.
        if mine:
            for p, i in self._uniform(mine):
                assert q[i] == 0, "JIQ invariant: listed servers are idle"
                qn = list(q)
                qn[i] = 1
                ln = list(l)
                ln[i] = -1
                yield p, qn, ln, 0, 0, 0, 0, 0
            return
        if pol == "jiq-pod" and d >= 2:
            targets, probes = self._pod(q), d
        else:
            targets, probes = self._uniform(range(n)), 0
        for p, i in targets:
            if q[i] >= cap:
                yield p, q, l, -1, 0, 0, probes, 0
                continue
            qn = list(q)
            qn[i] += 1
            if l[i] >= 0:  # an idle listed server got a task: delete request
                ln = list(l)
                ln[i] = -1
                yield p, qn, ln, q[i], 0, 1, probes, 0
            else:
                yield p, qn, l, q[i], 0, 0, probes, 0

    def _departure(self, q, l, i):
        """Branches of a service completion at busy server ``i``: (prob, q, l, joins, probes)."""
        pol = self.policy
        qn = list(q)
        qn[i] -= 1
        joins = None
        if pol in ("jiq", "jiq-pod") and qn[i] == 0:
            joins = self._join_uniform(l, i)
        elif pol == "jiq-sq" and qn[i] == 0:
            probes = self.d if self.d >= 2 else 0
            return [(p, qn, ln, 1, probes) for p, ln in self._join_sq(l, i)]
        elif pol == "jiq-original" and qn[i] == 0 and l[i] < 0:
            joins = self._join_uniform(l, i)
        elif pol == "jiq-threshold" and qn[i] == self.z:
            joins = self._join_uniform(l, i)
        if joins is None:
            return [(1.0, qn, l, 0, 0)]
        return [(p, qn, ln, 1, 0) for p, ln in joins]

    def expand(self, state):
        """Outgoing rates ``{target: rate}`` (no self-loops) and the reward vector."""
        q, l = self.decode(state)
        out = defaultdict(float)
        rew = np.zeros(self.n_rewards)
        canon = self.canon
        if self.listed:
            dispatchers, rate = range(self.m), self.lam * self.n / self.m
        else:  # the dispatcher does not matter
            dispatchers, rate = range(1), self.lam * self.n
        for j in dispatchers:
            for p, qn, ln, k, joins, deletes, probes, stale in self._arrivals(q, l, j):
                r = rate * p
                if k >= 0:
                    rew[_N_FIXED_REWARDS + k] += r
                else:
                    rew[_LOST] += r
                rew[_JOIN] += r * joins
                rew[_DELETE] += r * deletes
                rew[_PROBE] += r * probes
                rew[_STALE] += r * stale
                t = canon(qn, ln)
                if t != state:
                    out[t] += r
        for i in range(self.n):
            if q[i] > 0:
                for p, qn, ln, joins, probes in self._departure(q, l, i):
                    rew[_JOIN] += p * joins
                    rew[_PROBE] += p * probes
                    t = canon(qn, ln)
                    if t != state:
                        out[t] += p
        return out, rew


def _estimate_states(policy, n, m, z, bound, symmetry):
    """Rough count of reachable states for queue bound ``bound`` (for budgeting)."""
    if policy in ("jiq", "jiq-pod", "jiq-sq"):
        t = bound + m
    elif policy == "jiq-original":
        t = m + (m + 1) * bound
    elif policy == "jiq-threshold":
        low = min(z, bound) + 1
        t = low * m + (bound + 1 - low)
    else:
        t = bound + 1
    if not symmetry:
        return t**n
    est = math.comb(t + n - 1, n)
    if policy in _JIQ_FAMILY:
        est //= math.factorial(m)
    return est


def _enumerate(chain, max_states):
    """BFS from the empty system; returns states, COO transitions, rewards."""
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


def _check_irreducible(n_states, rows, cols):
    """Every reachable state must lead back to state 0 (one closed class)."""
    # reverse graph in CSR form: for target t, the sources s with s -> t
    order = np.argsort(cols, kind="stable")
    src = rows[order]
    indptr = np.searchsorted(cols[order], np.arange(n_states + 1))
    seen = np.zeros(n_states, dtype=bool)
    seen[0] = True
    frontier = np.array([0])
    while frontier.size:
        starts, ends = indptr[frontier], indptr[frontier + 1]
        lengths = ends - starts
        total = int(lengths.sum())
        if total == 0:
            break
        offs = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(total)
        nb = np.unique(src[offs])
        nb = nb[~seen[nb]]
        seen[nb] = True
        frontier = nb
    if not seen.all():
        raise RuntimeError(
            f"{int((~seen).sum())} of {n_states} reachable states cannot return to the "
            "empty system: the chain is not irreducible (a bug in the transition rules)"
        )


#: Up to this many states the sparse LU is used directly; above it (where
#: fill-in makes LU slow: ~20 s at 27 000 states) GMRES with an incomplete-LU
#: preconditioner, with the full LU as the last resort.
_DIRECT_STATE_LIMIT = 2000


def _dot(u, v):
    # einsum without BLAS: multithreaded BLAS level-1/2 calls can crawl on a
    # busy machine, and these vectors are short enough not to need them
    return float(np.einsum("i,i->", u, v))


def _gmres(a, precond, b, rtol, restart, max_cycles):
    """Right-preconditioned restarted GMRES (modified Gram-Schmidt, Givens).

    Returns the iterate with ``||b - a x|| <= rtol ||b||``, or the last one.
    """
    n = b.shape[0]
    x = np.zeros(n)
    bnorm = math.sqrt(_dot(b, b))
    if bnorm == 0.0:
        return x
    for _ in range(max_cycles):
        r = b - a @ x
        beta = math.sqrt(_dot(r, r))
        if beta <= rtol * bnorm:
            break
        v = np.empty((restart + 1, n))
        v[0] = r / beta
        h = np.zeros((restart + 1, restart))
        cs, sn = np.zeros(restart), np.zeros(restart)
        g = np.zeros(restart + 1)
        g[0] = beta
        k = 0
        for j in range(restart):
            w = a @ precond(v[j])
            for i in range(j + 1):
                h[i, j] = _dot(v[i], w)
                w -= h[i, j] * v[i]
            h[j + 1, j] = math.sqrt(_dot(w, w))
            if h[j + 1, j] > 0.0:
                v[j + 1] = w / h[j + 1, j]
            for i in range(j):  # earlier rotations on the new column
                t = cs[i] * h[i, j] + sn[i] * h[i + 1, j]
                h[i + 1, j] = -sn[i] * h[i, j] + cs[i] * h[i + 1, j]
                h[i, j] = t
            den = math.hypot(h[j, j], h[j + 1, j])
            cs[j], sn[j] = (1.0, 0.0) if den == 0.0 else (h[j, j] / den, h[j + 1, j] / den)
            h[j, j] = den
            h[j + 1, j] = 0.0
            g[j + 1] = -sn[j] * g[j]
            g[j] = cs[j] * g[j]
            k = j + 1
            if abs(g[j + 1]) <= rtol * bnorm or h[j, j] == 0.0:
                break
        y = np.zeros(k)
        for i in range(k - 1, -1, -1):  # back substitution, upper triangular
            y[i] = (g[i] - _dot(h[i, i + 1 : k], y[i + 1 : k])) / h[i, i] if h[i, i] else 0.0
        x = x + precond(np.einsum("ij,i->j", v[:k], y))
    return x


def _sparse_solve(a, rhs):
    """Solve ``a x = rhs`` (scipy): direct when small, else GMRES with an ILU preconditioner."""
    if a.shape[0] <= _DIRECT_STATE_LIMIT:
        return _spla.spsolve(a, rhs)
    scale = np.abs(rhs).max()
    for drop_tol, fill in ((0.01, 3.0), (1e-3, 8.0)):
        try:
            ilu = _spla.spilu(a, drop_tol=drop_tol, fill_factor=fill, permc_spec="NATURAL")
        except RuntimeError:  # singular factor: try the next setting
            continue
        x = _gmres(a, ilu.solve, rhs, rtol=1e-13, restart=60, max_cycles=10)
        if np.all(np.isfinite(x)) and np.abs(a @ x - rhs).max() <= 1e-11 * scale:
            return x
    return _spla.spsolve(a, rhs)


def _stationary(n_states, rows, cols, vals):
    """Solve pi Q = 0, sum pi = 1 (fix pi[0] = 1, drop its balance equation)."""
    out_rate = np.bincount(rows, weights=vals, minlength=n_states)
    if n_states == 1:
        return np.ones(1)
    # Balance of state t != 0: sum_s pi_s Q[s, t] - pi_t out_t = 0, unknowns pi_1.. .
    keep = cols != 0
    r_eq, c_var, v = cols[keep] - 1, rows[keep], vals[keep]
    from_zero = c_var == 0
    rhs = -np.bincount(r_eq[from_zero], weights=v[from_zero], minlength=n_states - 1)
    inner = ~from_zero
    diag = np.arange(n_states - 1)
    ri = np.concatenate([r_eq[inner], diag])
    ci = np.concatenate([c_var[inner] - 1, diag])
    vi = np.concatenate([v[inner], -out_rate[1:]])
    if _sp is not None:
        a = _sp.csc_matrix((vi, (ri, ci)), shape=(n_states - 1, n_states - 1))
        x = _sparse_solve(a, rhs)
    else:
        if n_states > DENSE_STATE_LIMIT:
            raise ValueError(
                f"{n_states} states exceed the dense solver's limit DENSE_STATE_LIMIT="
                f"{DENSE_STATE_LIMIT} (scipy is not importable): install scipy or use a "
                "smaller system"
            )
        a = np.zeros((n_states - 1, n_states - 1))
        np.add.at(a, (ri, ci), vi)
        x = np.linalg.solve(a, rhs)
    pi = np.concatenate([[1.0], np.asarray(x, dtype=np.float64)])
    if not np.all(np.isfinite(pi)):
        raise RuntimeError("stationary solve failed (non-finite solution)")
    pi /= pi.sum()
    # residual of pi Q = 0, and non-negativity (unique solution of an irreducible chain)
    flow_in = np.bincount(cols, weights=pi[rows] * vals, minlength=n_states)
    resid = np.abs(flow_in - pi * out_rate).max()
    scale = max(1.0, float((pi * out_rate).max()))
    if resid > 1e-8 * scale or pi.min() < -1e-10:
        raise RuntimeError(
            f"stationary solve inaccurate: residual {resid:.3g}, min(pi) {pi.min():.3g}"
        )
    return np.clip(pi, 0.0, None) / np.clip(pi, 0.0, None).sum()


def _solve_bounded(policy, n, m, lam, d, z, buffer, cap, symmetry, max_states):
    chain = _Chain(policy, n, m, lam, d, z, cap, symmetry)
    states, rows, cols, vals, rewards = _enumerate(chain, max_states)
    n_states = len(states)
    _check_irreducible(n_states, rows, cols)
    pi = _stationary(n_states, rows, cols, vals)

    decoded = [chain.decode(s) for s in states]
    qs = np.array([q for q, _ in decoded], dtype=np.int64)  # (S, N)
    counts = np.stack([(qs == k).sum(axis=1) for k in range(cap + 1)], axis=1)  # (S, K+1)
    occupancy = pi @ counts / n
    tail = np.cumsum(occupancy[::-1])[::-1]
    mean_q = float(np.arange(cap + 1) @ occupancy)

    ev = pi @ rewards  # expected event rates
    arrival_rate = lam * n
    seen_rate = ev[_N_FIXED_REWARDS:]
    accepted = float(seen_rate.sum())
    arrival_seen = seen_rate / accepted
    lost = float(ev[_LOST]) / arrival_rate
    t_little = n * mean_q / accepted
    t_pasta = float(np.arange(1, cap + 1) @ arrival_seen)
    if abs(t_little - t_pasta) > 1e-6 * max(1.0, t_pasta):
        raise RuntimeError(
            f"Little's law ({t_little!r}) and PASTA ({t_pasta!r}) response times disagree"
        )

    if chain.listed:
        ls = np.array([l for _, l in decoded], dtype=np.int64)
        sizes = np.stack([(ls == j).sum(axis=1) for j in range(m)], axis=1)  # (S, M)
        hist = np.stack([(sizes == k).sum(axis=1) for k in range(n + 1)], axis=1) / m
        iq_dist = pi @ hist
        p0 = float(iq_dist[0])
    else:
        iq_dist = np.full(n + 1, np.nan)
        p0 = float("nan")

    at_bound = (qs == cap).any(axis=1)
    return ExactResult(
        policy=policy,
        n_servers=n,
        n_dispatchers=m,
        load=lam,
        d=d,
        z=z,
        buffer=buffer,
        queue_bound=None if buffer is not None else cap,
        tail=tail,
        occupancy=occupancy,
        mean_queue_length=mean_q,
        mean_response_time=t_little,
        waiting_probability=float(1.0 - arrival_seen[0]),
        blocking_probability=lost if buffer is not None else 0.0,
        arrival_seen=arrival_seen,
        p0=p0,
        iqueue_distribution=iq_dist,
        join_rate=float(ev[_JOIN]) / n,
        delete_rate=float(ev[_DELETE]) / n,
        probe_rate=float(ev[_PROBE]) / n,
        stale_fraction=float(ev[_STALE]) / arrival_rate
        if policy == "jiq-original"
        else float("nan"),
        truncated_mass=float(pi @ at_bound) if buffer is None else 0.0,
        truncation_loss=lost if buffer is None else 0.0,
        n_states=n_states,
        symmetry=symmetry,
    )


def solve_exact(
    policy: str,
    n_servers: int,
    n_dispatchers: int = 1,
    load: float | None = None,
    *,
    d: int = 1,
    z: int = 1,
    buffer: int | None = None,
    queue_bound: int | None = None,
    symmetry: bool = True,
    tol: float = 1e-9,
    max_states: int = 200_000,
    default_max_states: int = 20_000,
) -> ExactResult:
    """Exact stationary metrics of a small system, by solving its Markov chain.

    Args:
        policy: one of :data:`POLICIES`.
        n_servers: ``N >= 1``.
        n_dispatchers: ``1 <= M <= N``.
        load: ``lambda > 0`` (arrivals per server per unit time); ``< 1`` when
            ``buffer`` is ``None``. Required.
        d: probes for ``pod`` / ``jiq-pod`` (``1 <= d <= N``), sampled
            I-queues for ``jiq-sq`` (``1 <= d <= M``); ignored otherwise.
        z: threshold of ``jiq-threshold`` (``z >= 0``); ignored otherwise.
        buffer: places per server (``>= 1``), or ``None`` for infinite.
        queue_bound: truncation level for infinite buffers (``>= 1``); by
            default chosen so that ``truncated_mass <= tol`` within
            ``default_max_states`` states (a warning says if it cannot).
        symmetry: lump states by server and dispatcher relabelling (exact).
        tol: target truncated mass when ``queue_bound`` is chosen here.
        max_states: hard cap on the reachable state count.
        default_max_states: state budget of the automatic ``queue_bound``.

    Returns:
        :class:`ExactResult`.

    Raises:
        ValueError: a parameter out of range (the message names it), an
            unknown policy, or too many states.
        TypeError: a count that is not an int, a load that is not a number.

    Warns:
        UserWarning: the automatic ``queue_bound`` could not reach ``tol``
            within ``default_max_states`` states (the result is still returned,
            with its ``truncated_mass``).

    Example:
        >>> res = solve_exact("jiq", 4, 2, load=0.6, queue_bound=10)
        >>> res.n_states, round(res.p0, 4)
        (1068, 0.4648)
    """
    policy, n, m, lam, d, z, buffer, queue_bound = _validate(
        policy, n_servers, n_dispatchers, load, d, z, buffer, queue_bound
    )
    max_states = _check_range("max_states", max_states, 1)
    default_max_states = _check_range("default_max_states", default_max_states, 1)
    if not (isinstance(tol, (int, float)) and 0.0 < tol < 1.0):
        raise ValueError(f"tol={tol!r} is out of range: need 0 < tol < 1")
    args = (policy, n, m, lam, d, z, buffer)
    if buffer is not None:
        return _solve_bounded(*args, buffer, symmetry, max_states)
    if queue_bound is not None:
        return _solve_bounded(*args, queue_bound, symmetry, max_states)

    # Adaptive truncation: grow the bound until the mass at the bound is <= tol,
    # within a state budget (counts extrapolated from the last solve).
    budget = min(max_states, default_max_states)

    def largest_bound(b0, n0):
        e0 = _estimate_states(policy, n, m, z, b0, symmetry)
        b = b0
        while n0 * _estimate_states(policy, n, m, z, b + 1, symmetry) / e0 <= budget:
            b += 1
            if b >= 1_000_000:
                break
        return b

    bound = max(8, z + 2)
    while bound > 1 and _estimate_states(policy, n, m, z, bound, symmetry) > budget:
        bound -= 1
    history = []
    for _ in range(12):
        res = _solve_bounded(*args, bound, symmetry, max_states)
        if res.truncated_mass <= tol:
            return res
        # The mass at the bound decays about geometrically in the bound:
        # extrapolate, with the decay rate from the last two solves, or at
        # first from the middle of the tail (its last steps are bent by the bound).
        history.append((bound, res.truncated_mass))
        if len(history) >= 2 and history[-2][1] > res.truncated_mass > 0:
            (b1, m1), (b2, m2) = history[-2:]
            ratio = (m2 / m1) ** (1.0 / (b2 - b1))
        else:
            s = res.tail
            lo, hi = max(1, bound // 2), bound - 1
            ratio = (s[hi] / s[lo]) ** (1.0 / (hi - lo)) if hi > lo and s[hi] > 0 else 0.5
        ratio = min(max(ratio, 1e-6), 0.999)
        extra = math.ceil(math.log(tol / res.truncated_mass) / math.log(ratio)) + 2
        new = min(largest_bound(bound, res.n_states), bound + max(2, extra))
        if new <= bound:
            break
        bound = new
    warnings.warn(
        f"solve_exact({policy!r}, N={n}, M={m}, load={lam}): truncated_mass="
        f"{res.truncated_mass:.3g} > tol={tol:g} at queue_bound={bound}, the largest within "
        f"default_max_states={default_max_states}; pass queue_bound (and max_states) "
        "explicitly to go further",
        stacklevel=2,
    )
    return res
