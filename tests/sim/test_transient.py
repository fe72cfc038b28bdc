"""Transient estimates (:mod:`jaxqueue.sim.transient`).

The ensemble estimate at time ``t`` weights the embedded chain's states by
the Poisson law of the number of uniformized steps by ``t``: it is exact in
time. Checked against the exact transient law of small systems, ``p(t) =
p(0) exp(Q t)`` with the generator ``Q`` of the exact solver's chain (an
independent per-server implementation), and against the mean-field ODE at
``N = 1000``. Comparisons are two-sided Student-t tests for the replicas
used (:func:`jaxqueue.tolerance`), family-wise 0.001 (Bonferroni) over the
comparisons of this file (:data:`FAMILY`).
"""

import jax
import numpy as np
import pytest
from agreement import assert_near_mean_field
from scipy.linalg import expm

import jaxqueue as jq
from jaxqueue.exact.chain import Chain, PhaseChain, enumerate_states
from jaxqueue.results.stats import tolerance
from jaxqueue.runs.transient import transient
from jaxqueue.sim.transient import _last_step, poisson_weights
from jaxqueue.studies.transient import transient_study

ONE = jax.devices()[:1]
TIMES = [0.25, 1.0, 3.0]
# exact: 2 cases x 3 times x (s_1, s_2, p0), and with pools 3 times x (busy
# fraction and mean queue of 2 pools); mean field: 3 times x (s_1, s_2, s_3, p0);
# phase-type mean field: 3 times x (s_1, s_2, s_3)
FAMILY = 2 * 3 * 3 + 3 * 4 + 3 * 4 + 3 * 3


def _close(est, value, what):
    err = np.abs(np.asarray(est.mean) - np.asarray(value))
    tol = tolerance(est, FAMILY)
    assert np.all(err <= tol), f"{what}: simulated {est.mean} ± {tol}, reference {value}"


def _exact_transient(rule, n, m, lam, d, cap, times):
    chain = Chain(rule, n, m, lam, d, 0, cap, True)
    states, rows, cols, vals, _ = enumerate_states(chain, 10_000)
    q = np.zeros((len(states), len(states)))
    np.add.at(q, (rows, cols), vals)
    q -= np.diag(q.sum(axis=1))
    decoded = [chain.decode(s) for s in states]
    qs = np.array([x for x, _ in decoded])
    tails = np.stack([(qs >= k).sum(axis=1) / n for k in range(cap + 1)], axis=1)
    if chain.listed:
        ls = np.array([l for _, l in decoded])
        empty = np.array([sum(1 for j in range(m) if not np.any(row == j)) for row in ls]) / m
    else:
        empty = np.zeros(len(states))
    start = np.zeros(len(states))
    start[0] = 1.0  # the empty system (idle servers spread over the I-queues)
    out = [start @ expm(q * t) for t in times]
    return np.array([p @ tails for p in out]), np.array([p @ empty for p in out])


@pytest.mark.parametrize("rule, m", [("pod", 1), ("jiq", 2)])
@pytest.mark.slow
def test_against_the_exact_transient_law(rule, m):
    n, lam, cap = 3, 0.8, 3
    res = transient(
        rule,
        lam,
        n,
        m,
        times=TIMES,
        replicas=256,
        seed=4,
        buffer=cap,
        iqueue_levels=n if m > 1 else None,
        devices=ONE,
    )
    tails, p0 = _exact_transient(rule, n, m, lam, 2, cap, TIMES)
    for k in (1, 2):
        est = jq.Estimate(res.tail.mean[:, k], res.tail.ci95[:, k], res.tail.n)
        _close(est, tails[:, k], f"{rule} s_{k}(t)")
    if m > 1:
        _close(res.p0, p0, f"{rule} p0(t)")
    np.testing.assert_allclose(res.idle_fraction.mean, 1.0 - res.tail.mean[:, 1])


@pytest.mark.slow
def test_pools_against_the_exact_transient_law():
    """Pod(2) on 3 servers, one twice as fast, from empty: each pool's busy
    fraction and mean queue length at each time, read from the class counts,
    against ``p(0) exp(Q t)`` of the exact chain with pools."""
    from jaxqueue.core.service import exponential, make_pools

    n, lam, cap, spec = 3, 1.0, 3, "0.34:2,0.66:1"
    res = transient(
        "pod", lam, n, times=TIMES, replicas=256, seed=8, buffer=cap, pools=spec, devices=ONE
    )
    pools = make_pools(spec, n)
    chain = PhaseChain("pod", n, 1, lam, 2, 0, cap, True, exponential(), pools)
    states, rows, cols, vals, _ = enumerate_states(chain, 10_000)
    q = np.zeros((len(states), len(states)))
    np.add.at(q, (rows, cols), vals)
    q -= np.diag(q.sum(axis=1))
    decoded = [chain.decode(x)[0] for x in states]
    lengths = np.array([chain.queue_lengths(d) for d in decoded])
    labels = np.array([chain.pool_labels(d) for d in decoded])
    start = np.zeros(len(states))
    start[int(np.flatnonzero(lengths.sum(axis=1) == 0)[0])] = 1.0  # the empty system
    laws = [start @ expm(q * t) for t in TIMES]
    for i, pool in enumerate(pools):
        mine = labels == i
        busy = ((lengths > 0) & mine).sum(axis=1) / pool.count
        queue = np.where(mine, lengths, 0).sum(axis=1) / pool.count
        for name, f in (("pool_utilization", busy), ("pool_mean_queue_length", queue)):
            est = getattr(res, name)
            _close(
                jq.Estimate(est.mean[:, i], est.ci95[:, i], est.n),
                [p @ f for p in laws],
                f"{name} of pool {i}",
            )
    # the pools make up the whole: their busy fractions weighted by size give s_1
    np.testing.assert_allclose(
        res.pool_utilization.mean @ np.array([1.0, 2.0]) / 3, res.tail.mean[:, 1], rtol=1e-5
    )


@pytest.mark.slow
def test_load_step_against_the_mean_field_ode():
    """JIQ, N = 1000, r = 10, load 0.5 -> 0.95 from the stationary regime.

    Finite-N allowance: the mean field is the N -> infinity limit; at N
    servers its error is O(1/N), allowed as the house 10 / N times
    ``min(p, 1 - p)`` on every fraction (tests/agreement.py): at most 0.0045
    here, against gaps of at most 0.0085 (s_1 at t = 1) and tolerances of
    0.009-0.07; no gap above 0.2 of its tolerance.
    """
    n = 1000
    study = transient_study(
        "jiq",
        0.95,
        n,
        100,
        times=[1.0, 4.0, 16.0],
        start_load=0.5,
        warmup_time=20.0,
        replicas=16,
        seed=5,
    )
    res, rows = study["result"], study["rows"]
    checks = [(res.p0, [r["mf_p0"] for r in rows], "p0")]
    for k in (1, 2, 3):
        est = jq.Estimate(res.tail.mean[:, k], res.tail.ci95[:, k], res.tail.n)
        checks.append((est, [r[f"mf_s{k}"] for r in rows], "tail"))
    assert_near_mean_field(checks, FAMILY, n)


@pytest.mark.slow
def test_load_step_with_a_phase_type_law_against_its_mean_field_ode():
    """Pod(2), hyperexponential service of SCV 4, N = 1000, load 0.5 -> 0.9 from
    the stationary regime (the phase-type mean field's joint law of queue
    length and phase, then 10 time units at 0.5), against the phase-type
    mean-field ODE. Finite-N allowance 10 / N times ``min(p, 1 - p)``, as above:
    at most 0.0044, against gaps of at most 0.011 (s_2 at t = 2) and
    tolerances of 0.014-0.046; no gap above 0.36 of its tolerance."""
    n = 1000
    study = transient_study(
        "pod",
        0.9,
        n,
        times=[0.5, 2.0, 8.0],
        start_load=0.5,
        warmup_time=10.0,
        replicas=16,
        seed=6,
        service="hyperexp:4",
    )
    res, rows = study["result"], study["rows"]
    assert res.settings["service"]["label"] == "hyperexp:4"  # the law is recorded
    checks = []
    for k in (1, 2, 3):
        est = jq.Estimate(res.tail.mean[:, k], res.tail.ci95[:, k], res.tail.n)
        checks.append((est, [r[f"mf_s{k}"] for r in rows], "tail"))
    assert_near_mean_field(checks, FAMILY, n)
    # the ODE moved: the step is not compared with a flat line
    assert rows[-1]["mf_s2"] > rows[0]["mf_s2"] + 0.2


def test_poisson_weights_and_the_last_step():
    w = poisson_weights(np.array([0.0, 3.5, 400.0]), np.arange(2000))
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert w[0, 0] == 1.0 and np.all(w[0, 1:] == 0.0)
    n = _last_step(400.0)
    assert poisson_weights(np.array([400.0]), np.arange(n + 1)).sum() > 1.0 - 1e-12


def test_bad_inputs_fail_before_compiling():
    with pytest.raises(ValueError, match="times"):
        transient("pod", 0.9, 10, times=[])
    with pytest.raises(ValueError, match="times"):
        transient("pod", 0.9, 10, times=[-1.0])
    with pytest.raises(ValueError, match="load"):
        transient("pod", 1.2, 10, times=[1.0])
    with pytest.raises(ValueError, match="warmup_time"):
        transient("pod", 0.9, 10, times=[1.0], start_load=0.5, warmup_time=-1)
    with pytest.raises(NotImplementedError, match="expected wait"):  # no mean field to compare
        transient_study("jsew", 0.9, 10, times=[1.0], pools="0.5:2,0.5:0.5")


@pytest.mark.slow
def test_command_line_json_and_text_with_pools(capsys):
    """Pools, whose ODE is the mean field by pool (the text names the pools)."""
    from jaxqueue.cli import main

    args = [
        "transient",
        "--policy",
        "pod",
        "--servers",
        "20",
        "--load",
        "0.8",
        "--times",
        "0.5,2",
        "--replicas",
        "4",
        "--pools",
        "0.5:2,0.5:1",
    ]
    assert main(args + ["--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "transient" and out["times"] == [0.5, 2.0]
    assert len(out["rows"]) == 2 and {"s1", "mf_s1", "s1_ci95"} <= set(out["rows"][0])
    assert out["settings"]["replicas"] == 4 and out["settings"]["versions"]["jaxqueue"]
    assert out["settings"]["pools"] == [
        {"servers": 10, "speed": 2.0, "service": None},
        {"servers": 10, "speed": 1.0, "service": None},
    ]
    assert out["rows"][1]["mf_s1"] > out["rows"][0]["mf_s1"] > 0  # the ODE from empty
    assert len(out["pool_utilization"]["mean"]) == 2  # (times, pools)
    assert {"busy0", "busy1_ci95", "mf_busy1"} <= set(out["rows"][0])
    # the fast pool's ODE busy fraction moves from empty, below the slow pool's
    assert 0 < out["rows"][0]["mf_busy0"] < out["rows"][0]["mf_busy1"]
    for row in out["rows"]:  # two pools of 10: their busy fractions average to s_1
        assert 0.5 * (row["mf_busy0"] + row["mf_busy1"]) == pytest.approx(row["mf_s1"], abs=1e-12)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "pools 10 servers at speed 2, 10 servers at speed 1" in text
    assert "mean field s_1, s_2" in text
    assert "busy, speed 2" in text and "busy, speed 1" in text


def test_the_horizon_bound_is_the_default_where_it_covers_the_run():
    """Idle-first with ``d = 1`` and no ``levels``, buffer, service law or pools: the
    bound of the transient's horizon from its start; anything else keeps its bound."""
    from jaxqueue.core.config import Bounds, Model
    from jaxqueue.runs import bounds
    from jaxqueue.runs import transient as module

    lam, pol = 0.9, jq.make("idle-first", d=1)
    want = bounds.horizon_levels(pol, 100, lam, 5.0, start_top=3)
    bare = Model("idle-first", 100, d=1)
    assert module._horizon_bound(bare, Bounds(), lam, 5.0, 3) == Bounds(want)
    given = Bounds(levels=12)
    assert module._horizon_bound(bare, given, lam, 5.0, 3) is given
    for other in (Model("idle-first", 100, d=2), Model("idle-first", 100, d=1, buffer=6)):
        assert module._horizon_bound(other, Bounds(), lam, 5.0, 3) == Bounds()
    assert [module._init_top(x) for x in ("empty", "mean-field", [0.0, 0.5, 0.5, 0.0])] == [0, 1, 2]


@pytest.mark.slow
def test_idle_first_d1_transient_defaults_to_the_horizon_bound(monkeypatch):
    """The default transient of idle-first ``d = 1`` gets the horizon's bound (far
    below the stationary default) and the numbers of that ``levels=`` given; a
    start that holds a longer queue than taken is planned again from it."""
    from jaxqueue.runs import bounds
    from jaxqueue.runs import transient as module

    lam, pol = jq.halfin_whitt_load(100, 1.0), jq.make("idle-first", d=1)
    args = dict(times=[0.0, 1.0], replicas=4, seed=3, devices=ONE)
    top = bounds.horizon_levels(pol, 100, lam, 1.0, start_top=1)
    default = transient("idle-first", lam, 100, d=1, init=[0.0, 1.0], **args)
    given = transient("idle-first", lam, 100, d=1, init=[0.0, 1.0], levels=top, **args)
    assert default.settings["levels"] == top < bounds.default_levels(pol, 100, 1, lam) / 5
    for name in ("tail", "idle_fraction", "mean_queue_length"):
        a, b = getattr(default, name), getattr(given, name)
        assert np.array_equal(a.mean, b.mean) and np.array_equal(a.ci95, b.ci95), name
    start = [0.0, 0.5, 0.3, 0.2]  # taken to be empty: the start's three tasks re-plan it
    monkeypatch.setattr(module, "_init_top", lambda init: 0)
    res = transient("idle-first", lam, 100, d=1, init=start, **args)
    assert res.settings["levels"] == bounds.horizon_levels(pol, 100, lam, 1.0, start_top=3) > top
