"""Loads of other run lengths and sizes in one lockstep batch: each keeps its own window.

A sweep's points of one compiled program step together whatever their run
lengths (:attr:`jaxqueue.sim.runner.Plan.windows`) and their ``N`` and ``M``
(:attr:`~jaxqueue.sim.runner.Plan.sizes`); a load's result must be the one it
gets alone, bit for bit, on every backend, and a checkpoint taken between two
loads' boundaries must resume to the same results.
"""

import json

import numpy as np
import pytest

from jaxqueue.core.rng import BLOCK
from jaxqueue.runs import planner
from jaxqueue.sim import runner

#: Pod(2), two loads of other lengths and sizes: 20 and 30 servers, 4 and 9
#: measured blocks after 1 and 3 blocks of warm-up (one compiled program for
#: the batches here, one for the loads alone).
COMMON = dict(d=2, replicas=3, levels=12, init="empty", interval="replicas", batches=4, seed=4)
LOADS, SERVERS, STREAMS = [0.5, 0.8], [20, 30], [11, 22]
STEPS, WARMUP = [4 * BLOCK, 9 * BLOCK], [BLOCK, 3 * BLOCK]


def _batch():
    return planner.plan(
        "pod", LOADS, SERVERS, steps=STEPS, warmup=WARMUP, streams=STREAMS, **COMMON
    )


def _alone(j):
    return planner.plan(
        "pod",
        [LOADS[j]],
        SERVERS[j],
        steps=STEPS[j],
        warmup=WARMUP[j],
        streams=[STREAMS[j]],
        **COMMON,
    )


def _same(a, b, backend=False):
    """Equal results, bit for bit (``backend``: besides the backend's name)."""
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d["settings"].pop("wall_seconds")
        if backend:
            d["settings"].pop("backend")
    assert json.dumps(da, sort_keys=True) == json.dumps(db, sort_keys=True)


@pytest.fixture(scope="module")
def together():
    return runner.run(_batch())


def test_each_load_gets_what_it_gets_alone(together):
    p = _batch()
    assert p.windows == ((1, 4), (3, 9)) and (p.warmup_blocks, p.measure_blocks) == (3, 9)
    assert p.load_windows() == [(1, 4, 4), (3, 9, 4)]
    assert p.sizes == ((20, 1), (30, 1)) and p.system.n_servers == 30
    for j in range(2):
        alone = runner.run(_alone(j))[0]
        _same(together[j], alone)
        assert together[j].settings["steps"] == STEPS[j]
        assert together[j].settings["warmup"] == WARMUP[j]
        assert together[j].settings["n_servers"] == SERVERS[j]
        assert together[j].diagnostics["warmup_diagnostic"]["batches"] == 4


@pytest.mark.parametrize(
    "backend",
    [pytest.param(b, marks=pytest.mark.slow) for b in ("registers", "pallas")],  # heavy compiles
)
def test_the_register_layout_and_the_kernel_read_each_replicas_size(backend):
    """JIQ with 2 and 5 dispatchers over 10 and 25 servers in one batch: the
    register layout (and the GPU kernel, interpreted) give the engine's results."""
    kw = dict(
        replicas=3,
        steps=[3 * BLOCK, 5 * BLOCK],
        warmup=[BLOCK, 2 * BLOCK],
        seed=3,
        init="empty",
        interval="replicas",
        batches=3,
        levels=10,
        iqueue_levels=10,
        streams=[5, 6],
    )
    p = planner.plan("jiq", [0.6, 0.8], [10, 25], [2, 5], backend="xla", **kw)
    assert p.sizes == ((10, 2), (25, 5))
    engine = runner.run(p)
    other = runner.run(planner.plan("jiq", [0.6, 0.8], [10, 25], [2, 5], backend=backend, **kw))
    for a, b in zip(engine, other):
        _same(a, b, backend=True)
        assert a.settings["ratio"] == 5.0


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("xla", marks=pytest.mark.slow),  # three programs compiled
        pytest.param("registers", marks=pytest.mark.slow),
        pytest.param("pallas", marks=pytest.mark.slow),
    ],
)
def test_finite_buffers_are_per_replica_numbers(backend):
    """Pod(2) with buffers 3 and 5 (loads 1.1 and 0.9) in one program: each load's result is
    the one it gets alone, bit for bit, at its own levels, on every backend; blocking at the
    smaller buffer shows each replica reads its own."""
    kw = dict(
        d=2,
        replicas=3,
        steps=[4 * BLOCK, 6 * BLOCK],
        warmup=BLOCK,
        seed=2,
        init="empty",
        interval="replicas",
        batches=4,
        streams=[7, 8],
    )
    p = planner.plan("pod", [1.1, 0.9], 10, buffer=[3, 5], backend=backend, **kw)
    assert p.sizes == ((10, 1, 3), (10, 1, 5)) and p.system.buffer == p.system.levels == 5
    both = runner.run(p)
    for j, b in enumerate((3, 5)):
        one = {k: (v[j] if isinstance(v, list) else v) for k, v in kw.items() if k != "streams"}
        alone = runner.run(
            planner.plan(
                "pod",
                [[1.1, 0.9][j]],
                10,
                buffer=b,
                backend="xla",
                streams=[kw["streams"][j]],
                **one,
            )
        )[0]
        _same(both[j], alone, backend=True)
        assert both[j].settings["buffer"] == both[j].settings["levels"] == b
    assert both[0].blocking_probability.mean > 0.05 and len(both[0].tail.mean) == 4
    with pytest.raises(ValueError, match="buffer per load: give finite buffers only"):
        planner.plan("pod", [1.1, 0.9], 10, buffer=[3, None], **kw)
    with pytest.raises(
        ValueError,
        match="n_servers, n_dispatchers or buffer per load: jiq-original.* keeps per-server lists",
    ):
        planner.plan("jiq-original", [0.5, 0.9], 10, 2, buffer=[3, 5], **{**kw, "d": None})


def test_a_checkpoint_between_two_loads_boundaries_resumes_bit_for_bit(tmp_path, together):
    path = str(tmp_path / "windows.npz")
    p = _batch()
    part = runner.Run.start(p).advance(6)  # the first load is done, the second measures
    assert [w.done for w in part.windows] == [True, False] and not part.done
    part.save(path)
    resumed = runner.Run.resume(p, path)
    assert [w.done for w in resumed.windows] == [True, False]
    for a, b in zip(resumed.advance().results(), together):
        _same(a, b)


def test_equal_windows_make_the_plan_of_one_timeline():
    """Per-load lengths that are all alike give the plan a single length gives
    (same fingerprint: a checkpoint of either resumes the other)."""
    per_load = planner.plan("pod", LOADS, 20, steps=[4 * BLOCK] * 2, warmup=[BLOCK] * 2, **COMMON)
    single = planner.plan("pod", LOADS, 20, steps=4 * BLOCK, warmup=BLOCK, **COMMON)
    assert per_load == single and per_load.windows is None


def test_sizes_that_cannot_share_a_program_are_refused_before_anything_runs():
    for policy, kw, why in [
        ("jiq-original", dict(n_dispatchers=[2, 4]), "per-server lists"),
        ("pod", dict(n_dispatchers=[1, 2]), "one dispatcher and several"),
        ("pod", dict(n_dispatchers=1, d=20), "d = N is JSQ"),
        ("pod", dict(n_dispatchers=1, pools="0.5:2,0.5:1"), "server pools"),
    ]:
        args = {**COMMON, **kw}
        with pytest.raises(ValueError, match=why):
            planner.plan(policy, LOADS, SERVERS, **args)
    with pytest.raises(ValueError, match="init='auto' starts N < 100 empty"):
        planner.plan("pod", LOADS, [50, 200], **{**COMMON, "init": "auto"})
    with pytest.raises(ValueError, match="n_servers gives 3 values for 2 loads"):
        planner.plan("pod", LOADS, [10, 20, 30], **COMMON)
    with pytest.raises(ValueError, match="n_dispatchers=40 is out of range"):
        planner.plan("jiq", LOADS, SERVERS, [2, 40], **{**COMMON, "d": None})
    # one size for all is the plan of one size
    assert planner.plan("pod", LOADS, [20, 20], **COMMON) == planner.plan(
        "pod", LOADS, 20, **COMMON
    )


def test_per_load_lengths_are_checked_before_anything_runs():
    with pytest.raises(ValueError, match="steps gives 3 run lengths for 2 loads"):
        planner.plan("pod", LOADS, 20, steps=[BLOCK] * 3, **COMMON)
    with pytest.raises(ValueError, match=r"steps=0 is out of range"):
        planner.plan("pod", LOADS, 20, steps=[BLOCK, 0], **COMMON)
    with pytest.raises(ValueError, match=r"warmup=-1 is out of range"):
        planner.plan("pod", LOADS, 20, steps=BLOCK, warmup=[0, -1], **COMMON)
    with pytest.raises(ValueError, match="give steps .one per load. or a time in units"):
        planner.plan("pod", LOADS, 20, steps=[BLOCK, BLOCK], time=5.0, **COMMON)
    kw = {**COMMON, "interval": "batch-means", "batches": 20}
    with pytest.raises(ValueError, match=f"steps={BLOCK} is one block"):
        planner.plan("pod", LOADS, 20, steps=[BLOCK, 8 * BLOCK], **kw)
    # an array of lengths is a sequence too; the default warm-up (100 time units
    # at the largest load, 20 * 1.8 * 100 = 3600 steps) is every load's
    p = planner.plan("pod", LOADS, 20, steps=np.array([BLOCK, 2 * BLOCK]), **COMMON)
    assert p.windows == ((15, 1), (15, 2))
