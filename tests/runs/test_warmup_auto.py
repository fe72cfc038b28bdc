"""``warmup="auto"`` that runs out of extensions, and the command line's failed-diagnostic line.

One server at load 1.2 with room for 4000 tasks, started empty: its queue
grows by 0.2 a time unit for 20 000 time units before it fills, and windows
of 20 blocks (about 2 300 time units each) see it grow through the first
window and every window after it (measured: a half drift of 257 against a
99% half-width of 7.8 in the last). The warm-up diagnostic fails each time, so ``warmup="auto"`` turns
:data:`~jaxqueue.sim.runner.MAX_EXTENSIONS` windows into warm-up and then
stops: the result is kept, its diagnostic says it failed (``passed`` False,
``extensions`` at the most), and the command line prints ``diagnostic FAILED``.
A fixed seed makes every run here the same.
"""

import json

import pytest

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.core.rng import BLOCK
from jaxqueue.sim.runner import MAX_EXTENSIONS

STEPS = 20 * BLOCK
KW = dict(buffer=4000, replicas=2, steps=STEPS, seed=1, init="empty")
ARGS = [
    "simulate",
    "--policy",
    "random",
    "--servers",
    "1",
    "--load",
    "1.2",
    "--buffer",
    "4000",
    "--replicas",
    "2",
    "--steps",
    str(STEPS),
    "--seed",
    "1",
    "--init",
    "empty",
]


@pytest.mark.slow
def test_auto_warmup_out_of_extensions_keeps_the_failed_verdict(capsys):
    with pytest.warns(jq.WarmupWarning, match='still fails at load 1.2, N=1 after warmup="auto"'):
        res = jq.simulate("random", 1.2, 1, warmup="auto", **KW)
    diag = res.diagnostics["warmup_diagnostic"]
    assert diag["auto"] is True and diag["passed"] is False
    assert diag["extensions"] == MAX_EXTENSIONS
    # the last measured window follows the extensions: the warm-up grew by MAX_EXTENSIONS windows
    assert res.settings["warmup"] == diag["warmup"] > MAX_EXTENSIONS * STEPS
    assert res.to_dict()["diagnostics"]["warmup_diagnostic"]["passed"] is False
    # the command line says so, in its text and in its JSON
    assert cli_main([*ARGS, "--warmup", "auto"]) == 0
    out = capsys.readouterr().out
    assert "diagnostic FAILED" in out and f"warm-up extended {MAX_EXTENSIONS} times" in out
    assert cli_main([*ARGS, "--warmup", "auto", "--json"]) == 0
    diag = json.loads(capsys.readouterr().out)["diagnostics"]["warmup_diagnostic"]
    assert (diag["passed"], diag["extensions"]) == (False, MAX_EXTENSIONS)


@pytest.mark.slow
def test_a_fixed_warmup_too_short_prints_diagnostic_failed(capsys):
    """Without ``auto`` nothing is extended: one window, judged and reported as failed."""
    assert cli_main([*ARGS, "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    line = next(t for t in out.splitlines() if "warm-up 0 steps: diagnostic" in t)
    assert "diagnostic FAILED" in line and "extended" not in line, out
