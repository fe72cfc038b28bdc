"""Long runs: no 32-bit ceilings, checkpoints that resume bit for bit, batch means, warm-up.

Statistical checks use fixed keys; coverage counts are compared with their
binomial law at four standard deviations.
"""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.core.rng import BLOCK, block_keys, replica_keys
from jaxqueue.results.warmup import diagnose, half_drift, mser_truncation
from jaxqueue.runs import planner
from jaxqueue.runs.initial import initial_counts
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import block_words, max_chunk_blocks, run_blocks
from jaxqueue.sim.state import COUNTERS, core_from_counts
from jaxqueue.sim.totals import Totals

# -- exact sums ------------------------------------------------------------------


def _chunk(n_rep, levels, base, delta, count):
    """A device chunk's Stats as numpy (the same values for every replica)."""
    u = lambda x: np.full((n_rep, levels + 1), x, np.uint32)  # noqa: E731
    c = {
        "tail_lo": u(base & 0xFFFFFFFF),
        "tail_hi": u(base >> 32),
        "tail_delta": np.full((n_rep, levels + 1), delta, np.int32),
        "iq_lo": np.zeros((n_rep, 1), np.uint32),
        "iq_hi": np.zeros((n_rep, 1), np.uint32),
        "iq_delta": np.full((n_rep, 1), count, np.int32),
        "seen": np.full((n_rep, levels + 1), count, np.int32),
    }
    c.update({name: np.full(n_rep, count, np.int32) for name in COUNTERS + ("steps",)})
    return c


def test_host_totals_stay_exact_past_1e10_steps():
    """700 chunks of the largest size at N = 10^9 (1.2e10 steps): the totals equal
    exact integer arithmetic, where int32 counters would have wrapped five times and
    float32 time sums would have drifted."""
    n = 10**9
    blocks = 65_281  # the largest chunk (max_chunk_blocks with d = 2)
    totals = Totals.zeros(2, 3, 1, n, 1)
    totals.arrays["probes"][:] = 2**31 - 5  # an int32 counter near its old limit
    exact_tail, exact_steps = 0, 0
    for i in range(700):
        base = blocks * (n - 12_345 * (i % 7))  # sum over blocks of the block-start tail
        delta = -(2**31 - 1) + 977 * i  # a chunk's delta may be anywhere in int32
        steps = blocks * BLOCK
        totals.add(_chunk(2, 3, base, delta, steps))
        exact_tail += BLOCK * base + delta
        exact_steps += steps
    sums = totals.sums()
    assert int(totals.arrays["steps"][0]) == exact_steps > 10**10
    assert int(totals.arrays["probes"][0]) == 2**31 - 5 + exact_steps
    q, r = int(totals.arrays["tail_q"][0, 1]), int(totals.arrays["tail_r"][0, 1])
    assert q * n + r == exact_tail and 0 <= r < n
    # the time average is the exact rational to float64 rounding
    average = sums["tail"][0, 1] / sums["steps"][0]
    assert average == pytest.approx(float(Fraction(exact_tail, n * exact_steps)), rel=1e-15)
    # what the old float32 sums would have carried: a visible drift
    f32 = np.float32(0)
    for _ in range(700):
        f32 += np.float32((BLOCK * blocks * n - 2**31) / n)
    assert abs(float(f32) - exact_tail / n) / (exact_tail / n) > 1e-7


def test_a_window_is_exact_between_two_totals():
    totals = Totals.zeros(1, 2, 1, 7, 1)
    totals.add(_chunk(1, 2, 10, 3, 5))
    mark = totals.copy()
    totals.add(_chunk(1, 2, 4, -2, 6))
    window = totals.sums(since=mark)
    assert window["tail"][0, 0] == pytest.approx((BLOCK * 4 - 2) / 7, rel=1e-15)
    assert window["steps"][0] == 6 and mark.arrays["steps"][0] == 5


def test_block_keys_past_2_32_blocks_are_new_and_the_low_range_is_unchanged():
    key = replica_keys(3, np.arange(1))[0]
    low = [np.asarray(block_keys(key, jnp.uint32(b))) for b in (0, 1, 2**32 - 1)]
    same = [np.asarray(block_keys(key, jnp.uint32(b), jnp.uint32(0))) for b in (0, 1, 2**32 - 1)]
    np.testing.assert_array_equal(low, same)
    high = [np.asarray(block_keys(key, jnp.uint32(b), jnp.uint32(1))) for b in (0, 1)]
    words = {tuple(x) for x in low + high}
    assert len(words) == 5  # block 2**32 + b does not repeat block b
    np.testing.assert_array_equal(block_words(2**32 + 5), [5, 1])
    with pytest.raises(ValueError, match="block="):
        block_words(-1)


@pytest.mark.slow
def test_a_chunk_across_block_2_32_carries_into_the_high_word():
    """One call over blocks 2**32 - 1 and 2**32 equals two calls, one block each."""
    policy = jq.make("pod")
    p = planner.plan(policy, [0.9], 10, replicas=2, steps=2 * BLOCK, warmup=0, levels=12)
    system = p.system
    core = core_from_counts(*initial_counts("empty", system, policy, 0.9), system, policy)
    batch = jax.tree.map(lambda x: jnp.stack([x, x]), core)
    keys = replica_keys(0, np.arange(2))
    load = jnp.full((2,), 0.9, jnp.float32)
    kw = dict(system=system, policy=policy)
    one_core, one = run_blocks(
        jax.tree.map(jnp.copy, batch),
        keys,
        jnp.asarray(block_words(2**32 - 1)),
        jnp.int32(2),
        load,
        **kw,
    )
    mid, first = run_blocks(
        jax.tree.map(jnp.copy, batch),
        keys,
        jnp.asarray(block_words(2**32 - 1)),
        jnp.int32(1),
        load,
        **kw,
    )
    two_core, second = run_blocks(
        mid, keys, jnp.asarray(block_words(2**32)), jnp.int32(1), load, **kw
    )
    np.testing.assert_array_equal(one_core.tail, two_core.tail)
    np.testing.assert_array_equal(one.seen, np.asarray(first.seen) + np.asarray(second.seen))
    # and block 2**32 is not block 0 again
    _, zero = run_blocks(
        jax.tree.map(jnp.copy, batch), keys, jnp.asarray(block_words(0)), jnp.int32(1), load, **kw
    )
    assert not np.array_equal(np.asarray(zero.tail_delta), np.asarray(second.tail_delta))


@pytest.mark.slow
# a window of 40 blocks from the mean-field start, no warm-up: the carries are the point
@pytest.mark.filterwarnings("ignore::jaxqueue.WarmupWarning")
def test_a_billion_servers():
    """N = 10^9: block-start sums pass 2**32 after five blocks and carry; the tail's
    time averages stay exact (tail_0 = N always; tail_1 moves by one per step)."""
    n = 10**9
    res = jq.simulate(
        "pod", 0.9, n, replicas=2, steps=40 * BLOCK, warmup=0, levels=12, interval="replicas"
    )
    assert res.tail.mean[0] == 1.0 and res.tail.ci95[0] == 0.0
    start = initial_counts("mean-field", res_system(res), jq.make("pod"), 0.9)[0]
    s1 = start[1:].sum() / n
    assert abs(res.tail.mean[1] - s1) <= 40 * BLOCK / n
    assert res.settings["n_servers"] == n
    with pytest.raises(ValueError, match="n_servers=2147483648 is out of range"):
        planner.plan("pod", [0.9], 2**31, replicas=1, steps=BLOCK)


def res_system(res):
    s = res.settings
    return jq.System(
        s["n_servers"], s["n_dispatchers"], s["buffer"], s["levels"], s["iqueue_levels"]
    )


def test_chunks_are_capped_so_no_int32_chunk_sum_wraps():
    system = jq.System(10, 1, None, 12, 0)
    cap = max_chunk_blocks(system, jq.make("pod", d=2))
    per_block_delta = BLOCK * (BLOCK + 1) // 2
    assert cap * per_block_delta < 2**31 and cap * BLOCK * 6 < 2**31
    big = jq.System(10**6, 1, None, 12, 0)
    assert max_chunk_blocks(big, jq.make("pod", d=5000)) * BLOCK * (2 + 2 * 5000) < 2**31


# -- checkpoints -------------------------------------------------------------------

KW = dict(
    n_servers=20,
    n_dispatchers=4,
    replicas=3,
    steps=30 * BLOCK,
    warmup=4 * BLOCK,
    levels=12,
    iqueue_levels=12,
    seed=9,
    init="empty",
)


def _same(a, b):
    da, db = a.to_dict(), b.to_dict()
    da["settings"].pop("wall_seconds"), db["settings"].pop("wall_seconds")
    assert json.dumps(da, sort_keys=True) == json.dumps(db, sort_keys=True)


@pytest.mark.slow
def test_checkpoint_resume_finished_and_refused(tmp_path):
    path = str(tmp_path / "run.npz")
    whole = jq.simulate("jiq", 0.8, **KW)
    p = planner.plan("jiq", [0.8], **KW)
    part = runner.Run.start(p).advance(11)  # inside the window, between batch boundaries
    part.save(path)
    resumed = jq.simulate("jiq", 0.8, **KW, checkpoint=path)
    _same(whole, resumed)
    # a finished checkpoint gives the result again without running
    before = run_blocks._cache_size()
    again = jq.simulate("jiq", 0.8, **KW, checkpoint=path)
    _same(whole, again)
    assert run_blocks._cache_size() == before
    # other settings, or another version, are refused with what differs
    with pytest.raises(runner.CheckpointMismatch, match="seed: 9 there, 10 here"):
        jq.simulate("jiq", 0.8, **{**KW, "seed": 10}, checkpoint=path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(arrays["meta"].tobytes().decode())
    meta["fingerprint"]["jaxqueue"] = "0.0.1"
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(runner.CheckpointMismatch, match="jaxqueue: '0.0.1' there"):
        jq.simulate("jiq", 0.8, **KW, checkpoint=path)


_CHILD = """
import jax, sys
jax.config.update("jax_num_cpu_devices", 1)
import jaxqueue as jq
jq.simulate("pod", 0.9, 200, replicas=4, steps=4000 * 256, warmup=256, seed=2, levels=16,
            init="empty", checkpoint=sys.argv[1], checkpoint_every=0, progress=True)
"""


@pytest.mark.slow
def test_a_run_killed_part_way_resumes_bit_for_bit(tmp_path):
    """SIGKILL a run (one device) after its second checkpoint; resume it (two devices)."""
    path = str(tmp_path / "killed.npz")
    with subprocess.Popen(
        [sys.executable, "-c", _CHILD, path], stderr=subprocess.PIPE, text=True
    ) as child:
        saved = 0
        for line in child.stderr:
            saved += "checkpoint:" in line
            if saved == 2:
                child.send_signal(signal.SIGKILL)
                break
        child.stderr.close()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    p = planner.plan(
        "pod", [0.9], 200, replicas=4, steps=4000 * 256, warmup=256, seed=2, levels=16, init="empty"
    )
    run = runner.Run.resume(p, path)
    assert 0 < run.block < p.total_blocks and not run.done
    kw = dict(replicas=4, steps=4000 * 256, warmup=256, seed=2, levels=16, init="empty")
    resumed = jq.simulate("pod", 0.9, 200, **kw, checkpoint=path)
    whole = jq.simulate("pod", 0.9, 200, **kw)
    _same(whole, resumed)


@pytest.mark.slow
def test_cli_checkpoint_warmup_auto_and_heavy_traffic(tmp_path, capsys):
    path = str(tmp_path / "cli.npz")
    args = [
        "simulate",
        "--policy",
        "jsq",
        "--servers",
        "100",
        "--alpha",
        "0.5",
        "--buffer",
        "3",
        "--replicas",
        "2",
        "--steps",
        str(20 * BLOCK),
        "--warmup",
        "auto",
        "--checkpoint",
        path,
        "--json",
    ]
    assert cli_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["load"] == pytest.approx(0.9)
    diag = out["diagnostics"]
    assert diag["interval"] == "batch-means" and diag["batches"] == 20
    assert -1 <= diag["lag1_correlation"] <= 1
    assert diag["warmup_diagnostic"]["auto"] is True and os.path.exists(path)
    assert cli_main(args) == 0  # resumes the finished run: the same JSON
    again = json.loads(capsys.readouterr().out)
    again["settings"].pop("wall_seconds"), out["settings"].pop("wall_seconds")
    assert again == out


# -- batch means and warm-up -----------------------------------------------------------


@pytest.mark.slow
def test_batch_means_with_one_replica_cover_at_the_nominal_rate():
    """M/M/1 at lambda = 0.5 (L = 1, T = 2): 400 independent one-replica runs (one per
    load entry, so each has its own stream), each interval from 20 batch means of
    about 1700 time units. The count of intervals covering the exact value is
    Binomial(400, 0.95) if the intervals are right: 380 +- 4 x 4.36."""
    with pytest.warns(jq.WarmupWarning) as caught:  # the chance failures counted below
        results = jq.simulate("random", [0.5] * 400, 1, replicas=1, steps=200 * BLOCK, seed=11)
    assert all(r.diagnostics["interval"] == "batch-means" for r in results)
    assert results[0].mean_queue_length.n == 20
    lo, hi = 380 - 4 * 4.36, 380 + 4 * 4.36
    for metric, exact in (("mean_queue_length", 1.0), ("mean_response_time", 2.0)):
        covered = sum(
            abs(getattr(r, metric).mean - exact) <= getattr(r, metric).ci95 for r in results
        )
        assert lo <= covered <= hi, (metric, covered)
    # the warm-up diagnostic fails by chance on about 3% of stationary runs
    failed = sum(r.diagnostics["warmup_diagnostic"]["passed"] is False for r in results)
    assert failed <= 400 * 0.03 + 4 * math.sqrt(400 * 0.03 * 0.97)
    assert sum(w.category is jq.WarmupWarning for w in caught) == failed  # one per failed load


@pytest.mark.slow
def test_short_batches_are_flagged_and_widened():
    """M/M/1 at 0.95 (relaxation time about 800 time units) with batches of one
    block (170 time units): batch means are correlated, the lag-1 check widens."""
    res = jq.simulate("random", 0.95, 1, replicas=1, steps=20 * BLOCK, warmup=0, seed=3)
    diag = res.diagnostics
    assert diag["batches"] == 20 and diag["lag1_correlation"] > 2 / math.sqrt(20)
    assert diag["widened"] is True


@pytest.mark.slow
def test_warmup_diagnostic_catches_a_transient_and_auto_extends_it():
    """Pod(2), N = 100 at 0.95, started empty with no warm-up and a window of 105 time
    units: the queues fill during the first part of the window, and the diagnostic
    fails. The same plan with warmup_auto turns that window into warm-up and passes
    on the next one."""
    kw = dict(replicas=8, steps=80 * BLOCK, seed=5, init="empty", levels=16, warmup=0)
    with pytest.warns(jq.WarmupWarning, match="failed at load 0.95, N=100"):
        cold = jq.simulate("pod", 0.95, 100, **kw)
    diag = cold.diagnostics["warmup_diagnostic"]
    assert diag["passed"] is False and diag["batches"] == 20
    assert diag["mser_truncation"] == 10 and diag["half_drift"] > diag["half_drift_ci99"] > 0
    # warmup="auto" starts from the default warm-up; here from none, to see it extend
    p = dataclasses.replace(
        planner.plan("pod", [0.95], 100, **kw),
        warmup_auto=True,
        max_extensions=runner.MAX_EXTENSIONS,
    )
    auto = runner.run(p)[0]
    diag = auto.diagnostics["warmup_diagnostic"]
    assert diag["auto"] and diag["passed"] is True and diag["extensions"] == 1
    assert auto.settings["warmup"] == diag["warmup"] == 80 * BLOCK
    assert cold.mean_queue_length.mean < auto.mean_queue_length.mean


def test_mser_and_drift_on_known_series():
    rng = np.random.default_rng(0)
    flat = rng.normal(size=20)
    assert mser_truncation(flat) < 10
    trend = np.linspace(0.0, 1.0, 20) + 0.01 * rng.normal(size=20)
    assert mser_truncation(trend) == 10
    drift, ci = half_drift(trend)
    assert drift > ci > 0
    assert diagnose(trend)["passed"] is False and diagnose(flat)["passed"] is True
    assert diagnose([1.0, 2.0, 3.0, 4.0, 5.0])["passed"] is None


def test_default_start_is_the_mean_field_where_one_exists():
    assert planner.plan("pod", [0.9], 100, replicas=2, steps=BLOCK).init == "mean-field"
    assert (
        planner.plan("jiq-original", [0.9], 100, 10, replicas=2, steps=BLOCK).init == "mean-field"
    )
    assert (
        planner.plan("jiq-original", [0.9], 100, 10, buffer=4, replicas=2, steps=BLOCK).init
        == "empty"
    )  # its mean field is for infinite buffers
    assert (
        planner.plan("jiq-threshold", [0.9], 100, 10, replicas=2, steps=BLOCK).init == "mean-field"
    )
    assert (
        planner.plan("jiq-threshold", [0.9], 100, 10, buffer=4, replicas=2, steps=BLOCK).init
        == "empty"
    )
    assert planner.plan("pod", [0.9], 99, replicas=2, steps=BLOCK).init == "empty"
