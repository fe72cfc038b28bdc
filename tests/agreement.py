"""The large-N comparison of simulated estimates with mean-field values, shared by the tests.

Each estimate must lie within its Student-t tolerance for a family of
``family`` comparisons (:func:`jaxqueue.results.stats.tolerance`) plus
``10 / N`` of the predicted value, the allowance for the mean field's
O(1/N) error at ``N`` servers (as tests/test_vs_mean_field.py).
"""

import numpy as np

from jaxqueue.results.stats import tolerance


def assert_near_mean_field(checks, family: int, n_servers: int) -> None:
    """``checks``: ``(estimate, predicted, what)`` triples (arrays allowed)."""
    for est, predicted, what in checks:
        predicted = np.asarray(predicted, np.float64)
        tol = tolerance(est, family, allowance=10.0 / n_servers * np.abs(predicted))
        err = np.abs(np.asarray(est.mean) - predicted)
        assert np.all(err <= tol), f"{what}: simulated {est.mean} ± {tol}, mean field {predicted}"
