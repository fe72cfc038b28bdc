"""Design on the simulated system (jaxqueue.studies.crn.design_sim, docs/design.md).

The fast tests check the arguments and the mean field's answer; the slow one
designs Pod(2) at N = 3 for a mean response time of 2 and checks the answer
against the exact chain. The compiled shape is that of tests/studies/test_sensitivity.py
(four sides of 16 replicas, levels 24).
"""

from __future__ import annotations

import pytest

from jaxqueue.core.config import Model
from jaxqueue.exact import solve_exact
from jaxqueue.results.stats import within
from jaxqueue.studies.crn.design_sim import design_simulated, mean_field_load

#: Pod(2) at N = 3 in the sensitivity tests' shape; 16 replicas throughout.
SMALL = dict(d=2, replicas=16, max_replicas=16, levels=24, steps=12_800, richardson=True)


def test_arguments_are_checked_before_anything_runs():
    with pytest.raises(ValueError, match="target=0"):
        design_simulated("pod", 0, 3, d=2)
    with pytest.raises(TypeError, match="needs n_servers"):
        design_simulated("pod", 2.0, d=2)
    with pytest.raises(ValueError, match="replicas=32 is out of range"):
        design_simulated("pod", 2.0, 3, d=2, replicas=32, max_replicas=16)


def test_the_mean_field_answer_by_bisection_for_a_quantile():
    """Random's response time is exponential of rate 1 - lambda: its p99 is
    log(100) / (1 - lambda), so the largest load with p99 <= 10 is 1 - log(100) / 10."""
    found = mean_field_load(Model("random", 100), "p99", 10.0)
    assert found == pytest.approx(1.0 - 4.605170185988091 / 10.0, abs=1e-6)


def _exact_root(target: float) -> float:
    """The largest load with the exact chain's mean response time at most ``target`` (N = 3)."""
    lo, hi = 0.3, 0.95
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (
            (mid, hi) if solve_exact("pod", mid, 3, d=2).mean_response_time <= target else (lo, mid)
        )
    return lo


@pytest.mark.slow
def test_pod_at_n_3_meets_its_target_where_the_exact_chain_does():
    """Pod(2), N = 3, mean response time 2: the check run's metric at the load
    found is within its interval of the target, the exact chain's value there
    within it too, and the root's interval covers the exact chain's root
    (0.7248; measured 0.7268 +- 0.0042 with the check 1.998 +- 0.019 at
    0.7264): family 3. The mean field's answer (0.8116) is far above: at N = 3
    the queues are longer than the limit's."""
    d = design_simulated("pod", 2.0, 3, seed=3, **SMALL)
    exact = solve_exact("pod", d.load, 3, d=2).mean_response_time
    assert within(d.check, 2.0, family=3), d.check
    assert within(d.check, exact, family=3), (d.check, exact)
    assert within(d.root, _exact_root(2.0), family=3), d.root
    assert d.mean_field == pytest.approx(0.81156, abs=1e-4)
    assert d.mean_field - d.root.mean > 10 * d.root.ci95
    assert d.steps > 0 and len(d.history) <= 12
    assert "mean field: 0.8116" in str(d)
