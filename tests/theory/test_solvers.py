"""The theory's solver core: its settings as values (``solver=``), ``throw=False``,
and the bracketed scalar root.

References are computed here, not by the package: the M/M/1 tail ``lambda^k``
(Random's mean field), Pod(2)'s doubly exponential tail, and the
Pollaczek-Khinchine mean of M/E2/1 (Random with Erlang-2 service).
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxqueue import theory
from jaxqueue.core.service import erlang
from jaxqueue.core.status import Status
from jaxqueue.theory import LevelGrowth, Newton, Settle, Solver
from jaxqueue.theory.baselines.mph1 import mph1_tail, mph1_tail_decay
from jaxqueue.theory.generic import meanfield
from jaxqueue.theory.generic.solvers import bracketed_root


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Newton(tol=0.0), r"Newton.tol=0.0 is out of range: need a number in \(0, 1\)"),
        (lambda: Newton(tol=float("nan")), "Newton.tol=nan is out of range"),
        (lambda: Newton(max_iter=-1), r"Newton.max_iter=-1 is out of range: need 0..1000000"),
        (lambda: Newton(max_iter=2.5), "Newton.max_iter=2.5 is not an integer"),
        (lambda: Settle(time=-1.0), r"Settle.time=-1.0 is out of range: need a number in \[0"),
        (lambda: Settle(dt=0), r"Settle.dt=0 is out of range: need a number in \(0, 10\)"),
        (lambda: LevelGrowth(tol=1.0), "LevelGrowth.tol=1.0 is out of range"),
    ],
)
def test_settings_are_checked_where_they_are_made(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_solver_is_a_solver_setting_or_none():
    assert Solver.of(None) == Solver()
    assert Solver.of(Newton(max_iter=3)) == Solver(newton=Newton(max_iter=3))
    assert Solver.of(Settle(time=0.0)).settle == Settle(time=0.0)
    assert Solver.of(LevelGrowth(tol=1e-8)).levels.tol == 1e-8
    with pytest.raises(TypeError, match="Solver.newton must be a Newton"):
        Solver(newton=Settle())
    with pytest.raises(TypeError, match="solver='fast' is not a solver setting"):
        theory.mean_field("pod", 0.9, buffer=10, solver="fast")
    with pytest.raises(TypeError, match="throw=0 must be True or False"):
        theory.mean_field("pod", 0.9, buffer=10, throw=0)


def test_a_solver_where_none_is_solved_is_refused():
    with pytest.raises(ValueError, match="the closed form of 'jiq' takes none"):
        theory.mean_field("jiq", 0.9, 10.0, solver=Newton())
    with pytest.raises(ValueError, match="the mean field of 'jiq-threshold' takes none"):
        theory.mean_field("jiq-threshold", 0.9, 10.0, z=1, solver=Newton())


def test_the_level_growth_tolerance_sets_the_level_count():
    """Random's mean field is M/M/1; on ``L`` levels the solved model is M/M/1/L
    (arrivals at the bound left out): ``s_k = (lambda^k - lambda^(L+1)) / (1 -
    lambda^(L+1))``. The adaptive count grows ``L`` until ``s_L`` is at most the
    growth's tolerance: fewer levels for a looser one, the same law on each."""
    lam, counts = 0.9, []
    for tol in (1e-6, 1e-12):
        fp = meanfield.fixed_point("random", lam, solver=LevelGrowth(tol=tol))
        L = fp.tail.size - 1
        counts.append(L)
        assert fp.status == Status.CONVERGED and fp.tail[L] <= tol
        k = np.arange(L + 1)
        mm1l = (lam**k - lam ** (L + 1)) / (1.0 - lam ** (L + 1))
        # Newton stops at a drift of 1e-12; the state's error is at most that over
        # M/M/1's spectral gap (1 - sqrt(lambda))^2 = 0.0026: 3.8e-10
        np.testing.assert_allclose(fp.tail, mm1l, rtol=0, atol=4e-10)
    assert counts[0] < counts[1]


def test_newton_settings_reach_the_solver_and_throw_false_returns_the_status():
    """Pod(2) with a buffer of 10 (the generic fixed point): the default solve
    converges to the infinite system's tail up to the buffer's effect; one
    Newton step from a short ODE run does not, and says so, raising unless
    ``throw=False``; the defaults given explicitly give the same bits."""
    kwargs = dict(buffer=10, with_quantiles=False)
    default = theory.mean_field("pod", 0.9, **kwargs)
    assert default.status == Status.CONVERGED and "residual" not in default.diagnostics
    same = theory.mean_field("pod", 0.9, solver=Solver(), **kwargs)
    np.testing.assert_array_equal(same.tail, default.tail)
    # lambda^(2^k - 1), to within the residual (the buffer changes the deepest levels)
    np.testing.assert_allclose(
        default.tail, 0.9 ** (2.0 ** np.arange(11) - 1), rtol=1e-9, atol=1e-15
    )

    short = Solver(newton=Newton(max_iter=1), settle=Settle(time=1.0))
    with pytest.raises(RuntimeError, match="did not converge: MAX_ITERATIONS"):
        theory.mean_field("pod", 0.9, solver=short, **kwargs)
    rough = theory.mean_field("pod", 0.9, solver=short, throw=False, **kwargs)
    assert rough.status == Status.MAX_ITERATIONS
    assert np.max(np.abs(rough.tail - default.tail)) > 1e-9
    # the residual is the max-norm of Pod(2)'s drift where it stopped, written here:
    # ds_k/dt = lambda (s_{k-1}^2 - s_k^2) - (s_k - s_{k+1}), k = 1..10, s_11 = 0
    s = np.append(rough.tail, 0.0)
    drift = 0.9 * (s[:-2] ** 2 - s[1:-1] ** 2) - (s[1:-1] - s[2:])
    assert rough.diagnostics["residual"] == pytest.approx(np.max(np.abs(drift)), rel=1e-9)
    assert rough.diagnostics["residual"] > 1e-12


def test_settings_reach_the_mean_field_by_class():
    """Random with Erlang-2 service is M/E2/1 at each server: T = 1 + lambda *
    (1 + 1/2) / (2 (1 - lambda)) (Pollaczek-Khinchine, mean service 1, SCV
    1/2). A tolerance of 1e-13 gets it; one Newton step from the empty system
    does not, and with ``throw=False`` says so."""
    lam = 0.7
    exact = 1.0 + lam * 1.5 / (2.0 * (1.0 - lam))
    tight = theory.mean_field("random", lam, service="erlang:2", solver=Newton(tol=1e-13))
    assert tight.mean_response_time == pytest.approx(exact, rel=1e-9)
    one = Solver(newton=Newton(max_iter=1), settle=Settle(time=0.0))
    rough = theory.mean_field("random", lam, service="erlang:2", solver=one, throw=False)
    assert rough.status == Status.MAX_ITERATIONS and rough.diagnostics["residual"] > 1e-12


def test_bracketed_root_finds_known_roots_and_reports_how_it_ended():
    """``x^3 = 2`` and the Dottie number (``cos x = x``, 0.7390851332151607),
    from either sign at the low end; the aux of the last evaluation comes back;
    two evaluations are not enough and the status says so."""
    cube = bracketed_root(lambda x: (x**3 - 2.0, x), 0.0, 2.0, -2.0, 6.0, rtol=1e-15, ftol=0.0)
    assert cube.status == Status.CONVERGED and cube.aux == cube.x
    assert cube.x == pytest.approx(2.0 ** (1.0 / 3.0), rel=4e-15)
    dottie = bracketed_root(
        lambda x: (np.cos(x) - x, None), 0.0, 1.0, 1.0, np.cos(1.0) - 1.0, rtol=1e-15, ftol=0.0
    )
    assert dottie.x == pytest.approx(0.7390851332151607, rel=4e-15)
    short = bracketed_root(
        lambda x: (x**3 - 2.0, None), 0.0, 2.0, -2.0, 6.0, rtol=1e-15, ftol=0.0, max_iter=2
    )
    assert short.status == Status.MAX_ITERATIONS and short.iterations == 2


def test_the_mph1_tail_decay_against_its_closed_forms():
    """M/E2/1's decay: ``theta`` solves ``(2 / (2 - theta))^2 = 1 + theta / lambda``;
    dividing out ``theta = 0`` leaves ``theta^2 + (lambda - 4) theta + 4 - 4 lambda
    = 0``, whose root below 2 (the phases' rate) is ``theta = (4 - lambda -
    sqrt(lambda^2 + 8 lambda)) / 2``; ``eta = lambda / (lambda + theta)``."""
    for lam in (0.3, 0.7, 0.95):
        theta = (4 - lam - np.sqrt(lam**2 + 8 * lam)) / 2
        assert mph1_tail_decay(lam, erlang(2)) == pytest.approx(lam / (lam + theta), rel=1e-13)


def test_the_mph1_tail_is_mm1_with_exponential_service_and_decays_at_its_rate():
    """Exponential service: the M/M/1 tail lambda^k exactly (to rounding). Erlang-2:
    the matrix-geometric tail falls by the decay rate found by the root above."""
    from jaxqueue.core.service import exponential

    k = np.arange(31)
    np.testing.assert_allclose(mph1_tail(0.8, exponential(), 30), 0.8**k, rtol=1e-12)
    tail = mph1_tail(0.7, erlang(2), 60)
    assert tail[60] / tail[59] == pytest.approx(mph1_tail_decay(0.7, erlang(2)), rel=1e-9)
