"""The 1/N-refined mean field (jaxqueue.theory.finite_n.refined) against its own pieces, the exact
Markov chain and the simulator.

Exact comparisons. The refined mean field claims ``E_N = x* + V / N + O(1 / N^2)``, the
plain mean field ``E_N = x* + O(1 / N)``. So at three sizes N the refined error must be
smaller than the plain one, and the log-log slope of ``|exact - refined|`` against N must
be about -2, where the plain error's is about -1: the test asserts a slope below -1.5,
midway (in the exponent) between the two claims. The sizes are the largest the exact
chain solves in about a second each.

Simulation. Pod(2) at lambda = 0.8, N = 50, 100, 200, 1000, 16 replicas each, started at
the mean-field occupancy with 20 time units of warm-up; the measured time shrinks with
N so that every run has about the same number of events. Each simulated metric (T, s_2,
s_3 at each N: a family of 12) must agree with the refined value within
:func:`jaxqueue.results.stats.tolerance` (Student-t, family-wise 0.001, Bonferroni)
plus an allowance for the refined mean field's own O(1/N^2) error, stated before
looking at the data: the project's finite-N allowance (docs/statistics.md,
tests/agreement.py) taken one order further, ``10 / N^2`` times the part of the
value the limit gets wrong (``T - 1`` for T, ``min(s_k, 1 - s_k)`` for a tail):
0.0039 for T at N = 50 down to 2e-6 at N = 1000. Measured: no gap above 0.19 of
its tolerance (the largest, 0.0030 in T at N = 1000, against 0.016).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from agreement import assert_near_mean_field

import jaxqueue as jq
from jaxqueue import theory
from jaxqueue.cli import main as cli_main
from jaxqueue.core.status import Status
from jaxqueue.core.status import message as status_message
from jaxqueue.exact import solve_exact
from jaxqueue.theory.finite_n import refined
from jaxqueue.theory.generic import meanfield

slow = pytest.mark.slow


def _random_state(system, ratio, seed):
    """A state inside the domain (decreasing tails, the I-queues listing the idle servers)."""
    rng = np.random.default_rng(seed)
    s = np.sort(rng.uniform(0.05, 0.95, system.levels))[::-1]
    x = list(s)
    if system.iqueue_levels:
        q = np.sort(rng.uniform(0.0, 1.0, system.iqueue_levels))[::-1]
        x += list(q * ratio * (1.0 - s[0]) / q.sum())
    return np.array(x)


@pytest.mark.parametrize(
    "name, d, ratio, buffer",
    [
        ("random", None, None, None),
        ("pod", 2, None, None),
        ("pod", 3, None, 4),
        ("jiq", None, 2.0, None),
        ("jiq-pod", 2, 3.0, None),
        ("jiq-sq", 2, 2.0, 3),
        ("i1f", None, None, None),
    ],
)
def test_transitions_sum_to_the_drift_and_their_covariance(name, d, ratio, buffer):
    pol, system = meanfield.policy_and_system(name, ratio, d, buffer, buffer or 6, 5)
    r = ratio if system.iqueue_levels else 1.0

    @jax.jit
    def both(x):
        jumps, rates = refined.transitions(x, 0.7, r, pol, system)
        return (
            jumps,
            rates,
            jnp.sum(jumps * rates[:, None], axis=0),
            meanfield.drift(x, 0.7, r, pol, system),
            refined.jump_covariance(x, 0.7, r, pol, system),
        )

    with jax.enable_x64(True):
        for seed in range(3):
            jumps, rates, total, f, cov = both(jnp.asarray(_random_state(system, r, seed)))
            np.testing.assert_allclose(np.asarray(total), np.asarray(f), rtol=0, atol=1e-12)
            # the structured covariance of the jumps is the dense sum over them
            dense = (np.asarray(jumps) * np.asarray(rates)[:, None]).T @ np.asarray(jumps)
            np.testing.assert_allclose(np.asarray(cov), dense, rtol=0, atol=1e-12)
            assert np.all(np.asarray(rates) >= -1e-15)
            if system.iqueue_levels:  # every jump that occurs keeps sum_j Q_j / r + s_1
                c = np.zeros(f.size)
                c[0], c[system.levels :] = 1.0, 1.0 / r
                moved = np.abs(np.asarray(jumps) @ c) * np.asarray(rates)
                assert np.all(moved[:-1] < 1e-12)  # the last: a join at the size bound J


def test_lyapunov_solves_its_equation():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(7, 7)) - 4.0 * np.eye(7)
    g = rng.normal(size=(7, 7))
    q = g @ g.T
    with jax.enable_x64(True):
        w = np.asarray(refined.lyapunov(jnp.asarray(a), jnp.asarray(q)))
    np.testing.assert_allclose(a @ w + w @ a.T + q, 0.0, atol=1e-11)
    np.testing.assert_allclose(w, w.T, atol=1e-14)


@slow
def test_second_order_term_is_the_hessian_contraction():
    """``sum_k D^2 F[e_k, W e_k]`` equals ``B : W`` from the full ``jax.hessian``."""
    pol, system = meanfield.policy_and_system("jiq-pod", 2.0, 2, 3, 3, 4)
    fp = meanfield.fixed_point(pol, 0.8, 2.0, buffer=3, levels=3, iqueue_levels=4)
    x = np.concatenate([fp.tail[1:], fp.iq_tail[1:]])
    with jax.enable_x64(True):
        y = refined.project(jnp.asarray(x), pol, system)
        n = y.size
        w = jnp.asarray(np.cov(np.random.default_rng(0).normal(size=(n, 3 * n))))

        def model(z):
            return refined.model(
                z, jnp.float64(0.0), jnp.float64(0.8), jnp.float64(2.0), pol, system
            )

        @jax.jit
        def both(y, w):
            def second(e, we):
                return jax.jvp(lambda z: jax.jvp(model, (z,), (we,))[1], (y,), (e,))[1]

            ours = jnp.sum(jax.vmap(second)(jnp.eye(n), w.T), axis=0)
            return ours, jnp.einsum("jkm,km->j", jax.hessian(model)(y), w)

        ours, full = both(y, w)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(full), rtol=1e-10, atol=1e-12)


@slow
@pytest.mark.parametrize("buffer", [None, 3])
def test_random_has_no_correction(buffer):
    """Random routing: independent M/M/1 queues, E[s_k] = lambda**k at every N (28 levels
    leave 0.6**28 = 6e-7 of the tail out; fewer are refused)."""
    rf = theory.refined_mean_field(
        "random",
        0.6 if buffer is None else 1.3,
        buffer=buffer,
        n_servers=10,
        levels=None if buffer else 28,
    )
    assert rf.status is Status.CONVERGED
    for name in ("tail", "mean_response_time", "waiting_probability", "blocking_probability"):
        assert np.all(np.abs(rf.correction[name]) < 1e-12), name
    for q in rf.correction["response_quantiles"].values():
        assert abs(q) < 1e-12


@pytest.mark.parametrize(
    "name, d, ratio, buffer, load, n",
    [
        pytest.param("jsq", None, None, None, 0.9, 50, marks=slow),
        pytest.param("i1f", None, None, None, 0.9, 50, marks=slow),
        pytest.param("idle-first", 2, None, None, 0.9, 50, marks=slow),
        pytest.param("jiq-pod", 2, None, 2, 1.2, 50, marks=slow),
        pytest.param("pod", 4, None, 2, 0.9, 4, marks=slow),
        pytest.param("jsq", None, None, 2, 1.3, 50, marks=slow),
        pytest.param("jiq", None, 5.0, None, 0.9, 5, marks=slow),
    ],
)
def test_jsq_like_routing_has_no_refined_value(name, d, ratio, buffer, load, n):
    # 6 levels hold the JSQ-like tails of one dispatcher; JIQ's at r = 5 needs the adaptive count
    rf = theory.refined_mean_field(
        name,
        load,
        ratio,
        d=d,
        buffer=buffer,
        n_servers=n,
        levels=buffer or (6 if ratio is None else None),
    )
    assert rf.status is Status.NOT_DIFFERENTIABLE
    assert rf.reason and "JSQ-like" in rf.reason
    assert rf.correction is None and rf.refined is None
    # the mean field itself is still reported, also with a finite buffer and load >= 1
    # (s_1 = 1 exactly, where the drift jumps: the sliding ODE settles on it)
    assert rf.mean_field is not None


@slow
def test_the_level_count_grows_where_the_tail_needs_it():
    """JIQ-SQ(1) is JIQ; at r = 1 and lambda = 0.8 40 levels leave 2.4e-8 at the bound: the
    refined mean field takes the fixed point's adaptive count (80), its mean field is JIQ's
    closed form, and its correction JIQ's (the same drift)."""
    rf = theory.refined_mean_field("jiq-sq", 0.8, 1.0, d=1, n_servers=100)
    jiq = theory.refined_mean_field("jiq", 0.8, 1.0, n_servers=100)
    assert rf.status is jiq.status is Status.CONVERGED
    assert rf.mean_field.levels == theory.mean_field("jiq-sq", 0.8, 1.0, d=1).levels > 40
    closed = theory.mean_field("jiq", 0.8, 1.0).mean_response_time
    assert rf.mean_field.mean_response_time == pytest.approx(closed, rel=1e-12)
    assert rf.correction["mean_response_time"] == pytest.approx(
        jiq.correction["mean_response_time"], rel=1e-9
    )


def test_bad_arguments_are_named_before_compiling():
    with pytest.raises(ValueError, match="n_servers"):
        theory.refined_mean_field("pod", 0.5, n_servers=0)
    with pytest.raises(TypeError, match="n_servers"):
        theory.refined_mean_field("pod", 0.5, n_servers=10.0)
    with pytest.raises(ValueError, match="load"):
        theory.refined_mean_field("pod", 1.5, n_servers=10)
    with pytest.raises(ValueError, match="ratio"):
        theory.refined_mean_field("jiq", 0.5, 20.0, n_servers=10)
    with pytest.raises(ValueError, match="d=3"):
        theory.refined_mean_field("pod", 0.5, d=3, n_servers=2)
    with pytest.raises(NotImplementedError):
        theory.refined_mean_field("jiq-original", 0.5, 2.0, n_servers=10)


def _study(
    name, load, sizes, *, ratio=None, d=None, buffer=None, levels=None, metrics, exact_kw=None
):
    """Errors of the plain and refined mean fields against the exact chain at each size."""
    rf = theory.refined_mean_field(
        name, load, ratio, d=d, buffer=buffer, n_servers=sizes[0], levels=levels
    )
    assert rf.status is Status.CONVERGED
    plain, ref = {m: [] for m in metrics}, {m: [] for m in metrics}
    for n in sizes:
        m = 1 if ratio is None else round(n / ratio)
        assert ratio is None or m * ratio == n  # r = N / M fixed along the sizes
        ex = solve_exact(name, load, n, m, d=d, buffer=buffer, **(exact_kw or {}))
        for metric, index in metrics.items():

            def pick(v, index=index):
                return v if index is None else v[index]

            e, mf = pick(getattr(ex, metric)), pick(getattr(rf.mean_field, metric))
            v = pick(rf.correction[metric])
            plain[metric].append(abs(e - mf))
            ref[metric].append(abs(e - mf - v / n))
            # a truncated chain (infinite buffers) drops the arrivals at its bound, which moves
            # its metrics by about the mass there: keep it two orders below what is measured
            assert ex.truncated_mass <= 1e-2 * ref[metric][-1], (n, metric, ex.truncated_mass)
    return plain, ref


def _check_orders(sizes, plain, ref):
    for metric in plain:
        p, r = np.array(plain[metric]), np.array(ref[metric])
        assert np.all(r < p), (metric, p, r)
        slope = np.polyfit(np.log(sizes), np.log(r), 1)[0]
        assert slope < -1.5, (metric, slope, r)


@slow
def test_finite_buffer_pod_against_exact():
    """Pod(2) with two places per server, overloaded (lambda = 1.2): blocking is O(1)."""
    sizes = [8, 16, 32]
    plain, ref = _study(
        "pod",
        1.2,
        sizes,
        d=2,
        buffer=2,
        metrics={"mean_response_time": None, "blocking_probability": None, "tail": 2},
    )
    _check_orders(sizes, plain, ref)
    # V does not depend on N: the values moved to another N are those solved there
    one = theory.refined_mean_field("pod", 1.2, d=2, buffer=2, n_servers=sizes[0])
    other = theory.refined_mean_field("pod", 1.2, d=2, buffer=2, n_servers=sizes[-1])
    moved = one.at(sizes[-1])
    assert moved.mean_response_time == other.refined.mean_response_time
    np.testing.assert_array_equal(moved.tail, other.refined.tail)
    assert moved.settings["n_servers"] == sizes[-1]
    with pytest.raises(ValueError, match="n_servers=0"):
        one.at(0)


@slow
def test_pod_against_exact():
    """Pod(2), infinite buffers (the chain truncated at 8 tasks per server)."""
    sizes = [4, 6, 8]
    plain, ref = _study(
        "pod",
        0.6,
        sizes,
        d=2,
        levels=20,
        exact_kw={"queue_bound": 8},
        metrics={"mean_response_time": None, "waiting_probability": None, "tail": 2},
    )
    _check_orders(sizes, plain, ref)


@slow
def test_jiq_with_few_dispatchers_against_exact():
    """JIQ with r = 2: (N, M) = (4, 2), (8, 4), (12, 6). Four places per server keep the
    chain exact (no truncation); at lambda = 0.7 about 2% of arrivals are blocked."""
    sizes = [4, 8, 12]
    plain, ref = _study(
        "jiq",
        0.7,
        sizes,
        ratio=2.0,
        buffer=4,
        metrics={
            "mean_response_time": None,
            "p0": None,
            "delete_rate": None,
            "blocking_probability": None,
        },
    )
    _check_orders(sizes, plain, ref)


@slow
def test_conservation_law_of_the_jiq_family():
    """``c . V = 0`` and ``W c = 0`` for ``c = e_{s_1} + sum_j e_{Q_j} / r``."""
    rf = theory.refined_mean_field("jiq", 0.9, 2.0, buffer=2, n_servers=10)
    assert rf.status is Status.CONVERGED
    L = 2
    c = np.zeros(rf.state_correction.size)
    c[0], c[L:] = 1.0, 0.5
    assert abs(c @ rf.state_correction) < 1e-10
    np.testing.assert_allclose(rf.covariance @ c, 0.0, atol=1e-10)
    assert np.all(np.linalg.eigvalsh(rf.covariance) > -1e-10)
    # p0 and the I-queue law move together
    assert rf.correction["p0"] == pytest.approx(rf.correction["iqueue_distribution"][0], abs=1e-12)
    # refined = mean field + V / N, metric by metric
    assert rf.refined.mean_response_time == pytest.approx(
        rf.mean_field.mean_response_time + rf.correction["mean_response_time"] / 10, rel=1e-14
    )


@slow
def test_other_loads_and_ratios_reuse_the_compiled_programs():
    """The ratio is traced: a second point of the same policy and truncation compiles nothing."""
    first = theory.refined_mean_field("jiq", 0.9, 2.0, buffer=2, n_servers=10)
    sizes = (refined.corrections._cache_size(), meanfield._newton_step._cache_size())
    second = theory.refined_mean_field("jiq", 0.8, 3.0, buffer=2, n_servers=12)
    assert (refined.corrections._cache_size(), meanfield._newton_step._cache_size()) == sizes
    assert first.status is second.status is Status.CONVERGED
    assert second.mean_field.p0 != first.mean_field.p0  # the ratio did reach the computation


@pytest.mark.slow
def test_cli_theory_with_servers_prints_refined_values(capsys):
    args = [
        "theory",
        "--policy",
        "pod",
        "--load",
        "1.2",
        "--buffer",
        "2",
        "--servers",
        "10",
        "--json",
    ]
    assert cli_main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["refined"]) == set(theory.mean_field("pod", 1.2, buffer=2).to_dict())
    assert data["refined_status"] == {"status": "CONVERGED", "reason": None}
    corr = data["correction"]
    mf_t = data["mean_response_time"]["mean"]
    assert data["refined"]["mean_response_time"]["mean"] == pytest.approx(
        mf_t + corr["mean_response_time"] / 10, rel=1e-9
    )
    assert data["refined"]["settings"]["n_servers"] == 10
    for key in ("tail", "waiting_probability", "blocking_probability", "response_quantiles"):
        assert corr[key] is not None
    assert corr["p0"] is None and data["refined"]["p0"] is None  # no I-queues
    # without --servers nothing changes
    assert cli_main(args[:-3] + ["--json"]) == 0
    assert "refined" not in json.loads(capsys.readouterr().out)
    # JSQ-like routing: a status and no numbers
    assert (
        cli_main(
            [
                "theory",
                "--policy",
                "jsq",
                "--load",
                "0.5",
                "--servers",
                "10",
                "--levels",
                "6",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["refined"] is None and data["correction"] is None
    assert data["refined_status"]["status"] == "NOT_DIFFERENTIABLE"


@slow
def test_grid_matches_one_point():
    loads, ratios = np.array([0.7, 0.9]), np.array([2.0, 5.0])
    grid = refined.refined_grid(
        "jiq-pod", loads, ratios, (50, 1000, 75), levels=12, iqueue_levels=30
    )
    # N = 75 at r = 2 is 37.5 dispatchers: no such system, no refined value there
    assert np.all(grid.status[:, 0, 2] == int(Status.INVALID_INPUT))
    assert np.all(np.isnan(grid.refined["mean_response_time"][:, 0, 2]))
    grid.status[:, 0, 2] = 0
    assert np.all(grid.status == 0)
    for i, j in ((0, 0), (1, 1)):  # two of the four points (each a solve of its own)
        rf = theory.refined_mean_field(
            "jiq-pod", loads[i], ratios[j], n_servers=50, levels=12, iqueue_levels=30
        )
        for name in ("mean_response_time", "p0", "waiting_probability", "probe_rate"):
            assert grid.mean_field[name][i, j] == pytest.approx(
                getattr(rf.mean_field, name), rel=1e-9, abs=1e-12
            )
            assert grid.correction[name][i, j] == pytest.approx(
                rf.correction[name], rel=1e-7, abs=1e-10
            )
            assert grid.refined[name][i, j, 0] == pytest.approx(
                getattr(rf.refined, name), rel=1e-8, abs=1e-10
            )


@pytest.mark.slow
def test_a_grid_marks_the_points_whose_tail_its_level_bound_cuts():
    """Pod(2) with 5 levels: at load 0.5 they leave 0.5**31 = 5e-10 out, at 0.95
    0.95**31 = 0.2: that point is TRUNCATED, with no mean field or refined value."""
    grid = refined.refined_grid("pod", np.array([0.5, 0.95]), None, (100,), levels=5)
    assert Status(int(grid.status[0, 0, 0])) is Status.CONVERGED
    assert Status(int(grid.status[1, 0, 0])) is Status.TRUNCATED
    assert np.isnan(grid.mean_field["mean_response_time"][1, 0])
    assert np.isnan(grid.refined["mean_response_time"][1, 0, 0])
    assert grid.mean_field["mean_response_time"][0, 0] == pytest.approx(
        float(theory.mean_response_time("pod", 0.5)), rel=1e-6
    )
    assert "give more levels" in status_message(Status.TRUNCATED)


def test_a_correction_past_the_memory_bound_is_refused_before_compiling():
    """The correction's working memory grows like levels^2 * iqueue_levels
    (``refined.working_bytes``): 3000 levels and 30 I-queue levels, or a grid
    chunk of 64 points at 300 and 110, pass ``MAX_WORKING_BYTES``."""
    one = refined.working_bytes(meanfield.policy_and_system("jiq", 1.0, None, None, 3000, 30)[1])
    assert one > refined.MAX_WORKING_BYTES
    with pytest.raises(ValueError, match="levels=3000 and iqueue_levels=30.*GiB.*MAX_WORKING"):
        refined.refined_mean_field("jiq", 0.5, 1.0, n_servers=100, levels=3000, iqueue_levels=30)
    loads, ratios = np.linspace(0.5, 0.9, 8), np.linspace(1.0, 20.0, 8)
    with pytest.raises(ValueError, match="a chunk of 64 points.*smaller chunk"):
        refined.refined_grid("jiq", loads, ratios, (100,), levels=300, iqueue_levels=110)


SIM_LOAD, SIM_SIZES, SIM_EVENTS = 0.8, (50, 100, 200, 1000), 2e5  # N * time units
SIM_TAIL = (2, 3)
SIM_FAMILY = len(SIM_SIZES) * (1 + len(SIM_TAIL))


@slow
def test_simulation_minus_mean_field_is_the_correction():
    rf = theory.refined_mean_field("pod", SIM_LOAD, d=2, n_servers=SIM_SIZES[0], levels=20)
    mf, corr = rf.mean_field, rf.correction
    for n in SIM_SIZES:
        per = jq.steps_per_time_unit(n, SIM_LOAD)
        sim = jq.simulate(
            "pod",
            SIM_LOAD,
            n,
            1,
            d=2,
            replicas=16,
            levels=20,
            steps=int(SIM_EVENTS / n * per),
            warmup=int(20 * per),
            init=mf.occupancy,
            seed=17 + n,
        )
        # simulated minus mean field is V / N: the refined value's error is O(1/N^2)
        t = mf.mean_response_time + corr["mean_response_time"] / n
        checks = [(sim.mean_response_time, t, "T")]
        for k in SIM_TAIL:
            n_k = sim.tail.n if np.ndim(sim.tail.n) == 0 else np.asarray(sim.tail.n)[k]
            est = jq.Estimate(sim.tail.mean[k], sim.tail.ci95[k], n_k)
            checks.append((est, mf.tail[k] + corr["tail"][k] / n, "tail"))
        assert_near_mean_field(checks, SIM_FAMILY, n, order=2)


def test_a_ratio_that_does_not_divide_n_is_refused_before_compiling(monkeypatch, capsys):
    """N = 15 at r = 10 would be M = 1.5 dispatchers: refused, naming both, with the
    nearest ratios that divide N; in the API and the CLI, before any solve. (A grid,
    refined_grid, marks such (r, N) INVALID_INPUT and gives the rest.)"""

    def no_solve(*args, **kwargs):
        raise AssertionError("a solve was started")

    monkeypatch.setattr(meanfield, "fixed_point", no_solve)
    want = (
        r"n_servers=15 and ratio=10 give N / ratio = 1.5 dispatchers: .* must be a whole "
        r"number; give a ratio that divides n_servers, e.g. ratio=15 \(M = 1\) or "
        r"ratio=7.5 \(M = 2\)"
    )
    with pytest.raises(ValueError, match=want):
        theory.refined_mean_field("jiq", 0.9, 10.0, n_servers=15)
    with pytest.raises(ValueError, match=r"n_servers=1000 and ratio=3 give N / ratio = 333.333"):
        theory.refined_mean_field("jiq-sq", 0.9, 3.0, n_servers=1000)
    assert (
        cli_main(["theory", "--policy", "jiq", "--load", "0.9", "--ratio", "10", "--servers", "15"])
        == 2
    )
    assert "n_servers=15 and ratio=10 give N / ratio = 1.5" in capsys.readouterr().err
    # a ratio N / M of a real system (1000 / 3) is whole up to rounding
    refined.check_whole(2000, 1000 / 3)
    refined.check_whole(15, None)
