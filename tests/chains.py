"""Exact references: small chains solved by linear algebra, independent of the package's solvers.

Time-varying arrivals (tests/sim/test_arrivals.py, tests/test_periodic*.py), and
whole farms of a few servers under a routing rule written in the test from
the rule's text (tests/policies/test_references.py, tests/results/test_response.py).
"""

import dataclasses
import itertools
import math
from collections import defaultdict

import numpy as np
from scipy.optimize import brentq
from scipy.sparse.csgraph import connected_components

from jaxqueue.core.arrivals import MMPP, Profile


def _jsq_states(n: int, k: int):
    """Sorted queue vectors (non-increasing) of ``n`` servers holding at most ``k`` each."""
    out = [()]
    for _ in range(n):
        out = [s + (q,) for s in out for q in range(k + 1) if not s or q <= s[-1]]
    return out


def _jsq_generator(n: int, k: int, arrival_rate: float):
    """Generator of JSQ on ``n`` unit-rate servers with Poisson arrivals (blocked at ``k``)."""
    states = _jsq_states(n, k)
    index = {s: i for i, s in enumerate(states)}
    q = np.zeros((len(states), len(states)))
    for s, i in index.items():
        if s[-1] < k:  # the shortest queue gains a task
            t = list(s)
            t[-1] += 1
            q[i, index[tuple(sorted(t, reverse=True))]] += arrival_rate
        for j, x in enumerate(s):
            if x:
                t = list(s)
                t[j] -= 1
                q[i, index[tuple(sorted(t, reverse=True))]] += 1.0
    np.fill_diagonal(q, -q.sum(axis=1))
    return states, q


def _stationary(q):
    """``pi Q = 0``, ``sum pi = 1`` (irreducible ``Q``): one balance equation
    replaced by the normalisation."""
    a = q.T.copy()
    a[-1] = 1.0
    b = np.zeros(q.shape[0])
    b[-1] = 1.0
    return np.linalg.solve(a, b)


def pod_stationary(n: int, d: int, load: float, k: int):
    """Pod(d) on ``n`` unit-rate servers, Poisson arrivals of rate ``load * n``,
    each server holding at most ``k`` (an arrival to a full one is lost): the
    sorted queue vectors (non-increasing) and their stationary law. The
    arrival joins the shortest of ``d`` distinct uniformly random servers: the
    one of rank ``r`` (0 the shortest, ties in any order: they give the same
    vector) with probability ``C(n - 1 - r, d - 1) / C(n, d)``."""
    states = _jsq_states(n, k)
    index = {s: i for i, s in enumerate(states)}
    q = np.zeros((len(states), len(states)))
    pick = [math.comb(n - 1 - r, d - 1) / math.comb(n, d) for r in range(n)]
    for s, i in index.items():
        for r, p in enumerate(pick):  # rank r (ascending) is position n - 1 - r
            j = n - 1 - r
            if p and s[j] < k:
                t = list(s)
                t[j] += 1
                q[i, index[tuple(sorted(t, reverse=True))]] += load * n * p
        for j, x in enumerate(s):
            if x:
                t = list(s)
                t[j] -= 1
                q[i, index[tuple(sorted(t, reverse=True))]] += 1.0
    np.fill_diagonal(q, -q.sum(axis=1))
    return states, _stationary(q)


def mmpp_jsq_reference(src: MMPP, load: float, n: int, k: int = 40):
    """Mean queue length per server, the law of the shortest queue an arrival
    finds, for an MMPP (mean rate ``load * n``) feeding JSQ."""
    rates = load * n * src.shape
    blocks = [_jsq_generator(n, k, r) for r in rates]
    states = blocks[0][0]
    m, size = len(rates), len(states)
    full = np.kron(src.matrix, np.eye(size))
    for s, (_, qs) in enumerate(blocks):
        full[s * size : (s + 1) * size, s * size : (s + 1) * size] += qs
    pi = _stationary(full).reshape(m, size)
    total = np.array([sum(x) for x in states], float)
    shortest = np.array([x[-1] for x in states])
    seen = np.zeros(k + 1)
    for s in range(m):
        np.add.at(seen, shortest, pi[s] * rates[s])
    assert pi[:, total == total.max()].sum() < 1e-9  # the truncation is far out
    return float((pi.sum(axis=0) * total).sum() / n), seen / seen.sum()


def _uniformized_integral(p0, q, t, terms=4000):
    """``p0 exp(q t)`` and ``int_0^t p0 exp(q s) ds`` by uniformization."""
    lam = max(-np.diag(q).min(), 1e-12)
    step = np.eye(q.shape[0]) + q / lam
    weights = np.exp(-lam * t)  # Poisson(lam t) pmf, term by term
    cdf, v = weights, p0.copy()
    end, area = weights * v, (1.0 - cdf) * v / lam
    for n in range(1, terms):
        v = v @ step
        weights *= lam * t / n
        cdf += weights
        end += weights * v
        area += (1.0 - cdf) * v / lam
        if 1.0 - cdf < 1e-15 and n > lam * t:
            break
    return end, area


def profile_mm1_reference(src: Profile, load: float, k: int = 80):
    """Periodic regime of M/M/1 under a rate profile: time-average queue
    length and the law of the queue an arrival finds."""
    gens = [_jsq_generator(1, k, load * r)[1] for r in src.shape]
    area_total, seen = _periodic_regime(gens, src, load, periods=200)
    assert area_total[-1] / src.period < 1e-12
    return float(area_total @ np.arange(k + 1)) / src.period, seen / seen.sum()


def _periodic_regime(gens, src: Profile, load: float, periods: int):
    """The periodic regime of a chain whose generator is ``gens[i]`` on the
    profile's segment ``i``, from the first state, by uniformization: the
    integral of the law over one period from phase 0, and the same weighted
    by the arrival rate ``load * shape`` (what arrivals see, unnormalised)."""
    p = np.zeros(gens[0].shape[0])
    p[0] = 1.0
    for _ in range(periods):  # periods until the regime is periodic
        start = p
        for qg, d in zip(gens, src.durations):
            p, _ = _uniformized_integral(p, qg, d)
        if np.abs(p - start).max() < 1e-13:
            break
    area_total, seen = np.zeros_like(p), np.zeros_like(p)
    for qg, d, r in zip(gens, src.durations, src.shape):
        p, area = _uniformized_integral(p, qg, d)
        area_total += area
        seen += load * r * area
    return area_total, seen


def profile_mph1_reference(src: Profile, load: float, alpha, S, k: int = 80):
    """Periodic regime of the M_t/PH/1 queue under a rate profile, by
    uniformization of the chain on "idle" and ``(n, p)`` (``n = 1..k`` tasks,
    the task in service in phase ``p``; an arrival at ``n = k`` is lost, a
    truncation checked to hold no mass). A task starts in phase ``a`` with
    probability ``alpha[a]``, moves from ``p`` to ``q`` at rate ``S[p, q]``
    and completes at rate ``-sum_q S[p, q]``.

    Returns ``(occupancy, seen)``, both ``(k + 1, P)``: the time-average law of
    ``(n, p)`` and the law of the ``(n, p)`` an arrival finds (weighted by the
    arrival rate), the idle state at ``[0, 0]``."""
    alpha, S = np.asarray(alpha, np.float64), np.asarray(S, np.float64)
    P = alpha.size
    exits = -S.sum(axis=1)
    size = 1 + k * P

    def at(n, p):
        return 0 if n == 0 else 1 + (n - 1) * P + p

    def generator(rate):
        q = np.zeros((size, size))
        q[0, 1 : 1 + P] += rate * alpha
        for n in range(1, k + 1):
            for p in range(P):
                i = at(n, p)
                if n < k:
                    q[i, at(n + 1, p)] += rate
                for r in range(P):
                    if r != p:
                        q[i, at(n, r)] += S[p, r]
                if n == 1:
                    q[i, 0] += exits[p]
                else:
                    q[i, at(n - 1, 0) : at(n - 1, 0) + P] += exits[p] * alpha
        return q - np.diag(q.sum(axis=1))

    gens = [generator(load * r) for r in src.shape]
    area_total, seen = _periodic_regime(gens, src, load, periods=400)
    assert area_total[-P:].sum() / src.period < 1e-12

    def by_class(v):
        out = np.zeros((k + 1, P))
        out[0, 0] = v[0]
        out[1:] = v[1:].reshape(k, P)
        return out

    return by_class(area_total / src.period), by_class(seen / seen.sum())


# ---- farms of a few servers under a routing rule written in the test ----------------------

#: The response-time quantiles every result reports (docs/model.md).
LEVELS = (0.5, 0.9, 0.99, 0.999)
#: exp(1) service as ``(alpha, S)``.
EXP = ((1.0,), ((-1.0,),))
#: erlang:2 of mean 1 (docs/simulation.md): two phases of rate 2 in sequence.
ERLANG2 = ((1.0, 0.0), ((-2.0, 2.0), (0.0, -2.0)))


def hyperexp(scv: float):
    """The balanced-means two-phase hyperexponential of mean 1 (docs/simulation.md,
    ``hyperexp:SCV``): phase ``i`` w.p. ``p_i``, rate ``2 p_i``,
    ``p_1 = (1 + sqrt((scv - 1) / (scv + 1))) / 2``."""
    p = 0.5 * (1.0 + math.sqrt((scv - 1.0) / (scv + 1.0)))
    return (p, 1.0 - p), ((-2.0 * p, 0.0), (0.0, -2.0 * (1.0 - p)))


@dataclasses.dataclass
class Farm:
    """``n`` servers, ``m`` dispatchers, ``buffer`` places per server, Poisson
    arrivals of rate ``load * n``; server ``i`` is in pool ``pool[i]``, of
    speed ``speed[i]``, with the service law ``laws[i] = (alpha, S)`` at speed 1."""

    n: int
    m: int
    load: float
    buffer: int
    pool: tuple
    speed: tuple
    laws: tuple

    @property
    def n_pools(self) -> int:
        return max(self.pool) + 1

    @property
    def n_phases(self) -> int:
        return max(len(a) for a, _ in self.laws)

    def __post_init__(self):
        #: each server's mean service time at speed 1, ``alpha (-S)^-1 1``
        self.means = tuple(float(a @ np.linalg.solve(-s, np.ones(len(a)))) for a, s in self.laws)


def farm(n, m, load, buffer, pools=None, law=EXP):
    """A :class:`Farm`; ``pools``: ``(count, speed, law or None)`` each, in
    order (``None``: ``law``); without pools, one pool of ``n`` servers."""
    pools = pools or [(n, 1.0, None)]
    assert sum(c for c, _, _ in pools) == n
    pool, speed, laws = [], [], []
    for i, (count, v, own) in enumerate(pools):
        a, s = own or law
        pool += [i] * count
        speed += [float(v)] * count
        laws += [(np.asarray(a, np.float64), np.asarray(s, np.float64))] * count
    return Farm(n, m, load, buffer, tuple(pool), tuple(speed), tuple(laws))


@dataclasses.dataclass
class Rule:
    """A routing rule as two functions of the farm and a state ``(q, ph, l)``
    (queue lengths, phase in service or 0, I-queue listing each server or -1):

    * ``route(f, state)``: ``[(probability, server, listing, events)]`` for
      an arrival: the server it is sent to (``None``: none, it is lost), the
      listing after it and the messages sent (``{"probe": 2}``);
    * ``join(f, state, i)``: ``[(probability, listing, events)]`` after a
      completion that leaves server ``i`` with at most ``z`` tasks
      (``None``: no I-queues).

    ``stale``: the rule can pick a listed server that is busy (its metrics
    then include ``stale_fraction``, from the events ``"stale"``)."""

    route: object
    join: object = None
    z: int = 0
    stale: bool = False


def replace(t: tuple, i: int, v) -> tuple:
    """``t`` with entry ``i`` set to ``v``."""
    t = list(t)
    t[i] = v
    return tuple(t)


def _arrivals(f: Farm, rule: Rule, state):
    q, ph, _ = state
    out = []
    for prob, s, listing, events in rule.route(f, state):
        rate = f.load * f.n * prob
        if s is None or q[s] == f.buffer:  # a full server (or none with room): lost
            out.append((rate, (q, ph, listing), {**events, "blocked": 1}))
            continue
        events = {**events, ("seen", f.pool[s], q[s], ph[s]): 1}
        if q[s]:
            out.append((rate, (replace(q, s, q[s] + 1), ph, listing), events))
            continue
        for p, a in enumerate(f.laws[s][0]):  # a task that starts service draws its phase
            if a > 0:
                out.append((rate * a, (replace(q, s, 1), replace(ph, s, p), listing), events))
    return out


def _service(f: Farm, rule: Rule, state, i: int):
    q, ph, listing = state
    alpha, s = f.laws[i]
    rates = f.speed[i] * s[ph[i]]
    out = [
        (rates[r], (q, replace(ph, i, r), listing), {})
        for r in range(len(alpha))
        if r != ph[i] and rates[r] > 0
    ]
    done, left = -rates.sum(), replace(q, i, q[i] - 1)
    if q[i] > 1:  # the next task starts service in phase r with probability alpha[r]
        starts = [(a, replace(ph, i, r)) for r, a in enumerate(alpha) if a]
    else:
        starts = [(1.0, replace(ph, i, 0))]
    for pa, phases in starts:
        after = (left, phases, listing)
        joins = [(1.0, listing, {})]
        if rule.join and left[i] <= rule.z:
            joins = rule.join(f, after, i)
        out += [(done * pa * pj, (left, phases, new), ev) for pj, new, ev in joins]
    return out


def solve_farm(f: Farm, rule: Rule):
    """Stationary law of the farm under ``rule`` on its one closed class of
    states: ``(states, pi, rewards)``, ``rewards[key]`` the long-run rate of
    each event (``"blocked"``, ``"join"``, ``("seen", pool, k, phase)``, ...)."""
    start = ((0,) * f.n, (0,) * f.n, (0 if rule.join else -1,) * f.n)
    index, states, edges = {start: 0}, [start], []
    for s in states:  # breadth first: the list grows while it is read
        out = _arrivals(f, rule, s)
        for i in range(f.n):
            out += _service(f, rule, s, i) if s[0][i] else []
        for rate, t, ev in out:
            if t not in index:
                index[t] = len(states)
                states.append(t)
            edges.append((index[s], index[t], rate, ev))
    gen = np.zeros((len(states), len(states)))
    for i, j, rate, _ in edges:
        gen[i, j] += rate if i != j else 0.0
    # keep the one closed class (a start may be transient: it need not be reachable)
    _, comp = connected_components(gen > 0, connection="strong")
    closed = [c for c in set(comp) if not gen[comp == c][:, comp != c].any()]
    assert len(closed) == 1, "the chain has more than one closed class"
    keep = comp == closed[0]
    gen = gen[np.ix_(keep, keep)]
    np.fill_diagonal(gen, -gen.sum(axis=1))
    pi = np.zeros(len(states))
    pi[keep] = _stationary(gen)
    assert pi[keep].min() > -1e-12  # (positive, up to rounding)
    rewards = defaultdict(float)
    for i, _, rate, ev in edges:
        for key, c in ev.items():
            rewards[key] += pi[i] * rate * c
    return [s for s, k in zip(states, keep) if k], pi[keep], dict(rewards)


def response_ph(f: Farm, seen):
    """The response time of an accepted arrival as one phase-type law ``(beta, T)``.

    ``seen[pool, k, p]``: the rate (or law) of the accepted arrivals that
    find ``k`` tasks at a server of the pool, the one in service in phase
    ``p`` (0 when idle). FIFO: a task that finds ``k >= 1`` tasks stays the
    residual service from ``p``, ``k - 1`` services and its own; one that
    finds none, its own service. The phases of ``T`` are ``(pool, j, p)``:
    ``j`` services left, the one in service in phase ``p``."""
    b, width = f.buffer, f.n_phases
    size = f.n_pools * b * width

    def at(i, j, p):
        return (i * b + j - 1) * width + p

    beta, t = np.zeros(size), -np.eye(size)  # phases a pool's law lacks: never entered
    for i in range(f.n_pools):
        server = f.pool.index(i)
        alpha, s = f.laws[server]
        s, phases = f.speed[server] * s, range(len(alpha))
        for j, p in itertools.product(range(1, b + 1), phases):
            for r in phases:
                t[at(i, j, p), at(i, j, r)] = s[p, r]
                if j > 1:  # a completion: the next task starts in phase r w.p. alpha[r]
                    t[at(i, j, p), at(i, j - 1, r)] = -s[p].sum() * alpha[r]
        beta[at(i, 1, 0) : at(i, 1, 0) + len(alpha)] += seen[i, 0, 0] * alpha
        for k, p in itertools.product(range(1, b), phases):
            beta[at(i, k + 1, p)] += seen[i, k, p]
    return beta / beta.sum(), t


def expm(a):
    """``exp(a)`` by scaling and squaring with a Taylor series (numpy only)."""
    norm = np.abs(a).sum(axis=1).max()
    squarings = max(0, int(np.ceil(np.log2(norm / 0.25)))) if norm > 0 else 0
    a = a / 2.0**squarings
    term, out = np.eye(len(a)), np.eye(len(a))
    for k in range(1, 20):  # |a| <= 1/4: the remainder is below 1e-30
        term = term @ a / k
        out += term
    for _ in range(squarings):
        out = out @ out
    return out


def ph_mean_quantiles(beta, t, levels=LEVELS):
    """Mean and quantiles of ``PH(beta, T)``: ``beta (-T)^-1 1``, and the
    roots of ``P(X > x) = beta exp(T x) 1 = 1 - level`` (brentq)."""
    ones = np.ones(len(beta))
    mean = float(beta @ np.linalg.solve(-t, ones))

    def excess(x, level):  # P(X > x) - (1 - level)
        return float(beta @ expm(t * x) @ ones) - (1.0 - level)

    out = []
    for level in levels:
        hi = mean
        while excess(hi, level) > 0:
            hi *= 2.0
        out.append(brentq(excess, 0.0, hi, args=(level,), xtol=1e-15, rtol=1e-14))
    return mean, np.array(out)


def seen_rates(f: Farm, rewards):
    """``seen[pool, k, p]``: the rate of the accepted arrivals that find ``k``
    tasks at a server of the pool, the one in service in phase ``p`` (0 when idle)."""
    seen = np.zeros((f.n_pools, f.buffer, f.n_phases))
    for key, rate in rewards.items():
        if key[0] == "seen":
            seen[key[1:]] += rate
    return seen


def shortest_queue(f: Farm, state):
    """JSQ: a shortest queue (of all servers), ties uniform."""
    q, _, listing = state
    ties = [i for i in range(f.n) if q[i] == min(q)]
    return [(1.0 / len(ties), s, listing, {}) for s in ties]


def uniform_server(f: Farm, state):
    """Random: a uniform server of all ``n``, full or not (a full one loses the task)."""
    return [(1.0 / f.n, s, state[2], {}) for s in range(f.n)]


def accepted_average(f: Farm, rule: Rule, states, pi, value) -> float:
    """The average of ``value(state)`` over the accepted arrivals, of the state each
    found before it was routed, from a solved farm (:func:`solve_farm`): a state's
    arrivals weigh ``pi`` times the probability that ``rule`` sends them to a server
    with room (a branch to no server, or to a full one, is lost and not counted)."""
    num = den = 0.0
    for state, p in zip(states, pi):
        q = state[0]
        room = sum(
            prob for prob, s, _, _ in rule.route(f, state) if s is not None and q[s] < f.buffer
        )
        num += p * room * value(state)
        den += p * room
    return num / den


def farm_metrics(f: Farm, states, pi, rewards, levels=LEVELS, stale=False) -> dict:
    """The metrics of docs/model.md from a solved farm (:func:`solve_farm`),
    the response-time quantiles at ``levels``; ``stale``: with ``stale_fraction``."""
    b, n = f.buffer, f.n
    qs = np.array([s[0] for s in states])
    by_server = np.stack([pi @ (qs == k) for k in range(b + 1)], axis=1)  # (n, b + 1)
    occupancy = by_server.mean(axis=0)
    seen = seen_rates(f, rewards)
    accepted, mean_q = seen.sum(), float(occupancy @ np.arange(b + 1))
    arrival_seen = np.append(seen.sum(axis=(0, 2)) / accepted, 0.0)
    tagged, quantiles = ph_mean_quantiles(*response_ph(f, seen), levels)
    out = dict(
        n_states=len(states),
        tail=np.cumsum(occupancy[::-1])[::-1],
        occupancy=occupancy,
        arrival_seen=arrival_seen,
        mean_queue_length=mean_q,
        mean_response_time=n * mean_q / accepted,  # Little's law
        waiting_probability=1.0 - arrival_seen[0],
        blocking_probability=rewards.get("blocked", 0.0) / (f.load * n),
        join_rate=rewards.get("join", 0.0) / n,
        delete_rate=rewards.get("delete", 0.0) / n,
        probe_rate=rewards.get("probe", 0.0) / n,
        **({"stale_fraction": rewards.get("stale", 0.0) / (f.load * n)} if stale else {}),
        response_quantiles=dict(zip(levels, quantiles)),
    )
    assert abs(tagged - out["mean_response_time"]) < 1e-10 * tagged  # the tagged task's mean
    if any(x >= 0 for s in states for x in s[2]):
        listed = np.array([s[2] for s in states])
        sizes = np.stack([(listed == j).sum(axis=1) for j in range(f.m)], axis=1)  # (S, m)
        dist = np.array([pi @ (sizes == x).mean(axis=1) for x in range(n + 1)])
        out.update(p0=dist[0], iqueue_distribution=dist)
    if f.n_pools > 1:
        out.update(_by_pool(f, by_server, seen, levels))
    return out


def _by_pool(f: Farm, by_server, seen, levels) -> dict:
    """Each pool's metrics (docs/model.md), from each server's queue law and
    the rates of what the accepted arrivals find (``seen[pool, k, p]``)."""
    pool = np.array(f.pool)
    occupancy = np.stack([by_server[pool == i].mean(axis=0) for i in range(f.n_pools)])
    mean_q = occupancy @ np.arange(f.buffer + 1)
    sent = seen.sum(axis=(1, 2))
    alone = np.eye(f.n_pools)[:, :, None, None] * seen  # row i: pool i's arrivals only
    means, quantiles = zip(*(ph_mean_quantiles(*response_ph(f, row), levels) for row in alone))
    response = np.bincount(pool) * mean_q / sent  # Little's law, pool by pool
    np.testing.assert_allclose(means, response, rtol=1e-10)
    return dict(
        pool_arrival_share=sent / sent.sum(),
        pool_utilization=1.0 - occupancy[:, 0],
        pool_mean_queue_length=mean_q,
        pool_mean_response_time=response,
        pool_waiting_probability=1.0 - seen[:, 0].sum(axis=-1) / sent,
        pool_occupancy=occupancy,
        pool_response_quantiles=dict(zip(levels, np.array(quantiles).T)),
    )
