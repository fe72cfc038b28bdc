"""Server classes of the mean field by class: pools and phases, their arrays and checks.

A class is a pool and the phase of the task in service (one pool without
pools). :class:`ServerClasses` holds them on the host, :class:`ClassLaw` as
arrays for the drift; :func:`check_inputs` validates a setting.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.service import PhaseType, as_law, exponential, pool_shares
from jaxqueue.core.system import System, check_int, is_real
from jaxqueue.policies import Policy, available, policy_class
from jaxqueue.theory.baselines.mph1 import mph1_tail_decay
from jaxqueue.theory.generic.limit import Limit
from jaxqueue.theory.generic.solvers import (
    DEFAULT_LEVELS,
    MAX_DENSE_LEVELS,
    round8,
)

__all__ = [
    "MAX_STATE",
    "ServerClasses",
    "ClassLaw",
    "server_classes",
    "law_arrays",
    "service_law",
    "random_only",
    "check_inputs",
    "step_size",
    "mph1_tail_decay",
    "initial_levels",
    "empty_start",
]

#: Most state coordinates ``levels * phases`` the adaptive level count grows to.
MAX_STATE = 2048
_MAX_LEVELS = 10**6


class ServerClasses(NamedTuple):
    """The servers of the limit by pool (host side): one pool unless pools were given.

    Attributes:
        laws: each pool's service law at its speed (a server of speed ``v``
            completes a task of law ``L`` in ``L / v``).
        fractions: each pool's share of the servers (summing to 1).
        speeds: each pool's speed.
        base: each pool's first class: pool ``i`` owns the classes ``base[i]
            .. base[i] + laws[i].n_phases - 1``, one per phase (as the
            simulator's :func:`jaxqueue.sim.classes.class_table`).
        given: whether pools were given (their record goes into the settings).
    """

    laws: tuple
    fractions: tuple
    speeds: tuple
    base: tuple
    given: bool

    @property
    def n_classes(self) -> int:
        return sum(law.n_phases for law in self.laws)

    @property
    def capacity(self) -> float:
        """Tasks per server per unit time when every server is busy: ``sum_i f_i / mean_i``."""
        return sum(f / law.mean for f, law in zip(self.fractions, self.laws))


def server_classes(service=None, pools=None) -> ServerClasses:
    """The :class:`ServerClasses` of a service law and pools of the limit.

    Args:
        service: the servers' law (a :class:`~jaxqueue.core.service.PhaseType`
            or its command-line form; ``None``: exponential), the law of a pool
            that gives none of its own.
        pools: ``None`` (identical servers), ``"F1:S1,F2:S2"``, ``(fraction,
            speed)`` pairs, or :class:`~jaxqueue.core.service.Pool` objects
            (their shares of the servers are ``count / sum of counts``).
    """
    law = as_law(service) or exponential()
    shares = pool_shares(pools)
    if shares is None:
        return ServerClasses((law,), (1.0,), (1.0,), (0,), False)
    fracs = [f for f, _, _ in shares]
    speeds = [v for _, v, _ in shares]
    laws = [own or law for _, _, own in shares]
    laws = tuple(lw.scaled(lw.mean / v) for lw, v in zip(laws, speeds))
    base = tuple(int(b) for b in np.cumsum([0] + [lw.n_phases for lw in laws[:-1]]))
    return ServerClasses(laws, tuple(fracs), tuple(speeds), base, True)


class ClassLaw(NamedTuple):
    """The server classes as arrays (traced: settings with as many classes share compilations).

    A class is a pool and a phase (one pool without pools: the phases of the law).
    """

    alpha: jax.Array  # (C,) the phase a task starts in, every pool in its share
    generator: jax.Array  # (C, C) sub-generator S, block-diagonal by pool, at the pools' speeds
    mix: jax.Array  # (C,) class of a level whose servers have vanished (in-service mix)
    starts: jax.Array  # (I, C) row i: pool i's alpha, on its classes
    member: jax.Array  # (C, I) one-hot: the pool of each class
    fractions: jax.Array  # (I,) each pool's share of the servers


def law_arrays(law) -> ClassLaw:
    """The arrays :func:`drift` takes for a law (a :class:`~jaxqueue.core.service.PhaseType`)
    or for :class:`ServerClasses` (call with x64 on: ``with host_float64()``)."""
    classes = law if isinstance(law, ServerClasses) else server_classes(law)
    C, n_pools = classes.n_classes, len(classes.laws)
    starts = np.zeros((n_pools, C))
    member = np.zeros((C, n_pools))
    gen = np.zeros((C, C))
    mix = np.zeros(C)
    for i, (lw, b, f) in enumerate(zip(classes.laws, classes.base, classes.fractions)):
        P = lw.n_phases
        starts[i, b : b + P] = lw.alpha
        member[b : b + P, i] = 1.0
        gen[b : b + P, b : b + P] = lw.matrix
        mix[b : b + P] = f * lw.in_service_mix()
    f = np.asarray(classes.fractions)
    return ClassLaw(
        *(
            jnp.asarray(v, jnp.float64)
            for v in (f @ starts, gen, mix / mix.sum(), starts, member, f)
        )
    )


def service_law(service) -> PhaseType:
    law = as_law(service)
    if law is None:
        raise TypeError("service must be a PhaseType or a string such as 'erlang:3', got None")
    return law


def random_only(pol: Policy) -> bool:
    """Routing that ignores queue lengths: every server is its own M/PH/1 queue."""
    return pol.tail_bound() == (1, False) and not pol.uses_iqueues


def check_inputs(limit: Limit, load, levels=None):
    """Validated ``(classes, policy, load)`` of ``limit`` at ``load``; errors name the
    parameter. A service law of ``None`` is exp(1) (at the pools' speeds with pools)."""
    service, pools, buffer, ratio = limit.service, limit.pools, limit.buffer, limit.ratio
    law = service_law("exp" if service is None else service) if pools is None else service
    classes = server_classes(law, pools)
    pol = limit.built()
    if pol.per_server:
        exchangeable = [n for n in available() if policy_class(n).engine != "per-server"]
        what = "server pools" if pools is not None else "phase-type service"
        raise ValueError(
            f"policy {pol.name!r} is a per-server policy (its I-queues may list busy servers, so "
            f"its state is not exchangeable): {what} covers the exchangeable policies "
            f"({', '.join(exchangeable)})"
        )
    if pools is not None and pol.routes_by_speed and len({lw.mean for lw in classes.laws}) > 1:
        raise NotImplementedError(
            f"no mean field for {pol.name!r} with pools of different mean service times: it "
            "routes by expected wait, which the mean field of queue lengths does not cover"
        )
    if not is_real(load):
        raise TypeError(f"load must be a real number, got {load!r}")
    lam = float(load)
    if not (math.isfinite(lam) and 0.0 < lam <= 1e6):
        raise ValueError(f"load={load!r} is out of range: need 0 < load <= 1e6")
    if buffer is not None:
        check_int("buffer", buffer, 1, _MAX_LEVELS)
        if buffer * classes.n_classes > MAX_DENSE_LEVELS:
            raise ValueError(
                f"buffer={buffer} is out of range for the mean field by class: its state has "
                f"buffer x classes = {buffer * classes.n_classes} coordinates, solved densely "
                f"up to {MAX_DENSE_LEVELS}; need buffer <= {MAX_DENSE_LEVELS // classes.n_classes}"
                " (or simulate from init='empty')"
            )
    if levels is not None:
        check_int("levels", levels, 1, _MAX_LEVELS)
    if (
        buffer is None and lam >= classes.capacity
    ):  # capacity sum_i f_i / mean_i (one law: 1 / mean)
        need = (
            f"the load per server load * service mean = {lam * classes.laws[0].mean:.6g} "
            "must be < 1"
            if pools is None
            else "it must be below the pools' capacity "
            f"sum_i fraction_i * speed_i / mean_i = {classes.capacity:.6g}"
        )
        raise ValueError(
            f"load={load} is out of range: with infinite buffers {need} "
            "(give a finite buffer otherwise)"
        )
    worst = max(lam * lw.mean for lw in classes.laws)
    if buffer is None and random_only(pol) and worst >= 1.0:  # (with one pool: caught above)
        raise ValueError(
            f"load={load} is out of range for {pol.name!r} with pools: routing at random "
            f"loads a pool's servers to {worst:.6g} >= 1 (its queues grow without bound; "
            "give a finite buffer otherwise)"
        )
    if ratio is not None:
        try:
            r = float(ratio)
        except (TypeError, ValueError):
            raise TypeError(f"ratio must be a number or None, got {ratio!r}") from None
        if not r > 0:  # also NaN
            raise ValueError(f"ratio={ratio!r} is out of range: need ratio > 0 (or None)")
    return classes, pol, lam


def step_size(classes: ServerClasses, lam: float, pol: Policy, system: System, ratio) -> float:
    """An RK4 step with ``h * (largest total rate out of a coordinate) <= 1.25``.

    The Jacobian's Gershgorin discs are centred at ``-a`` with radius about
    ``a`` (rates out balance rates in), and RK4 is stable on the disc of centre
    ``-c`` and radius ``c`` for ``c <= 1.3``: this covers the defective
    Erlang chains (a Jordan block, whose pseudospectrum fills that disc), which
    a step of ``2.5 / rate`` would not.
    """
    d = int(pol.options().get("d", 1) or 1)
    fastest = max(lw.rate for lw in classes.laws) + lam * (d + 1)
    if system.iqueue_levels:  # I-queue sizes move at about r (lambda + 1) per unit time
        fastest += float(ratio) * (lam + 1.0)
    return min(0.1, 1.25 / fastest)


def initial_levels(pol: Policy, lam: float, classes: ServerClasses, level_tol: float) -> int:
    """The first level count of the adaptive search (infinite buffers)."""
    if random_only(pol):  # Random: M/PH/1 queues (one per pool)
        eta = max(mph1_tail_decay(lam, lw) for lw in classes.laws)
        need = math.log(level_tol) / math.log(eta) + 16 if 0 < eta < 1 else DEFAULT_LEVELS
        return max(DEFAULT_LEVELS, round8(need))
    return DEFAULT_LEVELS


def empty_start(L: int, P: int, system: System, ratio) -> np.ndarray:
    """All servers idle; with many dispatchers, ``r`` idle servers listed per I-queue."""
    J = system.iqueue_levels
    x = np.zeros(L * P + J)
    if J:
        r = float(ratio)
        whole = min(int(r), J)
        x[L * P : L * P + whole] = 1.0
        if whole < J:
            x[L * P + whole] = r - int(r)
    return x
