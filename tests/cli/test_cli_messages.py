"""Small command-line and message fixes: each checked without running a simulation.

Errors, warnings and advice name the parameter and state the range that is
actually valid; the tables print what the numbers are (a small interval is
not 0, an undefined ratio is ``n/a``); ``-`` is stdout; Ctrl-C is one line.
"""

import csv
import io
import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue import cli, theory
from jaxqueue.cli import main as cli_main
from jaxqueue.core.arrivals import Trace
from jaxqueue.results.estimates import Estimate
from jaxqueue.runs import planner
from jaxqueue.sim import runner
from jaxqueue.studies.compare import Comparison
from jaxqueue.studies.grids.store import COLUMNS, Store


@pytest.fixture
def no_compile(monkeypatch):
    """Every error below comes before anything steps (or compiles) a replica."""

    def no_run(*args, **kwargs):
        raise AssertionError("validation must come before any compilation")

    monkeypatch.setattr(runner, "run_blocks", no_run)


def test_one_batch_names_batches_and_its_range(no_compile, capsys):
    with pytest.raises(
        ValueError,
        match=r"batches=1 is out of range for one replica: .*"
        r"need 2 <= batches <= 10000",
    ):
        planner.plan("jsq", [0.5], 1, replicas=1, steps=100 * 256, batches=1)
    # a one-block window still blames the steps
    with pytest.raises(ValueError, match=r"steps=256 is one block"):
        planner.plan("jsq", [0.5], 1, replicas=1, steps=256)
    assert (
        cli_main(
            [
                "simulate",
                "--policy",
                "jsq",
                "--servers",
                "1",
                "--load",
                "0.5",
                "--replicas",
                "1",
                "--steps",
                "25600",
                "--batches",
                "1",
            ]
        )
        == 2
    )
    assert "batches=1 is out of range" in capsys.readouterr().err


def test_batch_means_asked_for_by_name_is_not_swapped_for_replica_intervals(no_compile, capsys):
    with pytest.raises(
        ValueError,
        match=r"interval='batch-means' needs at least 2 batches, "
        r"and batches=1: pass 2 <= batches <= 10000",
    ):
        planner.plan(
            "jsq", [0.5], 1, replicas=4, steps=100 * 256, batches=1, interval="batch-means"
        )
    with pytest.raises(ValueError, match=r"and steps=256 is one block of 256 steps"):
        planner.plan("jsq", [0.5], 1, replicas=4, steps=256, interval="batch-means")
    # interval='auto' with 4 replicas picks batch means, and replica intervals without batches
    assert (
        planner.plan("jsq", [0.5], 1, replicas=4, steps=100 * 256, batches=1).interval == "replicas"
    )
    assert planner.plan("jsq", [0.5], 1, replicas=4, steps=100 * 256).interval == "batch-means"
    assert (
        cli_main(
            [
                "simulate",
                "--policy",
                "jsq",
                "--servers",
                "1",
                "--load",
                "0.5",
                "--replicas",
                "4",
                "--steps",
                "25600",
                "--batches",
                "1",
                "--interval",
                "batch-means",
            ]
        )
        == 2
    )
    assert "interval='batch-means' needs at least 2 batches" in capsys.readouterr().err


def test_time_rounded_up_to_whole_blocks_warns_with_the_time_simulated(no_compile):
    # N = 1 at 0.5: 1.5 steps a time unit, so time=5 is 8 steps, run as one block of 256
    with pytest.warns(
        planner.WindowWarning,
        match=r"time=5 is 8 steps per replica at N=1 and "
        r"load 0.5.* 256 steps, 170.7 time units",
    ):
        p = planner.plan("jsq", [0.5], 1, replicas=2, time=5)
    assert p.measure_blocks == 1
    with warnings.catch_warnings():  # within WINDOW_TOLERANCE (10%): no warning
        warnings.simplefilter("error")
        planner.plan("jsq", [0.5], 1, replicas=2, time=170)  # 0.4% over
        planner.plan("jsq", [0.5], 1, replicas=2, time=160)  # 240 steps, run as 256: 6.7% over
        planner.plan("jsq", [0.5], 1, replicas=2, steps=300)  # steps as asked: never warned


def test_trace_service_column_is_documented_as_not_simulated(capsys):
    with pytest.raises(SystemExit):
        cli_main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a service column is not simulated" in text


def test_trace_server_bound_states_the_valid_range(no_compile):
    trace = Trace(np.arange(10.0))
    top = 2**23 - 1
    with pytest.raises(
        ValueError,
        match=rf"n_servers={2**23} is out of range, need 1 <= "
        rf"n_servers <= {top}",
    ):
        planner.plan("jsq", [0.5], 2**23, arrivals=trace, replicas=2, steps=256)
    from jaxqueue.core.system import System
    from jaxqueue.sim.source import check_source

    check_source(System(top, levels=1, arrivals=trace), [0.5])  # the largest N is taken


def _store(path) -> None:
    row = {c: None for c in COLUMNS}
    row.update(
        point_id="p0",
        policy="pod",
        servers=10,
        metric="mean_response_time",
        idx=None,
        mean=1.25,
        ci95=0.01,
    )
    with Store(path, "h", "tiny", {"jaxqueue": "test"}) as store:
        store.commit_batch(0, [("p0", {}, 0.0)], [row])


def test_export_csv_dash_is_stdout(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _store(tmp_path / "s.sqlite")
    assert cli_main(["export", "s.sqlite", "--csv", "-"]) == 0
    out = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(out.out)))
    assert [(r["point_id"], float(r["mean"])) for r in rows] == [("p0", 1.25)]
    assert "wrote 1 rows to stdout" in out.err and not (tmp_path / "-").exists()
    assert cli_main(["export", "s.sqlite", "--parquet", "-"]) == 2
    assert "only --csv writes to stdout" in capsys.readouterr().err


def test_checkpoint_mismatch_prints_loads_as_decimals(tmp_path, no_compile):
    theirs = planner.plan("jsq", [0.1, 0.7], 1, replicas=2, steps=512)
    ours = planner.plan("jsq", [0.1, 0.75], 1, replicas=2, steps=512)
    path = tmp_path / "run.npz"
    meta = json.dumps({"fingerprint": theirs.fingerprint()}).encode()
    np.savez(path, meta=np.frombuffer(meta, np.uint8))
    with pytest.raises(runner.CheckpointMismatch) as err:
        runner.Run.resume(ours, str(path))
    assert "loads: [0.1, 0.7] there, [0.1, 0.75] here" in str(err.value)
    assert "0x" not in str(err.value)


def test_overflow_advice_stays_within_the_valid_bounds(no_compile):
    p = planner.plan("jiq", [0.1], 20, 4, iqueue_levels=12, replicas=2, steps=256)
    advice = runner._overflow_advice(np.array([0, 2]), p)
    assert (
        "iqueue_levels=12; rerun with a larger iqueue_levels= (e.g. 20, at most "
        "n_servers=20)" in advice
    )  # 2 x 12 = 24 would be refused
    p = planner.plan("jiq", [0.1], 40, 4, iqueue_levels=12, replicas=2, steps=256)
    assert "(e.g. 24, at most n_servers=40)" in runner._overflow_advice(np.array([0, 2]), p)
    levels = p.system.levels
    assert f"(e.g. {2 * levels})" in runner._overflow_advice(np.array([1, 0]), p)


@pytest.mark.parametrize(
    "policy, n, m, bad, valid",
    [
        ("pod", 8, 1, (0, 9), r"it probes servers, need 1 <= d <= n_servers \(8\)"),
        ("jiq-pod", 8, 2, (0, 9), r"it probes servers, need 1 <= d <= n_servers \(8\)"),
        ("idle-first", 8, 1, (0, 9), r"it probes servers, need 1 <= d <= n_servers \(8\)"),
        ("jiq-sq", 8, 4, (0, 5), r"it probes dispatchers, need 1 <= d <= n_dispatchers \(4\)"),
        (
            "pod",
            200,
            1,
            (0, 201),
            r"it probes servers, need 1 <= d <= n_servers \(200\)",
        ),
        (
            "idle-first",
            200,
            1,
            (0, 201),
            r"it probes servers, need 1 <= d <= n_servers \(200\)",
        ),
        (
            "jiq-sq",
            200,
            100,
            (0, 101),
            r"it probes dispatchers, need 1 <= d <= n_dispatchers \(100\)",
        ),
    ],
)
def test_d_out_of_range_states_one_form_of_the_valid_range(policy, n, m, bad, valid):
    from jaxqueue.core.system import System

    system = System(n, m, None, 1, 0)
    for d in bad:
        with pytest.raises(ValueError, match=rf"^d={d} is out of range: {valid}$"):
            jq.make(policy, d=d).validate(system)
    jq.make(policy, d=1).validate(system)


def test_mean_field_d_messages_agree():
    for policy, ratio in (("pod", None), ("jiq-pod", 10.0), ("jiq-sq", 10.0), ("idle-first", None)):
        with pytest.raises(ValueError, match=r"^d=0 is out of range: need 1 <= d <= 2147483647$"):
            theory.mean_field(policy, 0.5, ratio, d=0)


def test_ctrl_c_is_one_line_and_status_130(monkeypatch, capsys):
    import jaxqueue.api
    import jaxqueue.studies.grids.grid
    import jaxqueue.studies.grids.spec

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(
        jaxqueue.studies.grids.spec,
        "load_spec",
        lambda path, quick=False, mode=None: SimpleNamespace(name="tiny", points=[]),
    )
    monkeypatch.setattr(jaxqueue.studies.grids.grid, "run_grid", interrupt)
    assert cli_main(["sweep", "tiny.toml"]) == 130
    assert capsys.readouterr().err == (
        "interrupted: the batches committed so far are in "
        "tiny.sqlite; the same command resumes from there\n"
    )
    monkeypatch.setattr(jaxqueue.api, "simulate", interrupt)
    argv = ["simulate", "--policy", "jsq", "--servers", "1", "--load", "0.5"]
    assert cli_main(argv) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert cli_main(argv + ["--checkpoint", "run.npz"]) == 130
    assert "resumes from its last save in run.npz" in capsys.readouterr().err


def _row(mean, ci, theory_value):
    sim = SimpleNamespace(
        settings={"policy_label": "pod(d=2)", "load": 0.5},
        metric=lambda name: Estimate(mean, ci, 4),
    )
    mf = SimpleNamespace(metric=lambda name: theory_value)
    return Comparison(sim, mf)


def test_compare_prints_small_intervals_and_no_zero_width_ratio(monkeypatch, capsys):
    import jaxqueue.studies.compare

    rows = [_row(2.1e-5, 4.2e-6, 2.0e-5), _row(0.0, 0.0, 3.3e-7)]
    monkeypatch.setattr(jaxqueue.studies.compare, "compare", lambda *a, **k: rows)
    assert cli_main(["compare", "--metric", "blocking_probability", "--buffer", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[2:] == ["2.1e-05", "±", "4.2e-06", "2e-05", "0.24"]
    assert lines[3].split()[2:] == ["0", "±", "0", "3.3e-07", "n/a"]
    assert lines[4].startswith("  n/a: the 95% CI has width 0") and len(lines) == 5


def test_cli_helpers_format():
    assert cli._num(0.0) == "0" and cli._num(1.23456) == "1.23456"
    assert cli._num(4.2e-5) == "4.2e-05"


# -- one number rule in every table; '-' where a metric does not apply -------------------


def test_one_number_rule_for_table_entries():
    """An interval's half-width to two significant digits and its mean to the same
    decimal place (the Estimate's own text); a number alone to six significant digits."""
    from jaxqueue.results.display import format_metric

    for value, text in (
        (Estimate(1.0702, 0.000626, 32), "1.07020 ± 0.00063"),
        (Estimate(1.7721, 0.0091, 32), "1.7721 ± 0.0091"),
        (Estimate(12.3456, 1.234, 32), "12.3 ± 1.2"),
        (Estimate(2.1e-5, 4.2e-6, 32), "2.1e-05 ± 4.2e-06"),
        (Estimate(0.0, 0.0, 32), "0 ± 0"),
        (Estimate(0.5, float("nan"), 1), "0.5"),  # one replica: no interval
        (0.9, "0.9"),
        (0.0, "0"),
        (0.390193482, "0.390193"),
        (None, "-"),
    ):
        assert format_metric(value) == text, value
        if isinstance(value, Estimate) and value.ci95 > 0:
            assert format_metric(value) == str(value)


def test_a_message_that_is_never_sent_prints_a_dash(monkeypatch, capsys):
    """JIQ sends no probes: its probe rate is '-', not 0.0000 ± 0.0000 (and a zero
    that is a measurement, a blocking probability, stays a number)."""
    from jaxqueue.results.display import format_metric

    assert format_metric(Estimate(0.0, 0.0, 32), "probe_rate") == "-"
    assert format_metric(0.0, "delete_rate") == "-"
    assert format_metric(Estimate(0.0, 0.001, 32), "probe_rate") == "0.0000 ± 0.0010"
    assert format_metric(Estimate(0.0, 0.0, 32), "blocking_probability") == "0 ± 0"
    assert cli_main(["theory", "--policy", "jiq", "--load", "0.9", "--ratio", "10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert row["probe_rate"] == ["-"] and row["join_rate"] == ["0.509807"]
    assert row["s_1"] == ["0.9"]  # the tail by the same rule as the metrics above it
    import jaxqueue.studies.compare

    rows = [_row(0.0, 0.0, 0.0)]
    monkeypatch.setattr(jaxqueue.studies.compare, "compare", lambda *a, **k: rows)
    assert cli_main(["compare", "--metric", "probe_rate"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[2:] == ["-", "-", "-"] and len(lines) == 3


def test_sensitivity_with_a_checkpoint_is_refused_in_one_line(capsys, tmp_path):
    """--checkpoint was silently ignored by --sensitivity."""
    argv = ["simulate", "--policy", "pod", "--servers", "4", "--load", "0.5", "--sensitivity"]
    argv += ["load", "--checkpoint", str(tmp_path / "c.npz")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: --checkpoint does not apply to --sensitivity")
        and err.count("\n") == 1
    )
