"""Progress of a run: lines on the ``jaxqueue`` logger with a percentage, a rate that
leaves out the compiling first chunk and the time left; a tqdm bar on a terminal."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.core.progress import LOGGER, Progress, duration, log, tqdm_bar


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
