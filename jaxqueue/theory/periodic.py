"""Mean field under a periodic arrival-rate profile: the periodic regime of the ODE.

With a :class:`~jaxqueue.core.arrivals.Profile` the arrival rate per server
is ``lambda(t) = lambda * shape(t)``, piecewise constant and periodic with
period ``P`` (``shape`` has time mean 1, so ``lambda`` is the mean load, as
in the simulator). Every rate of the system scales with ``N``, so in the
limit ``N, M -> infinity`` the occupancy follows the mean-field ODE of
:mod:`jaxqueue.theory.meanfield` on each segment, with that segment's rate,
and the state at a segment's end starts the next one. Under a stable mean
load (``lambda < 1``, or a finite buffer) the ODE settles into a periodic
orbit ``x*(t)``, and the long-run averages of a large system are averages
over one period of that orbit:

* time averages: the tails ``s_k``, the mean queue length, ``p0`` (the
  fraction of empty I-queues, ``1 - Q_1``), the join rate;
* arrival averages, weighted by ``lambda(t)``: the law of the queue an
  accepted arrival finds (``arrival_seen``), from which the waiting
  probability, the mean response time and its quantiles follow as with
  constant load (FIFO, exponential service: an arrival that finds ``k``
  tasks stays an Erlang(``k + 1``) time), the blocking probability, and the
  delete and probe rates.

A peak above the capacity is allowed as long as the mean load is stable:
queues build up while ``lambda(t) > 1`` and drain afterwards.

How it is solved. Time is cut into RK4 steps of at most ``dt`` that end on
the segment boundaries. Alongside the state, each step integrates what the
averages need (the state itself, ``lambda * level law``, the delete, probe
and join rates) by the same four stages, so the period integrals are
fourth-order accurate as well. The orbit is found by shooting: a few periods
forward from the fixed point at the mean load, then Newton on
``Phi(x) - x = 0``, ``Phi`` the map over one period, with ``jax.jacfwd``
through the whole period (with the I-queue conservation law
``sum_j Q_j / r = 1 - s_1`` in place of one equation, as in the fixed point).
For JSQ-like routing the ODE slides along a level the peak fills
(:func:`jaxqueue.theory.meanfield.sliding`), and the averages integrate the
mix of the two routings it follows there. Should Newton stall (the flow has
kinks where a level fills or empties), the period map is iterated instead.
The map keeps the JIQ family's conservation law exactly: each period ends by
setting ``Q_1`` from it (the ODE keeps the law, so the map does not contract
along it, and what the integration leaks there would add up period after
period). ``levels`` and ``iqueue_levels`` left at ``None`` grow until the
orbit's mass at the bounds is below ``1e-10``: each time by as many levels
as the tail's decay at the bound says are missing, and half as many again
(at least 8, at most twice as many).

By class. With a phase-type service law or server pools (``service=``,
``pools=``) the state is that of :mod:`jaxqueue.theory.phases`, ``x[k, c]``
by queue length and class (pool and phase) with the I-queues after it, and
the same shooting runs on that module's drift. The averages then also
integrate, weighted by ``lambda(t)``, where arrivals find their servers: the
joint law of the queue length and the class in service, and the pool of an
idle server joined; :func:`as_result` hands them to
:func:`jaxqueue.theory.phases.as_result` (the response-time law, its
quantiles and every pool metric). JSQ-like routing slides along a level
the peak fills as it does with identical exponential servers, by
:func:`jaxqueue.theory.phases.sliding`, whose arrivals sent just below a
full level join the classes completions leave there; the averages take
that too. The RK4 step is also at most the fixed point's step at the peak
load (:func:`jaxqueue.theory.phases._dt`).

Averages over a window. A simulation measures over a window of its own
(:attr:`settings["time_warmup"]` to that plus ``settings["time_measured"]``,
time 0 being phase 0 of the profile), which rarely holds a whole number of
periods; the average over a partial period differs from the period average
by up to ``P / window`` of the orbit's swing. ``window=(start, length)``
averages the orbit over exactly that window.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.arrivals import Profile, as_arrivals
from jaxqueue.core.host import host_float64
from jaxqueue.core.service import as_law
from jaxqueue.core.status import Status
from jaxqueue.core.system import check_load
from jaxqueue.policies import make
from jaxqueue.theory import meanfield, phases
from jaxqueue.theory.meanfield import FixedPoint, Rates

__all__ = ["PeriodicOrbit", "periodic_orbit", "as_result", "refusal", "DEFAULT_DT"]

#: The longest RK4 step (time units); steps end on the profile's segment boundaries.
DEFAULT_DT = 0.02

#: The orbit's largest mass at an automatic bound (``s_levels`` or ``Q_iqueue_levels``).
REMAINDER = 1e-10

#: Automatic bounds grow up to this many levels.
MAX_AUTO_LEVELS = 5120

_MIN_STEPS = 64  # compiled step counts are powers of two from here (padded with empty steps)
_NEWTON_DIM = 160  # Newton (a Jacobian of dim^2 entries through a period) up to this dimension
_WARM_PERIODS = 3  # periods before the contraction rate is judged
_SLOW = 30  # periods left at which Newton is tried
_MAX_PERIODS = 5000


class PeriodicOrbit(NamedTuple):
    """The periodic regime of the mean-field ODE under a rate profile (host values).

    Attributes:
        start: the orbit's state at phase 0 of the profile, ``[s_1..s_L, Q_1..Q_J]``.
        averages: a :class:`~jaxqueue.theory.meanfield.FixedPoint` of the
            averages (``tail``, ``iq_tail``: time averages; ``rates.level``
            and the per-arrival rates: averages weighted by ``lambda(t)``;
            ``rates.join_probes``: weighted by the join rate);
            ``truncated`` holds the orbit's largest mass at each bound. By
            class, a :class:`jaxqueue.theory.phases.FixedPoint` of the same
            averages, with ``seen_phase`` and ``seen_idle``.
        p0: the time average of ``p0`` (``None`` without I-queues).
        window: ``(start, length)`` the averages are over.
        curve: the orbit over one period at the start of each RK4 step:
            ``{"time", "load", "mean_queue_length", "waiting_probability",
            "mean_response_time", "p0"}`` (arrays; ``p0`` only with I-queues),
            and with pools ``"pool_utilization"``, ``(steps, pools)``: each
            pool's busy fraction.
        status: ``CONVERGED``, or ``MAX_ITERATIONS`` if the period map did
            not settle within the iterations allowed.
        residual: ``max |Phi(start) - start|``.
        newton_iterations, periods: Newton steps and forward periods taken.
        system: the limit :class:`~jaxqueue.core.system.System` solved on
            (its ``levels`` and ``iqueue_levels`` are the bounds used).
    """

    start: np.ndarray
    averages: FixedPoint
    p0: float | None
    window: tuple
    curve: dict
    status: Status
    residual: float
    newton_iterations: int
    periods: int
    system: object


# -- one compiled pass over a schedule of RK4 steps -----------------------------------------


def _schedule(profile: Profile, load: float, t0: float, t1: float, dt: float):
    """Loads and lengths of the RK4 steps over ``[t0, t1]`` within one period
    (at most ``dt`` long, ending on segment boundaries), padded with empty
    steps to a power of two (few compiled shapes)."""
    times = np.asarray(profile.times, np.float64)
    a, b = np.maximum(times[:-1], t0), np.minimum(times[1:], t1)
    span = np.where(b > a, b - a, 0.0)
    n = np.where(span > 0, np.ceil(span / dt - 1e-9), 0).astype(np.int64)
    n = np.where(span > 0, np.maximum(n, 1), 0)
    loads = np.repeat(load * profile.shape, n)
    lengths = np.repeat(span / np.maximum(n, 1), n)
    size = max(_MIN_STEPS, 1 << max(0, int(loads.size) - 1).bit_length())
    pad = size - loads.size
    return (
        np.concatenate([loads, np.zeros(pad)]),
        np.concatenate([lengths, np.zeros(pad)]),
        int(loads.size),
    )


def _classes(x, system, law):
    """``x[1..L, :]`` as an ``(L, C)`` array and ``Q_1..Q_J`` (a state by class)."""
    return phases._split(x, system.levels, law.alpha.shape[0])


def _p0(x, policy, system):
    """``p0`` at ``x``: ``1 - Q_1``; with one dispatcher, whether no server is idle."""
    s, q = meanfield._split(x, system)
    if system.iqueue_levels:
        return 1.0 - q[1]
    if policy.uses_iqueues:  # one dispatcher: its I-queue is empty iff no server is idle
        return (s[1] >= 1.0).astype(x.dtype)
    return jnp.zeros((), x.dtype)


def _integrand(x, lam, rt: Rates, p0, joined, policy, system, law):
    """What the averages integrate: the state, ``lambda * level law``, by class
    where the arrivals go (``lambda * level[k] * share[k, c]`` for ``k = 1..L-1``
    and ``lambda * level[0] * pick[i]``; ``joined = (share, pick)`` from
    :func:`_stage`) and, per unit time, deletes, probes, join probes, joins,
    ``p0`` and arrivals."""
    L = system.levels
    if law is None:
        s, _ = meanfield._split(x, system)
        join = s[1] - s[2] if L >= 2 else s[1]  # servers becoming idle (rate-1 service)
        where = []
    else:
        X, _ = _classes(x, system, law)
        share, pick = joined
        join = X[0] @ -jnp.sum(law.generator, axis=1)  # completions at level 1
        where = [(lam * rt.level[1:L, None] * share[: L - 1]).reshape(-1), lam * rt.level[0] * pick]
    join = join if policy.uses_iqueues else jnp.zeros((), x.dtype)
    rest = jnp.stack([lam * rt.deletes, lam * rt.probes, join * rt.join_probes, join, p0, lam])
    return jnp.concatenate([x, lam * rt.level, *where, rest])


def _integrand_size(system, law) -> int:
    L, J = system.levels, system.iqueue_levels
    if law is None:
        return L + J + (L + 1) + 6
    C, pools = law.alpha.shape[0], law.starts.shape[0]
    return L * C + J + (L + 1) + (L - 1) * C + pools + 6


#: Columns of :func:`_observe` read by name: the mass at each bound and one level below.
_AT_L, _AT_J, _BELOW_L, _BELOW_J = 4, 5, 6, 7


def _class_means(law):
    """``(r, m)``: the mean rest of a service from each class, ``r_c = ((-S)^-1
    1)_c``, and each pool's mean service time ``m_i`` (None without classes)."""
    if law is None:
        return None
    rest = jnp.linalg.solve(-law.generator, jnp.ones(law.alpha.shape[0], law.generator.dtype))
    return rest, law.starts @ rest


def _observe(x, rt: Rates, p0, joined, system, law, means=None):
    """The orbit's instantaneous values at ``x``: mean queue length, P(wait),
    mean response time of an accepted arrival, ``p0``, the mass at the bounds
    (``s_L``, ``Q_J``) and one level below them (``s_{L-1}``, ``Q_{J-1}``);
    by class, then each pool's busy fraction.

    By class, an arrival that joins a server with ``k >= 1`` tasks whose task
    in service is of class ``c`` stays the rest of that service (mean
    ``r_c = ((-S)^-1 1)_c``) and ``k`` services of that server's pool; one that
    joins an idle server of pool ``i``, one service of pool ``i``."""
    L = system.levels
    accepted = rt.level[:L]
    seen = accepted / jnp.maximum(jnp.sum(accepted), 1e-300)
    k = jnp.arange(L, dtype=x.dtype)
    if law is None:
        s, q = meanfield._split(x, system)
        response = jnp.sum(seen * (k + 1.0))
    else:
        X, q = _classes(x, system, law)
        one = jnp.ones(1, x.dtype)
        s, q = jnp.concatenate([one, phases._tails(X)]), jnp.concatenate([one, q])
        share, pick = joined
        rest, pool_mean = means  # (classes,), (pools,): _class_means
        per_class = rest[None, :] + k[1:, None] * (law.member @ pool_mean)[None, :]
        response = seen[0] * (pick @ pool_mean) + jnp.sum(
            seen[1:, None] * share[: L - 1] * per_class
        )
    zero = jnp.zeros((), x.dtype)
    J = system.iqueue_levels
    out = jnp.stack(
        [
            jnp.sum(s[1:]),
            1.0 - seen[0],
            response,
            p0,
            s[L],
            q[J] if J else zero,
            s[L - 1],
            q[J - 1] if J else zero,
        ]
    )
    if law is None:
        return out
    return jnp.concatenate([out, jnp.sum(X, axis=0) @ law.member / law.fractions])


def _stage(y, lam, ratio, policy, system, law):
    """``(dx/dt, Rates, p0, joined)`` at ``y``; for a JSQ-like policy the sliding
    drift (:func:`jaxqueue.theory.meanfield.sliding`), its mixed law and ``p0``.
    By class (``law`` not None) the drift of :mod:`jaxqueue.theory.phases`
    (:func:`~jaxqueue.theory.phases.sliding` for a JSQ-like policy), and
    ``joined``: where the server an arrival joins is (``(share, pick)``,
    :func:`jaxqueue.theory.phases._joined`; None for the exponential state)."""
    kinked = meanfield.kinked(policy, system)
    if law is not None:
        if kinked:
            sl = phases.sliding(y, lam, ratio, law, policy, system)
            p0 = sl.inside * _p0(sl.below, policy, system) + (1.0 - sl.inside) * _p0(
                sl.state, policy, system
            )
            return sl.drift, sl.rates, p0, (sl.share, sl.pick)
        X, q = _classes(y, system, law)
        joined = phases._joined(X, law)
        rt = meanfield.rates(phases._flat(X, q), policy, system)
        f = phases._class_drift(X, q, lam, ratio, law, rt, *joined)
        return f, rt, _p0(phases._flat(X, q), policy, system), joined
    if kinked:
        sl = meanfield.sliding(y, lam, ratio, policy, system)
        p0 = sl.inside * _p0(sl.below, policy, system) + (1.0 - sl.inside) * _p0(
            sl.state, policy, system
        )
        return sl.drift, sl.rates, p0, None
    rt = meanfield.rates(y, policy, system)
    return meanfield.drift_from_rates(y, lam, ratio, rt, system), rt, _p0(y, policy, system), None


#: RK4's stages 2-4: (the step's fraction at which the drift is read, the weight of that drift).
_LATER_STAGES = ((0.5, 1.0 / 3.0), (0.5, 1.0 / 3.0), (1.0, 1.0 / 6.0))


def _rk4_step(x, lam, h, ratio, law, policy, system, integrate: bool):
    def stage(y):
        f, rt, p0, joined = _stage(y, lam, ratio, policy, system, law)
        area = _integrand(y, lam, rt, p0, joined, policy, system, law) if integrate else None
        return f, area, (rt, p0, joined)

    def step(y, h):
        # stages 2-4 are a loop, so that the drift is compiled twice, not four times
        k1, g1, obs = stage(y)

        def later(carry, coef):
            slope, k, g = carry
            f, area, _ = stage(y + coef[0] * h * slope)
            return (f, k + coef[1] * f, g + coef[1] * area if integrate else None), None

        coefs = jnp.asarray(_LATER_STAGES, y.dtype)
        (_, k, g), _ = jax.lax.scan(later, (k1, k1 / 6.0, g1 / 6.0 if integrate else None), coefs)
        return y + h * k, h * g if integrate else None, (obs, k1)

    new, area, (obs, slope) = step(x, h)
    if law is None and meanfield.kinked(policy, system):
        new, area = meanfield.split_at_filling(
            lambda y, h: step(y, h)[:2], x, h, new, area, slope, system
        )
    elif meanfield.kinked(policy, system):
        L, C = system.levels, law.alpha.shape[0]
        new, area = phases._split_at_filling(
            lambda y, h: step(y, h)[:2], x, h, new, area, slope, law, L, C
        )
        return phases._onto_full(jnp.clip(new, 0.0, 1.0), law, L, C), area, obs
    return jnp.clip(new, 0.0, 1.0), area, obs


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _flow(x, loads, lengths, ratio, law, policy, system):
    """The state after the schedule's steps, put back on the JIQ family's
    conservation law (:func:`_conserve`). ``law``: the server classes'
    arrays (:func:`jaxqueue.theory.phases.law_arrays`) for a state by class,
    None for identical exponential servers."""

    def body(x, step):
        new, _, _ = _rk4_step(x, step[0], step[1], ratio, law, policy, system, False)
        return new, None

    return _conserve(
        jax.lax.scan(body, x, jnp.stack([loads, lengths], axis=1))[0], ratio, system, law
    )


def _busy(x, system, law):
    """Where ``Q_1`` sits in the state, and the busy fraction ``s_1``."""
    if law is None:
        return system.levels, x[0]
    n = system.levels * law.alpha.shape[0]
    return n, jnp.sum(x[:n])


def _iqueue_gap(x, ratio, system, law):
    """``sum_j Q_j / r - (1 - s_1)`` for either state."""
    if law is None:
        return meanfield.iqueue_gap(x, ratio, system)
    return phases.iqueue_gap(x, ratio, system.levels, law.alpha.shape[0])


def _conserve(x, ratio, system, law=None):
    """``x`` with ``Q_1`` set so that ``sum_j Q_j / r = 1 - s_1`` (I-queues list
    exactly the idle servers: :func:`jaxqueue.theory.meanfield.iqueue_gap` zero).

    The ODE keeps this sum, so the period map has an eigenvalue 1 along it:
    what the integration leaks there (mass joining I-queues past the bound,
    the clip at 0) is never contracted away but adds up period after period
    (about 5e-10 a period for JIQ at r = 10 on a 48-unit day), and iterating
    the map would stall above a tight ``tol``. Without I-queues ``x`` as is.
    """
    if not system.iqueue_levels:
        return x
    at, busy = _busy(x, system, law)
    return x.at[at].set(jnp.clip(ratio * (1.0 - busy) - jnp.sum(x[at + 1 :]), 0.0, 1.0))


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _flow_integrals(x, loads, lengths, ratio, law, policy, system):
    """The state after the schedule, the integrals of :func:`_integrand` over
    it, and :func:`_observe` at the start of each step."""

    def body(carry, step):
        x, total = carry
        new, area, (rt, p0, joined) = _rk4_step(
            x, step[0], step[1], ratio, law, policy, system, True
        )
        return (new, total + area), _observe(x, rt, p0, joined, system, law, means)

    means = _class_means(law)

    zero = jnp.zeros(_integrand_size(system, law), x.dtype)
    (x, total), seen = jax.lax.scan(body, (x, zero), jnp.stack([loads, lengths], axis=1))
    return x, total, seen


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _newton(x, loads, lengths, ratio, law, policy, system):
    """``(Phi(x) - x``, the Newton step) with the conservation law in the row of
    ``Q_1``; one pass through the period gives the gap and the Jacobian together."""

    def residual(y):
        gap = _flow(y, loads, lengths, ratio, law, policy, system) - y
        f = gap
        if system.iqueue_levels:
            f = f.at[_busy(y, system, law)[0]].set(_iqueue_gap(y, ratio, system, law))
        return f, (f, gap)

    jac, (f, gap) = jax.jacfwd(residual, has_aux=True)(x)
    return gap, jnp.linalg.solve(jac, -f)


# -- the orbit ------------------------------------------------------------------------------


def _as_profile(arrivals) -> Profile:
    src = as_arrivals(arrivals)
    if isinstance(src, Profile):
        return src
    if src is None:
        raise ValueError(
            "arrivals is None: give a rate profile (use meanfield.fixed_point "
            "for Poisson arrivals at a constant rate)"
        )
    raise NotImplementedError(
        f"no mean field for {src.kind} arrivals: the periodic mean field takes a rate "
        "profile (an MMPP modulates the whole system's rate at random, so its limit is a "
        "random ODE, and a trace is one sample path); simulate instead"
    )


def _check_window(window, period: float):
    if window is None:
        return (0.0, float(period))
    try:
        start, length = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window={window!r} must be (start, length), two numbers") from None
    if not (math.isfinite(start) and start >= 0.0):
        raise ValueError(f"window start={start!r} is out of range: need a finite start >= 0")
    if not (math.isfinite(length) and length > 0.0):
        raise ValueError(f"window length={length!r} is out of range: need a finite length > 0")
    return (start, length)


def periodic_orbit(
    policy,
    load: float,
    arrivals,
    ratio: float | None = None,
    *,
    d: int | None = None,
    buffer: int | None = None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    dt: float = DEFAULT_DT,
    tol: float = 1e-10,
    max_newton: int = 30,
    window=None,
    service=None,
    pools=None,
) -> PeriodicOrbit:
    """The periodic regime of the generic mean field under a rate profile (float64).

    Args:
        policy, d, buffer: as for :func:`jaxqueue.theory.meanfield.fixed_point`
            (a policy with the generic mean field or a closed form).
        load: ``lambda``, the time-mean arrivals per server per unit time
            (``< 1`` with infinite buffers, or below the pools' capacity; the
            peak may pass it).
        arrivals: a :class:`~jaxqueue.core.arrivals.Profile` or a profile CSV
            file (``time,rate``); its rates are relative (scaled to time mean 1).
        ratio: ``r = N / M``; ``None``: one dispatcher.
        levels, iqueue_levels: the bounds; ``None`` grows them from the
            fixed point's defaults until the orbit's mass at the bound is
            below :data:`REMAINDER`. Given bounds are used as they are (the
            mass at them is reported in ``averages.truncated``).
        dt: the longest RK4 step, in ``(0, 1]`` (with a service law or pools
            at most the step :mod:`jaxqueue.theory.phases` takes at the peak).
        tol: ``max |Phi(x) - x|`` at which the orbit counts as found.
        max_newton: the most Newton steps, tried once where the period map
            contracts slowly (0: iterate the map only).
        window: ``(start, length)``: average over ``[start, start + length]``
            of the periodic regime (time 0 is phase 0 of the profile), as a
            simulation's measured window; ``None``: one period.
        service, pools: a phase-type service law and server pools, as for
            :func:`jaxqueue.theory.phases.fixed_point`: the ODE by class of
            that module (the module docstring, "By class"); ``averages`` is
            then a :class:`jaxqueue.theory.phases.FixedPoint`.

    Returns:
        A :class:`PeriodicOrbit`.

    Raises:
        ValueError: invalid arguments (naming the parameter and its range).
        NotImplementedError: a policy without a generic mean field, or
            arrivals that are not a rate profile.
    """
    profile = _as_profile(arrivals)
    if not (isinstance(dt, (int, float)) and 0.0 < dt <= 1.0):
        raise ValueError(f"dt={dt!r} is out of range: need 0 < dt <= 1")
    if not (isinstance(tol, (int, float)) and 0.0 < tol < 1.0):
        raise ValueError(f"tol={tol!r} is out of range: need 0 < tol < 1")
    win = _check_window(window, profile.period)
    classes, lam, cap, levels = _first_bounds(
        policy, load, service, pools, ratio, d, buffer, levels
    )
    auto_levels, auto_iq = levels is None and buffer is None, iqueue_levels is None
    pol, system = meanfield._policy_and_system(policy, ratio, d, buffer, levels, iqueue_levels)
    while True:
        orbit, decay = _solve(
            pol, lam, ratio, system, profile, float(dt), tol, max_newton, win, classes
        )
        mass = orbit.averages.truncated
        grow_s = auto_levels and mass[0] > REMAINDER
        grow_q = auto_iq and system.iqueue_levels and mass[1] > REMAINDER
        if not (grow_s or grow_q):
            return orbit
        levels = min(_grown(system.levels, mass[0], decay[0]), cap) if grow_s else system.levels
        iqueue_levels = (
            _grown(system.iqueue_levels, mass[1], decay[1]) if grow_q else system.iqueue_levels
        )
        if (levels, iqueue_levels) == (system.levels, system.iqueue_levels):
            raise RuntimeError(
                f"the orbit of {pol.label()!r} still reaches the bound at {system.levels} levels "
                f"and {system.iqueue_levels} I-queue levels (mass {orbit.averages.truncated}); "
                "the profile's peak builds queues too long to represent: give a finite buffer "
                "or a lower load"
            )
        _, system = meanfield._policy_and_system(
            pol, ratio, None, buffer, levels, iqueue_levels if system.iqueue_levels else None
        )


def largest_tail(
    policy,
    load: float,
    segments,
    ratio: float | None = None,
    *,
    d: int | None = None,
    service=None,
    pools=None,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    dt: float = 0.1,
) -> np.ndarray:
    """The largest queue-length tail along the mean-field ODE through a load path.

    From the fixed point at ``load`` (the mean load: a run's start), the ODE
    runs through ``segments``, ``((load_1, duration_1), ...)`` (absolute loads
    per server, any of them past the capacity), by RK4 steps of at most ``dt``.
    For each ``k`` it keeps the largest ``s_k`` met on the way (by class: the
    tails summed over the classes). What a simulator's default level bound
    under a time-varying source is sized from: the queues a peak builds.

    Args:
        policy, ratio, d, service, pools: as for :func:`periodic_orbit`
            (infinite buffers).
        load: the start's load, below the capacity.
        segments: the path, ``(load, duration)`` pairs (durations > 0).
        levels: the first bound tried (``None``: the fixed point's default);
            it grows until the largest ``s_levels`` on the path is below
            :data:`REMAINDER` (at most :data:`MAX_AUTO_LEVELS`).
        iqueue_levels: the I-queue bound (``None``: the fixed point's
            default). The JIQ family's drift costs about the cube of it; a
            smaller one leaves idle servers past it unlisted, which sends more
            arrivals to random servers and only lengthens the tails.
        dt: the longest RK4 step (with a service law or pools at most the
            step :mod:`jaxqueue.theory.phases` takes at the path's largest load).

    Returns:
        ``s`` (float64, ``s[0] = 1``): ``s[k]`` the largest ``s_k`` on the path.

    Raises:
        RuntimeError: the path builds queues past :data:`MAX_AUTO_LEVELS`.
    """
    loads = np.array([float(a) for a, _ in segments], np.float64)
    spans = np.array([float(b) for _, b in segments], np.float64)
    if loads.size == 0 or not (np.all(loads >= 0) and np.all(spans > 0)):
        raise ValueError("segments must be (load >= 0, duration > 0) pairs, at least one")
    classes, lam, cap, levels = _first_bounds(policy, load, service, pools, ratio, d, None, levels)
    pol, system = meanfield._policy_and_system(policy, ratio, d, None, levels, iqueue_levels)
    r = float(ratio) if system.iqueue_levels else 1.0
    if classes is not None:
        dt = min(dt, phases._dt(classes, float(loads.max()), pol, system, r))
    n = np.maximum(np.ceil(spans / dt - 1e-9), 1).astype(np.int64)
    step_loads, lengths = np.repeat(loads, n), np.repeat(spans / n, n)
    size = max(_MIN_STEPS, 1 << max(0, int(step_loads.size) - 1).bit_length())
    step_loads = np.concatenate([step_loads, np.zeros(size - step_loads.size)])
    lengths = np.concatenate([lengths, np.zeros(size - lengths.size)])
    per_level = 1 if classes is None else classes.n_classes
    start, start_levels = _start(pol, lam, ratio, system, classes, r), system.levels
    while True:
        with host_float64():
            law = None if classes is None else phases.law_arrays(classes)
            # the start on grown bounds: the mean load's fixed point, empty past its bound
            at = start_levels * per_level
            x = np.concatenate(
                [start[:at], np.zeros((system.levels - start_levels) * per_level), start[at:]]
            )
            x = jnp.asarray(x, jnp.float64)
            top = np.asarray(
                _flow_largest(
                    x,
                    jnp.asarray(step_loads),
                    jnp.asarray(lengths),
                    jnp.float64(r),
                    law,
                    pol,
                    system,
                )
            )
        tail = np.concatenate([[1.0], top])
        L = system.levels
        if tail[L] <= REMAINDER:
            return tail
        decay = tail[L] / tail[L - 1] if tail[L - 1] > 0 else math.nan
        grown = min(_grown(L, tail[L], decay), cap)
        if grown == L:
            raise RuntimeError(
                f"under {pol.label()!r} the load path builds queues past {L} levels "
                f"(s_{L} = {tail[L]:.3g}): too long to represent"
            )
        _, system = meanfield._policy_and_system(
            pol, ratio, None, None, grown, system.iqueue_levels or None
        )


@functools.partial(jax.jit, static_argnames=("policy", "system"))
def _flow_largest(x, loads, lengths, ratio, law, policy, system):
    """The largest ``s_1..s_L`` over the schedule's steps (:func:`largest_tail`)."""
    L = system.levels

    def tails(y):
        if law is None:
            return y[:L]
        per_level = jnp.sum(y[: L * law.alpha.shape[0]].reshape(L, -1), axis=1)
        return jnp.cumsum(per_level[::-1])[::-1]

    def body(carry, step):
        y, top = carry
        new, _, _ = _rk4_step(y, step[0], step[1], ratio, law, policy, system, False)
        return (new, jnp.maximum(top, tails(new))), None

    (_, top), _ = jax.lax.scan(body, (x, tails(x)), jnp.stack([loads, lengths], axis=1))
    return top


def _first_bounds(policy, load, service, pools, ratio, d, buffer, levels) -> tuple:
    """``(classes, lam, cap, levels)``: the server classes (None for identical
    exponential servers), the checked load, the largest level bound allowed, and
    the first level bound (by class with infinite buffers: the fixed point's
    first; else ``levels`` as given)."""
    if not _by_class(service, pools):
        return None, check_load(load, buffer), MAX_AUTO_LEVELS, levels
    classes, pol, lam = phases._check(policy, load, service, ratio, d, buffer, levels, pools)
    cap = max(1, phases.MAX_STATE // classes.n_classes)
    if levels is None and buffer is None:
        levels = min(phases._initial_levels(pol, lam, classes, phases.LEVEL_TOL), cap)
    return classes, lam, cap, levels


def _by_class(service, pools) -> bool:
    """Whether the state is by class: pools, or a service law other than exp(1)."""
    if pools is not None:
        return True
    law = as_law(service)
    return law is not None and not law.is_unit_exponential


def refusal(
    policy,
    load: float,
    arrivals,
    ratio: float | None = None,
    *,
    d: int | None = None,
    buffer: int | None = None,
    service=None,
    pools=None,
) -> str | None:
    """Why :func:`periodic_orbit` does not cover a setting it would be given, or
    None where it does: a policy without the generic mean field, or one that
    routes by the pools' speeds (``jsew``) with pools of different mean
    service times. It does not check the other arguments
    (:func:`periodic_orbit` does). For callers that run many settings and
    give theory where there is one, such as grids."""
    _as_profile(arrivals)
    pol = make(policy, d=d)
    if pol.mean_field_kind() not in ("generic", "closed-form"):
        return pol.no_mean_field or f"its mean field is {pol.mean_field_kind()!r}"
    if pools is None:
        return None
    classes = phases.server_classes(service, pools)
    if pol.routes_by_speed and len({lw.mean for lw in classes.laws}) > 1:
        return f"{pol.name!r} routes by expected wait, which the mean field does not cover"
    return None


def _grown(bound: int, mass: float, decay: float) -> int:
    """A larger automatic bound: where the tail, falling by ``decay`` a level from
    ``mass`` at ``bound`` (as it does there when that mass peaks), is below
    ``REMAINDER / 10``, with half as many levels again to spare; at least 8
    levels more, at most twice ``bound``, a multiple of 8, and at most
    :data:`MAX_AUTO_LEVELS`. (The solve that follows checks the mass again:
    a tail that falls more slowly further out grows the bound once more.)"""
    rho = min(max(decay, 1e-3), 0.95) if math.isfinite(decay) else 0.95
    more = math.ceil(1.5 * math.log(REMAINDER / 10.0 / mass) / math.log(rho))
    grown = min(2 * bound, max(bound + 8, -(-(bound + more) // 8) * 8))
    return max(bound, min(grown, MAX_AUTO_LEVELS))


def _newton_phase(x, loads, lengths, rj, law, pol, system, tol, max_newton):
    """Damped Newton on ``Phi(x) - x`` from ``x``: ``(x, converged, residual, steps)``."""
    residual, it = math.inf, 0
    for it in range(1, max_newton + 1):
        gap, dx = (np.asarray(v) for v in _newton(x, loads, lengths, rj, law, pol, system))
        residual = float(np.max(np.abs(gap)))
        if residual < tol:
            return x, True, residual, it
        if not np.all(np.isfinite(dx)):
            break
        # the longest of 1, 1/2, .., 1/16 of the step that shrinks the gap
        for step in 0.5 ** np.arange(5):
            trial = jnp.asarray(np.clip(np.asarray(x) + step * dx, 0.0, 1.0))
            moved = _flow(trial, loads, lengths, rj, law, pol, system)
            if float(jnp.max(jnp.abs(moved - trial))) < (1.0 - step / 4.0) * residual:
                x = trial
                break
        else:
            break  # Newton stalls (the clipped flow has kinks where a peak saturates the servers)
    return x, False, residual, it


def _find(x, loads, lengths, rj, law, pol, system, tol, max_newton):
    """The orbit's start by iterating the period map, and by Newton where the map
    contracts slowly (more than :data:`_SLOW` periods left at the observed rate)
    and the state is small enough for a Jacobian (:data:`_NEWTON_DIM`).

    Returns ``(x, status, residual, newton_steps, periods)``.
    """
    newton_allowed = max_newton > 0 and x.size <= _NEWTON_DIM
    previous, it = None, 0
    for periods in range(1, _MAX_PERIODS + 1):
        nxt = _flow(x, loads, lengths, rj, law, pol, system)
        residual = float(jnp.max(jnp.abs(nxt - x)))
        x = nxt
        if residual < tol:
            return x, Status.CONVERGED, residual, it, periods
        if newton_allowed and previous is not None and periods >= _WARM_PERIODS:
            rate = residual / previous
            left = math.log(tol / residual) / math.log(rate) if 0.0 < rate < 1.0 else math.inf
            if left > _SLOW:
                newton_allowed = False  # one try
                x, done, res, it = _newton_phase(
                    x, loads, lengths, rj, law, pol, system, tol, max_newton
                )
                if done:
                    return x, Status.CONVERGED, res, it, periods
        previous = residual
    return x, Status.MAX_ITERATIONS, residual, it, _MAX_PERIODS


def _start(pol, lam, ratio, system, classes, r) -> np.ndarray:
    """The fixed point at the mean load on ``system``'s bounds (the empty
    system where Newton cannot reach it)."""
    J = system.iqueue_levels
    if classes is None:
        fp = meanfield.fixed_point(
            pol,
            lam,
            ratio if J else None,
            buffer=system.buffer,
            levels=system.levels,
            iqueue_levels=J or None,
        )
        if fp.status == Status.CONVERGED:
            return np.concatenate([fp.tail[1:], fp.iq_tail[1:]])
        return meanfield._empty_start(system, r)
    fp = phases._fixed_point_of(classes, pol, lam, ratio if J else None, system)
    if fp.status == Status.CONVERGED:
        return np.concatenate(
            [fp.phase_counts[1:].reshape(-1), fp.iq_tail[1:] if J else np.zeros(0)]
        )
    return phases._empty_start(system.levels, classes.n_classes, system, r)


def _solve(pol, lam, ratio, system, profile, dt, tol, max_newton, window, classes=None) -> tuple:
    """The orbit on ``system``'s bounds, and the tails' decay at them (:func:`_decay`).

    It starts from the fixed point at the mean load on the same bounds (not
    from an orbit on smaller ones: the levels past those would start empty
    and fill over many periods, a slow mode the residual test can stop in).
    """
    r = float(ratio) if system.iqueue_levels else 1.0
    period = profile.period
    if classes is not None:  # RK4 stable at the peak (phases._dt)
        dt = min(dt, phases._dt(classes, lam * profile.peak, pol, system, r))
    with host_float64():
        rj = jnp.float64(r)
        law = None if classes is None else phases.law_arrays(classes)
        loads, lengths, n = _schedule(profile, lam, 0.0, period, dt)
        loads, lengths = jnp.asarray(loads), jnp.asarray(lengths)
        x = jnp.asarray(_start(pol, lam, ratio, system, classes, r), jnp.float64)
        x, status, residual, it, periods = _find(
            x, loads, lengths, rj, law, pol, system, tol, max_newton
        )
        start = np.asarray(x)
        # the averages over the window, and the orbit over one period from phase 0
        _, total_p, seen = _flow_integrals(x, loads, lengths, rj, law, pol, system)
        total_p, seen = np.asarray(total_p), np.asarray(seen)
        w0, length = window
        whole, rest = divmod(length, period)
        phase = math.fmod(w0, period)
        total = whole * total_p
        if rest > 0:
            y = x
            if phase > 0:
                a, b, _ = _schedule(profile, lam, 0.0, phase, dt)
                y = _flow(x, jnp.asarray(a), jnp.asarray(b), rj, law, pol, system)
            end = min(period, phase + rest)
            a, b, _ = _schedule(profile, lam, phase, end, dt)
            y, part, _ = _flow_integrals(y, jnp.asarray(a), jnp.asarray(b), rj, law, pol, system)
            total = total + np.asarray(part)
            if phase + rest > period:  # the window wraps into the next period
                a, b, _ = _schedule(profile, lam, 0.0, phase + rest - period, dt)
                _, part, _ = _flow_integrals(
                    y, jnp.asarray(a), jnp.asarray(b), rj, law, pol, system
                )
                total = total + np.asarray(part)
    seen = seen[:n]
    times = np.concatenate([[0.0], np.cumsum(np.asarray(lengths)[: n - 1])])
    args = (
        pol,
        system,
        lam,
        start,
        total / length,
        seen,
        times,
        np.asarray(loads)[:n],
        status,
        residual,
        it,
        periods,
        window,
    )
    orbit = _averages(*args) if classes is None else _class_averages(classes, *args)
    return orbit, _decay(seen)


def _decay(seen) -> tuple:
    """``s_L / s_{L-1}`` and ``Q_J / Q_{J-1}`` where the orbit's mass at each
    bound peaks (NaN where that level is empty)."""
    out = []
    for at, below in ((_AT_L, _BELOW_L), (_AT_J, _BELOW_J)):
        i = int(np.argmax(seen[:, at]))
        out.append(float(seen[i, at] / seen[i, below]) if seen[i, below] > 0 else math.nan)
    return tuple(out)


def _averages(
    pol, system, load, start, mean, seen, times, loads, status, residual, it, periods, window
) -> PeriodicOrbit:
    """The window's averages as a FixedPoint whose rates give, through
    :func:`jaxqueue.theory.meanfield.as_result` (which multiplies per-arrival
    rates by ``load``), the window's averages per unit time."""
    L, J = system.levels, system.iqueue_levels
    x_avg, rest = mean[: L + J], mean[L + J :]
    level, (deletes, probes, join_probes, join, p0, lam) = rest[: L + 1], rest[L + 1 :]
    s, q = meanfield._split(np.asarray(x_avg), system)
    rates = Rates(
        level=level / lam,
        iq_remove=np.zeros(J + 1),
        join=np.zeros(J + 1),
        deletes=deletes / load,
        probes=probes / load,
        join_probes=join_probes / join if join > 0 else 0.0,
    )
    truncated = (
        float(seen[:, _AT_L].max()) if system.buffer is None else 0.0,
        float(seen[:, _AT_J].max()) if J else 0.0,
    )
    averages = FixedPoint(s, q, rates, residual, status, it, truncated)
    curve = {
        "time": times,
        "load": loads,
        "mean_queue_length": seen[:, 0],
        "waiting_probability": seen[:, 1],
        "mean_response_time": seen[:, 2],
    }
    if pol.uses_iqueues:
        curve["p0"] = seen[:, 3]
    return PeriodicOrbit(
        start=start,
        averages=averages,
        p0=float(p0) if pol.uses_iqueues else None,
        window=window,
        curve=curve,
        status=Status(status),
        residual=float(residual),
        newton_iterations=it,
        periods=periods,
        system=system,
    )


def _class_averages(
    classes,
    pol,
    system,
    load,
    start,
    mean,
    seen,
    times,
    loads,
    status,
    residual,
    it,
    periods,
    window,
) -> PeriodicOrbit:
    """:func:`_averages` by class: the averages as a
    :class:`jaxqueue.theory.phases.FixedPoint` whose ``seen_phase`` and
    ``seen_idle`` hold where the accepted arrivals found their servers
    (weighted by ``lambda(t)``), for :func:`jaxqueue.theory.phases.as_result`."""
    L, J, C = system.levels, system.iqueue_levels, classes.n_classes
    parts = np.split(mean, np.cumsum([L * C, J, L + 1, (L - 1) * C, len(classes.laws)]))
    x_avg, q, level, joint, idle, rest = parts
    deletes, probes, join_probes, join, p0, lam = rest
    level = level / lam  # the law of the level an arrival joins (level[L]: blocked)
    accepted = level[:L].sum()
    rates = Rates(
        level=level,
        iq_remove=np.zeros(J + 1),
        join=np.zeros(J + 1),
        deletes=deletes / load,
        probes=probes / load,
        join_probes=join_probes / join if join > 0 else 0.0,
    )
    X = x_avg.reshape(L, C)
    tail = phases.tail_of(X)
    fp = phases._summarize(
        pol, load, classes, system, X, tail, q, rates, system.buffer, status, residual, it
    )
    truncated = (
        float(seen[:, _AT_L].max()) if system.buffer is None else 0.0,
        float(seen[:, _AT_J].max()) if J else 0.0,
    )
    fp = fp._replace(
        p0=float(p0) if pol.uses_iqueues else None,
        truncated=truncated,
        seen_phase=joint.reshape(L - 1, C) / lam / accepted,
        seen_idle=idle / lam / accepted,
    )
    curve = {
        "time": times,
        "load": loads,
        "mean_queue_length": seen[:, 0],
        "waiting_probability": seen[:, 1],
        "mean_response_time": seen[:, 2],
    }
    if pol.uses_iqueues:
        curve["p0"] = seen[:, 3]
    if classes.given:
        curve["pool_utilization"] = seen[:, 8:]
    return PeriodicOrbit(
        start=start,
        averages=fp,
        p0=fp.p0,
        window=window,
        curve=curve,
        status=Status(status),
        residual=float(residual),
        newton_iterations=it,
        periods=periods,
        system=system,
    )


def as_result(
    orbit: PeriodicOrbit,
    policy,
    load: float,
    ratio: float | None,
    arrivals,
    *,
    buffer: int | None = None,
    with_quantiles: bool = True,
):
    """A :class:`~jaxqueue.theory.result.MeanFieldResult` of the orbit's averages.

    ``settings["arrivals"]`` records the profile and ``settings["window"]``
    the averaging window; ``diagnostics["orbit"]`` holds
    :attr:`PeriodicOrbit.curve`, with the solver's ``residual``, ``periods``
    and ``newton_iterations``. By class (a service law or pools) the result
    is :func:`jaxqueue.theory.phases.as_result`'s, with its quantiles and
    pool metrics.
    """
    if isinstance(orbit.averages, phases.FixedPoint):
        res = phases.as_result(orbit.averages, policy, load, ratio, buffer=buffer)
    else:
        res = meanfield.as_result(
            orbit.averages, policy, load, ratio, buffer=buffer, with_quantiles=with_quantiles
        )
    settings = dict(
        res.settings, arrivals=_as_profile(arrivals).to_dict(), window=list(orbit.window)
    )
    diagnostics = dict(
        res.diagnostics,
        orbit=orbit.curve,
        residual=orbit.residual,
        periods=orbit.periods,
        newton_iterations=orbit.newton_iterations,
    )
    return dataclasses.replace(res, p0=orbit.p0, settings=settings, diagnostics=diagnostics)
