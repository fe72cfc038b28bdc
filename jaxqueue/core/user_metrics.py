"""User-defined metrics: functions of a replica's occupancy state, averaged over time and arrivals.

A metric is a JAX function of a :class:`MetricState` or an expression
(:mod:`jaxqueue.core.expressions`) over its fields; the simulator reports its time
average and its average over accepted arrivals (``docs/metrics.md``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.expressions import Expression, compile_expression

__all__ = [
    "MetricState",
    "UserMetric",
    "STATE_NAMES",
    "PER_ARRIVAL",
    "UserMetricWarning",
    "nonfinite_message",
    "user_metrics",
    "metric_names",
    "metric_settings",
    "evaluate",
    "evaluation_error",
    "at_state",
    "at_fixed_point",
]

#: The suffix of a metric's average over accepted arrivals (``name_per_arrival``).
PER_ARRIVAL = "_per_arrival"


class UserMetricWarning(UserWarning):
    """A user metric was infinite or undefined (inf or NaN) in states a run visited, so
    its average is reported as inf or NaN (:func:`nonfinite_message`)."""


def nonfinite_message(name: str, averages: dict) -> str:
    """What to say of metric ``name`` whose averages ``{result name: reported value}``
    (its time average ``name``, its per-arrival average ``name_per_arrival``) came out
    infinite or undefined: one line, with a guard to write instead."""
    said = " and ".join(
        f"its {'per-arrival' if key.endswith(PER_ARRIVAL) else 'time'} average ({key}) is {value}"
        for key, value in averages.items()
    )
    return (
        f"metric {name!r} is infinite or undefined in some visited states: {said}; guard "
        "the expression where it is undefined, e.g. where(s[3] > 0, 1/s[3], 0) for 1/s[3]"
    )


class MetricState(NamedTuple):
    """What a user metric sees of one replica at one instant (float32 JAX values).

    Attributes:
        s: ``(levels + 1,)`` tail fractions: ``s[k]`` the fraction of servers with at
            least ``k`` tasks (``s[0] = 1``).
        q: ``(levels + 1,)`` the fraction of servers with exactly ``k`` tasks.
        N, M: the numbers of servers and dispatchers.
        load: the arrival rate per server, ``lambda``.
        iq: the I-queue tail fractions: ``iq[j]`` the fraction of dispatchers listing at
            least ``j`` idle servers (JIQ family; ``(2,)`` with one dispatcher); ``None``
            for the policies without I-queues.
    """

    s: jax.Array
    q: jax.Array
    N: jax.Array
    M: jax.Array
    load: jax.Array
    iq: jax.Array | None = None


#: The names an expression reads from the state (``iq`` only where the policy has I-queues).
STATE_NAMES = MetricState._fields


@dataclasses.dataclass(frozen=True)
class UserMetric:
    """One named metric: ``function(state) -> scalar`` or an :class:`Expression`.

    Hashable (a function by identity, an expression by its text), so it is a static
    argument of the compiled step: the same metric reuses one compiled program.
    ``constants`` are parameters an expression reads besides the state (a sweep
    point's ``alpha``), as ``(name, value)`` pairs.
    """

    name: str
    function: Callable | Expression
    constants: tuple = ()

    @property
    def text(self) -> str:
        """The expression, or the function's qualified name (what the settings record)."""
        if isinstance(self.function, Expression):
            return self.function.text
        fn = self.function
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"

    @property
    def uses_iq(self) -> bool:
        """Whether an expression reads ``iq`` (a function's needs show when it runs)."""
        return isinstance(self.function, Expression) and "iq" in self.function.variables

    def __call__(self, state: MetricState):
        if isinstance(self.function, Expression):
            fields = state._asdict()
            values = {k: fields[k] for k in self.function.variables if k in fields}
            return self.function(**values, **dict(self.constants))
        return self.function(state)


def user_metrics(metrics, parameters: Mapping | None = None, reserved=()) -> tuple:
    """The metrics of ``metrics``, checked: ``{name: expression or function}`` (or
    :class:`UserMetric` values, or ``None`` for none) as a tuple of :class:`UserMetric`.

    Expressions may read :data:`STATE_NAMES` and the ``parameters`` (bound as
    constants; one whose value is ``None`` stays unbound, and evaluating says so). A name must be an identifier, not one of ``reserved`` (the built-in
    metrics), nor end in :data:`PER_ARRIVAL`; a bad expression raises ``ValueError``.
    """
    if metrics is None:
        return ()
    if isinstance(metrics, tuple) and all(isinstance(m, UserMetric) for m in metrics):
        for m in metrics:
            _check_name(m.name, reserved)
        if len({m.name for m in metrics}) < len(metrics):
            raise ValueError(f"two metrics share a name: {[m.name for m in metrics]}")
        return metrics
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"metrics must map names to expressions or functions, not {type(metrics).__name__}"
        )
    params = dict(parameters or {})
    names = set(STATE_NAMES) | set(params)
    out = []
    for name, spec in metrics.items():
        _check_name(name, reserved)
        if isinstance(spec, UserMetric):
            out.append(dataclasses.replace(spec, name=name))
        elif isinstance(spec, str):
            try:
                expr = compile_expression(spec, names)
            except ValueError as err:  # named with its metric (a spec's table, a flag)
                raise ValueError(f"metric {name!r}: {err}") from None
            bound = tuple(
                (k, params[k]) for k in sorted(expr.variables) if params.get(k) is not None
            )
            _check_constant(name, expr, dict(bound))
            out.append(UserMetric(name, expr, bound))
        elif callable(spec):
            out.append(UserMetric(name, spec))
        else:
            raise TypeError(f"metric {name!r}: an expression (str) or a function, not {spec!r}")
    return tuple(out)


def _check_constant(name: str, expr: Expression, bound: dict) -> None:
    """Refuse a metric that reads no state (nor any unbound parameter) and is not finite
    (``9**9**9`` is inf): its time sums would be NaN, and its estimate empty."""
    if not expr.variables <= set(bound):
        return
    try:
        with np.errstate(all="ignore"):
            value = float(np.asarray(expr(**bound), np.float64))
    except (ArithmeticError, TypeError, ValueError):
        return  # (not a number here: said where it is evaluated, as before)
    if not math.isfinite(value):
        raise ValueError(
            f"metric {name!r} is {value} in every state ({expr.text!r}): a metric must be finite"
        )


def _check_name(name, reserved) -> None:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"metric name {name!r} must be an identifier not starting with '_'")
    if name in reserved:
        raise ValueError(f"metric name {name!r} is a built-in metric: choose another name")
    if name.endswith(PER_ARRIVAL):
        raise ValueError(f"metric name {name!r} may not end in {PER_ARRIVAL!r} (reserved)")


def metric_names(metrics) -> tuple:
    """The result names of ``metrics``: each ``name`` (time average), then each
    ``name_per_arrival`` (average over accepted arrivals)."""
    names = tuple(m.name for m in metrics)
    return names + tuple(n + PER_ARRIVAL for n in names)


def metric_settings(metrics) -> dict:
    """``{name: expression}`` (or the function's name), with its bound constants,
    as a result's settings record it."""
    out = {}
    for m in metrics:
        consts = ", ".join(f"{k}={v!r}" for k, v in m.constants)
        out[m.name] = m.text + (f"  [{consts}]" if consts else "")
    return out


def evaluate(metrics, state: MetricState) -> jax.Array:
    """The metrics at ``state``: float32 ``(K,)``."""
    values = []
    for m in metrics:
        v = jnp.asarray(m(state), jnp.float32)
        if v.shape != ():
            raise ValueError(
                f"metric {m.name!r} must give a scalar (one number), not an array of shape "
                f"{v.shape}: reduce it with sum(), max() or min(), or take one entry (s[1])"
            )
        values.append(v)
    return jnp.stack(values)


def evaluation_error(metric: UserMetric, err: Exception, levels: int, iq: int | None) -> str:
    """One line on a metric that cannot be evaluated on a run's state (``levels + 1``
    entries in ``s`` and ``q``, ``iq`` in ``iq`` or None without I-queues), naming it
    and what it may read."""
    text = " ".join(str(err).split()) or type(err).__name__
    if text.startswith(f"metric {metric.name!r}"):  # (it says what a metric must give)
        return text
    if text.startswith("expression "):  # (it quotes the expression)
        text = f"metric {metric.name!r}: {text}"
    else:
        text = f"metric {metric.name!r} ({metric.text!r}) cannot be evaluated: {text}"
    if "out of range" in text:  # (the subscript's message says the entries)
        return f"{text}; a larger levels tracks longer queues"
    reads = f"s and q have {levels + 1} entries (s[0] to s[{levels}])"
    if iq is not None:
        reads += f", iq has {iq} (iq[0] to iq[{iq - 1}])"
    return f"{text} ({reads}; N, M and load are numbers; a metric gives one number)"


def at_state(metrics, tail, n, m, load, iq=None) -> dict:
    """Each metric (time average and per arrival alike) at one deterministic state: a
    mean-field fixed point's tails ``tail`` (``s_0 = 1``), where a metric of the
    occupancy concentrates as ``N`` grows. float64 on the host; ``None`` for a metric
    that cannot be evaluated there (one that reads ``iq`` without I-queue tails)."""
    s = np.asarray(tail, np.float64)
    q = s - np.concatenate([s[1:], np.zeros(1)])
    iq = None if iq is None else np.asarray(iq, np.float64)
    state = MetricState(s, q, float(n), float(m), float(load), iq)
    out = {}
    for metric in metrics:
        try:
            value = float(np.asarray(metric(state)))
        except (ValueError, TypeError, AttributeError, IndexError):
            value = None
        out[metric.name] = value
        out[metric.name + PER_ARRIVAL] = value
    return out


def at_fixed_point(result, metrics, n, m, load):
    """A mean-field result (``source == "mean-field"``) with the user ``metrics`` at its
    fixed point (:func:`at_state`; ``iq`` from its I-queue law or ``p0``) in its
    ``user_metrics``; any other result as it is (an exact chain's tails are a mean, at
    which a nonlinear metric is not its mean)."""
    if not metrics or result is None or getattr(result, "source", None) != "mean-field":
        return result
    iq = None  # the I-queue tails: from their law, or with one I-queue from p0
    if result.iqueue_distribution is not None:
        iq = np.cumsum(np.asarray(result.iqueue_distribution, np.float64)[::-1])[::-1]
    elif result.p0 is not None:
        iq = np.array([1.0, 1.0 - float(result.p0)])
    values = at_state(metrics, result.tail, n, m, load, iq)
    values = {k: v if v is not None and math.isfinite(v) else None for k, v in values.items()}
    return dataclasses.replace(result, user_metrics=values)
