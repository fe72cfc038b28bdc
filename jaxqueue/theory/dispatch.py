"""``mean_field``: the mean field of any policy at one point, chosen by its declarations.

A policy declares which mean field it has (:meth:`jaxqueue.policies.Policy.mean_field_kind`):
a closed form (:mod:`jaxqueue.theory.closed.closed_forms`), the generic fixed point
(:mod:`jaxqueue.theory.generic.meanfield`), the tagged-server cycle of JIQ without delete
requests (:mod:`jaxqueue.theory.per_server.tagged_server`), the I-queue compositions of
JIQ-Threshold (:mod:`jaxqueue.theory.per_server.threshold`), or none (:attr:`~jaxqueue.policies.Policy.no_mean_field`
gives the reason). This module is the only one that knows both paths; neither
imports it.
"""

from __future__ import annotations

import copy
import functools
import math
import numbers
from typing import NamedTuple

from jaxqueue.core.config import Bounds, check_options, takes_options
from jaxqueue.core.service import as_law
from jaxqueue.core.system import as_int, check_int, check_load
from jaxqueue.policies import make
from jaxqueue.policies.base import PER_SERVER_MEAN_FIELDS
from jaxqueue.theory.closed.closed_forms import closed_form_of, closed_form_result
from jaxqueue.theory.generic import meanfield, phases
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.generic.settings import LevelGrowth, Newton, Settle, Solver
from jaxqueue.theory.per_server import tagged_server, threshold
from jaxqueue.theory.profiles import periodic
from jaxqueue.theory.result import TRUNCATION_LIMIT, MeanFieldResult

__all__ = ["mean_field", "TRUNCATION_LIMIT"]

_MAX_LEVELS = 10**6


@takes_options("d", "z", "order", "buffer", "service", "pools", "arrivals")
def mean_field(
    policy,
    load,
    ratio: float | None = None,
    *,
    levels: int | None = None,
    with_quantiles: bool = True,
    window=None,
    solver: Solver | Newton | Settle | LevelGrowth | None = None,
    throw: bool = True,
    **options,
) -> MeanFieldResult:
    """All mean-field metrics of a policy at one point (float64, host side).

    The policy is built as ``make(policy, d=d, z=z)``: options left at ``None``
    take the policy's defaults (``pod`` and ``jiq-pod`` probe ``d = 2``, as in
    the simulator), and an option the policy does not take is an error. Then:

    * a policy with a closed form and infinite buffers gets it
      (:func:`jaxqueue.theory.closed.closed_forms.closed_form_result`; for JIQ and
      JIQ-Pod, with a ``ratio``);
    * otherwise, including every policy with a finite ``buffer``, the generic
      fixed point (:func:`jaxqueue.theory.generic.meanfield.fixed_point`), with one
      dispatcher for single-dispatcher policies, policies without I-queues
      and ``ratio=None``;
    * JIQ-Original (any ``order``, ``z``, ``d``) gets the tagged-server mean field
      (:func:`jaxqueue.theory.per_server.tagged_server.jiq_no_delete_mean_field`; infinite
      buffers only, ``ratio`` required);
    * JIQ-Threshold(z) gets the mean field of its I-queue compositions
      (:func:`jaxqueue.theory.per_server.threshold.jiq_threshold_mean_field`; infinite
      buffers only, ``ratio`` required; ``z`` of 0 and 1 up to ratios of
      several hundred, ``z = 2`` up to about ``r = 10``, larger ``z`` at small
      ratios, and past that a :class:`RuntimeError` that says why);
    * a policy without a mean field raises :class:`NotImplementedError`.

    The mean field is in units of the mean service time
    (:data:`jaxqueue.core.system.SERVICE_RATE` is 1); see
    :mod:`jaxqueue.theory.result`.

    Args:
        policy: a policy name or :class:`~jaxqueue.policies.Policy`.
        load: ``lambda`` (in ``(0, 1)`` for infinite buffers, ``> 0`` with a buffer),
            or a list (or 1-d array) of loads: then one result per load, in a
            :class:`~jaxqueue.results.sweep.SweepResult` (as :func:`jaxqueue.simulate`).
            The solve runs on the host in float64 and cannot be traced: for
            ``jax.grad`` use the closed forms :func:`jaxqueue.theory.mean_response_time`
            and :func:`jaxqueue.theory.tail`, or :func:`jaxqueue.theory.solve_p0`.
        ratio: ``r = N / M`` for the JIQ family with several dispatchers;
            ``None`` is one dispatcher (one I-queue listing every idle server:
            the generic fixed point, for the policies of the family with a
            closed form too). Recorded, and unused, for policies without
            I-queues.
        levels: the largest queue length represented: the arrays have
            ``levels + 1`` entries (as the simulator's ``levels``; equal to
            ``buffer`` for finite buffers). ``None``: closed forms take the
            fewest with less than ``1e-15`` of tail mass left out, the fixed
            points grow the count until less than ``1e-12`` is left at the
            bound (periodic regimes ``1e-10``; or ``buffer``). A given
            ``levels`` with infinite buffers that leaves more than
            :data:`TRUNCATION_LIMIT` (``1e-6``) of the tail's mass at or past
            the bound is refused (``ValueError``): the truncated model's
            metrics would not be the infinite-buffer mean field's.
        with_quantiles: False skips the response-time quantiles (they are
            NaN where they need a root-finder); pass a list of such results to
            :func:`jaxqueue.theory.result.fill_quantiles` to compute them for
            many points in one vectorised call (as grid sweeps do).
        <options>
            In the mean field: a service law other than exp(1) gives the
            generic mean field with phases (:mod:`jaxqueue.theory.generic.phases`;
            its quantiles are always computed); pools give the mean field by
            pool and phase, for the exchangeable policies that route on queue
            lengths (not ``jsew``; ``diagnostics["pool_occupancy"]`` holds each
            pool's queue-length law); ``arrivals`` must be a periodic rate
            profile (a :class:`~jaxqueue.core.arrivals.Profile` or a
            ``time,rate`` CSV file; ``load`` is its time mean): the averages
            over the periodic regime of the mean-field ODE
            (:mod:`jaxqueue.theory.profiles.periodic`), for the policies with
            the generic mean field (JSQ-like routing with a service law or
            pools only while the peak stays below the capacity;
            ``diagnostics["orbit"]`` holds the orbit over one period).
        window: with ``arrivals``, ``(start, length)``: average over that
            window of the periodic regime (a simulation's
            ``settings["time_warmup"]`` and ``settings["time_measured"]``)
            instead of one period.
        solver: the settings of the generic fixed points (with or without
            phases and pools) and of the periodic regime: a
            :class:`~jaxqueue.theory.Solver` or one of its parts,
            :class:`~jaxqueue.theory.Newton` (``tol``, ``max_iter``),
            :class:`~jaxqueue.theory.Settle` (the ODE run that starts Newton;
            for the periodic regime only its ``dt``, the longest RK4 step) or
            :class:`~jaxqueue.theory.LevelGrowth` (the adaptive level count's
            ``tol``; not the periodic regime's); ``None`` or a field left at
            ``None``: the solve's default. The closed forms and the
            per-server mean fields have no such settings: a ``solver`` there
            is an error.
        throw: ``False`` returns the result of a generic fixed point or a
            periodic regime that did not converge, its ``status`` saying how
            it ended (``MAX_ITERATIONS``, ``NON_FINITE``) and ``residual``
            where it stopped, instead of raising :class:`RuntimeError`.
            Inputs a solver refuses still raise.

    Returns:
        A :class:`~jaxqueue.theory.result.MeanFieldResult` (a
        :class:`~jaxqueue.results.sweep.SweepResult` of them for a list of loads).

    Raises:
        NotImplementedError: for a policy without a mean field (with the reason).
        ValueError: for unknown names, options the policy does not take,
            invalid arguments, or a ``levels`` too small (above).
        RuntimeError: if a solver fails (``p0``, or the generic fixed point;
            with ``throw=False`` the latter returns its status instead).
        TypeError: a ``solver`` that is not a solver setting.

    Example:
        >>> from jaxqueue import theory
        >>> mf = theory.mean_field("jiq-pod", 0.98, 10.0)  # d = 2, the policy's default
        >>> round(mf.mean_response_time, 2)
        2.54
    """
    check_options("mean_field", options, mean_field)
    pol = make(policy, **{k: options[k] for k in ("d", "z", "order") if options.get(k) is not None})
    _refuse_tracer(load, ratio)
    if not isinstance(throw, bool):
        raise TypeError(f"throw={throw!r} must be True or False")
    request = _Request(
        buffer=as_int(options.get("buffer")),
        levels=as_int(levels),
        with_quantiles=with_quantiles,
        service=options.get("service"),
        pools=options.get("pools"),
        arrivals=options.get("arrivals"),
        window=window,
        solver=Solver.of(solver),
        throw=throw,
        given_solver=solver,
    )
    if _is_sequence(load):  # one result per load, as jaxqueue.simulate gives
        from jaxqueue.results.sweep import SweepResult

        return SweepResult(_checked(pol, x, ratio, request) for x in load)
    return _checked(pol, load, ratio, request)


class _Request(NamedTuple):
    """What :func:`mean_field` was asked besides the policy, the load and the ratio."""

    buffer: int | None
    levels: int | None
    with_quantiles: bool
    service: object
    pools: object
    arrivals: object
    window: object
    solver: Solver = Solver()
    throw: bool = True
    given_solver: object = None


def _checked(pol, load, ratio, request: _Request) -> MeanFieldResult:
    """:func:`mean_field` at one load, with the check of a given ``levels``."""
    buffer, levels = request.buffer, request.levels
    result = _mean_field(pol, load, ratio, request)
    left_out = result.tail_remainder
    if buffer is None and levels is not None and not left_out <= TRUNCATION_LIMIT:
        raise ValueError(
            f"levels={levels} is too small for the mean field of {pol.label()} at load={load}: "
            f"{left_out:.3g} of the tail's mass lies at or past the bound (at most "
            f"{TRUNCATION_LIMIT:g} may); omit levels for the adaptive count, or pass more"
        )
    return result


def _is_sequence(load) -> bool:
    """A list, tuple or 1-d array of loads (a 0-d array is one load)."""
    return isinstance(load, (list, tuple)) or (hasattr(load, "ndim") and load.ndim == 1)


def _refuse_tracer(load, ratio) -> None:
    """The mean field is solved on the host in float64: ``jax.grad`` and ``jax.jit``
    cannot trace it. Say which entry points they can."""
    import sys

    jax = sys.modules.get("jax")  # a tracer exists only where JAX is imported
    if jax is None:
        return
    for name, value in (("load", load), ("ratio", ratio)):
        if isinstance(value, jax.core.Tracer):
            raise TypeError(
                f"{name} is traced (jax.grad, jax.jit or jax.vmap): mean_field solves on the host "
                "in float64 and cannot be traced. Differentiable in the load and the ratio: "
                "jaxqueue.theory.mean_response_time and jaxqueue.theory.tail (the closed forms of "
                "random, jsq, pod, jiq and jiq-pod) and "
                "jaxqueue.theory.solve_p0; for any policy, jaxqueue.sensitivity differentiates "
                "the simulated metrics"
            )


def _mean_field(pol, load, ratio, request: _Request) -> MeanFieldResult:
    """:func:`mean_field` of a built policy, before the check of a given ``levels``."""
    buffer, levels, with_quantiles = request.buffer, request.levels, request.with_quantiles
    law = as_law(request.service)
    if request.arrivals is not None:
        return _periodic(pol, load, ratio, law, request)
    if request.window is not None:
        raise ValueError("window= averages a periodic regime: it needs arrivals= (a rate profile)")
    if request.pools is not None or (law is not None and not law.is_unit_exponential):
        return _phase_type(pol, load, ratio, law, request)
    if pol.mean_field_kind() == "none":
        raise NotImplementedError(f"no mean field for policy {pol.name!r}: {pol.no_mean_field}")
    if pol.mean_field_kind() in PER_SERVER_MEAN_FIELDS:
        _no_solver(request, f"the mean field of {pol.name!r}")
        if buffer is not None:
            raise NotImplementedError(
                f"the mean field of {pol.name!r} is for infinite buffers; got buffer={buffer}"
            )
        lam = check_load(load, None)
        if levels is not None:
            check_int("levels", levels, 1, _MAX_LEVELS)
        check_int("z", pol.z, 0, 10**6)
        if pol.mean_field_kind() == "tagged-server":
            if pol.order not in pol.ORDERS:
                raise ValueError(f"order={pol.order!r} is not valid: use 'random' or 'fifo'")
            check_int("d", pol.d, 1, 64)  # M is unbounded in the limit
        if not isinstance(ratio, numbers.Real):  # (the solver says what is wrong with it)
            return _per_server.__wrapped__(pol, lam, ratio, levels, with_quantiles)
        # solves of seconds to minutes, kept: a simulation's mean-field start and
        # the theory beside it (compare, grids) solve once; each caller gets a copy
        return copy.deepcopy(_per_server(pol, lam, float(ratio), levels, with_quantiles))
    if buffer is not None:
        check_int("buffer", buffer, 1, _MAX_LEVELS)
    if levels is not None:
        check_int("levels", levels, 1, _MAX_LEVELS)
    lam = check_load(load, buffer)
    # the JIQ family's closed forms are the many-dispatcher limit (they need
    # the ratio); with ratio None (one dispatcher) the generic fixed point
    one_queue = pol.uses_iqueues and ratio is None
    if pol.closed_form() is not None and buffer is None and not one_queue:
        _no_solver(request, f"the closed form of {pol.name!r}")
        pol, cf = closed_form_of(pol)  # checks the declared family and d
        return closed_form_result(pol, cf, lam, ratio, levels, with_quantiles)

    one_dispatcher = pol.single_dispatcher or not pol.uses_iqueues
    fp_ratio = None if one_dispatcher else ratio
    if fp_ratio is not None and not (float(fp_ratio) > 0 and not math.isnan(float(fp_ratio))):
        raise ValueError(f"ratio={ratio!r} is out of range: need ratio > 0")
    fp = meanfield.fixed_point(
        pol, lam, fp_ratio, buffer=buffer, levels=levels, solver=request.solver
    )
    if fp.status != 0 and request.throw:
        raise RuntimeError(
            f"the generic mean-field fixed point of {pol.label()!r} did not converge: "
            f"{fp.status.name} (residual {fp.residual:.3g})"
        )
    return meanfield.as_result(fp, pol, lam, ratio, buffer=buffer, with_quantiles=with_quantiles)


def _no_solver(request: _Request, what: str) -> None:
    """A ``solver`` given where no generic fixed point is solved is refused (it would be unused)."""
    if request.given_solver is not None:
        raise ValueError(
            f"solver={request.given_solver!r} sets the generic fixed points; {what} takes none"
        )


def _periodic(pol, load, ratio, law, request: _Request):
    """The mean field averaged over the periodic regime of a rate profile."""
    buffer, levels = request.buffer, request.levels
    if pol.mean_field_kind() not in ("generic", "closed-form"):
        reason = pol.no_mean_field or f"its mean field is {pol.mean_field_kind()!r}"
        raise NotImplementedError(
            f"no mean field under a rate profile for {pol.name!r}: the "
            f"periodic regime needs the generic mean field ({reason})"
        )
    if buffer is not None:
        check_int("buffer", buffer, 1, _MAX_LEVELS)
    if levels is not None:
        check_int("levels", levels, 1, _MAX_LEVELS)
    one_dispatcher = pol.single_dispatcher or not pol.uses_iqueues
    fp_ratio = None if one_dispatcher else ratio
    if fp_ratio is not None and not (float(fp_ratio) > 0 and not math.isnan(float(fp_ratio))):
        raise ValueError(f"ratio={ratio!r} is out of range: need ratio > 0")
    limit = Limit(
        pol, fp_ratio, buffer=buffer, service=law, pools=request.pools, arrivals=request.arrivals
    )
    orbit = periodic.periodic_orbit(
        limit,
        load,
        bounds=Bounds(levels),
        window=request.window,
        solver=request.solver,
    )
    if orbit.status != 0 and request.throw:
        raise RuntimeError(
            f"the periodic regime of {pol.label()!r} was not found: "
            f"{orbit.status.name} (residual {orbit.residual:.3g})"
        )
    return periodic.as_result(
        orbit,
        pol,
        float(load),
        ratio,
        request.arrivals,
        buffer=buffer,
        with_quantiles=request.with_quantiles,
    )


@functools.lru_cache(maxsize=32)
def _per_server(pol, lam: float, ratio, levels, with_quantiles: bool) -> MeanFieldResult:
    """The host-side mean field of a per-server policy (validated by the caller)."""
    if pol.mean_field_kind() == "composition":
        return threshold.jiq_threshold_mean_field(pol, lam, ratio, levels, with_quantiles)
    return tagged_server.jiq_no_delete_mean_field(pol, lam, ratio, levels, with_quantiles)


def _phase_type(pol, load, ratio, service, request: _Request):
    """The mean field with a phase-type service law or pools (:mod:`jaxqueue.theory.generic.phases`)."""
    one_dispatcher = pol.single_dispatcher or not pol.uses_iqueues
    buffer = request.buffer
    limit = Limit(
        pol, None if one_dispatcher else ratio, buffer=buffer, service=service, pools=request.pools
    )
    fp = phases.fixed_point(
        limit,
        load,
        bounds=Bounds(request.levels),
        solver=request.solver,
    )
    if fp.status != 0 and request.throw:
        what = "phase-type" if request.pools is None else "pools"
        raise RuntimeError(
            f"the {what} mean-field fixed point of {pol.label()!r} did not converge: "
            f"{fp.status.name} (residual {fp.residual:.3g})"
        )
    return phases.as_result(fp, pol, load, ratio, buffer=buffer)
