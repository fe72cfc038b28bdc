"""Registry-wide checks of the step kernel: invariants after every step,
reproducibility, batching and sharding invariance, resumable runs, overflow reporting.

Policies come from the registry (``jaxqueue.available()``), each with its
default options, so a new policy is checked without touching this file."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.core.rng import BLOCK, replica_keys, step_words
from jaxqueue.core.system import System
from jaxqueue.policies.base import level_of
from jaxqueue.runs import planner
from jaxqueue.runs.initial import initial_counts
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import PACK, run_blocks, unpack
from jaxqueue.sim.state import core_from_counts, n_words
from jaxqueue.sim.step import step

# One small system per policy; shapes shared across tests to keep compiles few.
N, M, LEVELS, IQ = 12, 3, 20, 12
OCCUPANCY = [n for n in jq.available() if jq.make(n).engine == "occupancy"]
PER_SERVER = [n for n in jq.available() if jq.make(n).engine == "per-server"]
CASES = [
    (name, m) for name in OCCUPANCY for m in (1, M) if m == 1 or not jq.make(name).single_dispatcher
]


def _system(policy, m=M, buffer=None):
    iq = IQ if policy.uses_iqueues and m > 1 else 0
    return System(N, m, buffer, buffer or LEVELS, iq)


def _start(policy, system):
    return core_from_counts(*initial_counts("empty", system, policy, 0.8), system, policy)


@functools.partial(jax.jit, static_argnames=("system", "policy", "n"))
def _trajectory(core, key, load, system, policy, n):
    """n steps of one replica, returning every core and event."""
    bkey = jax.random.bits(key, (2,), jnp.uint32)
    nw = n_words(system, policy)

    def body(core, t):
        new, ev = step(core, step_words(bkey, t, nw), load, system, policy)
        return new, (new, ev)

    _, out = jax.lax.scan(body, core, jnp.arange(n, dtype=jnp.int32))
    return out


def _seen_is_below_up(ev, system):
    """An accepted arrival is a real ``up`` that found ``up - 1`` tasks: a block
    counts it in the same scatter-add as its time sums (sim.blocks.PACK)."""
    up, seen = np.asarray(ev["up"]), np.asarray(ev["seen"])
    real = up <= system.levels
    np.testing.assert_array_equal(seen, np.where(real, up - 1, system.levels + 1))
    assert real.any()


@pytest.mark.parametrize("name, m", CASES)
@pytest.mark.slow
def test_invariants_after_every_step(name, m):
    policy = jq.make(name)
    if "d" in policy.options():  # every d <= min(N, M) is valid; use 3 where it fits
        policy = jq.make(name, d=min(3, N if name != "jiq-sq" else m))
    system = _system(policy, m)
    core0 = _start(policy, system)
    cores, ev = _trajectory(core0, jax.random.key(7), jnp.float32(0.8), system, policy, 3000)
    tail = np.asarray(cores.tail)
    assert (tail[:, 0] == N).all()
    assert (np.diff(tail, axis=1) <= 0).all() and (tail >= 0).all()
    # conservation: tasks change by accepted arrivals minus departures
    tasks = np.concatenate([[0], tail[:, 1:].sum(axis=1)])
    accepted = (np.asarray(ev["seen"]) <= system.levels).astype(int)
    dtasks = np.diff(tasks)
    assert set(np.unique(dtasks)) <= {-1, 0, 1}
    assert ((dtasks == 1) == (accepted == 1)).all()
    assert np.asarray(ev["overflow"]).sum() == 0
    _seen_is_below_up(ev, system)
    # a step moves at most one server between levels and one dispatcher between
    # I-queue sizes: the engine's one scatter-add per array (sim.events.move) needs it
    real = lambda key, top: np.asarray(ev[key]) <= top  # noqa: E731
    assert not (real("up", system.levels) & real("down", system.levels)).any()
    assert real("up", system.levels).any() and real("down", system.levels).any()
    assert not (real("iq_up", system.iqueue_levels) & real("iq_down", system.iqueue_levels)).any()
    if policy.uses_iqueues and m > 1:
        iq = np.asarray(cores.iq_tail)
        listed = np.asarray(cores.iq_listed)
        assert (iq[:, 0] == m).all() and (np.diff(iq, axis=1) <= 0).all() and (iq >= 0).all()
        counts = iq - np.concatenate([iq[:, 1:], np.zeros_like(iq[:, :1])], axis=1)
        sizes = np.arange(iq.shape[1])
        # I-queues hold exactly the idle servers
        assert ((counts * sizes).sum(axis=1) == N - tail[:, 1]).all()
        expect_listed = np.cumsum((counts * sizes)[:, ::-1], axis=1)[:, ::-1]
        assert (listed == expect_listed).all()
        assert np.asarray(ev["iq_overflow"]).sum() == 0
        # the trajectory exercised joins, and deletes for the JIQ routing
        assert np.asarray(ev["joins"]).sum() > 0
        assert np.asarray(ev["deletes"]).sum() > 0


@pytest.mark.slow  # ten level counts, a compile each
def test_level_search_in_runs_of_levels():
    """level_of counts the levels above an index in runs of at most 32 levels (a
    longer reduction is slow on the CPU): the same count as one sum, on both
    sides of each run's end."""
    rng = np.random.default_rng(0)
    for levels in (1, 31, 32, 33, 64, 65, 100, 256, 257, 300):  # past 256: one padded view
        tail = np.sort(rng.integers(0, 50, levels + 1))[::-1].copy()
        tail[0] = 50
        for index in range(0, 51):
            want = int(np.sum(tail[1:] > index))
            assert int(level_of(jnp.asarray(tail, jnp.int32), jnp.int32(index))) == want


def test_a_block_packs_arrivals_and_time_sums_without_loss():
    """A block's time sums and accepted-arrival counts share one int32 per level
    (sim.blocks.PACK): every pair a block can produce comes back unchanged."""
    most = BLOCK * (BLOCK + 1) // 2  # the largest |time sum| a block adds at one level
    assert most < PACK // 2 and BLOCK * PACK + most < 2**31
    arrivals = np.array([0, 0, 1, BLOCK, BLOCK, 7, 0], np.int32)
    sums = np.array([most, -most, -most, most, -most, 0, 0], np.int32)
    got_sums, got_arrivals = unpack(jnp.asarray(arrivals * PACK + sums))
    np.testing.assert_array_equal(got_sums, sums)
    np.testing.assert_array_equal(got_arrivals, arrivals)


@pytest.mark.slow
def test_finite_buffer_blocks_and_never_overflows():
    policy = jq.make("random")
    system = _system(policy, 1, buffer=2)
    core0 = _start(policy, system)
    cores, ev = _trajectory(core0, jax.random.key(3), jnp.float32(1.5), system, policy, 3000)
    tail = np.asarray(cores.tail)
    assert tail.shape[1] == 3 and (tail <= N).all()
    assert np.asarray(ev["blocked"]).sum() > 0
    assert np.asarray(ev["overflow"]).sum() == 0


def _run(policy, replicas_ids, n_blocks=2, devices=None):
    system = _system(policy)
    one = _start(policy, system)
    r = len(replicas_ids)
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (r,) + x.shape), one)
    keys = replica_keys(11, np.asarray(replicas_ids))
    load = jnp.full((r,), 0.8, jnp.float32)
    mesh = None
    if devices is not None:
        mesh = jax.sharding.Mesh(np.asarray(devices), ("replica",))
        sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("replica"))
        state, keys, load = jax.device_put((state, keys, load), sh)
    out = run_blocks(
        state,
        keys,
        jnp.zeros(2, jnp.uint32),
        jnp.int32(n_blocks),
        load,
        system=system,
        policy=policy,
        mesh=mesh,
    )
    return jax.tree.map(np.asarray, out)


@pytest.mark.slow
def test_batching_sharding_and_chunking_do_not_change_results():
    policy = jq.make("jiq-pod", d=2)
    batch = _run(policy, [0, 1, 2, 3])
    single = _run(policy, [2])
    for a, b in zip(jax.tree.leaves(batch), jax.tree.leaves(single)):
        np.testing.assert_array_equal(a[2], b[0])
    sharded = _run(policy, [0, 1, 2, 3], devices=jax.devices()[:2])
    for a, b in zip(jax.tree.leaves(batch), jax.tree.leaves(sharded)):
        np.testing.assert_array_equal(a, b)
    assert len(jax.devices()) == 2


@pytest.mark.slow
def test_same_key_same_result_and_chunking_invariance():
    kw = dict(
        load=0.8,
        n_servers=20,
        n_dispatchers=4,
        replicas=3,
        steps=4 * BLOCK,
        warmup=BLOCK,
        levels=12,
        iqueue_levels=12,
    )
    a = jq.simulate("jiq", seed=5, **kw)
    b = jq.simulate("jiq", seed=5, **kw, devices=jax.devices()[:1])
    c = jq.simulate("jiq", seed=6, **kw)
    np.testing.assert_array_equal(a.tail.mean, b.tail.mean)
    assert a.mean_response_time.mean == b.mean_response_time.mean
    assert a.mean_response_time.mean != c.mean_response_time.mean
    assert a.settings["versions"]["jax"] == jax.__version__


# levels=3 cuts the queue short on purpose, with no warm-up: its drift is not the point here
@pytest.mark.filterwarnings("ignore::jaxqueue.WarmupWarning")
def test_overflow_is_reported_not_clipped():
    kw = dict(n_servers=1, load=0.9, replicas=4, steps=16 * BLOCK, warmup=0, levels=3)
    with pytest.raises(ValueError, match="mean-field start .* puts 0.656 servers past levels=3"):
        jq.simulate("random", init="mean-field", **kw)
    assert planner.plan("random", [0.9], 1, replicas=4, steps=BLOCK).init == "empty"  # N < 100
    with pytest.raises(jq.LevelOverflowError, match="levels=3"):
        jq.simulate("random", **kw)
    res = jq.simulate("random", on_overflow="report", **kw)
    assert res.overflow > 0 and res.to_dict()["diagnostics"]["overflow"] == res.overflow


@pytest.mark.slow
def test_iqueue_overflow_is_reported():
    kw = dict(
        n_servers=40,
        n_dispatchers=8,
        load=0.1,
        replicas=2,
        steps=8 * BLOCK,
        warmup=0,
        levels=8,
        iqueue_levels=6,
    )
    with pytest.raises(jq.LevelOverflowError, match="iqueue_levels=6"):
        jq.simulate("jiq", **kw)
    res = jq.simulate("jiq", on_overflow="report", **kw)
    assert res.iq_overflow > 0 and res.overflow == 0
    assert res.to_dict()["diagnostics"]["iq_overflow"] == res.iq_overflow


@pytest.mark.slow
def test_runs_with_the_same_shapes_do_not_recompile():
    kw = dict(n_servers=20, n_dispatchers=4, replicas=3, warmup=BLOCK, levels=12, iqueue_levels=12)
    jq.simulate("jiq", load=0.8, steps=4 * BLOCK, seed=1, **kw)
    before = run_blocks._cache_size()
    # other loads, seeds and lengths reuse the compiled chunk
    jq.simulate("jiq", load=0.5, steps=9 * BLOCK, seed=2, **kw)
    jq.simulate("jiq", [0.3, 0.6, 0.7], steps=2 * BLOCK, seed=3, **{**kw, "replicas": 1})
    assert run_blocks._cache_size() == before


@pytest.mark.slow
def test_plan_state_and_next_block_are_an_exact_checkpoint():
    """Any split of a run into advance() calls, across the warm-up boundary and the
    batch boundaries, with the state leaving the devices in between, gives the same result."""
    p = planner.plan(
        "jiq-pod",
        [0.7, 0.8],
        20,
        4,
        replicas=3,
        steps=5 * BLOCK,
        warmup=3 * BLOCK,
        levels=12,
        iqueue_levels=12,
        seed=4,
        init="empty",
    )
    whole = runner.Run.start(p).advance().results()
    run = runner.Run.start(p)
    for count in (2, 1, 0, 4, 1):  # block 3 is the warm-up's end
        run.advance(count)
        # a checkpoint: the state leaves the devices and comes back
        run.core = jax.device_put(jax.tree.map(np.asarray, run.core), runner.placement(p)[1])
    assert run.done and run.block == p.total_blocks
    split = run.results()
    for a, b in zip(whole, split):
        np.testing.assert_array_equal(a.tail.mean, b.tail.mean)
        np.testing.assert_array_equal(a.tail.ci95, b.tail.ci95)
        assert a.mean_response_time == b.mean_response_time and a.p0 == b.p0
    with pytest.raises(ValueError, match="n_blocks=-1 is out of range"):
        run.advance(-1)


PER_SERVER_CASES = [
    (name, opts)
    for name in PER_SERVER
    for opts in ([{"z": 1}, {"z": 2}] if name == "jiq-threshold" else [{}])
]


@pytest.mark.slow
@pytest.mark.parametrize("name, opts", PER_SERVER_CASES)
@pytest.mark.parametrize("m", [1, M])
def test_per_server_lists_after_every_step(name, opts, m):
    policy = jq.make(name, **opts)
    z = policy.threshold
    cap = N  # room for every server in any list
    system = System(N, m, None, LEVELS, cap)
    core0 = core_from_counts(np.eye(1, LEVELS + 1, 0, dtype=np.int64)[0] * N, None, system, policy)
    cores, ev = _trajectory(core0, jax.random.key(5), jnp.float32(0.8), system, policy, 3000)
    q = np.asarray(cores.lists.q)
    slots, sizes, where = (np.asarray(x) for x in cores.lists[1:])
    tail = np.asarray(cores.tail)
    levels = np.arange(LEVELS + 1)
    # the occupancy tails are those of the per-server queue lengths
    assert (tail == (q[:, None, :] >= levels[None, :, None]).sum(axis=2)).all()
    iq = np.asarray(cores.iq_tail)
    assert (iq == (sizes[:, None, :] >= np.arange(cap + 1)[None, :, None]).sum(axis=2)).all()
    for t in range(0, 3000, 7):
        listed = [int(s) for d in range(m) for s in slots[t, d, : sizes[t, d]]]
        assert len(listed) == len(set(listed)), "a server is listed twice"
        for d in range(m):
            for c in range(sizes[t, d]):
                assert where[t, slots[t, d, c]] == d * cap + c
        assert (where[t] >= 0).sum() == len(listed)
        is_listed = where[t] >= 0
        if policy.delete_requests:  # listed exactly while holding at most z tasks
            assert (is_listed == (q[t] <= z)).all()
        else:  # every idle server is listed (busy ones may be, stale)
            assert is_listed[q[t] == 0].all()
    assert np.asarray(ev["joins"]).sum() > 0
    _seen_is_below_up(ev, system)
    # with one dispatcher the fallback only runs when nothing is listed: no
    # stale picks and no delete requests can happen
    other = np.asarray(ev["stale" if policy.stale_picks else "deletes"]).sum()
    assert (other > 0) == (m > 1)
    if not policy.delete_requests:
        assert np.asarray(ev["deletes"]).sum() == 0


@pytest.mark.slow  # (a compile of its own)
def test_one_dispatchers_iqueue_is_the_busy_time():
    """JIQ with one server and one dispatcher: the I-queue is empty exactly while the
    server is busy, so ``p0`` (the time-average fraction of an empty I-queue) equals
    the busy fraction ``tail[1]`` step by step, to float rounding. (One dispatcher's
    I-queue is read from the tail, not carried: a reading that lost it fails here.)"""
    res = jq.simulate("jiq", 0.7, 1, 1, replicas=2, steps=8 * BLOCK, warmup=BLOCK)
    assert 0.5 < res.tail.mean[1] < 0.9
    assert abs(res.p0.mean - res.tail.mean[1]) < 1e-6
