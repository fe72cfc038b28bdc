"""The refined mean field's result: :class:`RefinedMeanField` and the refined
:class:`~jaxqueue.theory.result.MeanFieldResult` (mean field plus correction / N)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxqueue.core.status import Status
from jaxqueue.core.system import MAX_SERVERS, check_int
from jaxqueue.policies import make
from jaxqueue.results.estimates import json_number
from jaxqueue.theory.result import MeanFieldResult, Metrics, build

__all__ = ["RefinedMeanField", "refined_result", "check_ratio", "whole", "check_whole"]


@dataclasses.dataclass(frozen=True)
class RefinedMeanField:
    """The refined mean field of one policy at one point and one ``N``.

    Attributes:
        mean_field: the :class:`~jaxqueue.theory.result.MeanFieldResult` of the
            generic fixed point (the model the correction expands; ``None`` if
            the fixed point failed).
        correction: ``{metric: V}``, the ``1 / N`` coefficient of every metric
            of the result schema (floats, float64 arrays, ``{q: value}`` for
            ``response_quantiles``; ``None`` where the metric does not apply),
            or ``None`` unless ``status`` is ``CONVERGED``.
        refined: a :class:`~jaxqueue.theory.result.MeanFieldResult` holding
            ``mean field + V / N`` for every metric, its settings with
            ``n_servers`` and ``approximation = "refined"``; ``None`` unless
            ``status`` is ``CONVERGED``.
        n_servers: ``N``.
        status: :class:`~jaxqueue.core.status.Status`: ``CONVERGED``,
            ``NOT_DIFFERENTIABLE`` (JSQ-like routing; ``reason`` says why), the
            fixed point's failure status, or ``NON_FINITE`` (a non-finite
            correction, e.g. an unstable fixed point).
        reason: why there are no numbers (``None`` when ``CONVERGED``).
        state_correction: ``V`` for ``x = [s_1..s_L, Q_1..Q_J]``.
        covariance: ``W``, the limit of ``N Cov(X_N)``.
    """

    mean_field: MeanFieldResult | None
    correction: dict | None
    refined: MeanFieldResult | None
    n_servers: int
    status: Status
    reason: str | None = None
    state_correction: np.ndarray | None = None
    covariance: np.ndarray | None = None

    def at(self, n_servers: int) -> MeanFieldResult | None:
        """The refined values at another ``N``: the correction ``V`` does not depend on N.

        None unless ``status`` is ``CONVERGED``. For the JIQ family the ratio
        ``r = N / M`` stays the one the correction was computed for.
        """
        if self.correction is None:
            return None
        check_int("n_servers", n_servers, 1, MAX_SERVERS)
        mf = self.mean_field
        pol = make(mf.settings["policy"], **mf.settings["options"])
        if pol.uses_iqueues and not pol.single_dispatcher:
            check_whole(n_servers, check_ratio(mf.settings["ratio"], None))
        return refined_result(
            mf,
            self.correction,
            pol,
            mf.settings["load"],
            mf.settings["ratio"],
            mf.settings["buffer"],
            n_servers,
        )

    def to_dict(self) -> dict:
        """JSON-ready: ``refined`` (the keys of the mean field's ``to_dict``),
        ``correction`` (plain numbers and lists, same metric names), ``status``
        and ``reason``."""
        corr = None
        if self.correction is not None:
            corr = {
                k: (v if v is None or isinstance(v, dict) else json_number(v))
                for k, v in self.correction.items()
            }
            corr["response_quantiles"] = {
                str(q): json_number(v)
                for q, v in sorted(self.correction["response_quantiles"].items())
            }
        return {
            "n_servers": self.n_servers,
            "status": self.status.name,
            "reason": self.reason,
            "refined": None if self.refined is None else self.refined.to_dict(),
            "correction": corr,
        }


def refined_result(mf, corr, pol, lam, ratio, buffer, n) -> MeanFieldResult:
    """``mean field + correction / N`` as a MeanFieldResult (settings note the approximation)."""

    def at_n(name):
        base = getattr(mf, name)
        if base is None:
            return None
        return base + corr[name] / n

    plain = [m for m in Metrics._fields if m not in ("response_quantiles", "stale_fraction")]
    corrected = {name: at_n(name) for name in plain}
    quantiles = {q: t + corr["response_quantiles"][q] / n for q, t in mf.response_quantiles.items()}
    res = build(
        pol,
        Metrics(**corrected, response_quantiles=quantiles),
        load=lam,
        ratio=ratio,
        buffer=buffer,
        tail_remainder=mf.tail_remainder,
        iqueue_remainder=mf.iqueue_remainder,
    )
    res.settings["n_servers"] = n
    res.settings["approximation"] = "refined"
    return res


def check_ratio(ratio, n_servers):
    if ratio is None or (isinstance(ratio, float) and math.isinf(ratio)):
        return None
    try:
        r = float(ratio)
    except (TypeError, ValueError):
        raise TypeError(f"ratio must be a number or None, got {ratio!r}") from None
    if not (r > 0 and math.isfinite(r)):
        raise ValueError(f"ratio={ratio!r} is out of range: need 0 < ratio")
    if n_servers is not None and r > n_servers:
        raise ValueError(
            f"ratio={ratio!r} is out of range: need ratio <= n_servers "
            f"({n_servers}), at least one dispatcher"
        )
    return r


def whole(n_servers: int, ratio: float) -> bool:
    """Whether ``N / ratio`` dispatchers is a whole number."""
    m = n_servers / ratio
    return math.isclose(m, round(m), rel_tol=1e-9)


def check_whole(n_servers: int, ratio) -> None:
    """Refuse ``N`` servers at a ratio that does not make ``M = N / r`` whole: the
    refined value is that of a system of ``N`` servers and ``N / r`` dispatchers."""
    if ratio is None or whole(n_servers, ratio):
        return
    m = n_servers / ratio
    near = sorted({k for k in (math.floor(m), math.ceil(m)) if 1 <= k <= n_servers})
    advice = " or ".join(f"ratio={n_servers / k:g} (M = {k})" for k in near)
    raise ValueError(
        f"n_servers={n_servers} and ratio={ratio:g} give N / ratio = {m:g} dispatchers: the "
        f"refined mean field is at N servers and M = N / ratio dispatchers, which must be a "
        f"whole number; give a ratio that divides n_servers, e.g. {advice}"
    )
