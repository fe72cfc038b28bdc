"""The theory's front door over the generic mean field's two models:
``theory.fixed_point`` and ``theory.transient`` (one signature, the model chosen
by the service law and the pools). References are written here: Pod(2)'s
doubly exponential tail, M/M/1/L (Random on ``L`` levels) and the
Pollaczek-Khinchine mean of M/E2/1."""

from __future__ import annotations

import numpy as np
import pytest

from jaxqueue import theory
from jaxqueue.core.config import Bounds
from jaxqueue.core.status import Status
from jaxqueue.theory.generic import meanfield, phases


def test_the_exponential_model_is_the_generic_fixed_point_bit_for_bit():
    fp = theory.fixed_point("pod", 0.9, d=2)
    same = meanfield.fixed_point("pod", 0.9, d=2)
    assert isinstance(fp, meanfield.FixedPoint) and fp.status == Status.CONVERGED
    np.testing.assert_array_equal(fp.tail, same.tail)
    k = np.arange(fp.tail.size)
    np.testing.assert_allclose(fp.tail, 0.9 ** (2.0**k - 1), rtol=1e-9, atol=1e-15)


def test_bounds_set_the_levels_represented():
    """Random on 30 levels is M/M/1/30: s_k = (lambda^k - lambda^31) / (1 - lambda^31)."""
    lam, L = 0.9, 30
    fp = theory.fixed_point("random", lam, bounds=Bounds(levels=L))
    k = np.arange(L + 1)
    np.testing.assert_allclose(
        fp.tail, (lam**k - lam ** (L + 1)) / (1 - lam ** (L + 1)), rtol=0, atol=4e-10
    )


def test_a_service_law_takes_the_model_by_class():
    lam = 0.7
    fp = theory.fixed_point("random", lam, service="erlang:2", solver=theory.Newton(tol=1e-13))
    assert isinstance(fp, phases.FixedPoint) and fp.status == Status.CONVERGED
    assert fp.mean_response_time == pytest.approx(1 + lam * 1.5 / (2 * (1 - lam)), rel=1e-9)


def test_the_transient_is_the_ode_for_either_model():
    """Exponential service through the model by class agrees with the exponential
    model's own ODE at t = 5 (both error-controlled to 1e-10 a step), and
    reaches the fixed point's tail by t = 400."""
    tr = theory.transient("pod", 0.9, d=2, times=[5.0, 400.0])
    t, tails, _ = meanfield.transient("pod", 0.9, d=2, t_end=5.0, dt=0.1)
    n = min(tails.shape[1], tr.tails.shape[1])
    assert t[-1] == pytest.approx(5.0)
    np.testing.assert_allclose(tr.tails[0, :n], tails[-1, :n], rtol=0, atol=1e-9)
    k = np.arange(8)
    np.testing.assert_allclose(tr.tails[1, :8], 0.9 ** (2.0**k - 1), rtol=0, atol=1e-7)


def test_options_the_front_door_does_not_take_are_refused():
    with pytest.raises(TypeError, match="fixed_point\\(\\) got an unexpected keyword argument 'z'"):
        theory.fixed_point("pod", 0.9, z=1)
    with pytest.raises(
        TypeError, match="unexpected keyword argument 'buffers'; did you mean 'buffer'"
    ):
        theory.transient("pod", 0.9, times=[1.0], buffers=3)
