"""Hostile inputs: each refused (or evaluated) at once, with a one-line error naming the
parameter and its valid range, never a hang, a traceback or a silent wrong value.

Fast: nothing here runs a simulation (a step function is at most traced).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxqueue as jq
from jaxqueue.cli import main as cli_main
from jaxqueue.cli.parser import build_parser
from jaxqueue.core.expressions import MAX_DEPTH, compile_expression
from jaxqueue.core.user_metrics import MetricState, evaluate, user_metrics
from jaxqueue.runs.planner import plan
from jaxqueue.sim import runner
from jaxqueue.studies.grids.spec import SpecError, parse_spec
from jaxqueue.studies.grids.spec_values import d_at
from jaxqueue.studies.plotting.figure_spec import check_expression, evaluate_expression
from jaxqueue.theory.per_server import threshold

DEEP = {
    "parentheses": "(" * 500 + "1" + ")" * 500,
    "unary minus": "-" * 10_000 + "1",
    "a long sum": "+".join(["1"] * 20_000),
    "just past the limit": "-" * (MAX_DEPTH + 1) + "1",
}


@pytest.fixture
def no_compile(monkeypatch):
    """Every refusal below comes before anything steps (or compiles) a replica."""

    def no_run(*args, **kwargs):
        raise AssertionError("validation must come before any compilation")

    monkeypatch.setattr(runner, "run_blocks", no_run)


class within:
    """A block that must take less than ``seconds`` (of wall time)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        took = time.perf_counter() - self.start
        assert took < self.seconds, f"took {took:.2f} s, more than {self.seconds} s"


def _one_line(err) -> str:
    text = str(err.value) if hasattr(err, "value") else str(err)
    assert "\n" not in text, text
    return text


# 1. constant arithmetic in floats; depth limit


@pytest.mark.parametrize("text", ["9**9**9", "(9**9)**(9**9)", "2**100000 * 10", "-(9**9**9)"])
def test_integer_powers_of_constants_evaluate_in_floats_at_once(text):
    with within(0.5):
        value = compile_expression(text, ["N"])()
    assert isinstance(value, float) and np.isinf(value)


def test_constant_arithmetic_stays_exact_where_a_float_is():
    cases = {"2**10": 1024.0, "7 * 6": 42.0, "2**-1 / 4": 0.125, "(-8) ** 2": 64.0}
    for text, want in cases.items():
        assert compile_expression(text, [])() == want, text
    assert np.isnan(compile_expression("(-8) ** (1 / 3)", [])())  # not a complex number
    s = jnp.asarray([1.0, 0.5, 0.25], jnp.float32)
    got = jax.jit(lambda s: compile_expression("s[1] ** 2 + 2**3", ["s"])(s=s))(s)
    assert got.dtype == jnp.float32 and float(got) == 8.25


@pytest.mark.parametrize("text", ["9**9**9", "N/0", "10.0**400", "N - N * 10**400", "9.0**9**9"])
def test_d_expressions_that_overflow_or_divide_by_zero_name_d_and_its_range(text):
    with within(0.5), pytest.raises(ValueError, match=r"need a finite value, 1 <= d <= N") as e:
        d_at(text, 100)
    assert _one_line(e).startswith(f"d={text!r} is ")


def test_a_spec_whose_d_is_a_huge_power_is_refused_at_once():
    text = """\
[grid]
policy = [{ name = "pod", d = ["9**9**9"] }]
n_servers = [100]
load = [0.9]
[run]
replicas = 4
time = 50
"""
    with within(2.0), pytest.raises(SpecError, match=r"d='9\*\*9\*\*9' is inf .*1 <= d <= N"):
        parse_spec(text)


@pytest.mark.parametrize("text", DEEP.values(), ids=DEEP.keys())
def test_deep_nesting_names_the_depth_limit(text):
    with within(2.0), pytest.raises(ValueError, match=rf"the depth limit is {MAX_DEPTH} ") as e:
        compile_expression(text, ["N"])
    assert len(_one_line(e)) < 400  # the expression shortened, not repeated in full
    with pytest.raises(ValueError, match=rf"y_scale: .*the depth limit is {MAX_DEPTH} "):
        check_expression(text, "y_scale")
    with pytest.raises(ValueError, match=rf"the depth limit is {MAX_DEPTH} "):
        evaluate_expression(text, {})
    with pytest.raises(ValueError, match=rf"the depth limit is {MAX_DEPTH} "):
        d_at(text, 100)


def test_nesting_up_to_the_limit_still_works():
    assert compile_expression("-" * (MAX_DEPTH - 1) + "1", [])() == -1
    assert compile_expression("(" * MAX_DEPTH + "2" + ")" * MAX_DEPTH, [])() == 2


def test_figure_expressions_overflow_into_a_value_error_at_once():
    with within(0.5), pytest.raises(ValueError, match="cannot be evaluated in floating point"):
        evaluate_expression("9**9**9", {})


def test_a_deep_metric_on_the_command_line_is_one_line_not_out_of_memory(no_compile, capsys):
    argv = ["simulate", "--policy", "pod", "--servers", "100", "--load", "0.5"]
    with within(2.0):
        code = cli_main([*argv, "--replicas", "2", "--metric", "x=" + "-" * 10_000 + "1"])
    err = capsys.readouterr().err
    assert code == 2 and "out of memory" not in err, err
    assert err.count("\n") == 1 and f"the depth limit is {MAX_DEPTH}" in err, err


# 2. subscripts out of range


@pytest.mark.parametrize("text", ["s[5000]", "s[-1000]", "q[4] + s[1]", "s[-5]"])
def test_a_constant_subscript_past_the_levels_is_refused(text):
    expr = compile_expression(text, ["s", "q"])
    arrays = {"s": np.array([1.0, 0.5, 0.25, 0.0]), "q": np.array([0.5, 0.25, 0.25, 0.0])}
    with pytest.raises(ValueError, match=r"out of range: \w has 4 entries here, need 0 <= k <= 3"):
        expr(**{k: arrays[k] for k in expr.variables})
    on_device = {k: jnp.asarray(v, jnp.float32) for k, v in arrays.items()}
    with pytest.raises(ValueError, match=r"need 0 <= k <= 3"):  # (JAX would clamp it)
        jax.jit(lambda a: expr(**{k: a[k] for k in expr.variables}))(on_device)


def test_subscripts_and_slices_in_range_keep_working():
    s = np.array([1.0, 0.5, 0.25, 0.0])
    cases = {"s[3]": 0.0, "s[-4]": 1.0, "s[-2] * 4": 1.0, "sum(s[1:])": 0.75, "sum(s[1:50])": 0.75}
    for text, want in cases.items():
        assert float(compile_expression(text, ["s"])(s=s)) == want, text


def test_a_user_metric_subscript_past_the_levels_is_refused_where_they_are_known():
    """The levels are known when the step is traced (the shapes are static): refused there."""
    metrics = user_metrics({"far": "s[5000]"})
    s = jnp.asarray([1.0, 0.4, 0.1], jnp.float32)
    state = MetricState(s, s - jnp.append(s[1:], 0.0), 100.0, 1.0, 0.5)
    with pytest.raises(ValueError, match=r"s\[5000\] is out of range: s has 3 entries"):
        jax.jit(lambda st: evaluate(metrics, st))(state)
    ok = user_metrics({"near": "s[2]", "rest": "sum(s[1:])"})
    np.testing.assert_allclose(evaluate(ok, state), [0.1, 0.5], rtol=1e-6)


# 3. duplicate --metric


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_a_metric_named_twice_is_refused(command, capsys):
    argv = [command, "--metric", "x=s[1]", "--metric", "y=s[2]", "--metric", "x=s[2]"]
    if command == "simulate":
        argv += ["--policy", "pod", "--servers", "100", "--load", "0.5"]
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2
    assert "argument --metric: 'x' is defined twice ('s[1]' and 's[2]')" in err, err


def test_different_metric_names_are_all_kept():
    argv = ["simulate", "--policy", "pod", "--servers", "100", "--load", "0.5"]
    argv += ["--metric", "x=s[1]"]
    args = build_parser().parse_args([*argv, "--metric", "y=s[2]"])
    assert args.metrics == [("x", "s[1]"), ("y", "s[2]")]


# 4. a metric that is never finite


@pytest.mark.parametrize("text", ["9**9**9", "1 / 0", "log(0)", "exp(1000)"])
def test_a_metric_that_is_infinite_in_every_state_is_refused(text):
    with pytest.raises(ValueError, match=r"metric 'x' is -?(inf|nan) in every state") as e:
        user_metrics({"x": text})
    _one_line(e)
    user_metrics({"x": "log(s[1])"})  # (depends on the state: evaluated where it runs)


# 5. JIQ-Threshold's z


def test_the_mean_field_z_bound_is_where_two_busy_members_stop_fitting():
    assert threshold._busy_limit(threshold.Z_MAX) == 2
    assert threshold._busy_limit(threshold.Z_MAX + 1) == 1


@pytest.mark.parametrize("z", [threshold.Z_MAX + 1, 100, 100_000])
def test_a_large_z_is_refused_by_the_mean_field_at_once(z):
    pattern = rf"z={z} is out of range for the JIQ-Threshold mean field: need 0 <= z <= 33 \("
    with within(1.0), pytest.raises(RuntimeError, match=pattern) as e:
        threshold.jiq_threshold_mean_field(jq.make("jiq-threshold", z=z), 0.9, 10.0)
    _one_line(e)


def test_theory_command_refuses_a_large_z_in_under_a_second(capsys):
    argv = ["theory", "--policy", "jiq-threshold", "--z", "100", "--load", "0.9", "--ratio", "10"]
    with within(1.0):
        code = cli_main(argv)
    err = capsys.readouterr().err
    assert code == 3 and err.count("\n") == 1
    assert err.startswith("error: z=100 is out of range for the JIQ-Threshold mean field: need")


def test_simulate_with_a_large_z_starts_empty_at_once():
    """The simulator takes any z (a static comparison: as fast at z = 10^5 as at 1);
    its automatic mean-field start is refused at once, with a warning saying why (the
    planner's own sizing compiles a small helper, whatever z: done first, untimed)."""
    plan("jiq-threshold", [0.9], 100, 10, z=1, replicas=2, steps=256, init="empty")
    with within(1.0), pytest.warns(jq.StartWarning, match=r"z=100000 is out of range .*<= 33"):
        p = plan("jiq-threshold", [0.9], 100, 10, z=100_000, replicas=2, steps=256)
    assert p.init == "empty"


def test_simulate_refuses_z_past_its_own_bound_before_compiling(no_compile, capsys):
    argv = ["simulate", "--policy", "jiq-threshold", "--z", "2000000", "--load", "0.5"]
    with within(1.0):
        code = cli_main([*argv, "--servers", "100", "--dispatchers", "10", "--replicas", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err == "error: z=2000000 is out of range: need 0 <= z <= 1000000\n"
