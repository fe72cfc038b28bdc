"""User-defined metrics: time and per-arrival averages of functions of the occupancy state.

The independent check is Random routing, under which the ``N`` servers are independent
M/M/1 queues at load ``lambda`` (product form): at ``N = 2`` the law of the state, and so
of any function of it, is known exactly. The per-arrival averages equal the time averages
(Poisson arrivals see time averages).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from typing import ClassVar

import jax
import numpy as np
import pytest
from chains import (
    Rule,
    accepted_average,
    farm,
    pod_stationary,
    shortest_queue,
    solve_farm,
    uniform_server,
)

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.core.user_metrics import (
    PER_ARRIVAL,
    MetricState,
    UserMetric,
    UserMetricWarning,
    at_fixed_point,
    at_state,
    metric_names,
    metric_settings,
    user_metrics,
)
from jaxqueue.results.simulation import user_metric_samples
from jaxqueue.results.stats import within
from jaxqueue.sim.totals import COUNTS, Totals
from jaxqueue.studies.grids.grid import run_grid
from jaxqueue.studies.grids.points import SpecError
from jaxqueue.studies.grids.spec import parse_spec
from jaxqueue.studies.grids.store import Store

LAM = 0.5
#: Random routing at N = 2: a server is busy with probability LAM, independently.
EXACT = {
    "idle": 1 - LAM,  # 1 - s[1]
    "both": LAM**2,  # P(both servers busy)
    "square": (2 * LAM * (1 - LAM) + 4 * LAM**2) / 4,  # E[s_1^2], s_1 = Binomial(2, LAM) / 2
    "waiting": 1 - (1 - LAM**2) ** 2,  # P(some server holds two tasks or more)
    "empty": 1 - LAM,  # a function: q[0]
}
METRICS = {
    "mq": "sum(s[1:])",
    "idle": "1 - s[1]",
    "both": "where(s[1] >= 1, 1, 0)",
    "square": "s[1]**2",
    "waiting": "where(s[2] > 0, 1, 0)",
    "empty": lambda state: state.q[0],
}
#: The comparisons with exact values below: each of EXACT, over time and at arrivals.
FAMILY = 2 * len(EXACT)
RUN = dict(replicas=8, steps=2**17, warmup=2**12, seed=5, levels=24, init="empty")


@pytest.fixture(scope="module")
def random2():
    return jq.simulate("random", LAM, 2, metrics=METRICS, interval="replicas", **RUN)


# -- cheap: names, expressions, checks before compiling ---------------------------------


def test_names_and_settings():
    found = user_metrics({"a": "s[1]", "b": "alpha * s[1]"}, {"alpha": 0.5})
    assert [m.name for m in found] == ["a", "b"]
    assert found[1].constants == (("alpha", 0.5),)
    assert metric_names(found) == ("a", "b", "a" + PER_ARRIVAL, "b" + PER_ARRIVAL)
    assert metric_settings(found) == {"a": "s[1]", "b": "alpha * s[1]  [alpha=0.5]"}
    # equal metrics are one static argument: one compiled program
    assert user_metrics({"a": "s[1]"}) == user_metrics({"a": "s[1]"}, {"alpha": None})


@pytest.mark.parametrize(
    ("metrics", "says"),
    [
        ({"x": "lg(s[1])"}, "did you mean 'log'"),
        ({"x": "s.sum()"}, "attribute access"),
        ({"x": "iq[1]"}, "reads iq, but pod"),
        ({"mean_queue_length": "s[1]"}, "built-in metric"),
        ({"x_per_arrival": "s[1]"}, "may not end in"),
        ({"2x": "s[1]"}, "identifier"),
        ({"x": 3}, "an expression (str) or a function"),
        ({"x": lambda st: st.s}, "must give a scalar"),
    ],
)
def test_bad_metrics_are_refused_before_anything_runs(metrics, says):
    with pytest.raises((ValueError, TypeError)) as err:
        jq.simulate("pod", 0.7, 10, metrics=metrics, replicas=2, steps=256, levels=8, init="empty")
    assert says in str(err.value)


def test_the_register_layout_refuses_user_metrics():
    with pytest.raises(ValueError, match="metrics= needs backend 'xla' or 'auto', not 'pallas'"):
        jq.simulate("pod", 0.7, 10, metrics={"x": "s[1]"}, backend="pallas", replicas=2)


def test_samples_from_sums():
    sums = {
        "steps": np.array([4, 8]),
        "seen": np.array([[2, 0], [1, 1]]),
        "user": np.array([[[2.0], [1.0]], [[4.0], [3.0]]]),  # (R, 2, K)
    }
    out = user_metric_samples(sums, (("m", "m_at"),))
    np.testing.assert_array_equal(out["m"], [0.5, 0.5])
    np.testing.assert_array_equal(out["m_at"], [0.5, 1.5])


def test_host_totals_add_the_compensated_sums():
    totals = Totals.zeros(1, 2, 1, 10, 1, n_user=1)
    chunk = {f"tail_{w}": np.zeros((1, 3), np.int64) for w in ("lo", "hi", "delta")}
    chunk.update({f"iq_{w}": np.zeros((1, 1), np.int64) for w in ("lo", "hi", "delta")})
    chunk.update({k: np.zeros_like(v) for k, v in totals.arrays.items() if k in COUNTS})
    chunk["user"] = np.array([[[1.0], [2.0]]], np.float32)
    chunk["user_comp"] = np.array([[[2.0**-30], [0.0]]], np.float32)
    totals.add(chunk)
    totals.add(chunk)
    np.testing.assert_array_equal(totals.sums()["user"], [[[2 - 2.0**-29], [4.0]]])


def test_fixed_point_values_are_float64():
    state_tail = np.array([1.0, 0.5, 0.25, 0.0])
    found = user_metrics({"a": "sum(s[1:])", "f": lambda st: st.q[0], "i": "iq[1]"})
    got = at_state(found, state_tail, 100, 1, 0.5)
    assert got["a"] == 0.75 and got["a" + PER_ARRIVAL] == 0.75
    assert got["f"] == 0.5
    assert got["i"] is None  # no I-queue tails at a fixed point without them


@dataclasses.dataclass(frozen=True)
class _FixedPoint:
    """What :func:`at_fixed_point` reads of a mean-field result."""

    source: ClassVar[str] = "mean-field"
    tail: tuple
    iqueue_distribution: tuple | None = None
    p0: float | None = None
    user_metrics: dict = dataclasses.field(default_factory=dict)


def test_a_mean_field_gives_the_metric_at_its_fixed_point():
    found = user_metrics({"p": "1 - iq[1]", "b": "s[1]", "i2": "iq[2]"})
    several = _FixedPoint((1.0, 0.5, 0.1), iqueue_distribution=(0.25, 0.5, 0.25))
    got = at_fixed_point(several, found, 50, 10, 0.5).user_metrics
    assert got == {"p": 0.25, "b": 0.5, "i2": 0.25} | {
        k + PER_ARRIVAL: v for k, v in (("p", 0.25), ("b", 0.5), ("i2", 0.25))
    }
    one = at_fixed_point(_FixedPoint((1.0, 0.5, 0.1), p0=0.2), found, 50, 1, 0.5).user_metrics
    assert one["p"] == pytest.approx(0.2) and one["i2"] is None  # one I-queue: iq = [1, 1 - p0]
    assert at_fixed_point(None, found, 50, 1, 0.5) is None


def test_a_metric_sees_a_named_tuple():
    seen = []
    metric = UserMetric("m", lambda st: seen.append(st) or st.s[1])
    state = MetricState(np.array([1.0, 0.4]), np.array([0.6, 0.4]), 2.0, 1.0, 0.5)
    assert metric(state) == 0.4 and seen[0].iq is None


def test_spec_metrics_are_checked_with_their_line():
    base = '[grid]\npolicy = ["pod"]\nn_servers = [6]\nload = [0.5]\n[run]\nreplicas = 2\nsteps = 1024\n'
    with pytest.raises(SpecError, match=r"line 10: .*did you mean 'alpha'"):
        parse_spec(base + "[metrics]\nok = 's[1]'\nbad = 'alhpa * s[1]'\n")
    with pytest.raises(SpecError, match="must be an expression string"):
        parse_spec(base + "[metrics]\nbad = 3\n")
    spec = parse_spec(base + "[metrics]\nbusy = 's[1]'\n")
    assert spec.metrics == (("busy", "s[1]"),)


def test_cli_metric_definitions_are_checked(capsys):
    with pytest.raises(SystemExit):
        cli_main(
            ["simulate", "--policy", "pod", "--servers", "5", "--load", "0.5", "--metric", "x"]
        )
    assert "not NAME=EXPR" in capsys.readouterr().err
    argv = ["simulate", "--policy", "pod", "--servers", "5", "--load", "0.5"]
    assert cli_main(argv + ["--metric", "x=lg(s[1])"]) == 2
    assert "did you mean 'log'" in capsys.readouterr().err


# -- one compiled program: Random routing at N = 2 ---------------------------------------


@pytest.mark.slow
def test_a_user_metric_equal_to_a_built_in_one_gives_its_estimate(random2):
    user = random2.user_metrics
    assert user["mq"].n == random2.mean_queue_length.n
    np.testing.assert_allclose(user["mq"].mean, random2.mean_queue_length.mean, rtol=1e-6)
    np.testing.assert_allclose(user["mq"].ci95, random2.mean_queue_length.ci95, rtol=1e-4)
    np.testing.assert_allclose(user["idle"].mean, 1 - random2.tail.mean[1], rtol=1e-6)


@pytest.mark.slow
def test_time_and_arrival_averages_against_the_product_form(random2):
    for name, value in EXACT.items():
        for key in (name, name + PER_ARRIVAL):
            assert within(random2.user_metrics[key], value, FAMILY), (key, value)
    # under Random routing the server an arrival joins is busy as often as servers are
    assert within(random2.waiting_probability, LAM, 1)


@pytest.mark.slow
def test_results_carry_the_metrics_everywhere(random2):
    assert random2.metric("both") is random2.user_metrics["both"]
    assert random2.settings["metrics"]["mq"] == "sum(s[1:])"
    assert random2.settings["metrics"]["empty"].endswith("<lambda>")
    as_json = json.loads(json.dumps(random2.to_dict()))
    assert set(as_json["user_metrics"]) == set(metric_names(user_metrics(METRICS)))
    rows = {r["metric"] for r in random2.records()}
    assert {"both", "both" + PER_ARRIVAL} <= rows
    # and what produced them: the versions, the backend and why (none asked: no note)
    assert random2.settings["versions"]["jaxqueue"] == jq.__version__
    assert random2.settings["versions"]["jax"] == jax.__version__
    assert random2.settings["backend"] == "xla" and random2.settings["backend_note"] is None


@pytest.mark.slow
def test_batch_means_and_a_checkpoint_reuse_the_program(random2, tmp_path):
    res = jq.simulate("random", LAM, 2, metrics=METRICS, interval="batch-means", **RUN)
    assert res.user_metrics["mq"].n == res.mean_queue_length.n == RUN["replicas"] * 20
    np.testing.assert_allclose(res.user_metrics["mq"].ci95, res.mean_queue_length.ci95, rtol=1e-4)
    path = str(tmp_path / "run.npz")
    kw = dict(metrics=METRICS, interval="replicas", checkpoint=path, **RUN)
    first, again = (jq.simulate("random", LAM, 2, **kw) for _ in range(2))
    assert first.user_metrics == again.user_metrics == random2.user_metrics


#: The spec's system: Pod(2) at N = 6, ``lambda = 1 - N**-alpha`` with alpha = 0.5.
SPEC_N, SPEC_ALPHA = 6, 0.5
#: Its exact chain's queues are capped here: the mass at the cap is 1.2e-4
#: (the excess moves by 1.2e-5 from the cap 6 to 10), far below the tolerance (0.017).
SPEC_CAP = 6


def _pod_excess(n, alpha, k, cap):
    """The exact time averages of ``s_1`` and of Theorem 2.1's excess
    ``max(sum(s[1:]) - 1 - k log(N) / N**(1 - alpha), 0)`` for Pod(2) at
    ``lambda = 1 - N**-alpha``, and the mass at the cap (tests/chains.py)."""
    states, pi = pod_stationary(n, 2, 1.0 - n**-alpha, cap)
    tasks = np.array([sum(s) for s in states]) / n
    busy = np.array([sum(x > 0 for x in s) for s in states]) / n
    excess = np.maximum(tasks - 1.0 - k * np.log(n) / n ** (1.0 - alpha), 0.0)
    return float(pi @ busy), float(pi @ excess), float(pi[[s[0] == cap for s in states]].sum())


@pytest.mark.slow
def test_a_spec_metrics_table_end_to_end(tmp_path):
    """A spec's [metrics] through the grid into the store, and Theorem 2.1's
    excess at k = 0.1 (``gap``) against the exact chain of Pod(2) at N = 6
    (0.1175; its ``s_1``, ``busy``, is lambda = 0.5918): 16 replicas of 3400
    time units, each metric over time and at arrivals (the same by PASTA):
    a family of 4. Measured: 0.1163 ± 0.0077 (tolerance 0.017, 0.07 of it
    off). A row forced to 0 would be 6.8 tolerances off, one that summed
    s[2:] 6.2 and one without the max 19."""
    spec = parse_spec(
        '[grid]\npolicy = ["pod"]\nn_servers = [6]\nalpha = [0.5]\n'
        '[run]\nreplicas = 16\nsteps = 32768\nwarmup = 2048\ntheory = "mean-field"\n'
        "[metrics]\nbusy = 's[1]'\n"
        "gap = 'maximum(sum(s[1:]) - 1 - 0.1 * log(N) / N**(1 - alpha), 0)'\n"
    )
    assert run_grid(spec, tmp_path / "s.sqlite") == 1
    with Store.open_existing(tmp_path / "s.sqlite") as store:
        rows = {r["metric"]: r for r in store.rows()}
    busy = rows["busy"]
    assert busy["k"] == -1 and busy["ci95"] > 0
    # the mean field's value of s[1] is its own s_1, the load
    assert busy["theory"] == pytest.approx(rows["busy" + PER_ARRIVAL]["theory"])
    assert busy["theory"] == pytest.approx(busy["load"], rel=1e-6)
    s1, excess, capped = _pod_excess(SPEC_N, SPEC_ALPHA, 0.1, SPEC_CAP)
    assert capped < 1e-3 and excess > 0.1 and s1 == pytest.approx(busy["load"], rel=1e-5)
    for name, exact in (("busy", s1), ("gap", excess)):
        for key in (name, name + PER_ARRIVAL):
            row = rows[key]
            assert row["replicas"] == 16  # > 10: the interval is across replicas, n = 16
            est = jq.Estimate(row["mean"], row["ci95"], row["replicas"])
            assert abs(est.mean - exact) <= jq.tolerance(est, family=4), (key, row, exact)


# -- blocked arrivals: Random and JSQ at N = 2 with two places per server ----------------

#: Per server: ``idle`` the fraction of idle servers, ``queue`` the mean tasks per server.
BLOCKING_METRICS = {"idle": "1 - s[1]", "queue": "sum(s[1:])"}
BLOCKING = dict(load=0.9, buffer=2)
#: Each policy: each metric over time and at arrivals, and the blocking probability.
BLOCKING_FAMILY = 2 * (2 * len(BLOCKING_METRICS) + 1)


def _blocking_reference(rule):
    """Time and accepted-arrival averages of :data:`BLOCKING_METRICS` and the
    blocking probability, from the farm's chain (tests/chains.py), not the simulator."""
    f = farm(2, 1, BLOCKING["load"], BLOCKING["buffer"])
    states, pi, rewards = solve_farm(f, rule)
    values = {
        "idle": lambda st: sum(x == 0 for x in st[0]) / f.n,
        "queue": lambda st: sum(st[0]) / f.n,
    }
    out = {}
    for name, value in values.items():
        out[name] = float(sum(p * value(st) for st, p in zip(states, pi)))
        out[name + PER_ARRIVAL] = accepted_average(f, rule, states, pi, value)
    out["blocking_probability"] = rewards["blocked"] / (f.load * f.n)
    return out


@pytest.mark.parametrize(("policy", "rule"), [("random", uniform_server), ("jsq", shortest_queue)])
def test_per_arrival_metrics_count_only_accepted_arrivals(policy, rule):
    """With blocking (N = 2, two places per server, load 0.9) an accepted arrival does
    not see the time average: Random, exact idle fraction 0.369 over time and 0.448 at
    accepted arrivals, tasks per server 0.930 and 0.702, blocking 0.299; JSQ, 0.275 and
    0.342, 1.066 and 0.841, blocking 0.195. A per-arrival sum that also counted the
    blocked arrivals' states (over the same divisor) would be off by their share
    (Random: idle +0.079, tasks +0.625; JSQ: tasks +0.48)."""
    exact = _blocking_reference(Rule(rule))
    sim = jq.simulate(
        policy,
        BLOCKING["load"],
        2,
        buffer=BLOCKING["buffer"],
        metrics=BLOCKING_METRICS,
        replicas=16,
        steps=2**14,
        warmup=2**10,
        seed=7,
        init="empty",
        interval="replicas",
    )
    assert exact["idle" + PER_ARRIVAL] > exact["idle"] + 0.01  # the arrivals' view differs
    for key, value in exact.items():
        est = sim.metric(key)
        tol = jq.tolerance(est, family=BLOCKING_FAMILY)
        assert abs(est.mean - value) <= tol, (key, est, value, tol)


def test_q_is_exactly_zero_where_no_server_holds_k_tasks():
    """``q`` comes from the integer counts: with every server busy, ``q[0]`` is 0
    exactly, so ``1/q[0]`` is infinite there and said to be (as a difference of
    float32 fractions, ``q[0]`` was 1.5e-8 at N = 10 and ``1/q[0]`` averaged a
    finite 3.8e7 in this run). Said once: the batches (4 replicas: batch means) repeat
    what the whole window says."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = jq.simulate("jsq", 0.95, 10, replicas=4, steps=1024, seed=3, metrics={"x": "1/q[0]"})
    said = [w for w in caught if issubclass(w.category, UserMetricWarning)]
    assert len(said) == 1 and "'x' is infinite or undefined" in str(said[0].message)
    assert float(res.tail.mean[1]) > 0.9  # the servers are busy: q[0] is 0 much of the time
    assert not np.isfinite(res.user_metrics["x"].mean)


@pytest.mark.slow  # (a compile of its own)
def test_a_batch_of_sizes_gives_each_replica_its_own_n_and_m():
    """Sizes and buffers of their own in one batch (N = 4, M = 2, 3 places and
    N = 6, M = 3, 5 places): the metrics read each replica's own ``N`` and ``M``
    (exactly, every step; not its buffer, which a replica carries beside them)."""
    res = jq.simulate(
        "jiq",
        [0.5, 0.5],
        [4, 6],
        [2, 3],
        buffer=[3, 5],
        metrics={"mm": "M", "nn": "N"},
        replicas=2,
        steps=2048,
        warmup=256,
    )
    for r, (n, m) in zip(res, [(4, 2), (6, 3)]):
        assert (r.settings["n_servers"], r.settings["n_dispatchers"]) == (n, m)
        assert r.user_metrics["nn"].mean == n and r.user_metrics["mm"].mean == m
