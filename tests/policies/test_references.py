"""The multi-server rules against chains written here from their text (docs/policies.md).

The generic mean field evaluates the policies' own decisions, so it checks
how they are sampled, not the rules. Here each rule is written again from
its words, as the routing of a small labelled chain (tests/chains.py: every
server's queue, phase in service and I-queue), solved with numpy. Then:

* the exact solver (:func:`jaxqueue.exact.solve_exact`) agrees with it to
  1e-9 in every metric, the response-time quantiles and the pools' included;
* the simulator agrees with it within a two-sided Student-t tolerance
  (:func:`jaxqueue.tolerance`), family-wise 0.001 (Bonferroni) over the
  comparisons that run (:func:`_family`, counted from the cases: 137);
* the same run, at the same key, is rejected against a deliberately wrong
  reading of its rule (:data:`WRONG`), on the metric where that reading
  shows: the run is long enough to tell the rule from its misreadings, and a
  shorter one fails here instead of passing without that power.

All cases share the load, the buffer and the run sizes.
"""

import dataclasses
import itertools

import jax
import numpy as np
import pytest
from chains import (
    ERLANG2,
    EXP,
    Rule,
    farm,
    farm_metrics,
    hyperexp,
    replace,
    shortest_queue,
    solve_farm,
)

import jaxqueue as jq
from jaxqueue.core.service import PhaseType, Pool
from jaxqueue.exact import solve_exact
from jaxqueue.results.stats import tolerance

LOAD = 0.9
BUFFER = 3
REPLICAS = 16
STEPS = 2**16

#: hyperexp:4, written from its definition (tests/chains.py).
H4 = hyperexp(4.0)
#: exp of mean 3/4: at speed 1 its expected wait ties a speed-2 server of mean 1 one level up.
EXP34 = ((1.0,), ((-4.0 / 3.0,),))


# ---------------------------------------------------------------- the rules, from their text


def random_server(f, state):
    """A uniformly random server (of all ``N``)."""
    return [(1.0 / f.n, s, state[2], {}) for s in range(f.n)]


def i1f(f, state):
    """I1F: an idle server if there is one; else a server with exactly one
    task if there is one; else a uniformly random server; uniformly among those."""
    q, _, listing = state
    idle = [i for i in range(f.n) if q[i] == 0]
    one = [i for i in range(f.n) if q[i] == 1]
    group = idle or one or list(range(f.n))
    return [(1.0 / len(group), s, listing, {}) for s in group]


def pod(d):
    """Pod(d): probe ``d`` distinct servers (a uniformly random ``d``-subset)
    and join the shortest, ties uniform; ``d`` probes per arrival when ``d >= 2``."""

    def route(f, state):
        q, _, listing = state
        subsets = list(itertools.combinations(range(f.n), d))
        sent = {"probe": d} if d >= 2 else {}
        out = []
        for sub in subsets:
            ties = [i for i in sub if q[i] == min(q[j] for j in sub)]
            out += [(1.0 / len(subsets) / len(ties), s, listing, sent) for s in ties]
        return out

    return route


def jiq(fallback):
    """JIQ (Wang, Feng and Cheng): the arrival goes to a uniformly random
    dispatcher. A non-empty I-queue sends it to a uniformly random listed
    server, which leaves the I-queue; an empty one sends it by ``fallback``
    (JIQ: a uniformly random server), and if that server was idle a delete
    request removes it from the I-queue that lists it."""

    def route(f, state):
        q, _, listing = state
        out = []
        for j in range(f.m):
            listed = [i for i in range(f.n) if listing[i] == j]
            out += [(1.0 / f.m / len(listed), s, replace(listing, s, -1), {}) for s in listed]
            for prob, s, _, sent in [] if listed else fallback(f, state):
                if q[s] == 0:
                    out.append((prob / f.m, s, replace(listing, s, -1), {**sent, "delete": 1}))
                else:
                    out.append((prob / f.m, s, listing, sent))
        return out

    return route


def join_random(f, state, i):
    """JIQ: a server that becomes idle sends a join request to a uniformly random dispatcher."""
    return [(1.0 / f.m, replace(state[2], i, j), {"join": 1}) for j in range(f.m)]


def join_shortest(d):
    """JIQ-SQ(d): a server that becomes idle probes ``d`` distinct I-queues
    (a uniformly random ``d``-subset) and joins the one listing the fewest
    servers, ties uniform; ``d`` probes per join when ``d >= 2`` and ``M > 1``."""

    def join(f, state, i):
        listing = state[2]
        size = [listing.count(j) for j in range(f.m)]
        subsets = list(itertools.combinations(range(f.m), d))
        sent = {"join": 1, "probe": d} if d >= 2 and f.m > 1 else {"join": 1}
        out = []
        for sub in subsets:
            ties = [j for j in sub if size[j] == min(size[x] for x in sub)]
            out += [(1.0 / len(subsets) / len(ties), replace(listing, i, j), sent) for j in ties]
        return out

    return join


def idle_first(d):
    """idle-first(d), one dispatcher (Mukherjee et al.): an idle server if there
    is one (uniformly: its I-queue lists them all), else the shortest of ``d``
    distinct probed servers (Pod(d), its probes counted)."""

    def route(f, state):
        q, _, listing = state
        idle = [i for i in range(f.n) if q[i] == 0]
        if idle:
            return [(1.0 / len(idle), s, replace(listing, s, -1), {}) for s in idle]
        return pod(d)(f, state)

    return route


def join_only(f, state, i):
    """One dispatcher: a server that becomes idle joins its I-queue (a join request)."""
    return [(1.0, replace(state[2], i, 0), {"join": 1})]


def jsew(f, state):
    """JSEW: a server with the least ``(k + 1) * mean / speed`` among those
    with room, ties (within a relative 1e-9) uniform; lost if none has room."""
    q, _, listing = state
    wait = {i: (q[i] + 1) * f.means[i] / f.speed[i] for i in range(f.n) if q[i] < f.buffer}
    if not wait:
        return [(1.0, None, listing, {})]
    ties = [i for i, w in wait.items() if w <= min(wait.values()) * (1.0 + 1e-9)]
    return [(1.0 / len(ties), s, listing, {}) for s in ties]


def unless_listed(join):
    """A join by a server that is not listed already (JIQ-Original: a server is
    listed at most once; JIQ-Threshold: one listed stays so below ``z``)."""

    def wrapped(f, state, i):
        return [(1.0, state[2], {})] if state[2][i] >= 0 else join(f, state, i)

    return wrapped


def jiq_original(f, state):
    """JIQ-Original (Lu et al.), ``order="random"``: the arrival goes to a
    uniformly random dispatcher. A non-empty I-queue sends it to a uniformly
    random listed server, even a busy one (a stale pick; lost if that server
    is full), which leaves the I-queue; an empty one sends it to a uniformly
    random server, which stays listed if it is. No delete requests."""
    q, _, listing = state
    out = []
    for j in range(f.m):
        listed = [i for i in range(f.n) if listing[i] == j]
        for s in listed:
            stale = {"stale": 1} if q[s] else {}
            out.append((1.0 / f.m / len(listed), s, replace(listing, s, -1), stale))
        out += [] if listed else [(1.0 / f.m / f.n, s, listing, {}) for s in range(f.n)]
    return out


def jiq_threshold(z):
    """JIQ-Threshold(z) (Wang et al.): a server is listed, in exactly one
    I-queue, exactly while it holds at most ``z`` tasks. A non-empty I-queue
    sends the task to a uniformly random listed server and removes it; if it
    still holds at most ``z`` tasks it joins a uniformly random I-queue again
    (a join request). An empty one sends it to a uniformly random server; if
    that pushes a listed server above ``z``, a delete request removes it."""

    def route(f, state):
        q, _, listing = state
        out = []
        for j in range(f.m):
            listed = [i for i in range(f.n) if listing[i] == j]
            for s in listed:
                p = 1.0 / f.m / len(listed)
                if q[s] + 1 <= z:
                    out += [(p / f.m, s, replace(listing, s, x), {"join": 1}) for x in range(f.m)]
                else:
                    out.append((p, s, replace(listing, s, -1), {}))
            for s in [] if listed else range(f.n):
                if listing[s] >= 0 and q[s] + 1 > z:
                    out.append((1.0 / f.m / f.n, s, replace(listing, s, -1), {"delete": 1}))
                else:
                    out.append((1.0 / f.m / f.n, s, listing, {}))
        return out

    return route


# ---------------------------------------------------------------- deliberately wrong readings
# Each misreads one clause of a rule above. Its rejection is asserted on a
# metric where it is statistical (the run's interval against the misreading's
# value), never on a structural zero (a message the misreading never sends, an
# I-queue size it never reaches): those would reject at any run length.


def i1f_without_the_one_task_tier(f, state):
    """I1F misread: an idle server if there is one; else a uniformly random
    server (the servers with exactly one task get no preference)."""
    q, _, listing = state
    group = [i for i in range(f.n) if q[i] == 0] or list(range(f.n))
    return [(1.0 / len(group), s, listing, {}) for s in group]


def join_uniform_probing(d):
    """JIQ-SQ(d) misread: the ``d`` I-queues are probed, but the server joins a
    uniformly random I-queue (JIQ's join), not the one listing the fewest."""

    def join(f, state, i):
        sent = {"join": 1, "probe": d} if d >= 2 and f.m > 1 else {"join": 1}
        return [(1.0 / f.m, replace(state[2], i, j), sent) for j in range(f.m)]

    return join


def idle_first_any_probed(d):
    """idle-first(d) misread: an idle server if there is one; else one of the
    ``d`` probed servers, uniformly (not the shortest of them): a uniformly
    random server, its ``d`` probes sent."""

    def route(f, state):
        q, _, listing = state
        idle = [i for i in range(f.n) if q[i] == 0]
        if idle:
            return [(1.0 / len(idle), s, replace(listing, s, -1), {}) for s in idle]
        return [(1.0 / f.n, s, listing, {"probe": d}) for s in range(f.n)]

    return route


def jsew_by(wait_of):
    """JSEW with the expected wait misread as ``wait_of(f, i, k)``."""

    def route(f, state):
        q, _, listing = state
        wait = {i: wait_of(f, i, q[i]) for i in range(f.n) if q[i] < f.buffer}
        if not wait:
            return [(1.0, None, listing, {})]
        ties = [i for i, w in wait.items() if w <= min(wait.values()) * (1.0 + 1e-9)]
        return [(1.0 / len(ties), s, listing, {}) for s in ties]

    return route


#: JSEW misread as ``k * mean / speed``: the wait before service, not to completion.
jsew_before_service = jsew_by(lambda f, i, k: k * f.means[i] / f.speed[i])
#: JSEW misread as ``(k + 1) / speed``: the law's mean left out.
jsew_without_the_mean = jsew_by(lambda f, i, k: (k + 1) / f.speed[i])


def pod_with_replacement(d):
    """Pod(d) misread: ``d`` independent uniform probes (a server may be probed twice)."""

    def route(f, state):
        q, _, listing = state
        probes = list(itertools.product(range(f.n), repeat=d))
        out = []
        for sub in probes:
            ties = sorted({i for i in sub if q[i] == min(q[j] for j in sub)})
            out += [(1.0 / len(probes) / len(ties), s, listing, {"probe": d}) for s in ties]
        return out

    return route


def join_fewest(f, state, i):
    """JIQ misread: a server that becomes idle joins the I-queue listing the
    fewest servers, ties uniform (not a uniformly random one; no probes sent)."""
    listing = state[2]
    size = [listing.count(j) for j in range(f.m)]
    ties = [j for j in range(f.m) if size[j] == min(size)]
    return [(1.0 / len(ties), replace(listing, i, j), {"join": 1}) for j in ties]


def jiq_by_pool(f, state):
    """JIQ with pools misread: an empty I-queue sends the arrival to a
    uniformly random pool, then a uniformly random server of it (not a
    uniformly random server of all ``N``)."""
    out = []
    for p in range(f.n_pools):
        members = [i for i in range(f.n) if f.pool[i] == p]
        out += [(1.0 / f.n_pools / len(members), s, state[2], {}) for s in members]
    return out


# ---------------------------------------------------------------- the cases


@dataclasses.dataclass
class Case:
    """A system under a rule: jaxqueue's inputs, and the chain's pools
    (``(count, speed, (alpha, S) or None)``) where they are not the default."""

    policy: str
    n: int
    m: int
    rule: Rule
    options: dict = dataclasses.field(default_factory=dict)
    service: str | None = None
    pools: object = None
    chain_pools: list | None = None
    buffer: int = BUFFER


JIQ = Rule(jiq(random_server), join_random)
CASES = {
    "i1f": Case("i1f", 3, 1, Rule(i1f)),
    "jiq": Case("jiq", 3, 2, JIQ),
    "jiq-sq-M2": Case("jiq-sq", 3, 2, Rule(jiq(random_server), join_shortest(2)), {"d": 2}),
    "jiq-sq-M3": Case("jiq-sq", 3, 3, Rule(jiq(random_server), join_shortest(2)), {"d": 2}),
    "idle-first": Case("idle-first", 3, 1, Rule(idle_first(2), join_only), {"d": 2}),
    "jsew-pools": Case(
        "jsew", 4, 1, Rule(jsew), pools="0.5:2,0.5:1", chain_pools=[(2, 2.0, None), (2, 1.0, None)]
    ),
    "jiq-pools": Case(
        "jiq",
        3,
        2,
        JIQ,
        pools=[Pool(1, 2.0), Pool(2, 1.0)],
        chain_pools=[(1, 2.0, None), (2, 1.0, None)],
    ),
    "pod-erlang2": Case("pod", 3, 1, Rule(pod(2)), {"d": 2}, service="erlang:2"),
    "jiq-hyperexp": Case("jiq", 3, 2, JIQ, service="hyperexp:4"),
    # JIQ by class: each pool its own law and speed, the class a pool and a phase
    "jiq-classes": Case(
        "jiq",
        3,
        2,
        JIQ,
        pools=[Pool(1, 2.0, PhaseType(*ERLANG2)), Pool(2, 1.0, PhaseType(*H4))],
        chain_pools=[(1, 2.0, ERLANG2), (2, 1.0, H4)],
    ),
    # JSEW reads the laws' means: the slow pool's mean is 3/4 (a tie at a wait of 1.5)
    "jsew-classes": Case(
        "jsew",
        3,
        1,
        Rule(jsew),
        pools=[Pool(1, 2.0, PhaseType(*ERLANG2)), Pool(2, 1.0, PhaseType(*EXP34))],
        chain_pools=[(1, 2.0, ERLANG2), (2, 1.0, EXP34)],
    ),
}
#: The other rules, against the exact solver only (tests/exact/test_vs_exact.py
#: simulates them against it); JIQ-Original's per-server chain is larger: 2 places.
CASES.update(
    {
        "random": Case("random", 3, 1, Rule(random_server)),
        "jsq": Case("jsq", 3, 1, Rule(shortest_queue)),
        "pod": Case("pod", 3, 1, Rule(pod(2)), {"d": 2}),
        "jiq-pod": Case("jiq-pod", 3, 2, Rule(jiq(pod(2)), join_random), {"d": 2}),
        "jiq-threshold": Case(
            "jiq-threshold",
            3,
            2,
            Rule(jiq_threshold(1), unless_listed(join_random), z=1),
            {"z": 1},
            buffer=2,
        ),
        "jiq-original": Case(
            "jiq-original",
            3,
            2,
            Rule(jiq_original, unless_listed(join_random), stale=True),
            buffer=2,
        ),
        "jiq-original-z1-d2": Case(
            "jiq-original",
            3,
            2,
            Rule(jiq_original, unless_listed(join_shortest(2)), z=1, stale=True),
            {"z": 1, "d": 2},
            buffer=2,
        ),
    }
)
LAWS = {None: EXP, "erlang:2": ERLANG2, "hyperexp:4": H4}
#: The cases simulated: the rules of the pools, phases and per-rule cases
#: above (tests/exact/test_vs_exact.py simulates the others against the exact solver).
SIMULATED = [
    "i1f",
    "jiq-sq-M3",
    "idle-first",
    "jsew-pools",
    "jiq-pools",
    "pod-erlang2",
    "jiq-hyperexp",
    "jiq-classes",
    "jsew-classes",
]


def _chain(c: Case, rule: Rule):
    """The metrics of case ``c``'s farm under ``rule`` (tests/chains.py)."""
    f = farm(c.n, c.m, LOAD, c.buffer, c.chain_pools, LAWS[c.service])
    return farm_metrics(f, *solve_farm(f, rule), stale=rule.stale)


@pytest.fixture(scope="module")
def references():
    """Each case's reference metrics, solved once."""
    return {name: _chain(c, c.rule) for name, c in CASES.items()}


def _exact(c: Case):
    return solve_exact(
        c.policy, LOAD, c.n, c.m, buffer=c.buffer, service=c.service, pools=c.pools, **c.options
    )


# ---------------------------------------------------------------- the chains themselves


@pytest.mark.parametrize(("law", "load", "scv"), [(ERLANG2, 0.5, 0.5), (H4, 0.3, 4.0)])
def test_chain_of_one_server_is_pollaczek_khinchine(law, load, scv):
    """One server with a phase-type law of mean 1 and room for 60 (a
    truncation holding < 1e-10): the mean response time is
    ``1 + load (1 + scv) / (2 (1 - load))`` (Pollaczek-Khinchine)."""
    f = farm(1, 1, load, 60, law=law)
    ref = farm_metrics(f, *solve_farm(f, Rule(random_server)), levels=())
    assert ref["blocking_probability"] < 1e-10
    want = 1.0 + load * (1.0 + scv) / (2.0 * (1.0 - load))
    assert ref["mean_response_time"] == pytest.approx(want, rel=1e-9)


def test_chain_of_random_routing_on_two_speeds_is_two_mm1k_queues():
    """Random routing on a speed-2 and a speed-1 server, 4 places each: two
    independent M/M/1/4 queues, arrival rate ``load`` each, ``rho = load / v``."""
    load, k = 0.9, 4
    f = farm(2, 1, load, k, [(1, 2.0, None), (1, 1.0, None)])
    ref = farm_metrics(f, *solve_farm(f, Rule(random_server)))
    accepted = []
    for i, v in enumerate((2.0, 1.0)):
        pi = (load / v) ** np.arange(k + 1.0)
        pi /= pi.sum()
        np.testing.assert_allclose(ref["pool_occupancy"][i], pi, rtol=1e-12)
        little = float(np.arange(k + 1) @ pi) / (load * (1.0 - pi[k]))
        assert ref["pool_mean_response_time"][i] == pytest.approx(little, rel=1e-12)
        assert ref["pool_waiting_probability"][i] == pytest.approx(
            1.0 - pi[0] / (1.0 - pi[k]), rel=1e-12
        )
        accepted.append(1.0 - pi[k])
    assert ref["pool_arrival_share"] == pytest.approx(np.divide(accepted, sum(accepted)), rel=1e-12)


# ---------------------------------------------------------------- the exact solver


@pytest.mark.parametrize("name", CASES)
def test_exact_solver_follows_the_rule(name, references):
    ref, ex = references[name], _exact(CASES[name])
    for key, value in ref.items():
        if key == "n_states":
            continue
        got = getattr(ex, key)
        if got is None:  # a metric that does not apply: the hand-built chain counts none
            assert value == 0, f"{name}: {key} is None but the reference has {value}"
            continue
        if isinstance(value, dict):  # quantiles: {level: value}
            assert set(got) == set(value), key
            got, value = [got[q] for q in value], list(value.values())
        np.testing.assert_allclose(got, value, rtol=1e-9, atol=1e-12, err_msg=f"{name}: {key}")
    if "p0" not in ref:
        assert ex.p0 is None and ex.iqueue_distribution is None
    if "pool_occupancy" not in ref:
        assert ex.pool_occupancy is None
    if "stale_fraction" not in ref:
        assert ex.stale_fraction is None


# ---------------------------------------------------------------- the simulator

#: The scalar metrics compared where the reference has them and they are not 0
#: (a rate the rule never sends is checked to be exactly 0 instead).
SCALARS = (
    "mean_response_time",
    "waiting_probability",
    "blocking_probability",
    "mean_queue_length",
    "p0",
    "join_rate",
    "delete_rate",
    "probe_rate",
)
POOL_METRICS = ("pool_arrival_share", "pool_utilization", "pool_mean_response_time")
QUANTILES = (0.5, 0.9)

#: Per simulated case, deliberately wrong readings of its rule, ``(reading,
#: rule, metrics)``: the run's estimate of each of ``metrics`` is asserted
#: outside its tolerance against the reading's chain (for a vector, some
#: entry with an interval). Measured at this key and run length, in
#: tolerances of the family (the right rules: 0.09-0.42 at most, over
#: every metric):
#:
#: * I1F without the one-task tier: P(wait) 5.9, blocking 5.3, s_1..s_3 5.0;
#: * JIQ-SQ(2) joining a uniform I-queue: I-queue law 26.5, delete rate 7.0
#:   (T only 0.53: the misreading shows in the I-queues, not in T);
#: * idle-first(2) taking any probed server: blocking 10.9, P(wait) 10.9;
#: * JSEW by ``k * mean / speed``: pool arrival share 36.6 (jsew-pools),
#:   18.9 (jsew-classes);
#: * JSEW without the law's mean: pool arrival share 12.4, pool T 10.8;
#: * Pod(2) with replacement: blocking 3.7, s_1..s_3 2.6;
#: * JIQ joining the I-queue listing fewest: I-queue law 15.0, 11.9, 11.1,
#:   delete rate 8.5, 8.4, 6.8 (jiq-pools, jiq-hyperexp, jiq-classes);
#: * JIQ's fallback by pool: pool arrival share 11.7, pool T 10.3
#:   (jiq-pools); pool T 7.7, pool utilization 4.7 (jiq-classes).
JIQ_JOIN_FEWEST = (
    "JIQ joining the I-queue listing fewest",
    Rule(jiq(random_server), join_fewest),
    ("iqueue_distribution", "delete_rate"),
)
JIQ_BY_POOL = (
    "JIQ's fallback by pool",
    Rule(jiq(jiq_by_pool), join_random),
    ("pool_arrival_share", "pool_mean_response_time"),
)
WRONG = {
    "i1f": [
        (
            "I1F without the one-task tier",
            Rule(i1f_without_the_one_task_tier),
            ("waiting_probability", "blocking_probability", "tail"),
        )
    ],
    "jiq-sq-M3": [
        (
            "JIQ-SQ(2) joining a uniform I-queue",
            Rule(jiq(random_server), join_uniform_probing(2)),
            ("delete_rate", "iqueue_distribution"),
        )
    ],
    "idle-first": [
        (
            "idle-first(2) taking any probed server",
            Rule(idle_first_any_probed(2), join_only),
            ("blocking_probability", "waiting_probability"),
        )
    ],
    "jsew-pools": [
        ("JSEW by k * mean / speed", Rule(jsew_before_service), ("pool_arrival_share",))
    ],
    "jiq-pools": [JIQ_JOIN_FEWEST, JIQ_BY_POOL],
    "pod-erlang2": [
        ("Pod(2) with replacement", Rule(pod_with_replacement(2)), ("blocking_probability", "tail"))
    ],
    "jiq-hyperexp": [JIQ_JOIN_FEWEST],
    "jiq-classes": [
        JIQ_JOIN_FEWEST,
        (JIQ_BY_POOL[0], JIQ_BY_POOL[1], ("pool_mean_response_time", "pool_utilization")),
    ],
    "jsew-classes": [
        ("JSEW by k * mean / speed", Rule(jsew_before_service), ("pool_arrival_share",)),
        (
            "JSEW without the law's mean",
            Rule(jsew_without_the_mean),
            ("pool_arrival_share", "pool_mean_response_time"),
        ),
    ],
}


def _compared(c: Case, ref) -> list:
    """The metrics compared for case ``c`` against its reference ``ref``."""
    keys = ["tail"] + [k for k in SCALARS if ref.get(k, 0.0) != 0.0]
    keys += ["iqueue_distribution"] if c.m > 1 else []  # one dispatcher: not reported
    keys += [f"quantile {q}" for q in QUANTILES]
    return keys + [k for k in POOL_METRICS if k in ref]


def _reference(ref, key):
    if key == "tail":
        return np.asarray(ref["tail"][1:4], np.float64)  # s_1..s_3
    if key.startswith("quantile "):
        return np.float64(ref["response_quantiles"][float(key.split()[1])])
    return np.asarray(ref[key], np.float64)


def _estimate(sim, key):
    if key == "tail":
        return jq.Estimate(sim.tail.mean[1:4], sim.tail.ci95[1:4], sim.tail.n)
    if key.startswith("quantile "):
        return sim.response_quantiles[float(key.split()[1])]
    return getattr(sim, key)


def _family(references) -> int:
    """The comparisons that run: every entry of every compared metric of every
    simulated case whose reference is not exactly 0 (an I-queue size the rule
    never reaches is an exact check, not a comparison)."""
    return sum(
        int(np.count_nonzero(_reference(references[name], key)))
        for name in SIMULATED
        for key in _compared(CASES[name], references[name])
    )


def _distances(est, exact, family):
    """``|mean - exact| / tolerance`` per entry, where the run's interval is not
    empty (an entry never reached has a zero-width interval: left out)."""
    err = np.abs(np.asarray(est.mean, np.float64) - exact)
    tol = np.asarray(tolerance(est, family), np.float64)
    return np.atleast_1d(err / np.where(tol > 0, tol, np.nan))


@pytest.fixture(scope="module")
def family(references):
    return _family(references)


def test_the_family_counts_the_comparisons_that_run(references, family):
    """137 of an upper bound of 24 per case (216): the rates a rule never sends,
    the I-queue law with one dispatcher and the pools' metrics without pools
    are not compared."""
    assert family == 137
    assert family < (3 + 4 + 4 + 5 + 2 + 3 * 2) * len(SIMULATED)
    assert all(np.count_nonzero(_reference(references[n], "tail")) == 3 for n in SIMULATED)


def _simulate(c: Case):
    return jq.simulate(
        c.policy,
        LOAD,
        c.n,
        c.m,
        buffer=c.buffer,
        replicas=REPLICAS,
        steps=STEPS,
        warmup=4096,
        seed=5,
        devices=jax.devices()[:1],
        iqueue_levels=c.n if c.m > 1 else None,
        service=c.service,
        pools=c.pools,
        **c.options,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", SIMULATED)
def test_simulator_follows_the_rule_and_rejects_its_misreadings(name, references, family):
    c = CASES[name]
    ref, sim = references[name], _simulate(c)
    for key in SCALARS:  # none happen: exactly 0, or None where the metric does not apply
        if key not in ref:
            assert getattr(sim, key) is None, key
        elif ref[key] == 0.0:
            assert getattr(sim, key) is None or getattr(sim, key).mean == 0.0, key
    for key in POOL_METRICS:
        assert (getattr(sim, key) is None) == (key not in ref), key
    for key in _compared(c, ref):
        est, exact = _estimate(sim, key), _reference(ref, key)
        d = _distances(est, exact, family)
        assert np.all(np.nan_to_num(d) <= 1.0), f"{key}: simulated {est.mean}, reference {exact}"
        # a zero-width interval only where the value is exactly right (a state never reached)
        assert np.all((np.asarray(est.ci95) > 0) | (np.asarray(est.mean) == exact)), key
    for reading, rule, metrics in WRONG[name]:
        wrong = _chain(c, rule)
        for key in metrics:
            d = _distances(_estimate(sim, key), _reference(wrong, key), family)
            assert np.nanmax(d) > 1.0, f"{reading}: {key} not rejected ({np.nanmax(d):.2f})"
