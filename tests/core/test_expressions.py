"""The expression language of user metrics and parameters given as text: values and safety."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxqueue.core.expressions import FUNCTIONS, Expression, compile_expression

NAMES = ("s", "q", "N", "alpha", "load")


def test_numbers_on_the_host_are_float64():
    expr = compile_expression("N**0.5 * log(N)**2", ["N"])
    assert float(expr(N=1000)) == 1000**0.5 * math.log(1000) ** 2
    assert expr.variables == frozenset({"N"})


def test_arithmetic_comparisons_and_functions():
    s = np.array([1.0, 0.5, 0.25, 0.0])
    cases = {
        "sum(s[1:])": 0.75,
        "1 - s[1]": 0.5,
        "s[-2] * 4": 1.0,
        "-s[1] + +2": 1.5,
        "2 ** -1 / 4": 0.125,
        "where(s[1] >= 0.5, 1, 0)": 1.0,
        "0 < s[2] < 0.5": 1.0,
        "s[1] != 0.5": 0.0,
        "min(s) + max(s[1], 3, 2)": 3.0,
        "minimum(s[1], 0.1) + maximum(s[3], 0.2)": 0.3,
        "exp(0) + sqrt(4) + abs(-1) + floor(1.5) + ceil(1.5)": 7.0,
        "sum(s[::2])": 1.25,
    }
    for text, want in cases.items():
        assert float(compile_expression(text, NAMES)(s=s)) == pytest.approx(want), text


def test_the_same_expression_under_jit_on_arrays():
    expr = compile_expression("maximum(sum(s[1:]) - 1 - alpha * log(N) / N, 0) ** 2", NAMES)
    s = jnp.asarray([1.0, 0.9, 0.5, 0.1], jnp.float32)
    got = jax.jit(lambda s: expr(s=s, N=100, alpha=0.5))(s)
    want = max(1.5 - 1 - 0.5 * math.log(100) / 100, 0) ** 2
    assert got.dtype == jnp.float32
    assert float(got) == pytest.approx(want, rel=1e-6)


def test_equal_by_text_so_static_under_jit():
    a, b = compile_expression("s[1]", NAMES), compile_expression("s[1]", ["s"])
    assert a == b and hash(a) == hash(b)
    assert a != compile_expression("s[2]", NAMES)
    assert isinstance(a, Expression) and str(a) == "s[1]"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("s.__class__", "attribute access"),
        ("s.sum()", "attribute access"),
        ("os.system('x')", "attribute access"),
        ("__import__('os')", "unknown function '__import__'"),
        ("__builtins__", "names starting with '_'"),
        ("lambda: 1", "a lambda"),
        ("[x for x in s]", "a comprehension"),
        ("sum(x for x in s)", "a generator expression"),
        ("{x: 1 for x in s}", "a comprehension"),
        ("open('f')", "unknown function 'open'"),
        ("eval('1')", "unknown function 'eval'"),
        ("lg(s[1])", "did you mean 'log'"),
        ("alhpa + 1", "did you mean 'alpha'"),
        ("log", "a function: call it"),
        ("s[N]", "integer literals"),
        ("s[1, 2]", "only one subscript"),
        ("(s)[1][0]", "only named arrays"),
        ("'text'", "not a number"),
        ("True + 1", "not a number"),
        ("1 if s else 2", "where(c, x, y)"),
        ("s[1] and s[2]", "'and'/'or'"),
        ("7 % 2", "operator Mod"),
        ("exp(1, 2)", "takes 1 argument"),
        ("log(x=1)", "no keyword"),
        ("1 +", "cannot parse"),
        ("x := 1", "cannot parse"),
        ("f'{s}'", "a formatted string"),
    ],
)
def test_anything_outside_the_language_is_refused(text, says):
    with pytest.raises(ValueError, match="Allowed names: N, alpha, load, q, s; functions") as err:
        compile_expression(text, NAMES)
    assert says in str(err.value)


def test_empty_text_and_missing_values():
    with pytest.raises(ValueError, match="non-empty"):
        compile_expression("  ", NAMES)
    with pytest.raises(ValueError, match="no value for alpha"):
        compile_expression("alpha * s[1]", NAMES)(s=np.ones(3))


def test_the_whitelist():
    assert set(FUNCTIONS) == {
        "log",
        "exp",
        "sqrt",
        "abs",
        "floor",
        "ceil",
        "minimum",
        "maximum",
        "min",
        "max",
        "sum",
        "where",
    }
