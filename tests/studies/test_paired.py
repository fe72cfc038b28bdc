"""Paired comparisons on common random numbers (jaxqueue.studies.crn.paired, docs/crn.md).

The fast tests check the arguments and that the points share their keys; the
slow ones count how often the paired interval covers the exact chain's
difference, measure how much narrower it is than independent runs', and check
that two policies are reported as not coupled. The compiled shape is that of
tests/studies/test_sensitivity.py: Pod(2) at N = 3, four points of 16 replicas.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from agreement import coverage_acceptance, coverage_bounds, coverage_runs

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.exact import solve_exact
from jaxqueue.results.stats import within
from jaxqueue.sim.placement import placement
from jaxqueue.studies.crn.paired import coupling_threshold, paired, plan_points

#: Pod(2) at N = 3: four loads, 16 replicas each (the shape of the sensitivity tests).
SMALL = dict(d=2, replicas=16, levels=24, steps=12_800)
LOADS = (0.6, 0.65, 0.7, 0.75)


def _plans(models, load, n_servers=None, **options):
    return list(plan_points(models, load, n_servers, **options).plans)


def test_the_points_share_their_keys():
    (one,) = _plans("pod", [0.7, 0.8], 3, d=2, replicas=4, steps=256, levels=16)
    assert one.streams == (0, 0)
    keys = np.asarray(placement(one)[2]).reshape(2, 4, 2)
    assert np.array_equal(keys[0], keys[1])
    # two policies: a batch each, on the same keys
    a, b = _plans([jq.Model("pod", 3, d=2), jq.Model("jsq", 3)], 0.7, replicas=4, steps=256)
    assert np.array_equal(np.asarray(placement(a)[2]), np.asarray(placement(b)[2]))


@pytest.mark.parametrize(
    "models, load, error, text",
    [
        ("pod", 0.7, ValueError, "two or more points"),
        ("pod", None, TypeError, "needs load"),
        (["pod", "jsq", "random"], [0.7, 0.8], ValueError, "3 models and 2 loads"),
    ],
)
def test_arguments_are_checked_before_anything_runs(models, load, error, text):
    with pytest.raises(error, match=text):
        _plans(models, load, 3, replicas=4, steps=256)
    with pytest.raises(ValueError, match="warmup='auto'"):
        _plans("pod", [0.7, 0.8], 3, d=2, warmup="auto")


def test_the_coupling_threshold_and_the_public_name():
    assert coupling_threshold(16) == 0.5 and coupling_threshold(400) == 0.1
    assert jq.paired is paired


@pytest.mark.slow
def test_the_paired_interval_covers_the_exact_difference_and_is_narrower():
    """Runs (seeds from 200) of Pod(2) at N = 3, loads 0.6, 0.65, 0.7, 0.75:
    the 95% interval of each point's difference in mean response time from the
    first covers the exact chain's in about 95% of them. Each count is
    Binomial(runs, 0.95) if the interval is right; the test is two-sided at
    0.001 / 3 (Bonferroni over the three points, half each side): too few
    covering runs (an interval too narrow) and too many (one too wide) both
    fail. The runs are the fewest that also pass an interval of 85% coverage
    with probability at most 0.001: 372, accepting 337 to 366 (measured 349,
    348, 346). The paired interval is narrower than independent runs' by a
    factor (median over the runs) measured as 2.86, 1.79, 1.39 as the loads
    part: asserted as at least 2, 1.3, 1.1, and falling."""
    alpha = 1e-3 / 3
    runs = coverage_runs(0.95, 0.85, alpha)
    lower, upper = coverage_bounds(runs, 0.95, alpha)
    assert (runs, lower, upper) == (372, 337, 366)
    assert coverage_acceptance(runs, 0.95, alpha, 0.9993) < 1e-6
    covered, narrowing, reference = np.zeros(3, int), [], None
    for seed in range(200, 200 + runs):
        c = paired("pod", LOADS, 3, seed=seed, **SMALL)
        if reference is None:
            t = [
                solve_exact("pod", r.settings["load"], 3, d=2).mean_response_time for r in c.results
            ]
            reference = [t[k] - t[0] for k in (1, 2, 3)]
        for k in (1, 2, 3):
            est = c["mean_response_time", k]
            covered[k - 1] += abs(est.mean - reference[k - 1]) <= est.ci95
        narrowing.append([c.narrowing("mean_response_time", k) for k in (1, 2, 3)])
    assert np.all((lower <= covered) & (covered <= upper)), (covered, lower, upper)
    median = np.median(narrowing, axis=0)
    assert np.all(median >= (2.0, 1.3, 1.1)) and np.all(np.diff(median) < 0), median
    assert all(c.coupled[k]["mean_response_time"] for k in range(3))


@pytest.mark.slow
def test_two_policies_are_said_not_to_be_coupled():
    """Pod(2) and JSQ at N = 3 read the words differently: the correlation of
    their per-replica mean response times is near 0 (measured -0.03), and the
    comparison says that its interval is that of independent runs. A user
    metric is compared like the built-in ones."""
    models = [jq.Model("pod", 3, d=2), jq.Model("jsq", 3)]
    small = {k: v for k, v in SMALL.items() if k != "d"}
    c = paired(models, 0.7, seed=7, metrics={"two": "s[2]"}, **small)
    assert not c.coupled[0]["mean_response_time"], c.correlation
    assert {"two", "two_per_arrival"} <= set(c.differences[0])  # user metrics are paired too
    assert "not coupled" in c.coupling(1) and "not coupled" in str(c)
    data = c.to_dict()
    assert (
        data["points"][0]["differences"]["mean_response_time"] == c["mean_response_time"].to_dict()
    )
    assert data["settings"]["paired_interval"] == "replicas"


@pytest.mark.slow
def test_the_command_line_prints_the_paired_differences(capsys):
    """``compare --paired`` with one policy: its loads from the first, as :func:`paired`."""
    args = ["compare", "--policies", "pod", "--d", "2", "--servers", "3", "--ratio", "3"]
    args += ["--load", "0.6,0.7", "--time", "500", "--warmup-time", "50", "--replicas", "16"]
    assert cli_main(args + ["--paired", "--json"]) == 0
    (data,) = json.loads(capsys.readouterr().out)["comparisons"]
    c = paired("pod", [0.6, 0.7], 3, d=2, replicas=16, time=500, warmup_time=50, seed=0)
    assert data == json.loads(json.dumps(c.to_dict()))
    assert cli_main(args + ["--paired"]) == 0
    assert "pod(d=2), N = 3, load 0.7: coupled" in capsys.readouterr().out


#: Eight replicas of Pod(2) at N = 3: the intervals are batch means (at most 10 replicas).
BATCHED = dict(d=2, replicas=8, levels=24, steps=51_200)


@pytest.mark.slow
def test_paired_differences_by_batch_means_against_the_probe_rate():
    """Eight replicas (at most 10: the intervals are batch means of the paired
    per-batch differences): Pod(2) probes ``2 lambda`` per server per unit time, so
    each point's difference in probe rate from the first is ``2 (lambda_k -
    lambda_0)`` at the loads run (family 3). Measured (seed 2): 0.0993 +- 0.0014
    beside 0.1. The batch means read each batch's load (a batch given no load fails)."""
    c = jq.paired("pod", (0.6, 0.65, 0.7, 0.75), 3, seed=2, **BATCHED)
    assert c.settings["paired_interval"] == "batch-means"
    loads = [r.settings["load"] for r in c.results]
    for k in (1, 2, 3):
        est = c["probe_rate", k]
        assert within(est, 2 * (loads[k] - loads[0]), family=3), (k, est)
