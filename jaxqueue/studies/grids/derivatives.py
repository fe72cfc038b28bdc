"""The names and ``[run]`` keys of a grid spec's sensitivities and paired points: a
metric ``m`` differentiated in a parameter ``p`` is stored as the metric
``d_m_d_p``, its Richardson flag as ``d_m_d_p_curved``; a paired point's difference
from its line's reference as ``diff_m`` (docs/sweeps.md, Sensitivities and paired points).
"""

from __future__ import annotations

import hashlib

from jaxqueue.core.user_metrics import PER_ARRIVAL
from jaxqueue.results.schema import QUANTILE_NAMES, SCALAR_METRICS
from jaxqueue.studies.crn.sensitivity import LOAD_PARAMETERS, PARAMETERS
from jaxqueue.studies.crn.sensitivity_sides import SYSTEM_PARAMETERS

__all__ = [
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
    "paired_word",
]

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


def paired_word(seed: int) -> int:
    """The one stream of every point of a paired spec: a 31-bit integer from the
    sha256 of ``"paired:<seed>"`` (unpaired points draw from ``Point.seed_word``)."""
    digest = hashlib.sha256(f"paired:{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1
