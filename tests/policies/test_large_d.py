"""Probes of many servers: Pod(d) and its relatives for every 1 <= d <= N.

Past ``MAX_PROBES`` the shortest of ``d`` distinct servers is read off the
occupancy tail by its inverse CDF (:mod:`jaxqueue.policies.probes`): its
float32 probabilities against exact ones, its level law against the
hypergeometric law (and Floyd's draw), the two layouts against each other,
and, forced for small ``d``, the simulator against the exact chain.
"""

import dataclasses
import functools
import math
import warnings
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.core.host import host_float64
from jaxqueue.core.system import System
from jaxqueue.exact import solve_exact
from jaxqueue.policies import exact_rules, probes
from jaxqueue.policies.base import Servers, View, check_d
from jaxqueue.policies.classic import PowerOfD
from jaxqueue.policies.jiq import IdleFirst
from jaxqueue.results.estimates import estimate
from jaxqueue.results.stats import within
from jaxqueue.runs import bounds, planner
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import block_words, run_blocks
from jaxqueue.sim.registers import run_registers, unsupported
from jaxqueue.studies.grids.spec import SpecError, parse_spec
from jaxqueue.theory.closed import closed_forms

#: The documented worst relative error of ``C(t, d) / C(n, d)`` (docs/policies.md).
WORST_RELATIVE_ERROR = 1e-5
#: Rounding to float32 (half an ulp, relative), with room for the float64 sums.
ROUNDING = 2.0**-24 * (1.0 + 1e-6)
#: The most servers the tail's draw takes.
BIG = probes.MAX_TAIL_ITEMS


@functools.cache
def _log_comb(n: int, d: int) -> float:
    return math.log(math.comb(n, d))


def _exact_log(t: int, n: int, d: int) -> float:
    if t < d:
        return -math.inf
    if n <= 3000:  # exact integers
        return _log_comb(t, d) - _log_comb(n, d)
    return (math.lgamma(t + 1) - math.lgamma(t - d + 1)) - (
        math.lgamma(n + 1) - math.lgamma(n - d + 1)
    )


def _grid():
    """(n, d, t) across 64 < d < n <= 2**24, t near d, near n and spread between."""
    out = []
    for n in (66, 100, 1000, 3000, 10**5, 2**24 - 1):
        for d in sorted({65, int(n**0.5), n // 2, n - 2, n - 1} & set(range(65, n))):
            ts = set(range(d, min(n + 1, d + 8))) | set(range(max(d, n - 8), n + 1))
            ts |= set(np.linspace(d, n, 40).astype(int).tolist())
            out += [(n, d, t) for t in sorted(ts)]
    return out


@pytest.mark.slow
def test_tail_probabilities_are_accurate_in_float32():
    """Relative error of ``P = C(t, d) / C(n, d)`` wherever ``P >= 2**-32``: the formula's
    below the documented bound, the table's (where there is one) that of rounding the
    exact value to float32, and never larger than the formula's."""
    grid = np.array(_grid(), np.int64)
    n, d, t = (jnp.asarray(grid[:, i], jnp.int32) for i in range(3))
    got = np.asarray(jax.jit(probes.log_choose_ratio)(t, n, d), np.float64)
    worst = worst_table = 0.0
    for (n, d, t), g in zip(grid.tolist(), got):
        want = _exact_log(t, n, d)
        if want < -32 * math.log(2):
            assert g < -20.0  # tiny: far below any u the draw compares with
            continue
        error = abs(math.expm1(g - want))
        worst = max(worst, error)
        found = probes.choose_ratio_table(n, d)
        if found is not None:
            table, first = found
            assert t >= first  # the counts below have P < 2**-64
            table_error = abs(float(table[t - first]) / math.exp(want) - 1.0)
            assert table_error <= max(error, ROUNDING), (n, d, t, table_error, error)
            worst_table = max(worst_table, table_error)
    assert worst < WORST_RELATIVE_ERROR, worst
    assert worst_table <= ROUNDING, worst_table


def test_table_is_the_exact_ratio_rounded_to_float32():
    """Every count of a few small systems against exact binomials (Python integers)."""
    for n, d in ((7, 3), (66, 65), (300, 100), (3000, 65)):
        table, first = probes.choose_ratio_table(n, d)
        assert first == 0 and table.dtype == np.float32 and table.shape == (n + 1,)
        assert not table.flags.writeable and np.all(np.diff(table) >= 0)
        assert np.all(table[:d] == 0.0) and table[n] == 1.0
        total = math.comb(n, d)
        want = np.array([float(Fraction(math.comb(t, d), total)) for t in range(d, n + 1)])
        normal = want >= np.finfo(np.float32).tiny
        error = np.abs(table[d:].astype(np.float64)[normal] / want[normal] - 1.0)
        assert np.max(error) <= ROUNDING, (n, d, np.max(error))


def _law(tail, n, d):
    """Exact law of the shortest's level: ``P_k - P_{k+1}``, ``P_k = C(tail[k], d) / C(n, d)``."""
    p = [Fraction(math.comb(int(t), d), math.comb(n, d)) for t in tail] + [Fraction(0)]
    return np.array([float(p[k] - p[k + 1]) for k in range(len(tail))])


def _draws(tail, n, d, groups, per_group, seed):
    """Levels drawn by the table (``n`` a Python int) and by the formula (``n`` an array,
    as in a batch of other sizes), on the same words."""
    words = jax.random.bits(jax.random.key(seed), (groups * per_group, 2), jnp.uint32)
    arr = jnp.asarray(tail, jnp.int32)
    out = []
    for size in (n, jnp.int32(n)):
        draw = jax.vmap(lambda w, size=size: probes.shortest_by_tail(arr, size, d, w))
        out.append(np.asarray(jax.jit(draw)(words)).reshape(groups, per_group))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "n, d, tail",
    [
        (6, 3, (6, 5, 3, 3, 1, 0, 0, 0)),  # small: a forced tail draw
        (200, 100, (200, 199, 198, 197, 195, 192, 0, 0)),
        (10**6, 5000, (10**6, 999_900, 999_700, 999_300, 998_500, 0, 0, 0)),
        # a table of the top 2**20 counts: a count below it reads the smallest
        (BIG, 5000, (BIG, BIG - 100, BIG - 300, BIG - 700, BIG - 1500, BIG - 2**21, 0, 0)),
    ],
)
def test_tail_draw_has_the_hypergeometric_law(n, d, tail):
    """Per-level frequencies over 32 groups of draws, Student-t, family = 8 levels x 2
    draws x 4 cases; the two draws differ only where ``u`` falls between their roundings."""
    table, formula = _draws(tail, n, d, groups=32, per_group=4096, seed=3)
    law = _law(tail, n, d)
    law[law < 2.0**-64] = 0.0  # drawn by u = 0 alone
    for levels in (table, formula):
        freq = np.stack([(levels == k).mean(axis=1) for k in range(len(tail))], axis=1)
        assert within(estimate(freq), law, family=64), (freq.mean(axis=0), law)
    assert np.mean(table != formula) < 1e-4


@pytest.mark.slow
def test_both_layouts_and_floyd_agree_on_the_law():
    """The register layout's tuple gives the array's levels bit for bit; Floyd's draw
    at the same small system has the same law (family = 7 levels x 2 draws)."""
    n, d, tail = 7, 3, (7, 6, 4, 4, 2, 1, 0)
    words = jax.random.bits(jax.random.key(5), (32 * 2048, 2 * d), jnp.uint32)
    arr = jnp.asarray(tail, jnp.int32)
    as_array = jax.jit(jax.vmap(lambda w: probes.shortest_by_tail(arr, n, d, w)))(words[:, :2])
    rows = tuple(jnp.full((words.shape[0],), t, jnp.int32) for t in tail)
    as_rows = jax.jit(lambda r, w: probes.shortest_by_tail(r, n, d, (w[:, 0], w[:, 1])))(
        rows, words
    )
    assert np.array_equal(np.asarray(as_array), np.asarray(as_rows))
    system = System(n, 1, None, len(tail) - 1, 0)
    floyd = jax.jit(
        jax.vmap(lambda w: Servers(d).sample(View(arr, arr[:1], arr[:1], 0), w, system))
    )(words)
    law = _law(tail, n, d)
    for got in (as_array, floyd):
        got = np.asarray(got).reshape(32, -1)
        freq = np.stack([(got == k).mean(axis=1) for k in range(len(tail))], axis=1)
        assert within(estimate(freq), law, family=14), (freq.mean(axis=0), law)


@pytest.mark.slow
def test_floyd_loop_draws_from_a_tuple_of_words():
    """Floyd's loop (9 <= d <= 64) on the engine's words, a tuple of scalars: the
    hypergeometric law (family = 8 levels)."""
    n, d, tail = 14, 9, (14, 13, 12, 11, 10, 9, 4, 0)
    arr = jnp.asarray(tail, jnp.int32)
    system = System(n, 1, None, len(tail) - 1, 0)
    words = jax.random.bits(jax.random.key(9), (32 * 2048, 2 * d), jnp.uint32)

    def draw(w):
        as_tuple = tuple(w[k] for k in range(2 * d))
        return Servers(d).sample(View(arr, arr[:1], arr[:1], 0), as_tuple, system)

    got = np.asarray(jax.jit(jax.vmap(draw))(words)).reshape(32, -1)
    freq = np.stack([(got == k).mean(axis=1) for k in range(len(tail))], axis=1)
    assert within(estimate(freq), _law(tail, n, d), family=8)


@dataclasses.dataclass(frozen=True)
class _PodByTail(PowerOfD):
    """Pod(d) whose probes are always drawn from the tail (the draw past MAX_PROBES)."""

    def draws(self, system):
        return (Servers(self.d, by_tail=True),)


@dataclasses.dataclass(frozen=True)
class _IdleFirstByTail(IdleFirst):
    def draws(self, system):
        base = super().draws(system)
        return (Servers(self.d, by_tail=True),) + base[1:]


CASES = [(_PodByTail, 6, 5), (_PodByTail, 6, 3), (_IdleFirstByTail, 6, 4)]


@pytest.mark.slow
@pytest.mark.parametrize("cls, n, d", CASES, ids=["pod-5", "pod-3", "idle-first-4"])
def test_tail_draw_in_the_simulator_matches_the_exact_chain(cls, n, d):
    """Mean response time and waiting probability, family = 2 metrics x 3 cases."""
    policy = cls(d=d)
    sim = jq.simulate(
        policy,
        0.8,
        n,
        buffer=4,
        replicas=32,
        steps=2**15,
        warmup=4096,
        seed=7,
        devices=jax.devices()[:1],
    )
    ex = solve_exact(cls.name, 0.8, n, 1, buffer=4, tol=1e-9, d=d)
    for metric in ("mean_response_time", "waiting_probability"):
        assert within(getattr(sim, metric), getattr(ex, metric), family=6), metric


def test_every_d_up_to_n_is_valid():
    system = System(200, 50, None, 8, 8)
    for d in (1, 64, 65, 100, 199, 200):
        check_d(d, system)
        jq.make("pod", d=d).validate(system)
    for d in (1, 50):
        check_d(d, system, what="dispatchers")
    with pytest.raises(ValueError, match=r"^d=201 is out of range: .* 1 <= d <= n_servers \(200\)"):
        check_d(201, system)
    with pytest.raises(ValueError, match=r"1 <= d <= n_dispatchers \(50\)$"):
        check_d(51, system, what="dispatchers")
    assert Servers(65).n_words(system) == 2 and Servers(64).n_words(system) == 128
    big = System(2**24, 1, None, 8, 0)  # past 64 (and below N) the counts must fit float32
    check_d(64, big)
    check_d(2**24, big)
    with pytest.raises(ValueError, match=r"need 1 <= d <= 64 or d = n_servers \(16777216\)"):
        check_d(65, big)


def test_exact_rule_closed_form_equals_the_enumeration(monkeypatch):
    """The law of the shortest of d (ties uniform) for every d <= N <= 8."""
    sizes = [[0, 1, 1, 2, 0, 3, 1, 2], [2, 2, 2, 2, 2, 2], [0, 4, 1]]
    for size in sizes:
        for d in range(1, len(size) + 1):
            enum = exact_rules.shortest_of(exact_rules.subsets(len(size), d), size)
            monkeypatch.setattr(exact_rules, "MAX_SUBSETS", 0)
            closed = exact_rules.shortest_law(size, d)
            monkeypatch.undo()
            assert set(closed) == {i for i, p in enum.items() if p > 0}
            for i, p in closed.items():
                assert p == pytest.approx(enum[i], rel=1e-12)


@pytest.mark.slow
def test_finite_law_closed_form_past_max_probes():
    """The lnGamma form of the without-replacement tail against the product
    (float64 NumPy), and its first two derivatives in ``e = 1 / N`` at 0 (what the
    refined mean field takes) against ``f (L'^2 + L'')``, ``L = log f``."""
    p = np.array([1.0, 0.999, 0.99, 0.9, 0.5])
    with host_float64():
        d = 65
        i = np.arange(d, dtype=np.float64)[:, None]
        f = jax.jit(lambda e: probes.distinct_tail(jnp.asarray(p), d, e))
        for inv in (0.0, 1e-7, 1e-4, 1e-3):
            want = np.prod((p - i * inv) / (1.0 - i * inv), axis=0)
            np.testing.assert_allclose(np.asarray(f(inv)), want, rtol=1e-8)
        s1, s2 = np.sum(i), np.sum(i * i)
        d1, d2 = s1 * (1.0 - 1.0 / p), s2 * (1.0 - 1.0 / p**2)
        np.testing.assert_allclose(jax.jit(jax.jacfwd(f))(0.0), p**d * d1, rtol=1e-10)
        np.testing.assert_allclose(
            jax.jit(jax.jacfwd(jax.jacfwd(f)))(0.0), p**d * (d1 * d1 + d2), rtol=1e-10
        )
        # the refined mean field's Jacobian in the fractions: finite where p**d underflows
        tiny = jnp.array([0.9, 1e-3, 1e-200, 0.0])
        jac = jax.jit(jax.jacfwd(jax.jacfwd(probes.distinct_tail, 2), 0), static_argnums=1)
        assert np.all(np.isfinite(np.asarray(jac(tiny, d, 0.0))))


@pytest.mark.slow
def test_theory_and_bounds_take_huge_d():
    """Pod(d)'s closed form with d**i past any float: finite, and the right limits."""
    for d in (65, 8500, 10**6, 2**31 - 1):
        s = np.asarray(closed_forms.tail("pod", 0.9, d=d, levels=6))
        assert np.all(np.isfinite(s)) and s[1] == pytest.approx(0.9) and s[3] == 0.0
        assert closed_forms.mean_response_time("pod", 0.9, d=d) == pytest.approx(1.0, abs=2e-3)
        for name in ("pod", "idle-first"):
            assert 4 <= bounds.default_levels(jq.make(name, d=d), 10**4, 1, 0.999) <= 16


def _spec(policy: str, servers: str = "[100, 10000]", load: str = "load = [0.9]") -> str:
    return (
        f"[grid]\npolicy = [{policy}]\nn_servers = {servers}\n{load}\n"
        '[run]\nreplicas = 2\ntime = 10\nwarmup_time = 1\ntheory = "none"\n'
    )


def test_spec_d_may_be_an_expression_of_n():
    """Rounded per point (Liu and Ying's d >= N**alpha log(N)**2 at alpha = 1/2: 212 at N = 100 is clipped
    to 100, with a warning; 8483 at N = 10^4)."""
    text = _spec('{ name = "pod", d = ["N**0.5 * log(N)**2", "min(N - 1, 2 * sqrt(N))", 2] }')
    with pytest.warns(UserWarning, match=r"is 212\.\d+ at N=100: clipped to d=100"):
        spec = parse_spec(text)
    got = {(p.servers, dict(p.options)["d"]) for p in spec.points}
    want = {
        (n, d)
        for n in (100, 10_000)
        for d in (min(n, round(n**0.5 * math.log(n) ** 2)), min(n - 1, round(2 * n**0.5)), 2)
    }
    assert got == want and (10_000, 8483) in got


def test_spec_d_of_alpha_is_evaluated_per_load():
    text = _spec('{ name = "pod", d = ["N**alpha"] }', "[10000]", "alpha = [0.25, 0.5]")
    spec = parse_spec(text)
    assert sorted(dict(p.options)["d"] for p in spec.points) == [10, 100]


@pytest.mark.parametrize(
    "d, message",
    [
        (
            '"__import__(1)"',
            r"option d: expression '__import__\(1\)': unknown function '__import__'",
        ),
        ('"N.real"', r"option d: expression 'N\.real': attribute access"),
        ('"M + 1"', r"unknown name 'M'"),
        ('"N**alpha"', r"d='N\*\*alpha' names alpha, which this point has not"),
        ('"log(N - N)"', r"is -inf at N=100: need a finite value"),
    ],
)
def test_spec_d_expression_errors(d, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(_spec(f'{{ name = "pod", d = [{d}] }}', "[100]"))


@pytest.mark.slow
def test_register_layout_steps_the_tail_draw_as_the_engine_does():
    """The step in the register layout (plain XLA) against the engine, bit for bit, for
    Pod(100) at N = 200, and a whole run through ``backend="registers"``: the draw
    reads a table (no logarithms), so that backend takes it; the Pallas kernel, which
    does not capture the table, refuses it, and so does every backend but the engine
    where the draw takes the formula (each replica's own N)."""
    kw = dict(d=100, levels=8, replicas=12, steps=2560, seed=11)
    backends = ("xla", "registers")
    p = planner.plan("pod", [0.6, 0.9], 200, 1, **kw, backend="xla")
    core = runner._initial_core(p)
    _, _, keys, loads = runner.placement(p)
    args = (jnp.asarray(block_words(0)), jnp.int32(1), loads)
    fresh = lambda: jax.tree.map(jnp.asarray, core)  # noqa: E731  (donated)
    want = run_blocks(fresh(), keys, *args, system=p.system, policy=p.policy)
    got = run_registers(fresh(), keys, *args, system=p.system, policy=p.policy)
    same = [np.array_equal(a, b) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got))]
    assert all(same) and int(want[1].arrivals.sum()) > 0
    assert unsupported(p.system, p.policy, kernel=False) is None
    assert "a table of C(t, d) / C(N, d) at N=200" in unsupported(p.system, p.policy)
    assert "float32 logarithms" in unsupported(p.system, p.policy, kernel=False, sized=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", jq.BackendWarning)  # the registers backend runs it
        warnings.simplefilter("ignore", jq.WarmupWarning)  # (a short run)
        runs = {b: jq.simulate("pod", [0.6, 0.9], 200, **kw, backend=b) for b in backends}
    for backend, results in runs.items():
        for r in results:
            assert r.settings["backend"] == backend
    strip = lambda r: {**r, "settings": {**r["settings"], "backend": 0, "wall_seconds": 0}}  # noqa: E731
    same = [strip(a.to_dict()) == strip(b.to_dict()) for a, b in zip(*runs.values())]
    assert same == [True, True]


@pytest.mark.slow
def test_a_level_every_server_reaches_is_always_drawn():
    """``P = 1`` (``t = N``) against ``u`` as close to 1 as two words make it."""
    top = jnp.array([2**32 - 1, 2**32 - 1, 2**32 - 200, 0], jnp.uint32)
    low = jnp.array([2**32 - 1, 0, 0, 0], jnp.uint32)
    log_u = probes.log_uniform(top, low)
    assert np.all(np.asarray(log_u)[:3] < 0.0) and np.asarray(log_u)[3] == -np.inf
    tail = jnp.array([300, 300, 300, 299, 0], jnp.int32)
    draw = jax.vmap(lambda hi, lo: probes.shortest_by_tail(tail, 300, 100, (hi, lo)))
    assert np.all(np.asarray(draw(top, low)) >= 2)


def test_a_large_system_has_a_table_of_its_top_counts_where_those_below_are_negligible():
    n = probes.MAX_TAIL_ITEMS
    table, first = probes.choose_ratio_table(n, 1000)
    assert first == n - probes.MAX_TABLE_ITEMS and table.size == probes.MAX_TABLE_ITEMS + 1
    assert 0.0 < table[0] < 2.0**-64 and table[-1] == 1.0
    assert probes.choose_ratio_table(n, 65) is None  # (15/16)**65: far from negligible
    assert probes.choose_ratio_table(probes.MAX_TABLE_ITEMS, 65)[1] == 0


def test_sizes_past_max_probes_run_alone():
    """Past 64 probes the draw reads a table of its own N's counts, so points of other
    N do not share a compiled batch (a batched point would draw by the formula, which
    differs from the table in rare draws): their size keys differ, and a run of several
    sizes is refused before anything compiles, naming the reason."""
    bare = System(200, 1, None, 8, 0)
    pol = PowerOfD(d=100)
    assert planner.size_key(pol, 200, 1, None, bare) != planner.size_key(pol, 300, 1, None, bare)
    small = PowerOfD(d=2)
    assert planner.size_key(small, 200, 1, None, bare) == planner.size_key(
        small, 300, 1, None, bare
    )
    with pytest.raises(ValueError, match="table of each N's counts"):
        jq.simulate("pod", [0.5, 0.6], [200, 300], d=100, replicas=2, steps=256)
