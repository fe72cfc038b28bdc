"""Closed-form mean fields: tails, response times and the result at one point.

A policy declares its closed form (:meth:`jaxqueue.policies.Policy.closed_form`)
as a family of :data:`FAMILIES` and a probe count; nothing here reads policy
names. :func:`tail` and :func:`mean_response_time` are JAX array functions
(``jit``, ``grad``, ``vmap``); :func:`closed_form_result` is the host-side
float64 result behind :func:`jaxqueue.theory.mean_field`. The families' tails
and the metrics derived from them: docs/theory-derivations.md.

Example:
    >>> from jaxqueue import theory
    >>> import jax
    >>> dT = jax.grad(lambda lam: theory.mean_response_time("jiq", lam, 10.0))(0.9)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxqueue.core.status import Status, message
from jaxqueue.core.system import check_int
from jaxqueue.policies import ClosedForm, Policy, make
from jaxqueue.results import response
from jaxqueue.results.schema import QUANTILES
from jaxqueue.theory.closed.numerics import as_float_arrays, check_d
from jaxqueue.theory.closed.p0 import host_p0, solve_p0
from jaxqueue.theory.result import MeanFieldResult, Metrics, build

__all__ = [
    "FAMILIES",
    "closed_form_of",
    "need_ratio",
    "family_tail",
    "family_mean_response_time",
    "tail",
    "mean_response_time",
    "closed_form_result",
]

#: The closed-form families a policy can declare (``ClosedForm.family``).
FAMILIES = ("pod", "jsq", "jiq-pod")

_EXPONENT_CAP = 1e30  # exponents past this make s_i = 0 anyway; avoids 0 * inf
_TAIL_TOL = 1e-15  # tail mass left out by the automatic level count
_MAX_AUTO_LEVELS = 100_000
_MAX_AUTO_IQUEUE = 2_000_000
_MAX_LEVELS = 10**6


def closed_form_of(policy, d=None) -> tuple[Policy, ClosedForm]:
    """The policy (``make(policy, d=d)``) and its closed form, with ``d`` checked.

    Raises:
        ValueError: if the policy takes no option ``d`` (and ``d`` is given),
            or has no closed form (then the message says which mean field it has).
    """
    pol = make(policy, d=d)
    cf = pol.closed_form()
    if cf is None:
        if pol.no_mean_field is not None:
            why = f"it has no mean field: {pol.no_mean_field}"
        elif pol.mean_field_kind() != "generic":
            why = f"its mean field is the {pol.mean_field_kind()!r} solver: use theory.mean_field"
        else:
            why = "its mean field is the generic fixed point: use theory.mean_field"
        raise ValueError(f"policy {pol.name!r} has no closed-form mean field; {why}")
    if cf.family not in FAMILIES:
        raise ValueError(
            f"policy {pol.name!r} declares the closed form {cf.family!r}; "
            f"known families: {', '.join(FAMILIES)}"
        )
    return pol, ClosedForm(cf.family, check_d(cf.d))


def _exponents(d: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``(e_lam, e_p0)`` with ``s_i = lambda**e_lam[i] * p0**e_p0[i]``, ``i = 0..count-1``.

    Wang, Feng and Cheng (arXiv:1709.10119), Table I: ``e_lam = (d**i - 1)/(d - 1)``,
    ``e_p0 = (d**(i-1) - 1)/(d - 1)`` (``i`` and ``i - 1`` for ``d = 1``), ``s_0 = 1``.
    """
    if d == 1:
        i = np.arange(count, dtype=np.float64)
        e_lam = i
        e_p0 = np.maximum(i - 1.0, 0.0)
    else:  # e_lam[i] = 1 + d e_lam[i-1], e_p0[i] = e_lam[i-1], capped (no int64 overflow)
        e_lam = np.full(count, _EXPONENT_CAP)
        e_p0 = np.full(count, _EXPONENT_CAP)
        e, prev = 0.0, 0.0
        for k in range(count):
            if e >= _EXPONENT_CAP:
                break
            e_lam[k], e_p0[k] = e, prev
            e, prev = 1.0 + d * e, e
        e_p0[0] = 0.0
    return e_lam, e_p0


def _terms_for(d: int) -> int:
    """Levels that make the Pod(d)-type tail negligible for ``1 - lambda >= 4e-11``."""
    return int(math.ceil(12 * math.log(10) / math.log(d))) + 3


def need_ratio(pol: Policy, ratio):
    """``ratio``, or a ValueError where a JIQ-family policy has none."""
    if ratio is None:
        raise ValueError(f"policy {pol.name!r} needs ratio = N / M")
    return ratio


# ---------------------------------------------------------------------------
# Array functions (JAX)
# ---------------------------------------------------------------------------


def _in_domain(family: str, load, ratio):
    """Where the closed form applies: ``0 < lambda < 1`` (and ``0 < r < inf`` for the
    JIQ family); elsewhere the array functions give NaN, as :func:`solve_p0` does."""
    ok = (load > 0) & (load < 1)
    if family == "jiq-pod":
        ok = ok & (ratio > 0) & jnp.isfinite(ratio)
    return ok


def family_tail(family: str, d: int, load, ratio, count: int):
    """``s_0 .. s_{count-1}`` of a closed-form family (``ratio`` used by ``jiq-pod`` only)."""
    if family == "jiq-pod":
        load, ratio = as_float_arrays(load, ratio)
        log_p0 = jnp.log(solve_p0(load, ratio, d).p0)
    else:
        (load,) = as_float_arrays(load)
        log_p0 = jnp.zeros_like(load)
    ok = _in_domain(family, load, ratio)[..., None]
    if family == "jsq":
        i = jnp.arange(count)
        s = jnp.where(i == 0, 1.0, jnp.where(i == 1, load[..., None], 0.0))
        return jnp.where(ok, s, jnp.nan)
    e_lam, e_p0 = _exponents(d, count)
    log_s = jnp.log(load)[..., None] * e_lam + jnp.where(e_p0 > 0, log_p0[..., None] * e_p0, 0.0)
    return jnp.where(ok, jnp.exp(log_s), jnp.nan)


def family_mean_response_time(family: str, d: int, load, ratio):
    """``T = sum_{i>=1} s_i / lambda`` of a closed-form family."""
    if family == "jiq-pod":
        load, ratio = as_float_arrays(load, ratio)
        p0 = solve_p0(load, ratio, d).p0
    else:
        (load,) = as_float_arrays(load)
        p0 = jnp.ones_like(load)
    ok = _in_domain(family, load, ratio)
    if family == "jsq":
        return jnp.where(ok, 1.0, jnp.nan)
    if d == 1:  # geometric: 1 / (1 - lambda p0), 1 - lambda p0 = (1 - lambda) + lambda (1 - p0)
        return jnp.where(ok, 1.0 / ((1.0 - load) + load * (1.0 - p0)), jnp.nan)
    e_lam, e_p0 = _exponents(d, _terms_for(d))
    # s_i / lambda for i >= 1
    log_terms = jnp.log(load)[..., None] * (e_lam[1:] - 1.0) + jnp.where(
        e_p0[1:] > 0, jnp.log(p0)[..., None] * e_p0[1:], 0.0
    )
    return jnp.where(ok, jnp.sum(jnp.exp(log_terms), axis=-1), jnp.nan)


def tail(policy, load, ratio=None, *, d: int | None = None, levels: int = 32):
    """Mean-field tail ``s_0 .. s_levels`` (``s_i``: fraction of servers with at least ``i`` tasks).

    The closed form the policy declares (docs/theory-derivations.md). Differentiable
    in ``load`` and ``ratio`` (through :func:`~jaxqueue.theory.closed.p0.solve_p0`). Not
    jitted itself: it calls the compiled solver and a few array operations, so
    no second copy of the solver is compiled; it works inside ``jax.jit``,
    ``grad`` and ``vmap``.

    Args:
        policy: a policy name or :class:`~jaxqueue.policies.Policy` with a closed
            form (``random``, ``pod``, ``jsq``, ``jiq``, ``jiq-pod``).
        load: ``lambda`` in ``(0, 1)``, array-like.
        ratio: ``r = N / M`` (JIQ family only), array-like.
        d: probes, for the policies that take ``d`` (default: the policy's own,
            2 for ``pod`` and ``jiq-pod``); static.
        levels: the largest queue length represented (static), as the
            simulator's ``levels``.

    Returns:
        ``[..., levels + 1]`` array over the broadcast shape of ``load`` and
        ``ratio``; NaN where ``load`` is outside ``(0, 1)`` or ``ratio`` not
        positive and finite (as :func:`~jaxqueue.theory.closed.p0.solve_p0`: points
        of a grid, inside ``jit`` and ``vmap`` too, fail one by one).

    Raises:
        ValueError: for a policy without a closed form or an option it does not take.
    """
    pol, cf = closed_form_of(policy, d)
    check_int("levels", levels, 1, _MAX_LEVELS)
    if cf.family == "jiq-pod":
        need_ratio(pol, ratio)
    return family_tail(cf.family, cf.d, load, ratio, levels + 1)


def mean_response_time(policy, load, ratio=None, *, d: int | None = None):
    """Mean-field mean response time ``T = sum_{i>=1} s_i / lambda`` (Little's law).

    Closed forms (Wang, Feng and Cheng, arXiv:1709.10119, Table I): Random
    ``1/(1 - lambda)``; JIQ ``1/(1 - lambda p0)``; JSQ 1; Pod(d) and JIQ-Pod(d)
    by summing the doubly exponential tail (enough terms for
    ``1 - lambda >= 4e-11``). In units of the mean service time.
    Differentiable in ``load`` and ``ratio``; not jitted itself (see :func:`tail`).

    Args:
        policy: a policy name or Policy with a closed form.
        load: ``lambda``, array-like.
        ratio: ``r`` (JIQ family), array-like.
        d: probes, for the policies that take ``d`` (default: the policy's own).

    Returns:
        Array of the broadcast shape of ``load`` and ``ratio``; NaN where
        ``load`` is outside ``(0, 1)`` or ``ratio`` not positive and finite.

    Raises:
        ValueError: for a policy without a closed form or an option it does not take.
    """
    pol, cf = closed_form_of(policy, d)
    if cf.family == "jiq-pod":
        need_ratio(pol, ratio)
    return family_mean_response_time(cf.family, cf.d, load, ratio)


# ---------------------------------------------------------------------------
# Host helpers (float64)
# ---------------------------------------------------------------------------


def _host_p0(load: float, ratio: float, d: int) -> float:
    """``p0`` in float64 (x64 switched on for the call); raises on solver failure."""
    p0, status = host_p0(load, ratio, d)
    if status != Status.CONVERGED:
        raise RuntimeError(
            f"p0 solver failed at load={load!r}, ratio={ratio!r}, d={d}: "
            f"status {Status(status).name} ({message(status)})"
        )
    return p0


def _log_tail_host(d: int, log_lam: float, log_p0: float, count: int) -> np.ndarray:
    """``log s_i`` for ``i = 0..count-1`` (float64; ``-inf`` once it underflows)."""
    e_lam, e_p0 = _exponents(d, count)
    with np.errstate(over="ignore", invalid="ignore"):
        out = e_lam * log_lam + (e_p0 * log_p0 if log_p0 != 0.0 else 0.0)
    return np.where(np.isnan(out), -np.inf, out)


def _auto_count(d: int, log_lam: float, log_p0: float) -> int:
    """Fewest entries ``n`` with ``sum_{i>=n} s_i < 1e-15`` (at least 2, at most 100000)."""
    if d == 1:
        log_rho = log_lam + log_p0  # s_i = lambda rho**(i-1)
        one_minus_rho = -math.expm1(log_rho)
        need = (math.log(_TAIL_TOL * one_minus_rho) - log_lam) / log_rho
        return int(min(max(2, 1 + math.ceil(need)), _MAX_AUTO_LEVELS))
    log_s = _log_tail_host(d, log_lam, log_p0, _terms_for(d) + 8)
    below = np.nonzero(log_s < math.log(_TAIL_TOL / 2))[0]
    return int(max(2, below[0] if below.size else log_s.size))


def _tail_sum_from(d: int, log_lam: float, log_p0: float, start: int) -> float:
    """``sum_{i >= start} s_i`` (``start >= 1``)."""
    if d == 1:
        log_rho = log_lam + log_p0
        return math.exp(log_lam + (start - 1) * log_rho) / -math.expm1(log_rho)
    n = max(start, _terms_for(d) + 8)
    log_s = _log_tail_host(d, log_lam, log_p0, n + 1)
    return float(np.sum(np.exp(log_s[start:])))


def _iqueue_host(p0: float, load: float, ratio: float, d: int) -> tuple[np.ndarray, float]:
    """I-queue size law in float64 until the rest is below ``1e-15 min(1, 1 - p0)`` (or 2e6 sizes).

    Relative to ``1 - p0`` so that tiny means (``r (1 - lambda)`` down to 1e-8)
    keep their relative accuracy.
    """
    lam = load
    if d == 1:
        rg, om, lam_d = ratio, 1.0 - lam, lam
    else:
        om = -math.expm1(d * math.log(lam))
        rg, lam_d = ratio * (1.0 - lam) / om, 1.0 - om
    a = rg * ((1.0 - p0) / p0 + om)
    delta = rg * lam_d
    log_tol = math.log(_TAIL_TOL * max(min(1.0, 1.0 - p0), 1e-300))
    blocks = [np.array([math.log(p0)])]
    last = blocks[0][0]
    k0 = 0
    block = 4096
    while True:
        j = np.arange(k0 + 1, k0 + block + 1, dtype=np.float64)
        log_p = last + np.cumsum(-np.log1p((delta + j) / a))
        # p_k decreases (a < c): the rest after k is below p_k rho / (1 - rho), rho = a/(c+k+1)
        rho = a / (a + delta + j + 1.0)
        bound = log_p + np.log(rho) - np.log1p(-rho)
        stop = np.nonzero(bound < log_tol)[0]
        if stop.size:
            blocks.append(log_p[: stop[0] + 1])
            rest = float(np.exp(bound[stop[0]]))
            break
        blocks.append(log_p)
        last, k0 = log_p[-1], k0 + block
        if k0 >= _MAX_AUTO_IQUEUE:
            rest = float(np.exp(bound[-1]))
            break
        block *= 2
    return np.exp(np.concatenate(blocks)), rest


# ---------------------------------------------------------------------------
# The result at one point
# ---------------------------------------------------------------------------


def closed_form_result(
    pol: Policy,
    cf: ClosedForm,
    load: float,
    ratio: float | None,
    levels: int | None = None,
    with_quantiles: bool = True,
) -> MeanFieldResult:
    """All mean-field metrics of a closed form at one point (float64, host side).

    Tails from Wang, Feng and Cheng (arXiv:1709.10119), Table I
    (docs/theory-derivations.md). An arrival finds at least ``k >= 1`` tasks with probability
    ``s_k**d`` under Pod(d) (the minimum of ``d`` draws), ``p0 s_k**d`` under
    JIQ-Pod(d) (a dispatcher with a non-empty I-queue, probability ``1 - p0``,
    sends it to an idle server), ``0`` under JSQ; the response time given ``k``
    is Erlang(``k + 1``, 1) in units of the mean service time, so
    ``sum_k (k+1) arrival_seen[k]`` is the mean response time of Little's law.
    Messages (per server per unit time, Wang et al. Fig. 6): joins
    ``s_1 - s_2``; delete requests ``lambda p0 (1 - lambda**d)`` (empty-I-queue
    arrivals that land on an idle server); probes ``d lambda`` (Pod(d)) or
    ``d lambda p0`` (JIQ-Pod(d)) for ``d >= 2``, none for JSQ.

    Args:
        pol: the policy, ``cf`` its closed form (:func:`closed_form_of`).
        load: ``lambda`` in ``(0, 1)`` (checked by the caller).
        ratio: ``r = N / M``; required for the ``jiq-pod`` family, recorded otherwise.
        levels: the largest queue length represented (arrays of ``levels + 1``
            entries); ``None`` picks the fewest with less than ``1e-15`` of
            tail mass left out.
        with_quantiles: False leaves the response-time quantiles of an Erlang
            mixture NaN, for :func:`jaxqueue.theory.result.fill_quantiles`.

    Raises:
        ValueError: for a missing or invalid ratio.
        RuntimeError: if the ``p0`` solver fails.
    """
    family, d = cf
    if levels is not None:
        check_int("levels", levels, 1, _MAX_LEVELS)
    lam = float(load)
    log_lam = math.log(lam)
    p0, log_p0 = None, 0.0
    if family == "jiq-pod":
        if ratio is None or not float(ratio) > 0 or not math.isfinite(float(ratio)):
            raise ValueError(f"policy {pol.name!r} needs a positive finite ratio; got {ratio!r}")
        ratio = float(ratio)
        p0 = _host_p0(lam, ratio, d)
        log_p0 = math.log(p0)
    if family == "jsq":
        m = _jsq_metrics(lam, levels)
    else:
        m = _tail_metrics(d, lam, log_lam, p0, log_p0, levels, with_quantiles)
    rates = _message_rates(family, d, lam, log_lam, p0, ratio)
    metrics = Metrics(
        tail=m.tail,
        occupancy=m.occupancy,
        arrival_seen=m.seen,
        mean_queue_length=m.mean_q,
        mean_response_time=float(m.mean_q) / lam,
        waiting_probability=m.wait,
        blocking_probability=0.0,
        p0=p0,
        iqueue_distribution=rates.iqueue,
        join_rate=rates.join,
        delete_rate=rates.delete,
        probe_rate=rates.probe,
        response_quantiles=m.quantiles,
    )
    return build(
        pol,
        metrics,
        load=lam,
        ratio=ratio,
        d=d,
        buffer=None,
        tail_remainder=m.remainder,
        iqueue_remainder=rates.iqueue_rest,
    )


class _Metrics(NamedTuple):
    """The queue-length metrics of a closed form (:func:`closed_form_result`'s arrays)."""

    tail: np.ndarray
    occupancy: np.ndarray
    seen: np.ndarray  # law of the queue length an arrival finds
    mean_q: float
    remainder: float  # tail mass past the arrays
    wait: float
    quantiles: list


def _jsq_metrics(lam: float, levels: int | None) -> _Metrics:
    """JSQ: ``s_1 = lambda``, no task waits, the response time is Exp(1)."""
    n = 2 if levels is None else levels + 1
    tail_arr = np.zeros(n)
    tail_arr[:2] = 1.0, lam
    occupancy = tail_arr - np.append(tail_arr[1:], 0.0)
    seen = np.zeros(n)
    seen[0] = 1.0
    quantiles = [-math.log1p(-q) for q in QUANTILES]
    return _Metrics(tail_arr, occupancy, seen, lam, 0.0, 0.0, quantiles)


def _tail_metrics(
    d: int,
    lam: float,
    log_lam: float,
    p0: float | None,
    log_p0: float,
    levels: int | None,
    with_quantiles: bool,
) -> _Metrics:
    """Pod(d) (``p0`` None) and JIQ-Pod(d): the metrics of the doubly exponential tail.

    ``levels`` None: the fewest levels with less than ``1e-15`` of tail mass left out.
    """
    jiq = p0 is not None
    n = _auto_count(d, log_lam, log_p0) if levels is None else levels + 1
    log_s = _log_tail_host(d, log_lam, log_p0, n + 1)
    # log s_{k+1} - log s_k, exactly: log(lambda) for k = 0, then
    # d**k log(lambda) + d**(k-1) log(p0) (geometric for d = 1)
    e_lam, e_p0 = _exponents(d, n + 1)
    inc = np.diff(e_lam) * log_lam + (np.diff(e_p0) * log_p0 if log_p0 else 0.0)
    tail_arr = np.exp(log_s)[:n]
    occupancy = tail_arr * -np.expm1(inc)
    # P(find >= k): A_k = s_k**d (Pod), A_0 = 1 and A_k = p0 s_k**d (JIQ-Pod)
    log_a = d * log_s
    inc_a = d * inc
    if jiq:
        log_a = np.concatenate([[0.0], log_p0 + log_a[1:]])
        inc_a = np.concatenate([[log_p0 + d * log_lam], inc_a[1:]])
    seen = np.exp(log_a[:n]) * -np.expm1(inc_a)
    wait = math.exp(log_a[1])
    remainder = _tail_sum_from(d, log_lam, log_p0, n)
    if d == 1:
        one_minus_rho = (1.0 - lam) + lam * (1.0 - (p0 if jiq else 1.0))
        mean_q = lam / one_minus_rho
        quantiles = [-math.log1p(-q) / one_minus_rho for q in QUANTILES]
    else:
        mean_q = float(np.sum(tail_arr[1:])) + remainder
        quantiles = (
            response.erlang_mixture_quantile(seen, np.array(QUANTILES))
            if with_quantiles
            else [math.nan] * len(QUANTILES)
        )
    return _Metrics(tail_arr, occupancy, seen, mean_q, remainder, wait, quantiles)


class _Rates(NamedTuple):
    """The I-queue law and the messages per server per unit time of a closed form."""

    iqueue: np.ndarray | None
    iqueue_rest: float
    join: float
    delete: float
    probe: float


def _message_rates(
    family: str, d: int, lam: float, log_lam: float, p0: float | None, ratio
) -> _Rates:
    """Joins ``s_1 - s_2``, delete requests and probes (Wang et al., Fig. 6), and the
    I-queue size law of the JIQ family."""
    if family == "jiq-pod":
        iq_dist, iq_rest = _iqueue_host(p0, lam, ratio, d)
        lam_d = math.exp(d * log_lam)
        join = lam * (1.0 - p0 * lam_d)  # s_1 - s_2
        delete = lam * p0 * -math.expm1(d * log_lam)
        probe = d * lam * p0 if d >= 2 else 0.0
        return _Rates(iq_dist, iq_rest, join, delete, probe)
    probe = d * lam if family == "pod" and d >= 2 else 0.0
    return _Rates(None, 0.0, 0.0, 0.0, probe)
