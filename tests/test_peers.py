"""benchmarks/peers.py (the extra ``peers``: Ciw, SimPy, numba) at its smallest
size: every peer runs, counts its events and reports a finite T; the
structures its pure-Python models share keep their invariants. Skipped
without the extra."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ciw")
pytest.importorskip("simpy")
pytest.importorskip("numba")

pytestmark = pytest.mark.slow  # (about 20 s: the benchmark at its smallest)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "peers.py"


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("peers_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_quick_dry_run_every_peer():
    """The whole benchmark, --quick, on its JIQ system (N = 100, M = 10: the
    most involved model of each peer), as one JSON object on stdout."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--systems", "jiq-100"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    rows = {r["peer"]: r for r in res["rows"]}
    assert set(rows) == {"ciw", "simpy", "numba", "jaxqueue"}
    for peer, r in rows.items():
        assert r["system"] == "jiq-100" and r["label"] == "JIQ N=100 M=10"
        # tiny runs: T only within broad limits (the mean field says 1.77)
        assert 1.0 < r["mean"] < 4.0, (peer, r["mean"])
        assert math.isfinite(r["ci95"]) and r["ci95"] > 0, (peer, r["ci95"])
        assert r["events"] > 0 and r["wall_s"] > 0 and r["events_per_s"] > 0, peer
        assert r["x_jaxqueue"] > 0, peer
    # arrivals plus departures of 10 replicas x (5 + 2) time units at rate 90:
    # about 10 x 2 x 90 x 7 = 12600, give or take the Poisson noise and the drain
    for peer in ("ciw", "simpy"):
        assert 10000 < rows[peer]["events"] < 16000, (peer, rows[peer]["events"])
        assert rows[peer]["interval"] == "replicas" and rows[peer]["n"] == 10
        assert rows[peer]["left_in_system"] == 0, peer  # drained
    assert rows["numba"]["overflow_replicas"] == 0
    assert rows["numba"]["compile_s"] > 0
    jq = rows["jaxqueue"]
    assert jq["x_jaxqueue"] == 1.0
    # events = replicas x 2 lambda N x simulated time
    simulated = jq["measured_simulated"] + jq["warmup_simulated"]
    assert jq["events"] == pytest.approx(jq["replicas"] * 2 * 0.9 * 100 * simulated)
    assert jq["overflow"] == 0 and jq["iq_overflow"] == 0
    (ref,) = res["references"]
    assert ref["mean_field_T"] == pytest.approx(1.7654, abs=1e-3)
    assert ref["refined_T"] is None  # --quick leaves the refined mean field out
    assert isinstance(res["disagreements"], list)


def test_levels_keep_servers_sorted(peers):
    """Levels' order is sorted by queue length, start[k] counts the servers
    shorter than k, and shortest() picks among the shortest only."""
    rng = random.Random(3)
    n = 7
    lv = peers.Levels(n)
    for _ in range(3000):
        j = rng.randrange(n)
        if lv.q[j] > 0 and rng.random() < 0.45:
            lv.dec(j)
        else:
            lv.inc(j)
        lengths = [lv.q[i] for i in lv.order]
        assert lengths == sorted(lengths)
        assert all(lv.order[lv.where[i]] == i for i in range(n))
        for k in range(max(lv.q) + 2):
            assert lv.start[k] == sum(q < k for q in lv.q)
        assert lv.q[lv.shortest(rng)] == min(lv.q)


def test_iqueues_hold_each_server_once(peers):
    rng = random.Random(5)
    iq = peers.IQueues(3, 10)
    listed = set()
    for _ in range(2000):
        j = rng.randrange(10)
        if j in listed:
            iq.remove(j)
            listed.discard(j)
        else:
            iq.add(j, rng.randrange(3))
            listed.add(j)
        members = [x for lst in iq.lists for x in lst]
        assert sorted(members) == sorted(listed)
        for k, lst in enumerate(iq.lists):
            for p, x in enumerate(lst):
                assert iq.of[x] == k and iq.pos[x] == p


def test_student_t_and_intervals(peers):
    assert peers.t975(1) == 12.706
    assert peers.t975(30) == 2.042
    assert peers.t975(40) == pytest.approx(2.0211, abs=1e-4)
    assert peers.t975(120) == pytest.approx(1.9799, abs=1e-4)
    # ten replicas: across replicas
    est = peers.interval([[float(i), 0.0] for i in range(10)], [[1, 0]] * 10)
    assert est["interval"] == "replicas" and est["n"] == 10 and est["mean"] == 4.5
    assert est["ci95"] == pytest.approx(2.262 * math.sqrt(55 / 6 / 10))
    # two replicas of independent batches: their batch means as one sample
    rng = random.Random(11)
    sums = [[rng.gauss(3.0, 1.0) for _ in range(16)] for _ in range(2)]
    est = peers.interval(sums, [[1] * 16] * 2)
    assert est["interval"] == "batch-means" and est["batches"] == 16 and est["n"] == 32
    assert est["mean"] == pytest.approx(sum(map(sum, sums)) / 32)
    # a slow drift within each replica: batches merged in pairs, a wider interval
    drift = [[math.sin(i / 5.0) + 0.01 * rng.gauss(0, 1) for i in range(16)] for _ in range(2)]
    est = peers.interval(drift, [[1] * 16] * 2)
    assert est["batches"] < 16 and est["n"] == 2 * est["batches"]
    assert est["mean"] == pytest.approx(sum(map(sum, drift)) / 32)


@pytest.mark.parametrize("policy", ["pod", "jsq", "jiq"])
def test_simpy_and_ciw_replicas_in_process(peers, policy):
    """One tiny replica of each pool peer per policy, in this process: events
    counted, every task drained, T in the window."""
    s = peers.System(f"{policy}-10", policy, 10, m=2 if policy == "jiq" else 1)
    cdf = [0.2, 0.5, 0.8, 1.0]
    for fn in (peers._simpy_replica, peers._ciw_replica):
        out = fn({"system": s, "warm": 5.0, "end": 25.0, "seed": 2, "cdf": cdf})
        assert out["left"] == 0
        assert 250 < out["events"] < 600  # about 2 x 9 x 25 = 450
        t = sum(out["sums"]) / sum(out["counts"])
        assert 1.0 < t < 8.0, (fn.__name__, t)
