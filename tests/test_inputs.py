"""No silent acceptance: a value out of range is refused with its name, before anything runs.

Fast: every refusal comes before a compile (the runs are stopped if one starts).
"""

import math

import pytest

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.sim import runner
from jaxqueue.studies import compare


@pytest.fixture
def no_run(monkeypatch):
    """Any start of a run fails the test: the refusals must come first."""
    def started(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(runner.Run, "start", started)


@pytest.mark.parametrize("every", [-1.0, math.nan, math.inf, "300", True])
def test_checkpoint_every_must_be_finite_seconds(every, no_run, tmp_path):
    with pytest.raises(ValueError, match=r"checkpoint_every=.* is out of range: need a finite "
                                         r"number of seconds >= 0"):
        jq.simulate("pod", 0.9, 10, replicas=2, steps=256, checkpoint=str(tmp_path / "c.npz"),
                    checkpoint_every=every)  # fmt: skip


def test_a_load_given_twice_to_compare_is_refused(no_run):
    """compare's table has a row per policy and load. (jq.sweep takes a load
    twice: its results are a list, and each entry draws its own stream, so
    repeated loads are independent runs in one batch.)"""
    with pytest.raises(ValueError, match=r"loads gives 0\.9 twice: give each once"):
        compare.compare(["pod"], 100, ratio=10, loads=(0.9, 0.5, 0.9))


def test_cli_refuses_zero_batch_points_and_infinite_checkpoint_intervals(tmp_path, capsys, no_run):
    spec = tmp_path / "s.toml"
    spec.write_text('[grid]\npolicy = ["pod"]\nservers = [10]\nload = [0.5]\n'
                    '[run]\nreplicas = 2\nsteps = 256\n')  # fmt: skip
    for argv in (["sweep", str(spec), "--batch-points", "0"],
                 ["sweep", str(spec), "--batch-points", "0", "--plan"]):  # fmt: skip
        assert cli_main(argv) == 2
        assert "batch_points=0 is out of range: need >= 1" in capsys.readouterr().err
    argv = ["simulate", "--policy", "pod", "--servers", "10", "--load", "0.5", "--replicas", "2",
            "--steps", "256", "--checkpoint", str(tmp_path / "c.npz"), "--checkpoint-every", "nan"]
    assert cli_main(argv) == 2
    assert "checkpoint_every=nan is out of range" in capsys.readouterr().err
