"""The 1/N-refined mean field (Gast and Van Houdt) of the generic mean field.

:func:`refined_mean_field` at one point, :func:`refined_grid` on a grid of
loads and ratios: the mean field plus a ``1 / N`` correction from the
expansion of :mod:`jaxqueue.theory.finite_n.expansion`. Derivation and where the
expansion is undefined: docs/theory.md, "Refined mean field".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.config import Bounds, check_options, takes_options
from jaxqueue.core.host import host_float64
from jaxqueue.core.status import Status
from jaxqueue.core.system import MAX_SERVERS, System, as_int, check_int, check_load
from jaxqueue.theory.finite_n.expansion import (
    Corrections,
    corrections,
    jump_covariance,
    lyapunov,
    metrics_at,
    model,
    project,
    quantile_corrections,
    transitions,
)
from jaxqueue.theory.finite_n.refined_grid import (
    GRID_METRICS,
    RefinedGrid,
    closed_form_start,
    closed_form_starts,
    grid_core,
    ode_start,
)
from jaxqueue.theory.finite_n.refined_result import (
    RefinedMeanField,
    check_ratio,
    check_whole,
    refined_result,
    whole,
)
from jaxqueue.theory.generic import meanfield
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.result import TRUNCATION_LIMIT

__all__ = [
    "RefinedMeanField",
    "RefinedGrid",
    "Corrections",
    "GRID_METRICS",
    "refined_mean_field",
    "refined_grid",
    "transitions",
    "jump_covariance",
    "corrections",
    "lyapunov",
    "working_bytes",
    "MAX_WORKING_BYTES",
    "project",
    "model",
]

_MAX_LEVELS = 10**6

#: The most working memory (bytes) the correction of one point, or of one
#: chunk of a grid, may be estimated to take before it is refused (raise it
#: on a machine with more). See :func:`working_bytes`.
MAX_WORKING_BYTES = 16 * 2**30


def working_bytes(system: System) -> int:
    """Estimated working memory of :func:`corrections` at one point, in bytes.

    The derivatives of the outcome-grid sums hold, for each outcome law, the
    grid's sums keyed by (result, outcome): ``(L + 1)(J + 1)`` results times
    ``L + 1`` outcomes for the JIQ family's arrival law, so the memory grows
    as ``L^2 J``; the Schur and Lyapunov steps add ``O((L + J)^2)``.
    Measured on the CPU (JIQ, ``J = 30``): 0.64 GB at ``L = 600``, 2.4 GB
    at 1200 and 7.9 GB at 2048, against this estimate's 0.72, 2.9 and 9.2.
    """
    L, J = system.levels, system.iqueue_levels
    return 64 * (L + 1) ** 2 * (J + 1) + 200 * (L + J + 1) ** 2


def _check_work(pol, system: System, points: int = 1) -> None:
    """Refuse, before compiling, a correction estimated past :data:`MAX_WORKING_BYTES`."""
    need = working_bytes(system) * points
    if need > MAX_WORKING_BYTES:
        what = "the correction" if points == 1 else f"a chunk of {points} points"
        advice = ("give a smaller chunk, or " if points > 1 else "") + (
            "lower the load (the levels the tail needs grow like 1 / (1 - load)), "
            "or raise jaxqueue.theory.finite_n.refined.MAX_WORKING_BYTES on a machine with more memory"
        )
        raise ValueError(
            f"the refined mean field of {pol.label()} with levels={system.levels} and "
            f"iqueue_levels={system.iqueue_levels}: {what} would take about "
            f"{need / 2**30:.1f} GiB of working memory, more than MAX_WORKING_BYTES = "
            f"{MAX_WORKING_BYTES / 2**30:.1f} GiB; {advice}"
        )


def _setup(limit: Limit, load, n_servers, bounds: Bounds):
    """Validate everything (before any compilation); the policy, limit and finite systems."""
    policy, ratio, d, buffer = limit.policy, limit.ratio, limit.d, limit.buffer
    levels, iqueue_levels = bounds.levels, bounds.iqueue_levels
    if buffer is not None:
        check_int("buffer", buffer, 1, _MAX_LEVELS)
    if levels is not None:
        check_int("levels", levels, 1, _MAX_LEVELS)
    if iqueue_levels is not None:
        check_int("iqueue_levels", iqueue_levels, 1, MAX_SERVERS)
    for n in np.atleast_1d(np.asarray(n_servers, dtype=object)):
        check_int("n_servers", n, 1, MAX_SERVERS)
    n_min = int(np.min(np.atleast_1d(np.asarray(n_servers, dtype=object))))
    lam = check_load(load, buffer) if load is not None else None
    pol, system = meanfield.policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels)
    one_dispatcher = system.iqueue_levels == 0
    r = None if one_dispatcher else check_ratio(ratio, n_min)
    if not one_dispatcher and r is None:
        raise ValueError(f"ratio is required for {pol.label()} with several dispatchers")
    return pol, system, lam, r, n_min


def _finite_system(pol, system, n_servers, ratio, buffer) -> System:
    """The finite system ``N`` servers, ``M = round(N / r)`` dispatchers (1 for one dispatcher)."""
    m = 1 if ratio is None else min(n_servers, max(1, round(n_servers / ratio)))
    return System(n_servers, m, buffer, buffer if buffer is not None else system.levels, 0)


@takes_options("d", "buffer", "levels", "iqueue_levels")
def refined_mean_field(
    policy,
    load: float,
    ratio: float | None = None,
    *,
    n_servers: int,
    **options,
) -> RefinedMeanField:
    """The 1/N-refined mean field of a policy at one point (float64, host side).

    The fixed point is the generic one (:func:`jaxqueue.theory.generic.meanfield.fixed_point`;
    for closed-form policies it equals the closed form to about 1e-10), so the
    mean field and its correction describe the same truncated model. See the
    module docstring for the formula, the conservation law of the JIQ family
    and where the expansion is undefined.

    Args:
        policy: a policy name or :class:`~jaxqueue.policies.Policy` with an
            occupancy mean field (not ``jiq-original``, ``jiq-threshold``).
        load: ``lambda > 0`` (``< 1`` unless ``buffer`` is given).
        ratio: ``r = N / M`` (``0 < r <= n_servers``, with ``n_servers / r``
            a whole number of dispatchers) for the JIQ family with several
            dispatchers; ``None`` (or inf) for one dispatcher, which is
            JSQ-like (``NOT_DIFFERENTIABLE``). Ignored by policies without I-queues.
        n_servers: ``N >= 1``; the refined values are at this ``N``.
        <options>
            In the refined mean field: ``1 <= d <= n_servers`` (``d = N`` is
            JSQ); ``levels`` is the largest queue length represented
            (default the buffer, or :data:`meanfield.DEFAULT_LEVELS` grown by
            the fixed point's adaptive count where the tail needs more; a
            given one that leaves more than ``1e-6`` of the tail at the bound
            is refused), ``iqueue_levels`` the largest I-queue size
            (default :func:`jaxqueue.theory.generic.meanfield.default_iqueue_levels`).

    Returns:
        :class:`RefinedMeanField`.

    Raises:
        NotImplementedError: a policy without an occupancy mean field.
        ValueError, TypeError: an argument out of range (named, with its range),
            raised before anything is compiled; ValueError also where the
            levels the tail needs would take the correction past
            :data:`MAX_WORKING_BYTES` of memory (:func:`working_bytes`).

    Example:
        >>> from jaxqueue import theory
        >>> rf = theory.refined_mean_field("pod", 0.9, n_servers=100)
        >>> rf.refined.mean_response_time > rf.mean_field.mean_response_time
        True
    """
    check_options("refined_mean_field", options, refined_mean_field)
    d, buffer, levels = (
        options.get("d"),
        as_int(options.get("buffer")),
        as_int(options.get("levels")),
    )
    n_servers, bounds = as_int(n_servers), Bounds(levels, as_int(options.get("iqueue_levels")))
    limit = Limit(policy, ratio, d, buffer)
    pol, system, lam, r, _ = _setup(limit, load, n_servers, bounds)
    check_whole(n_servers, r)
    fsys = _finite_system(pol, system, n_servers, r, buffer)
    pol.validate(fsys)  # d against N (and M for jiq-sq)
    _check_work(pol, system)
    kink = pol.mean_field_kink(fsys)
    fp, pol, system = _fixed_point(pol, system, lam, r, ratio, d, buffer, n_servers, levels)
    converged = fp.status == Status.CONVERGED
    mf = meanfield.as_result(fp, pol, lam, ratio, buffer=buffer) if converged else None
    if kink is not None:  # whether or not Newton converged there
        return RefinedMeanField(mf, None, None, n_servers, Status.NOT_DIFFERENTIABLE, reason=kink)
    if not converged:
        return RefinedMeanField(
            None,
            None,
            None,
            n_servers,
            Status(fp.status),
            reason=f"the mean-field fixed point did not converge: "
            f"{Status(fp.status).name} (residual {fp.residual:.3g})",
        )
    c, metrics = _corrections(fp, lam, r, pol, system, buffer)
    finite = all(np.all(np.isfinite(b)) for _, b in metrics.values())
    if not finite or not float(c.spectral_abscissa) < 0:
        return RefinedMeanField(
            mf,
            None,
            None,
            n_servers,
            Status.NON_FINITE,
            reason="the correction is not finite, or the fixed point is not "
            f"stable (spectral abscissa {float(c.spectral_abscissa):.3g})",
        )
    correction = {k: (float(b) if b.ndim == 0 else b) for k, (_, b) in metrics.items()}
    for name in ("p0", "iqueue_distribution"):
        if name not in correction and getattr(mf, name) is not None:
            raise AssertionError(f"{name} of the mean field has no correction")  # pragma: no cover
        correction.setdefault(name, None)
    correction["stale_fraction"] = None
    seen, dseen = metrics["arrival_seen"]
    correction["response_quantiles"] = quantile_corrections(seen, dseen, mf.response_quantiles)
    refined = refined_result(mf, correction, pol, lam, ratio, buffer, n_servers)
    return RefinedMeanField(
        mf,
        correction,
        refined,
        n_servers,
        Status.CONVERGED,
        state_correction=c.state,
        covariance=c.covariance,
    )


def _fixed_point(pol, system, lam, r, ratio, d, buffer, n_servers, levels) -> tuple:
    """The generic fixed point the correction is taken at: ``(fp, pol, system)``, from
    the closed form where there is one, on more levels where the tail needs them."""
    iqueue_levels = system.iqueue_levels or None
    start = None
    if closed_form_starts(pol, buffer):
        with host_float64():  # Newton from the closed form, not from an ODE run
            start = np.asarray(
                closed_form_start(pol, system, jnp.asarray([lam]), jnp.asarray([r or 1.0]))[0, 0]
            )
    fp = meanfield.fixed_point(
        pol,
        lam,
        r,
        buffer=buffer,
        levels=system.levels,
        iqueue_levels=iqueue_levels,
        start=start,
    )
    converged = fp.status == Status.CONVERGED
    if converged and buffer is None and levels is None and fp.truncated[0] > meanfield.LEVEL_TOL:
        # the load builds longer queues than the first level count holds: the adaptive one
        fp = meanfield.fixed_point(pol, lam, r, iqueue_levels=iqueue_levels)
        bounds = Bounds(fp.tail.size - 1, iqueue_levels)
        pol, system, lam, r, _ = _setup(Limit(pol, ratio, d, buffer), lam, n_servers, bounds)
        converged = fp.status == Status.CONVERGED
        if converged:
            _check_work(pol, system)
    if converged and buffer is None and fp.truncated[0] > TRUNCATION_LIMIT:
        raise ValueError(
            f"levels={system.levels} is too small for the refined mean field of {pol.label()} "
            f"at load={lam}: the mean field leaves {fp.truncated[0]:.3g} of its tail at the "
            f"bound (at most {TRUNCATION_LIMIT:g} may); pass more levels"
        )
    return fp, pol, system


def _corrections(fp, lam, r, pol, system, buffer) -> tuple:
    """The corrections at ``fp`` and the metrics' ``(value, correction)`` (host float64)."""
    x = np.concatenate([fp.tail[1:], fp.iq_tail[1:]])
    with host_float64():
        c = corrections(
            jnp.asarray(x, jnp.float64), jnp.float64(lam), jnp.float64(r or 1.0), pol, system
        )
        metrics = metrics_at(
            jnp.asarray(x),
            c.state,
            c.observables,
            c.observables_correction,
            jnp.float64(lam),
            pol,
            system,
            buffer,
        )
        metrics = {
            k: (np.asarray(a, np.float64), np.asarray(b, np.float64))
            for k, (a, b) in metrics.items()
        }
        c = Corrections(*(np.asarray(v, np.float64) for v in c))
    return c, metrics


# ---------------------------------------------------------------------------
# A grid of (load, ratio), vmapped
# ---------------------------------------------------------------------------
@takes_options("d", "buffer", "levels", "iqueue_levels")
def refined_grid(
    policy,
    loads,
    ratios=None,
    n_servers=(100,),
    *,
    tol: float = 1e-12,
    max_newton: int = 30,
    chunk: int = 64,
    **options,
) -> RefinedGrid:
    """The refined mean field on the grid ``loads x ratios``, vmapped (float64).

    One compiled program for the whole grid: per point a Newton solve of the
    generic fixed point (in the plane of the JIQ conservation law) from the
    closed form where the policy declares ``pod`` or ``jiq-pod`` and the
    buffers are infinite, else from the ODE run :func:`meanfield.fixed_point`
    starts from; then :func:`corrections`. Points run in vmapped chunks of
    ``chunk`` under :func:`jax.lax.map` (memory grows with ``chunk`` times
    the outcome grid of the policy's draws). ``N`` enters last: the refined
    values for every ``N`` of ``n_servers`` come from one correction.

    Args:
        policy: a policy name or Policy (as for :func:`refined_mean_field`).
        loads: 1-D ``lambda`` values (``> 0``; ``< 1`` unless ``buffer``).
        ratios: 1-D ``r`` values for the JIQ family with several dispatchers;
            ``None`` for policies without I-queues (one column, ``r`` unused).
        n_servers: the ``N`` values (ints ``>= 1``).
        tol: residual at which Newton stops; max_newton: its step limit.
        chunk: points per vmapped batch (``>= 1``).
        <options>
            On the grid, as for :func:`refined_mean_field`, but ``levels`` and
            ``iqueue_levels`` are the truncation shared by every point
            (default :data:`meanfield.DEFAULT_LEVELS` or the buffer;
            :func:`meanfield.default_iqueue_levels` at the largest ``r``); a
            point whose tail it cuts is ``TRUNCATED``.

    Returns:
        :class:`RefinedGrid`.

    Raises:
        ValueError, TypeError: an argument out of range (named, with its range),
            or a chunk whose working memory :func:`working_bytes` estimates
            past :data:`MAX_WORKING_BYTES`, before anything is compiled.
        NotImplementedError: a policy without an occupancy mean field.
    """
    check_options("refined_grid", options, refined_grid)
    d, buffer = options.get("d"), options.get("buffer")
    bounds = Bounds(options.get("levels"), options.get("iqueue_levels"))
    loads, ns, ratio_list, top = _grid_inputs(
        loads, ratios, n_servers, buffer, tol, max_newton, chunk
    )
    pol, system, _, _, _ = _setup(Limit(policy, top, d, buffer), None, ns, bounds)
    if system.iqueue_levels and ratios is None:
        raise ValueError(f"ratios is required for {pol.label()} with several dispatchers")
    if not system.iqueue_levels:
        ratio_list = [None] if ratios is None else ratio_list
    for r in ratio_list:
        pol.validate(_finite_system(pol, system, min(ns), r, buffer))
    _check_work(pol, system, min(chunk, loads.size * len(ratio_list)))
    r_values = np.array([1.0 if (r is None or not system.iqueue_levels) else r for r in ratio_list])
    with host_float64():
        lam_j, r_j = jnp.asarray(loads), jnp.asarray(r_values)
        if closed_form_starts(pol, buffer):
            x0 = closed_form_start(pol, system, lam_j, r_j)
        else:
            x0 = ode_start(pol, system, lam_j, r_j)
        mf, corr, tail, dtail, status, its = jax.tree_util.tree_map(
            np.asarray,
            grid_core(x0, lam_j, r_j, pol, system, buffer, jnp.float64(tol), max_newton, chunk),
        )
    status, mf = _grid_status(status, mf, tail, pol, system, buffer, ratio_list, ns)
    good_any = np.any(status == int(Status.CONVERGED), axis=-1)
    n_arr = np.asarray(ns, np.float64)
    corr = {k: np.where(good_any, v, np.nan) for k, v in corr.items()}
    dtail = np.where(good_any[..., None], dtail, np.nan)
    refined = {
        k: np.where(status == 0, mf[k][..., None] + corr[k][..., None] / n_arr, np.nan) for k in mf
    }
    return RefinedGrid(
        loads,
        r_values if ratios is not None else np.array([np.nan]),
        np.asarray(ns, np.int64),
        mf,
        corr,
        refined,
        status,
        tail,
        dtail,
        its,
    )


def _grid_inputs(loads, ratios, n_servers, buffer, tol, max_newton, chunk) -> tuple:
    """:func:`refined_grid`'s arguments checked: ``(loads, ns, ratio_list, top)``."""
    loads = np.asarray(loads, np.float64)
    if loads.ndim != 1 or loads.size == 0:
        raise ValueError(f"loads must be a non-empty 1-D array, got shape {loads.shape}")
    for lam in loads:
        check_load(float(lam), buffer)
    ns = [n for n in np.atleast_1d(np.asarray(n_servers, dtype=object))]
    if not ns:
        raise ValueError("n_servers must hold at least one N")
    for n in ns:
        check_int("n_servers", n, 1, MAX_SERVERS)
    check_int("chunk", chunk, 1, 1 << 20)
    check_int("max_newton", max_newton, 1, 10_000)
    if not (isinstance(tol, float) and tol > 0):
        raise ValueError(f"tol={tol!r} is out of range: need a float > 0")
    if ratios is None:
        ratio_list, top = [None], None
    else:
        ratio_arr = np.asarray(ratios, np.float64)
        if ratio_arr.ndim != 1 or ratio_arr.size == 0:
            raise ValueError(f"ratios must be a non-empty 1-D array, got shape {ratio_arr.shape}")
        ratio_list = [check_ratio(float(r), min(ns)) for r in ratio_arr]
        top = max(ratio_list)
    return loads, ns, ratio_list, top


def _grid_status(status, mf, tail, pol, system, buffer, ratio_list, ns) -> tuple:
    """The grid's ``[A, B, K]`` status codes (JSQ-like routing, dispatchers that are
    not whole, tails the shared bound cuts), and the mean field with the cut points NaN."""
    limit_kink = pol.mean_field_kink(system) is not None
    kinks = np.array(
        [
            [pol.mean_field_kink(_finite_system(pol, system, n, r, buffer)) is not None for n in ns]
            for r in ratio_list
        ]
    )  # [B, K]
    status = np.broadcast_to(status[:, :, None], status.shape + (len(ns),)).copy()
    if limit_kink:
        status[:] = int(Status.NOT_DIFFERENTIABLE)
    status[:, kinks] = int(Status.NOT_DIFFERENTIABLE)
    if system.iqueue_levels:  # N servers and N / r dispatchers: a system only where it is whole
        for b, r in enumerate(ratio_list):
            for k, n in enumerate(ns):
                if r is not None and not whole(int(n), r):
                    status[:, b, k] = int(Status.INVALID_INPUT)
    if buffer is None:  # the shared bound cuts these points' tails: no mean field there either
        cut = tail[..., -1] > TRUNCATION_LIMIT  # [A, B]
        status[cut] = int(Status.TRUNCATED)
        mf = {
            k: np.where(cut.reshape(cut.shape + (1,) * (v.ndim - 2)), np.nan, v)
            for k, v in mf.items()
        }
    return status, mf
