"""Progress of a run, a sweep and a comparison: lines on the ``jaxqueue`` logger with a
percentage, a rate that leaves out what compiles and the time left; a tqdm bar on a
terminal; silenced with the logger; never on stdout."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re

import pytest

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.core.progress import LOGGER, PointProgress, Progress, duration, log, tqdm_bar
from jaxqueue.studies import compare as cmp
from jaxqueue.studies.grids.grid import run_grid
from jaxqueue.studies.grids.spec import parse_spec


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lines():
    """The messages of the ``jaxqueue`` logger while a test runs."""
    got = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append(record.getMessage())

    handler, level = Keep(), LOGGER.level
    LOGGER.addHandler(handler)
    yield got
    LOGGER.removeHandler(handler)
    LOGGER.setLevel(level)


def test_lines_say_compiling_then_percentage_rate_and_time_left(lines):
    clock = _Clock()
    report = Progress("jiq", 1000.0, every=2.0, clock=clock)
    report.start(0, 100)
    clock.now = 10.0  # the first chunk: compiling, and one block
    report.update(1, 100, "warm-up")
    for block in range(2, 101):  # then 10 blocks a second: 1e4 replica-steps/s
        clock.now = 10.0 + (block - 1) / 10
        report.update(block, 100, "measure" if block > 50 else "warm-up")
    assert lines[0] == "jiq: compiling, then the first chunk from block 0 of 100"
    assert lines[1] == "jiq warm-up: block 1/100 (1%), compiled and ran the first chunk in 10.0 s"
    # a line every 2 s at most (every 20 blocks), and the last
    assert lines[2] == "jiq warm-up: block 21/100 (21%), 1e+04 replica-steps/s, about 7.9 s left"
    assert lines[-1] == "jiq measure: block 100/100 (100%), 1e+04 replica-steps/s, done in 20 s"
    assert len(lines) == 7
    pattern = re.compile(
        r"jiq (warm-up|measure): block \d+/100 \(\d+%\), 1e\+04 replica-steps/s, about .* left"
    )
    assert all(pattern.fullmatch(line) for line in lines[2:-1])


def test_time_left_and_durations():
    assert [duration(s) for s in (0, 2.5, 45, 200, 7500)] == [
        "0.0 s",
        "2.5 s",
        "45 s",
        "3 min 20 s",
        "2 h 05 min",
    ]


def test_a_bar_only_on_a_terminal(lines):
    assert tqdm_bar(10, 0, "jiq", "block", io.StringIO()) is None

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    pytest.importorskip("tqdm")
    stream = Terminal()
    LOGGER.setLevel(logging.WARNING)  # silenced: no bar either
    assert tqdm_bar(10, 0, "jiq", "block", stream) is None
    LOGGER.setLevel(logging.NOTSET)
    bar = tqdm_bar(10, 0, "jiq", "block", stream)
    clock = _Clock()
    report = Progress("jiq", 256.0, bar=bar, clock=clock)
    report.start(0, 10)
    for block in (1, 4, 12):  # the end may move (a warm-up extended)
        clock.now += 1.0
        report.update(block, 12 if block > 4 else 10, "measure")
    report.close()
    assert bar.n == 12 and bar.total == 12 and not lines  # the bar, no lines
    assert "jiq measure" in stream.getvalue() and "replica-steps/s" in stream.getvalue()


def test_without_any_handler_progress_goes_to_stderr(capsys, monkeypatch):
    monkeypatch.setattr(LOGGER, "propagate", False)  # no handler up the chain either
    monkeypatch.setattr(LOGGER, "handlers", [])
    level = LOGGER.level
    try:
        LOGGER.setLevel(logging.INFO)
        log("a line")
        LOGGER.setLevel(logging.WARNING)  # silenced
        log("not this one")
    finally:
        LOGGER.setLevel(level)
    assert capsys.readouterr().err == "[jaxqueue] a line\n"


KW = dict(replicas=4, steps=4096, warmup=512, levels=48, seed=5)


def test_simulate_reports_on_the_logger_and_can_be_silenced(lines):
    jq.simulate("pod", 0.5, 8, **KW, progress=True)
    assert lines[0].startswith("pod(d=2): compiling")
    assert re.fullmatch(r"pod\(d=2\) measure: block 18/18 \(100%\), .* done in .*", lines[-1])
    lines.clear()
    LOGGER.setLevel(logging.WARNING)
    quiet = jq.simulate("pod", 0.5, 8, **KW, progress=True)
    assert not lines
    assert quiet.to_dict()["tail"] == jq.simulate("pod", 0.5, 8, **KW).to_dict()["tail"]


def test_the_command_line_reports_on_stderr_and_keeps_stdout_clean(capsys):
    args = ["simulate", "--policy", "pod", "--servers", "8", "--load", "0.5", "--replicas", "4"]
    args += ["--steps", "4096", "--warmup", "512", "--levels", "48", "--seed", "5"]
    assert cli_main([*args, "--json", "--progress"]) == 0
    out = capsys.readouterr()
    json.loads(out.out)
    err = out.err.splitlines()
    assert err[0].startswith("[jaxqueue] pod(d=2): compiling")
    assert re.fullmatch(r"\[jaxqueue\] pod\(d=2\) .*: block 1/18 \(6%\), compiled .*", err[1])
    assert err[-1].startswith("[jaxqueue] pod(d=2) measure: block 18/18 (100%)")
    assert not LOGGER.handlers  # the command's handler is gone after it


def test_a_sweeps_lines_count_points_and_leave_out_the_batches_that_compile(lines):
    clock = _Clock()
    report = PointProgress("grid", 10, 2, clock=clock)  # 2 of 10 points stored already
    report.compiling("pod(d=2) for 8 points in 4 batches of 2")
    clock.now = 5.0
    report.update(2, 1e4, 5.0, compiled=True)  # compiling: no rate yet
    for _ in range(3):  # then 2 points a second, 1e4 replica-steps each batch
        clock.now += 1.0
        report.update(2, 1e4, 1.0, compiled=False)
    report.close()
    assert lines == [
        "grid: compiling pod(d=2) for 8 points in 4 batches of 2",
        "grid: 4/10 points (40%), compiled and ran the batch in 5.0 s",
        "grid: 6/10 points (60%), 1e+04 replica-steps/s, about 2.0 s left",
        "grid: 8/10 points (80%), 1e+04 replica-steps/s, about 1.0 s left",
        "grid: 10/10 points (100%), 1e+04 replica-steps/s, done in 8.0 s",
    ]


#: A two-point grid, small enough to compile in about a second.
TINY = """\
name = "tiny"
[grid]
policy = ["random"]
n_servers = [2]
load = [0.4, 0.6]
[run]
replicas = 2
steps = 512
warmup = 0
seed = 1
theory = "none"
"""


@pytest.mark.slow
def test_a_sweeps_progress_is_on_the_logger_and_can_be_silenced(lines, tmp_path, capsys):
    spec = parse_spec(TINY)
    assert run_grid(spec, tmp_path / "a.sqlite", progress=True) == 2
    assert lines[0] == "tiny: compiling random for 2 points in 1 batches of 2"
    assert re.fullmatch(r"tiny: 2/2 points \(100%\), done in .*", lines[-1])
    lines.clear()
    LOGGER.setLevel(logging.WARNING)
    assert run_grid(spec, tmp_path / "b.sqlite", progress=True) == 2
    assert not lines
    out = capsys.readouterr()
    assert not out.out and not out.err  # no bar and no line either


def _fake_sweep(model, loads, run, **kw):
    """Results of a comparison's runs without running: the mean field's, with the
    settings a row reads."""
    pol, n, m = model.policy, model.n_servers, model.n_dispatchers
    settings = dict(policy=pol.name, policy_label=pol.label(), options={}, n_servers=n)
    settings.update(n_dispatchers=m, ratio=n / m)
    return [
        dataclasses.replace(jq.theory.mean_field(pol, lam), settings={**settings, "load": lam})
        for lam in loads
    ]


def test_compare_says_what_it_runs_on_the_logger_and_can_be_silenced(lines, monkeypatch):
    monkeypatch.setattr(cmp, "simulate", _fake_sweep)
    rows = cmp.compare(["pod", "random"], 20, ratio=10, loads=(0.5, 0.7), progress=True)
    assert len(rows) == 4
    assert lines == [
        "simulating pod(d=2) at loads [0.5, 0.7]",
        "simulating random at loads [0.5, 0.7]",
    ]
    lines.clear()
    LOGGER.setLevel(logging.WARNING)
    cmp.compare(["pod"], 20, ratio=10, loads=(0.5,), progress=True)
    assert not lines


def test_compare_json_is_alone_on_stdout(capsys, monkeypatch):
    monkeypatch.setattr(cmp, "simulate", _fake_sweep)
    args = ["compare", "--policies", "pod,random", "--servers", "20", "--load", "0.5,0.7"]
    assert cli_main([*args, "--json", "--progress"]) == 0
    out = capsys.readouterr()
    assert len(json.loads(out.out)["rows"]) == 4
    assert "[jaxqueue]" not in out.out and "simulating" not in out.out
    said = [line for line in out.err.splitlines() if line.startswith("[jaxqueue]")]
    assert said[0] == "[jaxqueue] simulating pod(d=2) at loads [0.5, 0.7]"


@pytest.mark.slow
def test_compare_on_the_command_line_compiles_then_reports_rates_on_stderr(capsys):
    args = ["compare", "--policies", "pod", "--servers", "20", "--load", "0.5", "--time", "25.6"]
    args += ["--warmup-time", "5", "--replicas", "4", "--json", "--progress"]
    assert cli_main(args) == 0
    out = capsys.readouterr()
    json.loads(out.out)
    assert "[jaxqueue]" not in out.out
    err = [line for line in out.err.splitlines() if line.startswith("[jaxqueue]")]
    assert err[0] == "[jaxqueue] simulating pod(d=2) at loads [0.5]"
    assert err[1].startswith("[jaxqueue] pod(d=2): compiling")
    assert re.fullmatch(r"\[jaxqueue\] pod\(d=2\) measure: .* replica-steps/s, done in .*", err[-1])


def test_a_sweeps_time_left_counts_replica_steps_not_points(lines):
    """Points 10x apart in size: after a small batch the time left is the replica-steps
    still to run at the measured rate (a sweep once said "about 1.0 s left" counting
    points, then ran a minute more); the compiling batch is left out of the rate."""
    clock = _Clock()
    # four batches of one point each: 1e4, 1e4, 1e5 and 1e5 replica-steps
    report = PointProgress("grid", 4, 0, steps_left=2.2e5, clock=clock)
    clock.now = 5.0
    report.update(1, 1e4, 5.0, compiled=True)  # compiling: no rate
    clock.now += 1.0
    report.update(1, 1e4, 1.0, compiled=False)  # 1e4 a second; 2e5 left: 20 s
    clock.now += 10.0
    report.update(1, 1e5, 10.0, compiled=False)  # still 1e4 a second; 1e5 left: 10 s
    assert lines[1:] == [
        "grid: 2/4 points (50%), 1e+04 replica-steps/s, about 20 s left",
        "grid: 3/4 points (75%), 1e+04 replica-steps/s, about 10 s left",
    ]
