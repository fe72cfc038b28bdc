"""Checks of the single values of a spec (numbers, a policy's ``d`` as an expression
of N, run lengths, service laws, pools, arrivals files, buffers, sensitivities and
paired points): each returns the value checked or raises a ValueError naming the key
and its valid range. The parser (:mod:`jaxqueue.studies.grids.spec_parser`) adds the line.

A metric ``m`` differentiated in a parameter ``p`` is stored as the metric
``d_m_d_p``, its Richardson flag as ``d_m_d_p_curved``; a paired point's difference
from its line's reference as ``diff_m`` (docs/sweeps.md, Sensitivities and paired points).
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from pathlib import Path

from jaxqueue.core.arrivals import parse_arrivals
from jaxqueue.core.expressions import compile_expression
from jaxqueue.core.service import make_pools, parse_service
from jaxqueue.core.system import check_int
from jaxqueue.core.user_metrics import PER_ARRIVAL
from jaxqueue.results.schema import QUANTILE_NAMES, SCALAR_METRICS
from jaxqueue.studies.crn.sides import LOAD_PARAMETERS, PARAMETERS, SYSTEM_PARAMETERS
from jaxqueue.studies.grids.points import ArrivalsFile
from jaxqueue.studies.plotting.figure_spec import check_expression

__all__ = [
    "number",
    "int_check",
    "D_NAMES",
    "d_at",
    "span",
    "choice",
    "service_value",
    "pools_text",
    "arrivals_text",
    "read_arrivals",
    "buffer_value",
    "CURVED",
    "derivative_name",
    "derivative_names",
    "DIFFERENCE",
    "CORRELATION",
    "COUPLED",
    "difference_name",
    "difference_names",
    "derived_names",
    "sensitivity_value",
    "paired_value",
    "sensitivity_missing",
]


def number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def int_check(name: str, lo: int, hi: int):
    return lambda value: check_int(name, value, lo, hi) or value


#: The names a policy's ``d`` given as an expression may read, per point.
D_NAMES = ("N", "alpha", "beta")


def d_at(text: str, n: int, alpha=None, beta=None) -> tuple[int, str | None]:
    """``d`` given as an expression (e.g. ``"N**0.5 * log(N)**2"``) at a point of ``n``
    servers: rounded to the nearest integer and clipped to ``[1, n]``, and a note
    saying so where it was clipped (else None).

    Raises:
        ValueError: outside the expression language, for a name the point lacks
            (``alpha`` at a plain load) or a value that is not finite.
    """
    expr = compile_expression(text, D_NAMES)
    values = {"N": float(n), "alpha": alpha, "beta": beta}
    if missing := sorted(k for k in expr.variables if values[k] is None):
        raise ValueError(
            f"d={text!r} names {', '.join(missing)}, which this point has not "
            "(give the load axis as alpha or beta)"
        )
    with warnings.catch_warnings():  # log(0) and the like: refused below, not warned about
        warnings.simplefilter("ignore", RuntimeWarning)
        try:  # (constant arithmetic is in floats: an overflow is inf, not an exception)
            x = float(expr(**{k: values[k] for k in expr.variables}))
        except (ArithmeticError, ValueError) as err:
            raise ValueError(
                f"d={text!r} cannot be evaluated at N={n} ({err}): need a finite value, "
                "1 <= d <= N once rounded"
            ) from None
    if not math.isfinite(x):
        raise ValueError(
            f"d={text!r} is {x} at N={n}: need a finite value, 1 <= d <= N once rounded"
        )
    k = math.floor(x + 0.5)
    d = min(max(k, 1), n)
    note = None if d == k else f"d={text!r} is {x:.6g} at N={n}: clipped to d={d} (1 <= d <= N)"
    return d, note


def span(name: str, zero: bool):
    def check(value):
        if isinstance(value, str):  # checked per point by RunSettings.time_units
            return check_expression(value, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"{name} must be a finite number or an expression string, got {value!r}"
            )
        if number(name, value) < 0 or (value == 0 and not zero):
            need = f"{name} {'>=' if zero else '>'} 0"
            raise ValueError(f"{name}={value} is out of range: need {need}")
        return float(value)

    return check


def choice(name: str, valid: tuple):
    def check(value):
        if value not in valid:
            raise ValueError(f"{name}={value!r} is not valid: use one of {str(valid)[1:-1]}")
        return value

    return check


def service_value(value, base=None):
    """A service law's command-line form, checked; ``"exp"`` is None (the default law).

    A ``ph:FILE.json`` law's file is found relative to ``base`` (the spec's folder;
    None: the working directory), like an ``arrivals`` file: the value is then
    ``(text, resolved, sha256)``, the form as written, ``ph:`` with the absolute
    path (what runs) and the digest of the file's bytes (part of the spec's hash).
    """
    if not isinstance(value, str):
        raise TypeError(f"service must be a string such as 'erlang:4', got {value!r}")
    kind, _, arg = value.partition(":")
    if kind == "ph" and arg:
        path = Path(base if base is not None else os.getcwd(), os.path.expanduser(arg)).resolve()
        resolved = f"ph:{path}"
        law = parse_service(resolved)
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as err:
            raise ValueError(f"service={value!r}: {path} cannot be read ({err})") from None
        return None if law.is_unit_exponential else (value, resolved, digest)
    law = parse_service(value)
    return None if law.is_unit_exponential else value


def pools_text(value):
    """Server pools ``"F1:S1,F2:S2"``, checked for form (counts are checked per N)."""
    if not isinstance(value, str):
        raise TypeError(f"pools must be a string such as '0.2:2,0.8:1', got {value!r}")
    make_pools(value, 10**6)  # the fractions and speeds; per-N counts at each point
    return value


def arrivals_text(value):
    """An ``arrivals`` value: a file path as written; ``"poisson"`` is None (the default)."""
    if not isinstance(value, str) or not value.strip():
        raise TypeError(
            f"arrivals must be a file path such as 'data/trace.csv' (or 'poisson'), got {value!r}"
        )
    return None if value == "poisson" else value


def read_arrivals(text: str, base) -> ArrivalsFile:
    """Find an ``arrivals`` file relative to ``base`` and parse it (errors: ValueError)."""
    path = Path(base, os.path.expanduser(text)).resolve()
    try:
        if not path.is_file():
            raise ValueError(f"no such file {path}")
        source = parse_arrivals(str(path))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except (OSError, ValueError) as err:
        raise ValueError(f"arrivals={text!r}: {err}") from None
    return ArrivalsFile(text, str(path), digest, source)


def buffer_value(value):
    if value == "inf" or (not isinstance(value, bool) and value in (0, math.inf)):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise ValueError(
            f"buffer={value} is out of range: need 1 <= buffer <= 10**6, or 0 or "
            '"inf" for infinite buffers'
        )
    return check_int("buffer", value, 1, 10**6) or value


#: The suffix of a derivative's Richardson flag (1.0: ``D(h)`` and ``D(h / 2)`` disagree).
CURVED = "_curved"


def derivative_name(metric: str, parameter: str) -> str:
    """The stored name of ``d metric / d parameter``: ``d_<metric>_d_<parameter>``."""
    return f"d_{metric}_d_{parameter}"


def derivative_names(parameters, user=()) -> tuple:
    """Every derivative (and flag) name a spec differentiating in ``parameters`` may
    store: the scalar metrics, the response-time quantiles (``p50`` ...) and the
    user metrics ``user`` (and their per-arrival forms)."""
    metrics = SCALAR_METRICS + QUANTILE_NAMES
    metrics += tuple(n for name in user for n in (name, name + PER_ARRIVAL))
    names = tuple(derivative_name(m, p) for p in parameters for m in metrics)
    return names + tuple(n + CURVED for n in names)


#: The prefix of a difference from the line's reference: ``diff_<metric>``.
DIFFERENCE = "diff_"
#: The suffix of the correlation of a point's values with its reference's.
CORRELATION = "_correlation"
#: The suffix of the coupling flag (1.0: the correlation is above
#: :func:`~jaxqueue.studies.crn.paired.coupling_threshold`).
COUPLED = "_coupled"


def difference_name(metric: str) -> str:
    """The stored name of ``metric``'s difference from the reference: ``diff_<metric>``."""
    return DIFFERENCE + metric


def difference_names(paired: bool, user=()) -> tuple:
    """Every difference (correlation and coupling) name a spec may store: none
    unless ``paired``; else those of the metrics of :func:`derivative_names`."""
    if not paired:
        return ()
    metrics = SCALAR_METRICS + QUANTILE_NAMES
    metrics += tuple(n for name in user for n in (name, name + PER_ARRIVAL))
    names = tuple(difference_name(m) for m in metrics)
    return names + tuple(n + s for s in (CORRELATION, COUPLED) for n in names)


def derived_names(run, user=()) -> tuple:
    """The derivative and difference names a spec of run settings ``run``
    (:class:`~jaxqueue.studies.grids.points.RunSettings`) may store."""
    return derivative_names(run.sensitivity, user) + difference_names(run.paired, user)


def sensitivity_value(value) -> tuple:
    """``[run] sensitivity``: a parameter of :data:`LOAD_PARAMETERS` or a list of them.

    The parameters of the compiled system (a pool's speed or share, the SCV, a
    profile's amplitude) are refused here, before anything runs: a spec's theory
    rows difference the mean field in the load, and they have no such rows
    (``jaxqueue.sensitivity`` and ``simulate --sensitivity`` take them)."""
    given = value if isinstance(value, list) else [value]
    system = [v for v in given if v in SYSTEM_PARAMETERS]
    if system:
        raise ValueError(
            f"sensitivity={system[0]!r} is not available in a spec: [run] sensitivity "
            f"takes {', '.join(LOAD_PARAMETERS)}; differentiate in {system[0]} with "
            f"jaxqueue.sensitivity(..., parameter={system[0]!r}) or simulate --sensitivity "
            f"{system[0]}"
        )
    if not given or any(v not in PARAMETERS for v in given) or len(set(given)) < len(given):
        raise ValueError(
            f"sensitivity={value!r} is not valid: give one of {', '.join(LOAD_PARAMETERS)} "
            "or a list of distinct ones"
        )
    return tuple(given)


def paired_value(value) -> bool:
    """``[run] paired``: true or false."""
    if not isinstance(value, bool):
        raise ValueError(f"paired={value!r} is not valid: give true or false")
    return value


def sensitivity_missing(parameters: tuple, alpha, beta) -> str | None:
    """Why a point given by ``alpha``/``beta`` (or a plain load) cannot be
    differentiated in ``parameters``, or None."""
    for name, value in (("alpha", alpha), ("beta", beta)):
        if name in parameters and value is None:
            return (
                f"sensitivity in {name} needs every point given by {name} (a [grid] "
                f"{name} axis); differentiate in the load instead"
            )
    return None
