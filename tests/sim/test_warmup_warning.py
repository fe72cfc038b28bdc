"""A failed warm-up diagnostic is loud: :class:`jaxqueue.WarmupWarning` from
``simulate`` and ``sweep`` (once per failing load, at the caller's line, with
advice), and a ``warning:`` line on the command line's stderr (exit 0, stdout
unchanged).

JIQ with N = 20, M = 2 started empty with no warm-up: at load 0.98 the queues
are still filling through the measured window (seed 2: a half drift of 2.4
against a 99% half-width of 0.56, MSER truncating 10 of 20 batches), while at
load 0.5 the start is forgotten within the first batch and the diagnostic passes.
"""

from __future__ import annotations

import json
import warnings

import pytest

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.core.rng import BLOCK
from jaxqueue.results.warmup import failure_message

SHORT = dict(replicas=4, steps=20 * BLOCK, seed=2, warmup=0, init="empty")
ARGS = [
    "simulate",
    "--policy",
    "jiq",
    "--servers",
    "20",
    "--dispatchers",
    "2",
    "--load",
    "0.98",
    "--replicas",
    "4",
    "--steps",
    str(20 * BLOCK),
    "--seed",
    "2",
    "--warmup",
    "0",
    "--init",
    "empty",
]


@pytest.fixture(scope="module")
def cold():
    """The short run at load 0.98, and the warnings it gave."""
    with pytest.warns(jq.WarmupWarning) as caught:
        res = jq.simulate("jiq", 0.98, 20, 2, **SHORT)
    return res, list(caught)


def test_simulate_warns_at_the_callers_line_with_advice(cold):
    res, caught = cold
    assert res.diagnostics["warmup_diagnostic"]["passed"] is False  # the result is still returned
    (w,) = [c for c in caught if c.category is jq.WarmupWarning]
    assert w.filename == __file__  # stacklevel: the user's call, not the package
    text = str(w.message)
    assert text.startswith("the warm-up diagnostic failed at load 0.98, N=20 (MSER truncation")
    for advice in ("warmup= or warmup_time=", 'init="mean-field"', 'warmup="auto"'):
        assert advice in text


def test_sweep_warns_once_per_failing_load():
    with pytest.warns(jq.WarmupWarning) as caught:
        results = jq.simulate("jiq", [0.5, 0.98], 20, 2, **SHORT)
    verdicts = [r.diagnostics["warmup_diagnostic"]["passed"] for r in results]
    assert verdicts == [True, False]
    messages = [str(c.message) for c in caught if c.category is jq.WarmupWarning]
    assert len(messages) == 1 and "at load 0.98" in messages[0]
    assert all(c.filename == __file__ for c in caught)


def test_the_warning_can_be_made_an_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error", jq.WarmupWarning)
        with pytest.raises(jq.WarmupWarning, match="at load 0.98"):
            jq.simulate("jiq", 0.98, 20, 2, **SHORT)


def test_the_command_line_warns_on_stderr_and_exits_0(capsys):
    assert cli_main([*ARGS, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["diagnostics"]["warmup_diagnostic"]["passed"] is False
    (line,) = [t for t in err.splitlines() if t.startswith("warning: ")]
    assert line.startswith("warning: the warm-up diagnostic failed at load 0.98, N=20")
    for advice in ("--warmup or --warmup-time", "--init mean-field", "--warmup auto"):
        assert advice in line
    assert cli_main(ARGS) == 0  # the table says it too, and stderr has the same line
    out, err = capsys.readouterr()
    assert "diagnostic FAILED" in out and "warning:" not in out and line in err.splitlines()


def test_the_message_of_each_verdict():
    diag = {
        "passed": False,
        "batches": 20,
        "mser_truncation": 3,
        "half_drift": 0.5,
        "half_drift_ci99": 0.2,
        "auto": False,
        "extensions": 0,
    }
    assert failure_message({**diag, "passed": True}, 0.9) is None
    assert (
        failure_message({**diag, "passed": None}, 0.9) is None and failure_message(None, 1) is None
    )
    text = failure_message(diag, 0.9)
    assert text.startswith("the warm-up diagnostic failed at load 0.9 (MSER truncation 3 of 20")
    assert "half drift 0.5 ± 0.2 (99%)" in text
    after = failure_message({**diag, "auto": True, "extensions": 4}, 0.9, spelling="cli")
    assert "still fails at load 0.9 after --warmup auto extended the warm-up 4 times" in after
    assert "(--steps or --time)" in after


def test_the_command_line_shows_a_python_warmup_warning_with_its_flags(capsys):
    """A WarmupWarning raised under a command (compare runs jq.sweep) names the flags."""
    from jaxqueue.cli import _show_warning

    diag = {
        "passed": False,
        "mser_truncation": 3,
        "batches": 20,
        "half_drift": 0.5,
        "half_drift_ci99": 0.2,
    }
    _show_warning(jq.WarmupWarning(failure_message(diag, 0.9)), jq.WarmupWarning, "f.py", 1)
    err = capsys.readouterr().err
    assert err.startswith("warning: the warm-up diagnostic failed at load 0.9")
    assert "(--warmup or --warmup-time)" in err and "--init mean-field" in err
    assert "--warmup auto" in err and "warmup=" not in err
