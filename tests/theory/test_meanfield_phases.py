"""The generic mean field with phase-type service (jaxqueue.theory.generic.phases).

Compilations are per (policy, phases, levels, I-queue levels): the cases share
them where they can (the exponential points are solved once, the two-phase
laws at 40 levels share Pod(2)'s and JIQ's).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxqueue import theory
from jaxqueue.core.config import Bounds
from jaxqueue.core.service import (
    PhaseType,
    erlang,
    exponential,
    fit_two_moments,
    hyperexponential,
    mph1_mean_response_time,
)
from jaxqueue.core.status import Status
from jaxqueue.policies import make
from jaxqueue.theory import Settle
from jaxqueue.theory.generic import meanfield, phases
from jaxqueue.theory.generic.limit import Limit

LOAD = 0.9
#: I-queue sizes represented at r = 10 (Q_30 ~ 1e-15): a smaller grid than the default
J = 30
CASES = {"pod": dict(d=2), "jiq": dict(ratio=10.0, iqueue_levels=J), "jsq": {}}
#: exponential service with mean 1, written as two phases
DISGUISED = PhaseType((0.5, 0.5), ((-1.0, 0.0), (0.0, -1.0)), "exp-in-2-phases")

_cache = {}


def _point(name, service):
    """The phase-type fixed point of CASES[name] at LOAD, solved once per module.

    Exponential service: Newton alone from the empty system (``Settle(time=0)``),
    which spares a compilation; the other laws take the default path (an ODE
    run, then Newton), so both paths are exercised.
    """
    key = (name, service if isinstance(service, str) else service.label)
    if key not in _cache:
        opts = dict(CASES[name])
        ratio, iq = opts.pop("ratio", None), opts.pop("iqueue_levels", None)
        solver = Settle(time=0.0) if key[1] == "exp" else None
        limit = Limit(name, ratio, service=service, **opts)
        _cache[key] = phases.fixed_point(limit, LOAD, bounds=Bounds(None, iq), solver=solver)
    return _cache[key]


@pytest.mark.parametrize(
    "name",
    [
        "pod",
        pytest.param("jiq", marks=pytest.mark.slow),
        pytest.param("jsq", marks=pytest.mark.slow),
    ],
)
def test_unit_exponential_reproduces_the_generic_mean_field(name):
    """One phase of rate 1 is the exponential mean field: its drift
    (:func:`meanfield.drift`, whose zero ``meanfield.fixed_point`` solves for)
    vanishes at the phase-type fixed point, and the tails are the closed forms,
    which ``meanfield.fixed_point`` reproduces (tests/theory/test_meanfield.py).
    Comparing with ``meanfield.fixed_point`` itself would compile its own
    Newton step, about 6 s for JIQ."""
    fp = _point(name, exponential())
    assert fp.status is Status.CONVERGED and fp.residual < 1e-12
    assert fp.levels == meanfield.DEFAULT_LEVELS and fp.phase_counts.shape == (fp.levels + 1, 1)
    assert np.all(fp.phase_counts[0] == 0.0)
    opts = dict(CASES[name])
    ratio = opts.pop("ratio", None)
    pol = make(name, d=opts.get("d"))
    system = meanfield.limit_system(pol, ratio, fp.levels, opts.get("iqueue_levels", 0))
    x = np.concatenate([fp.tail[1:], fp.iq_tail[1:] if ratio else []])
    with jax.enable_x64(True):
        f = jax.jit(meanfield.drift, static_argnames=("policy", "system"))(
            jnp.asarray(x), jnp.float64(LOAD), jnp.float64(ratio or 1.0), pol, system
        )
    assert np.max(np.abs(np.asarray(f))) < 1e-12
    closed = theory.mean_field(name, LOAD, ratio, d=opts.get("d"))
    k = min(closed.tail.size, fp.tail.size)
    np.testing.assert_allclose(fp.tail[:k], closed.tail[:k], rtol=0, atol=1e-8)
    # the tails are the phase counts summed from the top
    counts = fp.phase_counts[:, 0]
    np.testing.assert_allclose(fp.tail[1:], np.cumsum(counts[::-1])[::-1][1:], atol=1e-15)
    assert fp.mean_queue_length == pytest.approx(fp.tail[1:].sum(), rel=1e-15)
    assert fp.mean_response_time == pytest.approx(fp.mean_queue_length / LOAD, rel=1e-15)
    assert fp.mean_response_time == pytest.approx(closed.mean_response_time, rel=1e-8)
    if ratio is None:
        assert fp.iq_tail is None and fp.p0 is None
    else:
        assert q_conserved(fp, ratio)
        assert fp.p0 == pytest.approx(closed.p0, abs=1e-8)


def q_conserved(fp, ratio):
    """The I-queues list exactly the idle servers."""
    return abs(fp.iq_tail[1:].sum() / ratio - (1.0 - fp.tail[1])) < 1e-12


def _random_levels():
    if "random" not in _cache:
        law = hyperexponential(4.0)
        limit = Limit("random", service=law)
        _cache["random"] = phases.fixed_point(limit, 0.7, solver=Settle(time=0.0)).levels
        assert phases.mph1_tail_decay(0.7, law) ** _cache["random"] < phases.LEVEL_TOL
    return _cache["random"]


@pytest.mark.parametrize(
    "law",
    [
        pytest.param(erlang(3), marks=pytest.mark.slow),
        hyperexponential(4.0),
        fit_two_moments(1.0, 0.5),
    ],
    ids=lambda law: law.label,
)
def test_random_routing_gives_independent_mph1_queues(law):
    # hyperexp:4 has the longest tail: its adaptive level count (from the M/PH/1 tail decay)
    # for all three, so that the two-phase laws share a compilation
    levels = _random_levels()
    # the drift is linear: Newton from the empty system, no ODE run
    limit, bounds = Limit("random", service=law), Bounds(levels)
    fp = phases.fixed_point(limit, 0.7, bounds=bounds, solver=Settle(time=0.0))
    assert fp.status is Status.CONVERGED and fp.levels == levels
    assert fp.truncated[0] < 1e-12
    assert fp.tail[1] == pytest.approx(0.7, abs=1e-12)  # the fraction busy is the load
    expected = mph1_mean_response_time(0.7, law)
    assert fp.mean_response_time == pytest.approx(expected, rel=1e-6)
    # the phase of the task in service at a busy server: the in-service mix
    busy = fp.phase_counts.sum(axis=0)
    np.testing.assert_allclose(busy / busy.sum(), law.in_service_mix(), atol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pod", "jiq"])
def test_an_exponential_law_in_two_phases_gives_the_exponential_tails(name):
    fp, exp = _point(name, DISGUISED), _point(name, exponential())
    assert fp.status is Status.CONVERGED and fp.levels == exp.levels
    np.testing.assert_allclose(fp.tail, exp.tail, rtol=0, atol=1e-10)
    np.testing.assert_allclose(fp.phase_counts[:, 0], fp.phase_counts[:, 1], atol=1e-12)
    if name == "jiq":
        np.testing.assert_allclose(fp.iq_tail, exp.iq_tail, rtol=0, atol=1e-10)


@pytest.mark.slow
def test_jiq_with_phases_keeps_its_iqueue_conservation_law():
    fp = _point("jiq", "erlang:2")
    assert fp.status is Status.CONVERGED and fp.phase_counts.shape[1] == 2
    r, q, s = 10.0, fp.iq_tail, fp.tail
    assert fp.p0 == pytest.approx(1.0 - q[1], abs=1e-15)
    # the I-queues list exactly the idle servers; the busy fraction is the load
    assert q[1:].sum() / r == pytest.approx(1.0 - s[1], abs=1e-12) and q_conserved(fp, r)
    assert s[1] == pytest.approx(LOAD, abs=1e-12)
    # joins balance the departures that leave a server idle
    done = fp.phase_counts[1] @ fp.service.exit_rates
    assert done == pytest.approx(LOAD * fp.rates.level[0], rel=1e-10)
    # p0 sees the law only through the idle fraction 1 - lambda: the exponential p0
    assert fp.p0 == pytest.approx(_point("jiq", exponential()).p0, abs=1e-10)
    # less variable service, shorter response times
    assert fp.mean_response_time < _point("jiq", exponential()).mean_response_time


@pytest.mark.slow
def test_pod2_erlang_is_faster_than_hyperexponential():
    erl = phases.fixed_point(Limit("pod", d=2, service="erlang:4"), LOAD)
    hyp = _point("pod", "hyperexp:4")
    assert erl.status is Status.CONVERGED and hyp.status is Status.CONVERGED
    exp = _point("pod", exponential())
    assert erl.mean_response_time < exp.mean_response_time < hyp.mean_response_time
    assert hyp.truncated[0] < phases.LEVEL_TOL  # the adaptive level count covers the longer tail


@pytest.mark.slow
def test_transient_keeps_the_conservation_law_and_rests_at_the_fixed_point():
    fp = _point("jiq", "erlang:2")
    times = np.array([0.0, 1.0, 5.0, 20.0])
    limit, bounds = Limit("jiq", 10.0, service="erlang:2"), Bounds(None, J)
    tr = phases.transient(limit, LOAD, times=times, bounds=bounds)
    assert tr.tails.shape == (4, fp.levels + 1) and tr.phase_counts.shape == (4, fp.levels + 1, 2)
    np.testing.assert_allclose(tr.tails[0, 1:], 0.0)  # the empty system
    assert np.all(np.diff(tr.tails[:, 1]) > 0)
    listed = tr.iq_tails[:, 1:].sum(axis=1)
    np.testing.assert_allclose(listed / 10.0, 1.0 - tr.tails[:, 1], atol=1e-10)
    rest = phases.transient(limit, LOAD, times=[3.0], start=fp, bounds=bounds)
    np.testing.assert_allclose(rest.tails[0], fp.tail, atol=1e-10)


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match="service='gamma:2'"):
        phases.fixed_point(Limit("pod", service="gamma:2"), LOAD)
    with pytest.raises(TypeError, match="service must be"):
        phases.fixed_point(Limit("pod", service=3), LOAD)
    with pytest.raises(ValueError, match="load=0.6 is out of range"):
        phases.fixed_point(Limit("pod", service=erlang(2, mean=2.0)), 0.6)  # 1.2 a server
    for name in ("jiq-original", "jiq-threshold"):
        with pytest.raises(ValueError, match="phase-type service covers the exchangeable policies"):
            phases.fixed_point(Limit(name, 10.0, service="erlang:2"), LOAD)
    with pytest.raises(ValueError, match="ratio=-1"):
        phases.fixed_point(Limit("jiq", -1.0, service="exp"), LOAD)
    with pytest.raises(ValueError, match="levels=0"):
        phases.fixed_point(Limit("pod", service="exp"), LOAD, bounds=Bounds(0))
    with pytest.raises(ValueError, match="times must be"):
        phases.transient(Limit("pod", service="exp"), LOAD, times=[2.0, 1.0])
    assert theory.generic.phases is phases
