"""JIQ-Original's options: FIFO I-queues, the join threshold ``z``, joins to the shortest of ``d``.

The options follow Mitzenmacher, "Analyzing Distributed Join-Idle-Queue: A
Fluid Limit Approach", arXiv:1606.01833 (his JIQ is ``order="fifo"``, his
threshold variant ``order="fifo", z=1``, his JIQ-SQ(2) ``order="fifo", d=2``).

The simulator (:mod:`jaxqueue.sim.per_server`) is checked against the exact
chain (:mod:`jaxqueue.exact.chain`, an independent per-server implementation
of the same rules) on small systems with finite buffers (no truncation). Every
comparison is a two-sided Student-t test for the replicas used
(:func:`jaxqueue.tolerance`), family-wise 0.001 (Bonferroni) over the
comparisons of this file (FAMILY below: every metric of every case, counted
even where the exact value is 0 and the simulated one must be exactly 0).
Each case has its own seed, so the cases are independent.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.core.rng import step_words
from jaxqueue.core.system import System
from jaxqueue.exact import solve_exact
from jaxqueue.results.stats import tolerance
from jaxqueue.sim.state import core_from_counts, n_words
from jaxqueue.sim.step import step

LOAD, BUFFER = 0.8, 3
REPLICAS, STEPS, WARMUP = 32, 2**17, 4096

# (options, N, M, seed)
CASES = [
    ({"order": "fifo"}, 3, 2, 1),  # Mitzenmacher's JIQ
    ({"z": 1}, 3, 2, 2),
    ({"order": "fifo", "z": 1}, 3, 2, 3),  # his threshold variant
    ({"order": "fifo", "d": 2}, 3, 2, 4),  # his JIQ-SQ(2): both I-queues probed
    ({"order": "fifo", "d": 2}, 3, 3, 5),  # two of three I-queues: ties and subsets
    ({"order": "fifo", "z": 1, "d": 3}, 3, 3, 6),  # d = 3: the join's words from a sub-stream
]
METRICS = (
    "mean_response_time",
    "waiting_probability",
    "blocking_probability",
    "p0",
    "join_rate",
    "probe_rate",
    "stale_fraction",
)
FAMILY = len(CASES) * len(METRICS)


def _close(est, exact, what):
    exact = float(exact)
    err = abs(float(est.mean) - exact)
    tol = tolerance(est, FAMILY)
    assert err <= tol, f"{what}: simulated {est.mean} ± {tol}, exact {exact}"
    # a zero-width interval is only acceptable where the value is exactly right
    assert est.ci95 > 0 or err == 0, what


# ---------------------------------------------------------------------------- options


def test_defaults_are_the_rule_of_lu_et_al():
    policy = jq.make("jiq-original")
    assert policy.options() == {"order": "random", "z": 0, "d": 1}
    assert policy == jq.make("jiq-original", order="random", z=0, d=1)
    assert policy.label() == "jiq-original" and policy.threshold == 0
    assert policy.exact_rule() == ("jiq-original", {"order": "random", "z": 0, "d": 1})
    other = jq.make("jiq-original", order="fifo", z=1, d=2)
    assert other.label() == "jiq-original(order=fifo,z=1,d=2)" and other.threshold == 1
    assert jq.make("jiq-original", z=1).label() == "jiq-original(z=1)"


@pytest.mark.slow
def test_defaults_passed_explicitly_change_nothing():
    # by keyword or in the Policy: the same compiled step, the same random words
    kw = {
        "buffer": BUFFER,
        "replicas": 4,
        "steps": 1024,
        "warmup": 256,
        "seed": 9,
        "iqueue_levels": 3,
    }
    runs = [
        jq.simulate("jiq-original", LOAD, 3, 2, **kw),
        jq.simulate("jiq-original", LOAD, 3, 2, order="random", z=0, d=1, **kw),
        jq.simulate(jq.make("jiq-original", order="random", z=0, d=1), LOAD, 3, 2, **kw),
    ]
    dicts = [r.to_dict() for r in runs]
    for d in dicts:
        d["settings"].pop("wall_seconds")
    assert dicts[0]["settings"]["options"] == {"order": "random", "z": 0, "d": 1}
    assert dicts[0] == dicts[1] == dicts[2]


@pytest.mark.parametrize(
    "opts, match",
    [
        ({"order": "lifo"}, r"order='lifo' is not valid: use 'random' or 'fifo'"),
        ({"z": -1}, r"z=-1 is out of range: need 0 <= z <= 1000000"),
        (
            {"d": 0},
            r"d=0 is out of range: it probes dispatchers, need 1 <= d <= n_dispatchers \(2\)",
        ),
        (
            {"d": 3},
            r"d=3 is out of range: it probes dispatchers, need 1 <= d <= n_dispatchers \(2\)",
        ),
    ],
)
def test_bad_options_name_the_parameter_and_range(opts, match):
    with pytest.raises(ValueError, match=match):
        jq.make("jiq-original", **opts).validate(System(3, 2, None, 1, 0))
    with pytest.raises(ValueError, match=match):  # before anything compiles
        jq.simulate("jiq-original", LOAD, 3, 2, steps=256, **opts)
    with pytest.raises(ValueError, match=match):
        solve_exact("jiq-original", LOAD, 3, 2, queue_bound=4, **opts)


def test_order_is_an_option_of_jiq_original_only():
    with pytest.raises(ValueError, match="takes no option order"):
        jq.make("jiq-threshold", order="fifo")
    with pytest.raises(ValueError, match="takes no option order"):
        solve_exact("jiq", LOAD, 3, 2, order="fifo", queue_bound=4)


# ---------------------------------------------------------------------------- the exact chain


def test_exact_chain_options_change_the_answer():
    def solve(m=2, **opts):
        return solve_exact("jiq-original", LOAD, 3, m, buffer=BUFFER, **opts)

    base, fifo, z1, sq = solve(), solve(order="fifo"), solve(z=1), solve(d=2)
    t = base.mean_response_time
    assert abs(fifo.mean_response_time - t) > 1e-3 * t  # the order matters (FIFO: 0.2% worse)
    assert fifo.n_states > base.n_states  # the state holds each I-queue's order
    assert z1.mean_response_time > 1.02 * t  # picks of servers listed with one task
    assert z1.p0 < base.p0 and z1.join_rate > base.join_rate
    assert z1.stale_fraction > base.stale_fraction
    assert sq.mean_response_time < 0.99 * t and sq.probe_rate == pytest.approx(2 * sq.join_rate)
    assert base.probe_rate == fifo.probe_rate == z1.probe_rate == 0.0
    for res in (base, fifo, z1, sq):  # listings end only by picks
        assert res.join_rate == pytest.approx(LOAD * (1 - res.p0), rel=1e-9)
        assert res.delete_rate == 0.0
    # one dispatcher, z = 0: the one I-queue lists only idle servers, so the order cannot matter
    a, b = solve(m=1), solve(m=1, order="fifo")
    assert a.mean_response_time == pytest.approx(b.mean_response_time, rel=1e-12)
    assert a.stale_fraction == b.stale_fraction == 0.0
    # but with z = 1 it lists servers with one task too, and it does
    a, b = solve(m=1, z=1), solve(m=1, z=1, order="fifo")
    assert abs(a.mean_response_time - b.mean_response_time) > 1e-4 * a.mean_response_time


def test_fifo_symmetry_lumping_is_exact():
    kw = {"order": "fifo", "z": 1, "d": 2, "queue_bound": 4}
    a = solve_exact("jiq-original", LOAD, 3, 2, **kw)
    b = solve_exact("jiq-original", LOAD, 3, 2, symmetry=False, **kw)
    assert a.n_states < b.n_states
    for name in (*METRICS, "tail", "iqueue_distribution"):
        if getattr(b, name) is None:  # a metric that does not apply (infinite buffer)
            assert getattr(a, name) is None, name
            continue
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------- the engine


def _trajectory(policy, system, n, seed):
    """``n`` steps of one replica from the empty system: every core and event."""
    core0 = core_from_counts(
        np.eye(1, system.levels + 1, 0, dtype=np.int64)[0] * system.n_servers, None, system, policy
    )
    bkey = jax.random.bits(jax.random.key(seed), (2,), jnp.uint32)
    nw = n_words(system, policy)

    def body(core, t):
        new, ev = step(core, step_words(bkey, t, nw), jnp.float32(LOAD), system, policy)
        return new, (new, ev)

    run = jax.jit(lambda c: jax.lax.scan(body, c, jnp.arange(n, dtype=jnp.int32))[1])
    return jax.tree.map(np.asarray, run(core0))


@pytest.mark.slow
def test_fifo_rings_and_joins_to_the_shortest_after_every_step():
    n, m, levels, steps = 8, 3, 16, 3000
    policy = jq.make("jiq-original", order="fifo", z=1, d=3)  # d = M: a shortest I-queue
    system = System(n, m, None, levels, n)  # room for every server in any I-queue
    cores, ev = _trajectory(policy, system, steps, seed=11)
    q, slots, sizes, where = cores.lists
    cap = system.iqueue_levels
    heads = slots[:, :, cap]

    def queues(t):
        return [
            [int(slots[t, j, (heads[t, j] + k) % cap]) for k in range(sizes[t, j])]
            for j in range(m)
        ]

    prev = [list(range(j, n, m)) for j in range(m)]  # the start: round-robin, in order
    prev_q = np.zeros(n, np.int64)
    tied = np.zeros(m, np.int64)
    for t in range(steps):
        now = queues(t)
        listed = [s for lst in now for s in lst]
        assert len(listed) == len(set(listed)), "a server is listed twice"
        assert (where[t] >= 0).sum() == len(listed)
        for j, lst in enumerate(now):
            for k, s in enumerate(lst):
                assert where[t, s] == j * cap + (heads[t, j] + k) % cap
        assert (where[t][q[t] == 0] >= 0).all(), "an idle server is not listed"
        # FIFO: an I-queue loses its head, gains a server at its tail, or stays
        for j in range(m):
            a, b = prev[j], now[j]
            assert b == a or b == a[1:] or (b[:-1] == a and len(b) == len(a) + 1), (t, j, a, b)
            if len(b) == len(a) + 1:
                joiner = b[-1]
                # the join: a completion left an unlisted server with at most z tasks
                assert q[t, joiner] == prev_q[joiner] - 1 <= policy.z
                assert all(joiner not in lst for lst in prev)
                # to a shortest I-queue (d = M probes every one)
                assert len(a) == min(len(x) for x in prev)
                if len({len(x) for x in prev}) == 1:
                    tied[j] += 1
        # an unlisted server left with at most z tasks by a completion joins at once
        dropped = np.nonzero(q[t] < prev_q)[0]
        for s in dropped:
            if q[t, s] <= policy.z:
                assert where[t, s] >= 0
        prev, prev_q = now, q[t].astype(np.int64)
    joins = ev["joins"]
    assert joins.sum() > 500 and (ev["probes"] == 3 * joins).all()
    assert ev["stale"].sum() > 0 and ev["deletes"].sum() == 0 and ev["iq_overflow"].sum() == 0
    # ties among all three I-queues are broken uniformly (a loose check)
    assert tied.sum() > 150 and (tied > 0.2 * tied.sum()).all(), tied


# ---------------------------------------------------------------- against the exact chain


def _ids(case):
    opts, n, m, _ = case
    return "-".join(f"{k}{v}" for k, v in opts.items()) + f"-N{n}-M{m}"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_simulation_matches_the_exact_chain(case):
    opts, n, m, seed = case
    sim = jq.simulate(
        "jiq-original",
        LOAD,
        n,
        m,
        buffer=BUFFER,
        replicas=REPLICAS,
        steps=STEPS,
        warmup=WARMUP,
        seed=seed,
        iqueue_levels=n,
        **opts,
    )
    ex = solve_exact("jiq-original", LOAD, n, m, buffer=BUFFER, **opts)
    options = jq.make("jiq-original", **opts).options()
    assert sim.settings["options"] == ex.settings["options"] == options
    for metric in METRICS:
        est, exact = getattr(sim, metric), getattr(ex, metric)
        if exact == 0.0:
            assert est.mean == 0.0, metric
            continue
        _close(est, exact, metric)
