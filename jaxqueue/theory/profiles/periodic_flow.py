"""The periodic regime's compiled passes: RK4 over a schedule of steps, with integrals.

One pass over a schedule of RK4 steps (each of its own load and length) maps
a state over a period (:func:`flow`), integrates what the averages need on
the way (:func:`flow_integrals`), or gives Newton's step on the period map
(:func:`period_newton`), for either model of :mod:`jaxqueue.theory.generic.models`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.arrivals import Profile
from jaxqueue.theory.generic.exponential import Rates
from jaxqueue.theory.generic.models import Exponential, rk4_step

__all__ = [
    "MIN_STEPS",
    "AT_L",
    "AT_J",
    "BELOW_L",
    "BELOW_J",
    "schedule",
    "flow",
    "flow_integrals",
    "flow_largest",
    "period_newton",
    "conserve",
]

MIN_STEPS = 64  # compiled step counts are powers of two from here (padded with empty steps)


def schedule(profile: Profile, load: float, t0: float, t1: float, dt: float):
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
    size = max(MIN_STEPS, 1 << max(0, int(loads.size) - 1).bit_length())
    pad = size - loads.size
    return (
        np.concatenate([loads, np.zeros(pad)]),
        np.concatenate([lengths, np.zeros(pad)]),
        int(loads.size),
    )


def _integrand(model: Exponential, x, lam, rt: Rates, p0, joined):
    """What the averages integrate: the state, ``lambda * level law``, by class
    where the arrivals go (``lambda * level[k] * share[k, c]`` for ``k = 1..L-1``
    and ``lambda * level[0] * pick[i]``; ``joined = (share, pick)`` from
    ``model.stage``) and, per unit time, deletes, probes, join probes, joins,
    ``p0`` and arrivals."""
    L, law = model.system.levels, model.law
    if law is None:
        s, _ = model.tails(x)
        join = s[1] - s[2] if L >= 2 else s[1]  # servers becoming idle (rate-1 service)
        where = []
    else:
        X, _ = model.split(x)
        share, pick = joined
        join = X[0] @ -jnp.sum(law.generator, axis=1)  # completions at level 1
        where = [(lam * rt.level[1:L, None] * share[: L - 1]).reshape(-1), lam * rt.level[0] * pick]
    join = join if model.policy.uses_iqueues else jnp.zeros((), x.dtype)
    rest = jnp.stack([lam * rt.deletes, lam * rt.probes, join * rt.join_probes, join, p0, lam])
    return jnp.concatenate([x, lam * rt.level, *where, rest])


def _integrand_size(model: Exponential) -> int:
    L, J, law = model.system.levels, model.system.iqueue_levels, model.law
    if law is None:
        return L + J + (L + 1) + 6
    C, pools = law.alpha.shape[0], law.starts.shape[0]
    return L * C + J + (L + 1) + (L - 1) * C + pools + 6


#: Columns of :func:`_observe` read by name: the mass at each bound and one level below.
AT_L, AT_J, BELOW_L, BELOW_J = 4, 5, 6, 7


def _class_means(law):
    """``(r, m)``: the mean rest of a service from each class, ``r_c = ((-S)^-1
    1)_c``, and each pool's mean service time ``m_i`` (None without classes)."""
    if law is None:
        return None
    rest = jnp.linalg.solve(-law.generator, jnp.ones(law.alpha.shape[0], law.generator.dtype))
    return rest, law.starts @ rest


def _observe(model: Exponential, x, rt: Rates, p0, joined, means=None):
    """The orbit's instantaneous values at ``x``: mean queue length, P(wait),
    mean response time of an accepted arrival, ``p0``, the mass at the bounds
    (``s_L``, ``Q_J``) and one level below them (``s_{L-1}``, ``Q_{J-1}``);
    by class, then each pool's busy fraction.

    By class, an arrival that joins a server with ``k >= 1`` tasks whose task
    in service is of class ``c`` stays the rest of that service (mean
    ``r_c = ((-S)^-1 1)_c``) and ``k`` services of that server's pool; one that
    joins an idle server of pool ``i``, one service of pool ``i``."""
    L, law = model.system.levels, model.law
    accepted = rt.level[:L]
    seen = accepted / jnp.maximum(jnp.sum(accepted), 1e-300)
    k = jnp.arange(L, dtype=x.dtype)
    s, q = model.tails(x)
    if law is None:
        response = jnp.sum(seen * (k + 1.0))
    else:
        share, pick = joined
        rest, pool_mean = means  # (classes,), (pools,): _class_means
        per_class = rest[None, :] + k[1:, None] * (law.member @ pool_mean)[None, :]
        response = seen[0] * (pick @ pool_mean) + jnp.sum(
            seen[1:, None] * share[: L - 1] * per_class
        )
    zero = jnp.zeros((), x.dtype)
    J = model.system.iqueue_levels
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
    X, _ = model.split(x)
    return jnp.concatenate([out, jnp.sum(X, axis=0) @ law.member / law.fractions])


def _step(model: Exponential, x, lam, h, ratio, integrate: bool):
    """One RK4 step of the model's ODE (:func:`jaxqueue.theory.generic.models.rk4_step`),
    with the averages' integrand alongside where ``integrate``."""

    def integrand(y, rt, p0, joined):
        return _integrand(model, y, lam, rt, p0, joined)

    new, area, obs, _ = rk4_step(model, x, lam, h, ratio, integrand if integrate else None)
    return new, area, obs


@jax.jit
def flow(x, loads, lengths, ratio, model: Exponential):
    """The state after the schedule's steps, put back on the JIQ family's
    conservation law (:func:`conserve`); ``model``: either state
    (:func:`jaxqueue.theory.generic.models.model_of`)."""

    def body(x, step):
        new, _, _ = _step(model, x, step[0], step[1], ratio, False)
        return new, None

    return conserve(model, jax.lax.scan(body, x, jnp.stack([loads, lengths], axis=1))[0], ratio)


def conserve(model: Exponential, x, ratio):
    """``x`` with ``Q_1`` set so that ``sum_j Q_j / r = 1 - s_1`` (I-queues list
    exactly the idle servers: ``model.iqueue_gap`` zero).

    The ODE keeps this sum, so the period map has an eigenvalue 1 along it:
    what the integration leaks there (mass joining I-queues past the bound,
    the clip at 0) is never contracted away but adds up period after period
    (about 5e-10 a period for JIQ at r = 10 on a 48-unit day), and iterating
    the map would stall above a tight ``tol``. Without I-queues ``x`` as is.
    """
    if not model.system.iqueue_levels:
        return x
    at, busy = model.busy_index, model.busy(x)
    return x.at[at].set(jnp.clip(ratio * (1.0 - busy) - jnp.sum(x[at + 1 :]), 0.0, 1.0))


@jax.jit
def flow_integrals(x, loads, lengths, ratio, model: Exponential):
    """The state after the schedule, the integrals of :func:`_integrand` over
    it, and :func:`_observe` at the start of each step."""

    def body(carry, step):
        x, total = carry
        new, area, (rt, p0, joined) = _step(model, x, step[0], step[1], ratio, True)
        return (new, total + area), _observe(model, x, rt, p0, joined, means)

    means = _class_means(model.law)

    zero = jnp.zeros(_integrand_size(model), x.dtype)
    (x, total), seen = jax.lax.scan(body, (x, zero), jnp.stack([loads, lengths], axis=1))
    return x, total, seen


@jax.jit
def period_newton(x, loads, lengths, ratio, model: Exponential):
    """``(Phi(x) - x``, the Newton step) with the conservation law in the row of
    ``Q_1``; one pass through the period gives the gap and the Jacobian together."""

    def residual(y):
        gap = flow(y, loads, lengths, ratio, model) - y
        f = gap
        if model.system.iqueue_levels:
            f = f.at[model.busy_index].set(model.iqueue_gap(y, ratio))
        return f, (f, gap)

    jac, (f, gap) = jax.jacfwd(residual, has_aux=True)(x)
    return gap, jnp.linalg.solve(jac, -f)


@jax.jit
def flow_largest(x, loads, lengths, ratio, model: Exponential):
    """The largest ``s_1..s_L`` over the schedule's steps (:func:`largest_tail`)."""
    L, law = model.system.levels, model.law

    def tails(y):
        if law is None:
            return y[:L]
        per_level = jnp.sum(y[: L * law.alpha.shape[0]].reshape(L, -1), axis=1)
        return jnp.cumsum(per_level[::-1])[::-1]

    def body(carry, step):
        y, top = carry
        new, _, _ = _step(model, y, step[0], step[1], ratio, False)
        return (new, jnp.maximum(top, tails(new))), None

    (_, top), _ = jax.lax.scan(body, (x, tails(x)), jnp.stack([loads, lengths], axis=1))
    return top
