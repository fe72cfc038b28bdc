"""A small, safe expression language: user-defined metrics and parameters given as text.

An expression is parsed with :mod:`ast` and checked against a whitelist (numbers, named
variables, arithmetic, comparisons, integer subscripts and slices, a few functions); nothing
is ever passed to ``eval``. The language is described in ``docs/metrics.md``.
"""

from __future__ import annotations

import ast
import difflib
import operator
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["FUNCTIONS", "MAX_DEPTH", "Expression", "compile_expression", "parse_expression"]

#: The deepest an expression may nest (operators, calls, subscripts, parentheses): far past
#: any formula, and well inside Python's parser and recursion limits.
MAX_DEPTH = 100


def _extremum(name: str) -> Callable:
    def run(xp, *args):
        if len(args) == 1:
            return getattr(xp, name)(args[0])
        out = args[0]
        for arg in args[1:]:
            out = getattr(xp, "minimum" if name == "min" else "maximum")(out, arg)
        return out

    return run


def _plain(name: str, arity: tuple[int, int]) -> tuple[Callable, tuple[int, int]]:
    return (lambda xp, *args: getattr(xp, name)(*args)), arity


#: The functions an expression may call: name -> (implementation(xp, *args), (min, max) arguments).
FUNCTIONS: dict[str, tuple[Callable, tuple[int, int]]] = {
    "log": _plain("log", (1, 1)),
    "exp": _plain("exp", (1, 1)),
    "sqrt": _plain("sqrt", (1, 1)),
    "abs": _plain("abs", (1, 1)),
    "floor": _plain("floor", (1, 1)),
    "ceil": _plain("ceil", (1, 1)),
    "minimum": _plain("minimum", (2, 2)),
    "maximum": _plain("maximum", (2, 2)),
    "min": (_extremum("min"), (1, 99)),
    "max": (_extremum("max"), (1, 99)),
    "sum": _plain("sum", (1, 1)),
    "where": _plain("where", (3, 3)),
}

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_COMPARE = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}

_DESCRIBE = {
    ast.Attribute: "attribute access ('.')",
    ast.Lambda: "a lambda",
    ast.ListComp: "a comprehension",
    ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension",
    ast.GeneratorExp: "a generator expression",
    ast.BoolOp: "'and'/'or' (use comparisons with where, minimum, maximum)",
    ast.IfExp: "'x if c else y' (use where(c, x, y))",
    ast.Starred: "'*' unpacking",
    ast.NamedExpr: "':=' assignment",
    ast.JoinedStr: "a formatted string",
}


#: The largest integer constant kept an int (int32's); a larger one is a float.
_LARGEST_INT = 2**31 - 1


def _arithmetic(op: Callable, a, b):
    """``op(a, b)``; between two plain numbers in float64, as arrays are computed (an
    integer power of integers would be exact and without bound: ``9**9**9``), so that an
    overflow is inf and a division by zero inf or NaN, at once."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        with np.errstate(all="ignore"):
            return float(op(np.float64(a), np.float64(b)))
    return op(a, b)


def _shown(text: str, width: int = 80) -> str:
    """``repr(text)``, shortened in the middle past ``width`` characters (for messages)."""
    if len(text) <= width:
        return repr(text)
    return repr(text[: width // 2]) + f" ... ({len(text)} characters) ... " + repr(text[-10:])


def _too_deep(text: str) -> ValueError:
    return ValueError(
        f"expression {_shown(text)} is nested too deeply: the depth limit is "
        f"{MAX_DEPTH} nested operators, calls, subscripts or parentheses"
    )


def _depth(tree: ast.AST) -> int:
    """The depth of ``tree`` (without recursion: it may be deep)."""
    deepest, stack = 0, [(tree, 1)]  # (past MAX_DEPTH + 1: not counted further)
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:  # past the limit: no need to go further down
            stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def parse_expression(text: str) -> ast.expr:
    """``text`` parsed as one Python expression (its body), at most :data:`MAX_DEPTH` deep.

    Raises:
        ValueError: past the depth limit (one line, naming it), also where Python's
            parser itself gives up on the nesting (a RecursionError or MemoryError).
        SyntaxError: for anything else that does not parse.
    """
    brackets = 0
    for char in text:  # parentheses leave no node: counted before parsing
        brackets += (char in "([{") - (char in ")]}")
        if brackets > MAX_DEPTH:
            raise _too_deep(text)
    try:
        tree = ast.parse(text, mode="eval").body
    except (RecursionError, MemoryError):  # the parser's own stack, with thousands of levels
        raise _too_deep(text) from None
    except ValueError as err:  # e.g. an integer literal past Python's digit limit
        raise SyntaxError(str(err)) from None
    if _depth(tree) > MAX_DEPTH:
        raise _too_deep(text)
    return tree


def _suggest(word: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Compiler:
    """Checks a parsed expression and turns it into a closure ``f(xp, values)``."""

    def __init__(self, text: str, names: Collection[str]):
        self.text, self.names, self.used = text, frozenset(names), set()
        self.indexed = set()  # (name, k): the constant subscripts, checked against the shapes

    def fail(self, what: str, node: ast.AST | None = None, hint: str = "") -> ValueError:
        where = ""
        if node is not None and hasattr(node, "col_offset"):
            where = f" at column {node.col_offset + 1}"
        return ValueError(
            f"expression {_shown(self.text)}: {what}{where}{hint}. Allowed names: "
            f"{', '.join(sorted(self.names)) or '(none)'}; functions: {', '.join(FUNCTIONS)}"
        )

    def node(self, node: ast.AST) -> Callable:
        kind = type(node)
        if kind is ast.Constant:
            return self.constant(node)
        if kind is ast.Name:
            return self.name(node)
        if kind is ast.BinOp and type(node.op) in _BINARY:
            op, left, right = _BINARY[type(node.op)], self.node(node.left), self.node(node.right)
            return lambda xp, v: _arithmetic(op, left(xp, v), right(xp, v))
        if kind is ast.UnaryOp and type(node.op) in _UNARY:
            op, arg = _UNARY[type(node.op)], self.node(node.operand)
            return lambda xp, v: op(arg(xp, v))
        if kind is ast.Compare:
            return self.compare(node)
        if kind is ast.Subscript:
            return self.subscript(node)
        if kind is ast.Call:
            return self.call(node)
        if kind in (ast.BinOp, ast.UnaryOp):
            op = type(node.op).__name__
            raise self.fail(f"operator {op} is not allowed (only + - * / ** and unary -)", node)
        raise self.fail(f"{_DESCRIBE.get(kind, repr(kind.__name__))} is not allowed", node)

    def constant(self, node: ast.Constant) -> Callable:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(f"the constant {value!r} is not a number", node)
        if isinstance(value, int) and abs(value) > _LARGEST_INT:
            try:  # past int32 (what a JAX array takes): a float, as its arithmetic is
                value = float(value)
            except OverflowError:
                raise self.fail("the constant is too large for a float", node) from None
        return lambda xp, v: value

    def name(self, node: ast.Name) -> Callable:
        ident = node.id
        if ident.startswith("_"):
            raise self.fail(f"the name {ident!r} is not allowed (names starting with '_')", node)
        if ident not in self.names:
            hint = " (a function: call it)" if ident in FUNCTIONS else ""
            hint = hint or _suggest(ident, self.names | set(FUNCTIONS))
            raise self.fail(f"unknown name {ident!r}", node, hint)
        self.used.add(ident)
        return lambda xp, v: v[ident]

    def compare(self, node: ast.Compare) -> Callable:
        ops = []
        for op in node.ops:
            if type(op) not in _COMPARE:
                raise self.fail(f"comparison {type(op).__name__} is not allowed", node)
            ops.append(_COMPARE[type(op)])
        parts = [self.node(node.left)] + [self.node(c) for c in node.comparators]

        def run(xp, v):
            values = [p(xp, v) for p in parts]
            out = ops[0](values[0], values[1])
            for op, a, b in zip(ops[1:], values[1:], values[2:], strict=False):
                out = xp.logical_and(out, op(a, b))
            return out

        return run

    def index(self, node: ast.AST | None) -> int | None:
        """An integer literal (optionally negated) inside a subscript: static under jit."""
        if node is None:
            return None
        sign = 1
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            sign, node = -1, node.operand
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return sign * node.value
        raise self.fail("subscripts and slice bounds must be integer literals", node)

    def subscript(self, node: ast.Subscript) -> Callable:
        if not isinstance(node.value, ast.Name):
            raise self.fail("only named arrays may be subscripted", node)
        base = self.name(node.value)
        part = node.slice
        if isinstance(part, ast.Slice):
            key = slice(self.index(part.lower), self.index(part.upper), self.index(part.step))
        elif isinstance(part, ast.Tuple):
            raise self.fail("only one subscript (arrays are vectors)", node)
        else:
            key = self.index(part)
            self.indexed.add((node.value.id, key))
        return lambda xp, v: base(xp, v)[key]

    def call(self, node: ast.Call) -> Callable:
        func = node.func
        if not isinstance(func, ast.Name):
            raise self.fail(f"{_DESCRIBE.get(type(func), 'this call')} is not allowed", func)
        if func.id not in FUNCTIONS:
            raise self.fail(f"unknown function {func.id!r}", func, _suggest(func.id, FUNCTIONS))
        if node.keywords:
            raise self.fail(f"{func.id}() takes no keyword arguments", node)
        impl, (low, high) = FUNCTIONS[func.id]
        if not low <= len(node.args) <= high:
            count = f"{low}" if low == high else f"{low} or more"
            raise self.fail(f"{func.id}() takes {count} argument(s), got {len(node.args)}", node)
        args = [self.node(a) for a in node.args]
        return lambda xp, v: impl(xp, *(a(xp, v) for a in args))


@dataclass(frozen=True)
class Expression:
    """A checked expression: call it with its variables as keywords.

    Equal (and hashable) by its text (the allowed names only restrict what parses), so it
    can be a static argument of a jitted function. Evaluates with ``jax.numpy`` when any value is a JAX array (under jit
    too), otherwise with NumPy in float64, so ``float(expr(N=1000))`` is the host's double.
    """

    text: str
    names: tuple[str, ...] = field(compare=False)
    #: the variables the expression reads (a subset of ``names``)
    variables: frozenset[str] = field(compare=False)
    _run: Callable = field(compare=False, repr=False)
    #: the constant subscripts, ``(name, k)`` (slices are not: they clip, as NumPy's do)
    subscripts: frozenset = field(default=frozenset(), compare=False)

    def __call__(self, **values):
        missing = sorted(self.variables - set(values))
        if missing:
            raise ValueError(f"expression {_shown(self.text)}: no value for {', '.join(missing)}")
        used = {k: values[k] for k in self.variables}
        self.check_subscripts({k: np.shape(x) for k, x in used.items()})
        on_device = any(isinstance(x, jax.Array) for x in used.values())
        return self._run(jnp if on_device else np, used)

    def check_subscripts(self, shapes: dict) -> None:
        """Refuse a constant subscript outside its array: ``shapes`` maps names to shapes
        (static under ``jit``, where a JAX array would otherwise clamp it in silence)."""
        for name, k in sorted(self.subscripts):
            shape = shapes.get(name)
            if shape is None or len(shape) != 1 or -shape[0] <= k < shape[0]:
                continue  # (a scalar's subscript fails as it is evaluated)
            size = shape[0]
            raise ValueError(
                f"expression {_shown(self.text)}: the subscript {name}[{k}] is out of range: "
                f"{name} has {size} entries here, need 0 <= k <= {size - 1} "
                f"(or -{size} <= k <= -1, from the end)"
            )

    def __str__(self) -> str:
        return self.text


def compile_expression(text: str, names: Collection[str]) -> Expression:
    """Parse and check ``text``; ``names`` are the variables it may read.

    Raises :class:`ValueError` naming the offending token, the allowed names and functions
    (and the closest allowed one) for anything outside the language.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"an expression must be a non-empty string, not {text!r}")
    compiler = _Compiler(text, names)
    try:
        tree = parse_expression(text.strip())
    except SyntaxError as err:
        raise compiler.fail(f"cannot parse it ({err.msg})") from None
    run = compiler.node(tree)
    used, indexed = frozenset(compiler.used), frozenset(compiler.indexed)
    return Expression(text, tuple(sorted(set(names))), used, run, indexed)
