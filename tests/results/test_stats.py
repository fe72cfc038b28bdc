"""The tolerance helper: Student-t quantiles and family-wise levels."""

import json
import math

import numpy as np
import pytest
from scipy import stats

import jaxqueue as jq
from jaxqueue.results.estimates import estimate
from jaxqueue.results.stats import (
    comparison_level,
    student_t_cdf,
    student_t_quantile,
    tolerance,
    tolerance_factor,
    within,
)


@pytest.mark.parametrize("dof", [1, 2, 3, 4, 7, 15, 31, 100, 1000])
def test_student_t_against_scipy(dof):
    for p in (0.6, 0.9, 0.975, 0.995, 1 - 1e-3 / 84, 1 - 1e-6, 1 - 1e-8):
        assert student_t_quantile(p, dof) == pytest.approx(stats.t.ppf(p, dof), rel=1e-9)
        assert student_t_quantile(1 - p, dof) == pytest.approx(stats.t.ppf(1 - p, dof), rel=1e-9)
    for x in (-30.0, -2.0, -0.1, 0.0, 0.5, 3.0, 40.0):
        assert student_t_cdf(x, dof) == pytest.approx(stats.t.cdf(x, dof), abs=1e-12)


def test_family_levels():
    assert comparison_level(1e-3, 10) == pytest.approx(1e-4)
    assert comparison_level(1e-3, 10, "sidak") == pytest.approx(1 - (1 - 1e-3) ** 0.1, rel=1e-12)
    with pytest.raises(ValueError, match="family=0 is out of range"):
        comparison_level(1e-3, 0)
    with pytest.raises(ValueError, match="correction='holm' is not valid"):
        comparison_level(1e-3, 3, "holm")


def test_tolerance_factor_is_a_ratio_of_t_quantiles_not_normal_ones():
    # 8 replicas, a family of 42 at 0.001: about 4.16, twice the normal-quantile 2.08
    f = tolerance_factor(8, 42)
    assert f == pytest.approx(stats.t.ppf(1 - 1e-3 / 84, 7) / stats.t.ppf(0.975, 7), rel=1e-9)
    assert 4.1 < f < 4.2
    assert tolerance_factor(10_000, 1, alpha=0.05) == pytest.approx(1.0, abs=1e-12)


def test_tolerance_uses_the_estimates_replica_count():
    rng = np.random.default_rng(0)
    est = estimate(rng.normal(size=(8, 3)))
    assert est.n == 8
    tol = tolerance(est, 5, allowance=0.1)
    np.testing.assert_allclose(tol, est.ci95 * tolerance_factor(8, 5) + 0.1)
    single = estimate(rng.normal(size=(1,)))
    assert math.isnan(single.ci95) and single.n == 1
    with pytest.raises(ValueError, match="at least 2 replicas"):
        tolerance(single, 1)


def test_coverage_of_the_family_wise_test():
    """Under the null, the family-wise test rejects at about its rate (here 0.2 for visibility)."""
    rng = np.random.default_rng(1)
    trials, family, reps = 1000, 4, 5
    rejects = 0
    for _ in range(trials):
        x = rng.normal(size=(reps, family))
        rejects += not within(estimate(x), np.zeros(family), family, alpha=0.2)
    rate = rejects / trials  # Bonferroni: at most 0.2, close to it for independent tests
    assert 0.13 < rate <= 0.2 + 3 * math.sqrt(0.2 * 0.8 / trials)


def test_estimate_is_exported():
    assert jq.Estimate(1.0, 0.1, 4).to_json() == {"mean": 1.0, "ci95": 0.1, "n": 4}


def test_an_estimate_round_trips_through_json_and_tolerance_takes_the_dict():
    """A result's JSON keeps ``n``: the tolerance of the dict is the Estimate's, entry by entry."""
    per_entry = jq.Estimate(np.array([1.0, 0.5]), np.array([0.1, math.nan]), np.array([8, 1]))
    data = json.loads(json.dumps(per_entry.to_json()))
    assert data == {"mean": [1.0, 0.5], "ci95": [0.1, None], "n": [8, 1]}
    back = jq.Estimate.from_json(data)
    np.testing.assert_array_equal(back.mean, per_entry.mean)
    np.testing.assert_array_equal(back.ci95, per_entry.ci95)  # NaN where None
    np.testing.assert_array_equal(back.n, per_entry.n)
    one = jq.Estimate(2.0, 0.3, 8)
    assert jq.tolerance(one.to_json(), family=3) == jq.tolerance(one, family=3)
    assert jq.tolerance(one.to_json(), family=3) == pytest.approx(
        0.3 * student_t_quantile(1 - 1e-3 / 6, 7) / student_t_quantile(0.975, 7), rel=1e-12
    )


def test_tolerance_says_what_it_needs():
    with pytest.raises(ValueError, match=r"n=None; build it as Estimate\(mean, ci95, n\)"):
        jq.tolerance(jq.Estimate(1.0, 0.1), family=1)
    with pytest.raises(TypeError, match="a mean-field or exact value has no sampling error"):
        jq.tolerance(1.5, family=1)
    with pytest.raises(TypeError, match="an Estimate's JSON is a dict with mean, ci95 and n"):
        jq.tolerance({"mean": 1.0}, family=1)
