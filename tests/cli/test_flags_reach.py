"""Each flag the command line takes reaches the entry point behind it by name
(``options_from``): what the command passes on is recorded by a stand-in and
compared with the flags given, and the theory command's values with the Python
API's at the same options."""

from __future__ import annotations

import json

import pytest

import jaxqueue.cli.run_commands
import jaxqueue.studies.compare
from jaxqueue import theory
from jaxqueue.cli import main as cli_main


class _Called(BaseException):
    """Raised by a stand-in with the arguments it was given (past the command
    line's handler of errors, which turns an Exception into a message)."""

    def __init__(self, args, kwargs):
        super().__init__("called")
        self.args_given, self.kwargs = args, kwargs


def _record(*args, **kwargs):
    raise _Called(args, kwargs)


def test_compare_passes_every_model_and_run_flag_on(monkeypatch):
    monkeypatch.setattr(jaxqueue.studies.compare, "compare", _record)
    flags = ["compare", "--policies", "pod", "--d", "3", "--buffer", "6"]
    flags += ["--service", "erlang:2", "--replicas", "8", "--seed", "5"]
    flags += ["--steps", "4096", "--warmup", "512"]
    with pytest.raises(_Called) as call:
        cli_main(flags)
    kw = call.value.kwargs
    given = {k: kw[k] for k in ("d", "buffer", "service", "replicas", "seed", "steps", "warmup")}
    assert given == dict(
        d=3, buffer=6, service="erlang:2", replicas=8, seed=5, steps=4096, warmup=512
    )
    assert not {"z", "pools", "arrivals", "warmup_time"} & set(kw)  # not given: absent


def test_transient_passes_the_model_flags_on(monkeypatch):
    monkeypatch.setattr(jaxqueue.cli.run_commands, "transient_study", _record)
    flags = ["transient", "--policy", "pod", "--d", "3", "--servers", "20", "--load", "0.8"]
    flags += ["--buffer", "7", "--times", "1,2", "--replicas", "4", "--seed", "9"]
    with pytest.raises(_Called) as call:
        cli_main(flags)
    kw = call.value.kwargs
    assert (kw["d"], kw["buffer"], kw["replicas"], kw["seed"]) == (3, 7, 4, 9)
    assert not {"z", "order", "service", "pools"} & set(kw)


def test_theory_gives_the_python_api_value_at_the_same_options(capsys):
    assert (
        cli_main(
            ["theory", "--policy", "pod", "--d", "3", "--load", "0.8", "--buffer", "6", "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    ref = theory.mean_field("pod", 0.8, d=3, buffer=6)
    assert out["settings"]["buffer"] == 6 and out["settings"]["d"] == 3
    assert out["mean_response_time"]["mean"] == ref.mean_response_time
