"""Public API: closed-form special cases, bad input, result forms, command line.

Statistical comparisons use :func:`jaxqueue.tolerance`: a two-sided Student-t
tolerance for the replicas used, family-wise 0.001 over the stated family
(Bonferroni).
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.cli import main as cli_main
from jaxqueue.core.rng import BLOCK
from jaxqueue.exact import solve_exact
from jaxqueue.results.stats import within
from jaxqueue.runs import planner
from jaxqueue.sim.blocks import run_blocks

# Shapes reused across the tests of this file: levels=48 for the infinite-buffer runs.
MM1 = dict(replicas=32, steps=2**17, warmup=2**12, levels=48, seed=3)


@pytest.mark.slow
def test_single_server_is_mm1():
    lam = 0.5
    res = jq.simulate("random", lam, 1, 1, **MM1)
    t, wait = res.mean_response_time, res.waiting_probability
    p90 = res.response_quantiles[0.9]  # Exponential(1 - lam): p90 = log(10) / (1 - lam)
    family = 3
    assert within(t, 1 / (1 - lam), family)
    assert within(wait, lam, family)
    assert within(p90, np.log(10) / (1 - lam), family)


@pytest.mark.slow
def test_random_servers_are_independent_mm1_queues():
    lam = 0.5
    res = jq.simulate("random", lam, 8, 1, **MM1)
    i = np.arange(1, 7)
    tail = jq.Estimate(res.tail.mean[i], res.tail.ci95[i], res.tail.n)
    assert within(tail, lam**i, family=len(i))
    assert res.p0 is None and res.join_rate is None and res.probe_rate.mean == 0.0


@pytest.mark.slow
def test_result_forms():
    res = jq.simulate(
        "jiq-pod", 0.5, 8, 2, d=2, replicas=4, steps=4096, warmup=512, levels=48, iqueue_levels=8
    )
    d = res.to_dict()
    json.dumps(d)
    assert d["source"] == "simulation" and res.source == "simulation"
    assert set(d["mean_response_time"]) == {"mean", "ci95", "n"}
    assert set(d["response_quantiles"]) == {"0.5", "0.9", "0.99", "0.999"}
    assert len(d["tail"]["mean"]) == 49 and d["tail"]["mean"][0] == 1.0
    assert d["settings"]["policy"] == "jiq-pod" and d["settings"]["options"] == {"d": 2}
    diag = d["diagnostics"]
    assert d["stale_fraction"] is None and (diag["overflow"], diag["iq_overflow"]) == (0, 0)
    # 4 replicas: intervals from batch means (16 blocks: 16 batches), and a warm-up check
    assert (diag["interval"], diag["batches"], res.mean_response_time.n) == ("batch-means", 16, 64)
    assert -1 <= diag["lag1_correlation"] <= 1 and diag["warmup_diagnostic"]["batches"] == 16
    assert res.n_servers == 8 and res.overflow == 0  # settings and diagnostics as attributes
    assert res.replicas == 4
    rows = res.records()
    names = {r["metric"] for r in rows}
    assert {"mean_response_time", "p0", "tail", "iqueue_distribution", "response_quantile"} <= names
    assert all(r["load"] == 0.5 and r["source"] == "simulation" for r in rows)
    assert {r["k"] for r in rows if r["metric"] == "response_quantile"} == {
        0.5,
        0.9,
        0.99,
        0.999,
    }


@pytest.mark.slow
def test_sweep_returns_one_result_per_load():
    out = jq.simulate("pod", [0.3, 0.6], 8, 1, d=2, replicas=4, steps=4096, warmup=512, levels=48)
    assert [r.settings["load"] for r in out] == [0.3, 0.6]
    assert out[0].mean_response_time.mean < out[1].mean_response_time.mean


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(load=1.0), "load=1.0 is out of range"),
        (dict(load=0.0), "load=0.0 is out of range"),
        (dict(load=-0.5), "load=-0.5 is out of range"),
        (dict(policy="pod", d=0), "d=0 is out of range"),
        (dict(policy="pod", d=9), "d=9 is out of range"),
        (dict(n_dispatchers=0), "n_dispatchers=0 is out of range"),
        (dict(n_dispatchers=9), "n_dispatchers=9 is out of range"),
        (dict(n_servers=0), "n_servers=0 is out of range"),
        (dict(n_servers=2**31), "n_servers=2147483648 is out of range"),
        (dict(replicas=0), "replicas=0 is out of range"),
        (dict(steps=0), "steps=0 is out of range"),
        (dict(warmup=-1), "warmup=-1 is out of range"),
        (dict(levels=2, load=0.9), "levels=2 is too small"),
        (dict(policy="jsqq"), "unknown policy 'jsqq'; valid names: "),
        (dict(policy="jiq", d=2), "takes no option d"),
        (dict(policy="jiq-sq", n_dispatchers=2, d=3), "d=3 is out of range"),
        (dict(policy="idle-first", n_dispatchers=2), "n_dispatchers=2 is out of range"),
        (dict(buffer=0), "buffer=0 is out of range"),
        (dict(init="full"), "init='full' is not valid"),
        (dict(on_overflow="clip"), "on_overflow='clip' is not valid"),
        (dict(policy="pod", z=1), "takes no option z"),
        (dict(policy="jiq-threshold", z=-1), "z=-1 is out of range"),
        (dict(steps=None, time=0.0), "time=0.0 is out of range: need a finite number > 0"),
        (dict(steps=None, time=float("nan")), "time=nan is out of range"),
        (dict(steps=None, time=1e30), "steps per replica .12 a time unit., out of range"),
        (dict(time=10.0), "give steps or time, not both"),
        (dict(warmup_time=-1.0), "warmup_time=-1.0 is out of range: need a finite number >= 0"),
        (dict(warmup=512, warmup_time=1.0), "give warmup or warmup_time, not both"),
        (dict(warmup="auto", warmup_time=1.0), "warmup='auto' starts from the default"),
        (dict(seed=-1), "seed=-1 is out of range: need 0 <= seed <= 9223372036854775807"),
        (dict(seed=2**63), "seed=9223372036854775808 is out of range"),
    ],
)
def test_bad_input_is_rejected_before_compiling(kwargs, match):
    base = dict(policy="random", load=0.5, n_servers=8, n_dispatchers=1, replicas=2, steps=1000)
    base.update(kwargs)
    policy = base.pop("policy")
    compiled = run_blocks._cache_size()
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        jq.simulate(policy, **base)
    assert run_blocks._cache_size() == compiled  # nothing compiled


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(load="0.5"), "load must be a real number, got '0.5'"),
        (dict(load=True), "load must be a real number, got True"),
        (dict(seed=1.0), "seed must be an int, got 1.0"),
        (dict(replicas=np.float64(2)), "replicas must be an int"),
    ],
)
def test_wrong_types_are_rejected_before_compiling(kwargs, match):
    base = dict(policy="random", load=0.5, n_servers=8, replicas=2, steps=1000)
    base.update(kwargs)
    compiled = run_blocks._cache_size()
    with pytest.raises(TypeError, match=match):
        jq.simulate(base.pop("policy"), **base)
    assert run_blocks._cache_size() == compiled


def test_numpy_integers_are_counts_and_land_in_the_settings_as_ints():
    """Counts taken out of NumPy arrays work as Python ints do, down to the JSON settings."""
    i = np.int64
    p = planner.plan(
        "pod",
        [np.float32(0.5)],
        i(100),
        i(2),
        d=i(3),
        buffer=i(8),
        replicas=i(2),
        steps=i(1000),
        warmup=i(0),
        seed=i(7),
        iqueue_levels=None,
    )
    assert p == planner.plan(
        "pod", [0.5], 100, 2, d=3, buffer=8, replicas=2, steps=1000, warmup=0, seed=7
    )
    for value in (
        p.system.n_servers,
        p.system.n_dispatchers,
        p.system.buffer,
        p.replicas,
        p.seed,
        p.policy.d,
    ):
        assert type(value) is int
    json.dumps(p.fingerprint())
    mf = jq.theory.mean_field("pod", 0.5, d=i(3), buffer=i(8))
    assert type(mf.settings["buffer"]) is int and type(mf.options["d"]) is int
    json.dumps(mf.to_dict())


def test_time_units_set_the_run_length_at_the_largest_load():
    """``time``/``warmup_time``: ``ceil(units * N * (lambda_max + 1))`` steps,
    rounded up to whole blocks of 256 (nothing compiles)."""
    p = planner.plan("pod", [0.5, 0.9], 100, replicas=2, time=20, warmup_time=5)
    assert p.measure_blocks == math.ceil(math.ceil(20 * 100 * 1.9) / BLOCK)
    assert p.warmup_blocks == math.ceil(math.ceil(5 * 100 * 1.9) / BLOCK)
    zero = planner.plan("pod", [0.5], 100, replicas=2, time=20, warmup_time=0)
    assert zero.warmup_blocks == 0
    # with neither, the defaults: 10^6 steps and 100 time units of warm-up
    p = planner.plan("pod", [0.5], 100, replicas=2)
    assert p.measure_blocks == math.ceil(planner.DEFAULT_STEPS / BLOCK)
    assert p.warmup_blocks == math.ceil(math.ceil(100 * 100 * 1.5) / BLOCK)


@pytest.mark.slow
def test_cli_time_units_and_the_window_they_give(capsys):
    """The same compiled shape as test_cli_json_stands_alone_on_stdout."""
    assert (
        cli_main(
            [
                "simulate",
                "--policy",
                "pod",
                "--servers",
                "8",
                "--load",
                "0.5",
                "--replicas",
                "4",
                "--time",
                "200",
                "--warmup-time",
                "20",
                "--levels",
                "48",
                "--json",
            ]
        )
        == 0
    )
    s = json.loads(capsys.readouterr().out)["settings"]
    assert s["steps"] == 2560 and s["warmup"] == 256  # 2400 and 240 steps, in whole blocks
    assert s["time_measured"] == pytest.approx(2560 / 12)  # 8 servers x (0.5 + 1) a time unit
    assert s["time_warmup"] == pytest.approx(256 / 12)
    with pytest.raises(SystemExit):
        cli_main(
            [
                "simulate",
                "--policy",
                "pod",
                "--servers",
                "8",
                "--load",
                "0.5",
                "--time",
                "200",
                "--steps",
                "1000",
            ]
        )
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.slow
def test_finite_buffer_allows_overload():
    lam, b = 1.5, 2
    res = jq.simulate(
        "jsq", lam, 8, 1, buffer=b, replicas=8, steps=2**14, warmup=1024, interval="replicas"
    )
    assert res.settings["levels"] == b
    ex = solve_exact("jsq", lam, 8, 1, buffer=b)
    assert ex.blocking_probability > 0.2
    family = 3
    assert within(res.blocking_probability, ex.blocking_probability, family)
    assert within(res.mean_queue_length, ex.mean_queue_length, family)
    # Liu and Ying's p_W counts the blocked arrivals among those sent to a busy server
    assert ex.busy_routing_probability > ex.waiting_probability > 0
    assert within(res.busy_routing_probability, ex.busy_routing_probability, family)


@pytest.mark.slow
def test_cli_json_stands_alone_on_stdout(capsys):
    code = cli_main(
        [
            "simulate",
            "--policy",
            "pod",
            "--d",
            "2",
            "--servers",
            "8",
            "--dispatchers",
            "1",
            "--load",
            "0.5",
            "--replicas",
            "4",
            "--steps",
            "4096",
            "--warmup",
            "512",
            "--levels",
            "48",
            "--json",
            "--progress",
        ]
    )
    out = capsys.readouterr()
    assert code == 0
    data = json.loads(out.out)
    assert set(data["mean_response_time"]) == {"mean", "ci95", "n"}
    assert isinstance(data["tail"]["mean"], list) and isinstance(data["tail"]["ci95"], list)
    assert data["waiting_probability"]["mean"] > 0
    assert data["settings"]["versions"]["jaxqueue"] == jq.__version__
    assert "[jaxqueue]" in out.err


def test_cli_theory_json_uses_the_simulator_field_names(capsys):
    assert cli_main(["theory", "--policy", "jiq", "--load", "0.98", "--ratio", "10", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert abs(data["mean_response_time"]["mean"] - 1 / (1 - 0.98 * data["p0"]["mean"])) < 1e-9
    assert data["source"] == "mean-field" and data["mean_response_time"]["ci95"] is None
    sim_fields = {"mean_response_time", "waiting_probability", "tail", "p0", "join_rate"}
    assert sim_fields <= set(data)


@pytest.mark.slow  # a 400-level tail compiled for the table's last line
def test_cli_theory_table_prints_twenty_tail_levels_and_says_how_many_more(capsys):
    """JIQ at load 0.98, r = 10: s_k = 0.98 (0.98 p0)^(k - 1) stays above 1e-6
    for about 70 levels; the table shows 20 and names the rest, to the first
    level at or below 1e-6."""
    assert cli_main(["theory", "--policy", "jiq", "--load", "0.98", "--ratio", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    levels = [ln.split()[0] for ln in lines if ln.strip().startswith("s_")]
    assert levels[:20] == [f"s_{k}" for k in range(1, 21)]
    tail = np.asarray(theory.tail("jiq", 0.98, 10.0, levels=400))
    last = int(np.nonzero(tail > 1e-6)[0][-1]) + 1  # the first at or below 1e-6
    assert last > 21
    assert lines[-1].split()[:3] == ["s_21", "..", f"s_{last}"] and "--json" in lines[-1]


@pytest.mark.slow
def test_cli_simulate_theory_and_exact_print_the_same_keys(capsys):
    common = ["--policy", "jiq-pod", "--d", "2", "--load", "0.5", "--json"]
    size = ["--servers", "3", "--dispatchers", "2"]
    run = [
        "--replicas",
        "2",
        "--steps",
        "1024",
        "--warmup",
        "256",
        "--levels",
        "48",
        "--iqueue-levels",
        "3",
    ]
    outs = {}
    for cmd, extra in (("simulate", size + run), ("theory", ["--ratio", "1.5"]), ("exact", size)):
        assert cli_main([cmd] + common + extra) == 0
        outs[cmd] = json.loads(capsys.readouterr().out)
    keys = {cmd: set(data) for cmd, data in outs.items()}
    assert keys["simulate"] == keys["theory"] == keys["exact"]
    assert {
        "mean_response_time",
        "waiting_probability",
        "blocking_probability",
        "tail",
        "p0",
        "source",
        "settings",
        "diagnostics",
        "response_quantiles",
    } <= keys["exact"]
    assert [outs[c]["source"] for c in ("simulate", "theory", "exact")] == [
        "simulation",
        "mean-field",
        "exact",
    ]
    for cmd in outs:  # the quantile form is the same everywhere
        assert set(outs[cmd]["response_quantiles"]) == {"0.5", "0.9", "0.99", "0.999"}
        assert set(outs[cmd]["mean_response_time"]) == {"mean", "ci95", "n"}
        assert outs[cmd]["pool_utilization"] is None and outs[cmd]["pool_occupancy"] is None
        assert outs[cmd]["pool_response_quantiles"] is None
    # an exact JIQ-Pod with M = 2: p0 present; none for Pod
    assert outs["exact"]["p0"]["mean"] > 0
    assert cli_main(["exact", "--policy", "pod", "--servers", "3", "--load", "0.5", "--json"]) == 0
    pod = json.loads(capsys.readouterr().out)
    assert pod["p0"] is None and pod["settings"]["options"] == {"d": 2}


def test_cli_exact_text_and_bad_option(capsys):
    assert cli_main(["exact", "--policy", "jsq", "--servers", "2", "--load", "0.5"]) == 0
    assert "mean_response_time" in capsys.readouterr().out
    assert (
        cli_main(["exact", "--policy", "jsq", "--d", "2", "--servers", "2", "--load", "0.5"]) == 2
    )
    assert "takes no option d" in capsys.readouterr().err


def test_cli_bad_input_is_a_clear_error(capsys):
    code = cli_main(["simulate", "--policy", "nope", "--servers", "8", "--load", "0.5"])
    assert code == 2
    assert "valid names" in capsys.readouterr().err


@pytest.mark.slow
def test_module_entry_point_lists_policies():
    out = subprocess.run(
        [sys.executable, "-m", "jaxqueue", "policies"], capture_output=True, text=True, check=True
    )
    lines = out.stdout.splitlines()[1:]  # (after the header line)
    assert [line.split()[0] for line in lines] == list(jq.available())
    assert lines[jq.available().index("pod")].split()[1:3] == ["d=2", "closed-form"]


def test_policies_json_gives_options_and_mean_fields(capsys):
    assert cli_main(["policies", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["policies"]}
    assert set(rows) == set(jq.available())
    assert rows["jiq-threshold"]["options"] == {"z": 1}
    assert rows["jiq-original"]["mean_field"] == "tagged-server"
    assert rows["jiq"]["summary"].startswith("Distributed JIQ")


def test_compare_checks_every_policy_and_its_options_before_running(monkeypatch, capsys):
    """An unknown name late in the list, a shared option no listed policy takes, a
    ratio that does not divide N, a malformed own option: errors before any run."""
    from jaxqueue.studies import compare as compare_module

    def no_run(*args, **kwargs):
        raise AssertionError("validation must come before any run")

    monkeypatch.setattr(compare_module, "simulate", no_run)
    cases = [
        (["--policies", "jiq,pod,foo"], "unknown policy 'foo'"),
        (["--policies", "jiq,jsq", "--d", "3"], "d=3 applies to the policies"),
        (["--servers", "105"], "ratio=10 does not split n_servers=105"),
        (["--policies", "jiq-pod:d"], "is not NAME:OPTION=VALUE"),
        (["--policies", "jiq-pod:d=x"], "d must be an integer"),
        (["--policies", "jiq:d=3"], "takes no option d"),
    ]
    for argv, message in cases:
        assert cli_main(["compare", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv


def test_compare_gives_a_policy_its_own_options(monkeypatch):
    """NAME:OPTION=VALUE makes that policy; shared --d and --z reach only the plain names."""
    from jaxqueue.studies import compare as compare_module

    seen = []
    monkeypatch.setattr(
        compare_module, "simulate", lambda model, *a, **k: seen.append(model.policy.label()) or []
    )
    monkeypatch.setattr(compare_module, "mean_field", lambda *a, **k: None)
    assert (
        cli_main(
            [
                "compare",
                "--policies",
                "jiq-original,jiq-pod:d=3,pod,jiq-threshold:z=2",
                "--d",
                "4",
                "--loads",
                "0.5",
            ]
        )
        == 0
    )
    assert seen == ["jiq-original(d=4)", "jiq-pod(d=3)", "pod(d=4)", "jiq-threshold(z=2)"]


def test_heavy_traffic_scalings():
    assert jq.heavy_traffic_load(10_000, 0.5) == pytest.approx(0.99)
    assert jq.halfin_whitt_load(10_000, 2.0) == pytest.approx(0.98)
    with pytest.raises(ValueError, match="alpha=1.5 is out of range"):
        jq.heavy_traffic_load(100, 1.5)
    with pytest.raises(ValueError, match="beta=20.0 is out of range"):
        jq.halfin_whitt_load(100, 20.0)


@pytest.mark.slow
def test_cli_per_server_policies(capsys):
    args = [
        "simulate",
        "--servers",
        "6",
        "--dispatchers",
        "2",
        "--load",
        "0.5",
        "--replicas",
        "2",
        "--steps",
        "2048",
        "--warmup",
        "256",
        "--levels",
        "48",
        "--json",
    ]
    assert cli_main(args[:1] + ["--policy", "jiq-threshold", "--z", "2"] + args[1:]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["options"] == {"z": 2} and data["stale_fraction"] is None
    assert cli_main(args[:1] + ["--policy", "jiq-original"] + args[1:]) == 0
    data = json.loads(capsys.readouterr().out)
    assert 0 <= data["stale_fraction"]["mean"] < 1 and data["delete_rate"]["mean"] == 0.0


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(extra)
    return env


@pytest.mark.slow
def test_cli_and_import_use_one_device_per_core_unless_told_otherwise():
    cmd = [
        sys.executable,
        "-m",
        "jaxqueue",
        "simulate",
        "--policy",
        "pod",
        "--servers",
        "10",
        "--load",
        "0.5",
        "--replicas",
        "2",
        "--steps",
        "512",
        "--json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), check=True)
    assert json.loads(out.stdout)["settings"]["devices"] == os.cpu_count()
    probe = [sys.executable, "-c", "import jaxqueue, jax; print(len(jax.devices()))"]
    out = subprocess.run(probe, capture_output=True, text=True, env=_clean_env(), check=True)
    assert int(out.stdout) == os.cpu_count()
    own = _clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=1")
    out = subprocess.run(probe, capture_output=True, text=True, env=own, check=True)
    assert int(out.stdout) == 1  # a user's own flag is kept


def test_result_metric_by_name():
    """One number by name, the quantiles as p50..p99.9; a bad name says what is valid."""
    from jaxqueue import theory
    from jaxqueue.results.schema import QUANTILE_NAMES

    mf = theory.mean_field("jiq", 0.9, 10)
    assert QUANTILE_NAMES == ("p50", "p90", "p99", "p99.9")
    assert mf.metric("p99") == mf.response_quantiles[0.99]
    assert mf.metric("p99.9") == mf.response_quantiles[0.999]
    assert mf.metric("mean_response_time") == mf.mean_response_time
    assert theory.mean_field("pod", 0.9).metric("p0") is None
    assert mf.metric("pool_utilization") is None  # a pool metric, without pools
    pooled = theory.mean_field("random", 0.5, pools="0.5:2,0.5:1")
    np.testing.assert_allclose(pooled.metric("pool_utilization"), [0.25, 0.5], rtol=1e-9)
    # each pool is M/M/1 under Random: Exp(v - lambda)
    np.testing.assert_allclose(
        pooled.metric("pool_p99"), math.log(100) / np.array([1.5, 0.5]), rtol=1e-9
    )
    assert mf.metric("pool_p99.9") is None
    with pytest.raises(ValueError, match="p99.9"):
        mf.metric("p95")


@pytest.mark.slow
def test_cli_compare_by_pool(capsys):
    """A pool metric puts a row per pool beside the mean field by pool."""
    # --time 45.7: 1024 steps at N = 8, load 0.8, four whole blocks (no WindowWarning)
    args = [
        "compare",
        "--policies",
        "pod",
        "--servers",
        "8",
        "--ratio",
        "8",
        "--loads",
        "0.5,0.8",
        "--time",
        "45.7",
        "--warmup-time",
        "5",
        "--replicas",
        "4",
        "--pools",
        "0.5:2,0.5:1",
        "--metric",
        "pool_arrival_share",
    ]
    assert cli_main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("pool arrival share, simulation (95% CI) vs mean field")
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[1], r[3]) for r in rows] == [
        ("pod(d=2)", "0.500", "2"),
        ("pod(d=2)", "0.500", "1"),
        ("pod(d=2)", "0.800", "2"),
        ("pod(d=2)", "0.800", "1"),
    ]
    for fast, slow in (rows[:2], rows[2:]):  # the shares of one run add up to 1
        for col in (4, 7):  # shares printed to their intervals' precision: sum to 1 within it
            places = max(len(row[col].partition(".")[2]) for row in (fast, slow))
            assert float(fast[col]) + float(slow[col]) == pytest.approx(1.0, abs=10.0**-places)
        assert float(fast[4]) > 0.5  # Pod(2) sends the fast servers more than half
    # each pool's quantiles, the same way
    assert cli_main(args[:-1] + ["pool_p99"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("pool p99, simulation (95% CI) vs mean field") and len(lines) == 6
    slow, fast = (float(line.split()[4]) for line in (lines[3], lines[2]))
    assert fast < slow  # the fast pool's tail is shorter
    # without pools there is no pool to show: refused before anything runs
    assert cli_main(["compare", "--metric", "pool_utilization"]) == 2
    assert "give --pools" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_compare_with_a_service_law_and_a_quantile(capsys):
    """compare passes the service law to both the simulation and the mean
    field, and its table shows the metric asked for."""
    # --time 45.7: 1024 steps at N = 8, load 0.8, four whole blocks (no WindowWarning)
    args = [
        "compare",
        "--policies",
        "pod,jsew",
        "--servers",
        "8",
        "--ratio",
        "8",
        "--loads",
        "0.5,0.8",
        "--time",
        "45.7",
        "--warmup-time",
        "5",
        "--replicas",
        "4",
        "--service",
        "erlang:2",
    ]
    assert cli_main(args + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["policy"], r["load"]) for r in rows] == [
        ("pod", 0.5),
        ("pod", 0.8),
        ("jsew", 0.5),
        ("jsew", 0.8),
    ]
    for r in rows:
        assert r["simulation"]["settings"]["service"]["label"] == "erlang:2"
        assert set(r["simulation"]["response_quantiles"]) == {"0.5", "0.9", "0.99", "0.999"}
        # with a phase-type law jsew is JSQ by expected wait, whose mean field is JSQ's
        assert r["mean_field"]["settings"]["service"]["label"] == "erlang:2"
    assert cli_main(args + ["--metric", "p99"]) == 0
    out = capsys.readouterr().out
    assert "service erlang:2: p99, simulation (95% CI) vs mean field" in out
    # the table rounds each mean to its interval's precision: equal to that rounding
    for line, r in zip(out.splitlines()[2:], rows):
        text = line.split()[2]
        places = len(text.partition(".")[2])
        mean = r["simulation"]["response_quantiles"]["0.99"]["mean"]
        assert abs(float(text) - mean) <= 0.5 * 10.0**-places + 1e-12


def test_cli_simulate_takes_a_halfin_whitt_beta(monkeypatch, capsys):
    """--beta B runs at lambda = 1 - B / sqrt(N), as --alpha at 1 - N^-alpha."""

    def stub(policy, load, *args, **kwargs):
        raise ValueError(f"stub load={load!r}")

    monkeypatch.setattr("jaxqueue.api.simulate", stub)
    for flag, value, load in (("--beta", "2", 0.98), ("--alpha", "0.5", 0.99)):
        assert cli_main(["simulate", "--policy", "jsq", "--servers", "10000", flag, value]) == 2
        assert f"stub load={load!r}" in capsys.readouterr().err


def test_cli_stops_quietly_when_its_reader_goes_away(monkeypatch, capsys, tmp_path):
    """`... | head`: a write to a closed pipe ends the command with status 1 and
    no traceback (stdout is then pointed at os.devnull, so exit flushes nothing)."""
    with open(tmp_path / "out", "w") as sink:

        class ClosedPipe:
            def write(self, text):
                raise BrokenPipeError(32, "Broken pipe")

            def flush(self):
                pass

            def fileno(self):
                return sink.fileno()

        monkeypatch.setattr(sys, "stdout", ClosedPipe())
        assert cli_main(["policies"]) == 1
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_start_given_as_an_occupancy_is_recorded_as_such():
    res = jq.simulate("random", 0.5, 2, init=[0.5, 0.5], replicas=2, steps=2048, warmup=256)
    assert res.settings["init"] == "array"
    assert (
        jq.simulate("random", 0.5, 2, init="empty", replicas=2, steps=2048, warmup=256).settings[
            "init"
        ]
        == "empty"
    )
