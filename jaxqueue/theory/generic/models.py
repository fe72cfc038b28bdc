"""The two mean-field models behind one interface, and what is written once against it.

:class:`Exponential` (identical exponential servers, :mod:`jaxqueue.theory.generic.exponential`)
and :class:`ByClass` (servers by pool and phase, :mod:`jaxqueue.theory.generic.byclass`)
differ in their state layout, drift and kink handling only; the integrators
(:func:`rk4_step`, :func:`transient_states`) and the periodic regime
(:mod:`jaxqueue.theory.profiles.periodic_flow`) take either. Both are pytrees: the
policy and System are static, a class law's arrays are traced.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from jaxqueue.core.system import System
from jaxqueue.policies import Policy
from jaxqueue.theory.generic import byclass, exponential
from jaxqueue.theory.generic.classes import ClassLaw
from jaxqueue.theory.generic.solvers import integrate, settle

__all__ = [
    "Exponential",
    "ByClass",
    "model_of",
    "p0_at",
    "rk4_step",
    "rk4_run",
    "rk4_path",
    "drift_norm",
    "settle_flow",
    "transient_states",
    "SETTLE_TIME",
    "SETTLE_RUNS",
]


def p0_at(x, policy: Policy, system: System):
    """``p0`` at the exponential state ``x``: ``1 - Q_1``; with one dispatcher,
    whether no server is idle; 0 without I-queues."""
    s, q = exponential.split_state(x, system)
    if system.iqueue_levels:
        return 1.0 - q[1]
    if policy.uses_iqueues:  # one dispatcher: its I-queue is empty iff no server is idle
        return (s[1] >= 1.0).astype(x.dtype)
    return jnp.zeros((), x.dtype)


@jax.tree_util.register_pytree_node_class
class Exponential:
    """Identical exponential servers: the state ``[s_1..s_L, Q_1..Q_J]``."""

    law = None

    def __init__(self, policy: Policy, system: System):
        self.policy, self.system = policy, system

    def tree_flatten(self):
        return (), (self.policy, self.system)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*aux)

    @property
    def kinked(self) -> bool:
        """Whether the routing jumps where a level fills (JSQ-like)."""
        return exponential.kinked(self.policy, self.system)

    @property
    def busy_index(self) -> int:
        """Where ``Q_1`` sits in the state."""
        return self.system.levels

    def busy(self, x):
        """The busy fraction ``s_1``."""
        return x[0]

    def tails(self, x):
        """The tails ``(s_0..s_L, Q_0..Q_J)``, each with its leading 1."""
        return exponential.split_state(x, self.system)

    def drift(self, x, load, ratio):
        """The right-hand side of the ODE (the sliding drift for JSQ-like routing)."""
        return exponential.ode_drift(x, load, ratio, self.policy, self.system)

    def stage(self, y, load, ratio):
        """``(dx/dt, Rates, p0, joined)`` at ``y`` (``joined`` None: no classes)."""
        pol, system = self.policy, self.system
        if self.kinked:
            sl = exponential.sliding(y, load, ratio, pol, system)
            p0 = sl.inside * p0_at(sl.below, pol, system) + (1.0 - sl.inside) * p0_at(
                sl.state, pol, system
            )
            return sl.drift, sl.rates, p0, None
        rt = exponential.rates(y, pol, system)
        f = exponential.drift_from_rates(y, load, ratio, rt, system)
        return f, rt, p0_at(y, pol, system), None

    def cut(self, step, x, h, new, extra, slope, fill_error: bool = False):
        """A step cut where it fills a level (:func:`exponential.split_at_filling`)."""
        return exponential.split_at_filling(step, x, h, new, extra, slope, self.system, fill_error)

    def finish(self, x):
        """The state a step ends in: clipped to [0, 1]."""
        return jnp.clip(x, 0.0, 1.0)

    def iqueue_gap(self, x, ratio):
        """``sum_j Q_j / r - (1 - s_1)``."""
        return exponential.iqueue_gap(x, ratio, self.system)


@jax.tree_util.register_pytree_node_class
class ByClass(Exponential):
    """Servers by class (pool and phase): the state ``[x[1..L, :].ravel(), Q_1..Q_J]``."""

    def __init__(self, policy: Policy, system: System, law: ClassLaw):
        super().__init__(policy, system)
        self.law = law

    def tree_flatten(self):
        return (self.law,), (self.policy, self.system)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*aux, *children)

    @property
    def classes(self) -> int:
        return self.law.alpha.shape[0]

    @property
    def busy_index(self) -> int:
        return self.system.levels * self.classes

    def busy(self, x):
        return jnp.sum(x[: self.busy_index])

    def split(self, x):
        """``x[1..L, :]`` as an ``(L, C)`` array, and ``Q_1..Q_J``."""
        return byclass.split_classes(x, self.system.levels, self.classes)

    def tails(self, x):
        X, q = self.split(x)
        one = jnp.ones(1, x.dtype)
        return jnp.concatenate([one, byclass.class_tails(X)]), jnp.concatenate([one, q])

    def drift(self, x, load, ratio):
        return byclass.ode_drift(x, load, ratio, self.law, self.policy, self.system)

    def stage(self, y, load, ratio):
        """``(dx/dt, Rates, p0, joined)``; ``joined = (share, pick)``: where the
        server an arrival joins is (:func:`byclass.joined`, or on a full level
        :func:`byclass.sliding`'s)."""
        pol, system, law = self.policy, self.system, self.law
        if self.kinked:
            sl = byclass.sliding(y, load, ratio, law, pol, system)
            p0 = sl.inside * p0_at(sl.below, pol, system) + (1.0 - sl.inside) * p0_at(
                sl.state, pol, system
            )
            return sl.drift, sl.rates, p0, (sl.share, sl.pick)
        X, q = self.split(y)
        joined = byclass.joined(X, law)
        flat = byclass.flat_state(X, q)
        rt = exponential.rates(flat, pol, system)
        f = byclass.class_drift(X, q, load, ratio, law, rt, *joined)
        return f, rt, p0_at(flat, pol, system), joined

    def cut(self, step, x, h, new, extra, slope, fill_error: bool = False):
        L, C = self.system.levels, self.classes
        return byclass.split_at_filling(step, x, h, new, extra, slope, self.law, L, C, fill_error)

    def finish(self, x):
        x = jnp.clip(x, 0.0, 1.0)
        if self.kinked:
            return byclass.onto_full(x, self.law, self.system.levels, self.classes)
        return x

    def iqueue_gap(self, x, ratio):
        return byclass.iqueue_gap(x, ratio, self.system.levels, self.classes)


def model_of(policy: Policy, system: System, law: ClassLaw | None = None) -> Exponential:
    """The model of a setting: :class:`ByClass` with a class law, else :class:`Exponential`."""
    return Exponential(policy, system) if law is None else ByClass(policy, system, law)


#: RK4's stages 2-4: (the step's fraction at which the drift is read, the weight of that drift).
_LATER_STAGES = ((0.5, 1.0 / 3.0), (0.5, 1.0 / 3.0), (1.0, 1.0 / 6.0))


def rk4_step(model: Exponential, x, load, h, ratio, integrand=None):
    """One RK4 step of ``model``'s ODE, cut where it fills a level for JSQ-like
    routing, ended by ``model.finish``: ``(x', area, (rates, p0, joined), slope)``.

    ``integrand(y, rates, p0, joined)``: what to integrate alongside by the same
    stages (``area``, its integral over the step; None: nothing). Stages 2-4 are
    a loop, so the drift is compiled twice, not four times.
    """
    integrate_too = integrand is not None

    def stage(y):
        f, rt, p0, joined = model.stage(y, load, ratio)
        area = integrand(y, rt, p0, joined) if integrate_too else None
        return f, area, (rt, p0, joined)

    def step(y, h):
        k1, g1, obs = stage(y)

        def later(carry, coef):
            slope, k, g = carry
            f, area, _ = stage(y + coef[0] * h * slope)
            return (f, k + coef[1] * f, g + coef[1] * area if integrate_too else None), None

        coefs = jnp.asarray(_LATER_STAGES, y.dtype)
        init = (k1, k1 / 6.0, g1 / 6.0 if integrate_too else None)
        (_, k, g), _ = jax.lax.scan(later, init, coefs)
        return y + h * k, h * g if integrate_too else None, (obs, k1)

    new, area, (obs, slope) = step(x, h)
    if model.kinked:
        new, area = model.cut(lambda y, h: step(y, h)[:2], x, h, new, area, slope)
    return model.finish(new), area, obs, slope


@functools.partial(jax.jit, static_argnames=("max_steps",))
def transient_states(model: Exponential, x, times, load, ratio, tol, h0, max_steps=100_000):
    """``model``'s ODE from ``x`` at ``times`` by Dormand-Prince 5(4) with error
    control (:func:`jaxqueue.theory.generic.solvers.integrate`; tolerance ``tol``,
    relative and absolute, first step ``h0``), cut where a level fills for
    JSQ-like routing (what filling it moves counts as error), each step ended
    by ``model.finish``: ``(states, steps, rejected, failed)``."""

    def cut(step, y, h, new, err, slope):
        return model.cut(step, y, h, new, err, slope, fill_error=True)

    return integrate(
        lambda y: model.drift(y, load, ratio),
        x,
        times,
        rtol=tol,
        atol=tol,
        h0=h0,
        cut=cut if model.kinked else None,
        finish=model.finish,
        max_steps=max_steps,
    )


@jax.jit
def rk4_run(model: Exponential, x, load, ratio, h, steps):
    """The state after ``steps`` RK4 steps of ``h`` (:func:`rk4_step`; both traced:
    every run length shares one compiled program per model)."""
    return jax.lax.fori_loop(0, steps, lambda _, y: rk4_step(model, y, load, h, ratio)[0], x)


@functools.partial(jax.jit, static_argnames=("steps",))
def rk4_path(model: Exponential, x, load, ratio, h, steps: int):
    """The state after each of ``steps`` RK4 steps of ``h``: ``(steps, n)``."""

    def body(y, _):
        y = rk4_step(model, y, load, h, ratio)[0]
        return y, y

    return jax.lax.scan(body, x, None, length=steps)[1]


@jax.jit
def drift_norm(model: Exponential, x, load, ratio):
    """The max-norm of the ODE's right-hand side at ``x`` (the sliding drift for
    JSQ-like routing): how far the flow is from settling."""
    return jnp.max(jnp.abs(model.drift(x, load, ratio)))


#: Time units per ODE run of :func:`settle_flow`, and the most runs.
SETTLE_TIME, SETTLE_RUNS = 100.0, 20


def settle_flow(model: Exponential, x, load, ratio, dt: float, tol: float):
    """Run the ODE (RK4 steps of at most ``dt``) until its drift is below ``tol``
    (:func:`jaxqueue.theory.generic.solvers.settle`): the fixed point of JSQ-like routing
    on a full level, where the drift jumps and Newton has no zero."""
    steps = int(math.ceil(SETTLE_TIME / dt))
    h = jnp.float64(SETTLE_TIME / steps)
    return settle(
        lambda y: rk4_run(model, y, load, ratio, h, steps),
        lambda y: (drift_norm(model, y, load, ratio), None),
        jnp.asarray(x, jnp.float64),
        tol=tol,
        runs=SETTLE_RUNS,
    )
