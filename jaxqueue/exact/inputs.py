"""The inputs of :func:`~jaxqueue.exact.solve_exact`, each checked, in order,
before any work: the policy and its exact rule, the sizes, the load against
the capacity, the service law and the pools.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

from jaxqueue.core.config import Model
from jaxqueue.core.service import as_law, capacity, exponential, make_pools
from jaxqueue.core.system import System, check_load
from jaxqueue.exact.chain import exact_rules
from jaxqueue.policies.base import Policy
from jaxqueue.policies.registry import available, make

__all__ = ["Inputs", "as_count", "at_least", "resolve", "pools_label"]


class Inputs(NamedTuple):
    """The checked inputs of one solve.

    Attributes:
        policy: the :class:`~jaxqueue.policies.base.Policy`.
        rule, options: its ``exact_rule()``.
        load, n, m, buffer, queue_bound: the load and the counts (Python ints).
        law: the service law given (``None``: none).
        phases: whether the law needs the phase-type chain (it is not
            exponential with rate 1).
        pools: the :class:`~jaxqueue.core.service.Pool` tuple of
            :func:`~jaxqueue.core.service.make_pools` (``None``: identical servers).
    """

    policy: Policy
    rule: str
    options: dict
    load: float
    n: int
    m: int
    buffer: int | None
    queue_bound: int | None
    law: object
    phases: bool
    pools: tuple | None


def as_count(name, value):
    """``value`` as a Python int (numpy integers too); TypeError naming ``name`` otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def at_least(name, value, lo):
    """``value`` as a Python int ``>= lo``; an error naming ``name`` otherwise."""
    value = as_count(name, value)
    if value < lo:
        raise ValueError(f"{name}={value} is out of range: need {lo} <= {name}")
    return value


def pools_label(pools, law):
    """``"2 x speed 2 (erlang:2), 1 x speed 1 (exp)"``: the pools, for messages."""
    return ", ".join(
        f"{p.count} x speed {p.speed:g} ({(p.law or law or exponential()).label})" for p in pools
    )


def _phase_policies(named):
    """The registered policies whose exact rule (of ``named``) has a phase-type chain."""
    out = []
    for name in available():
        try:
            rule = make(name).exact_rule()[0]
        except NotImplementedError:
            continue
        if rule in named and named[rule].exact_phases:
            out.append(name)
    return out


def _policy_rule(policy, n, m, buffer, d, z, order):
    """The policy, checked against the system, and its exact rule."""
    policy = make(policy, d=d, z=z, order=order)  # unknown policy or option: ValueError
    system = System(n, m, buffer, buffer or 1, 0)  # n_servers, n_dispatchers, buffer
    policy.validate(system)  # d, z, order, single-dispatcher schemes
    try:
        rule, options = policy.exact_rule()
    except NotImplementedError as err:
        raise ValueError(str(err)) from None
    named = exact_rules()
    if rule not in named:
        raise ValueError(
            f"policy {policy.name!r} names exact rule {rule!r}, not one of {tuple(sorted(named))}"
        )
    return policy, rule, options


def _law_and_pools(policy, rule, service, pools, n):
    """The service law, whether it needs phases, and the pools, each allowed for ``rule``."""
    law = as_law(service)
    phases = law is not None and not law.is_unit_exponential
    named = exact_rules()
    if phases and not named[rule].exact_phases:
        raise ValueError(
            f"service={law.label!r}: policy {policy.label()!r} (exact rule {rule!r}) is solved "
            "with exponential service only; the policies that take a phase-type service law "
            f"are {', '.join(_phase_policies(named))} (use service=None or 'exp' here)"
        )
    if pools is None:
        return law, phases, None
    if not named[rule].exact_phases:
        raise ValueError(
            f"pools={pools!r}: policy {policy.label()!r} (exact rule {rule!r}) is solved "
            "with identical servers only; the policies that take pools are "
            f"{', '.join(_phase_policies(named))} (use pools=None here)"
        )
    try:
        return law, phases, make_pools(pools, n)
    except ValueError as err:
        if "pools" in str(err):
            raise
        raise ValueError(f"pools={pools!r}: {err}") from None
    except TypeError:
        raise TypeError(
            f"pools must be None, a string 'F1:S1,F2:S2', (fraction, speed) pairs or Pool "
            f"objects, got {pools!r}"
        ) from None


def _checked_load(load, buffer, law, phases, pools, n):
    """The load, below the capacity when the buffers are infinite."""
    if load is None:
        raise ValueError("load is required: the arrival rate per server, load > 0")
    if pools is not None:  # stability is load < capacity: check_load checks the rest
        load = check_load(load, 1 if buffer is None else buffer)
        cap = capacity(law, pools, n)
        if buffer is None and load >= cap:
            raise ValueError(
                f"load={load} is out of range with pools {pools_label(pools, law)}: infinite "
                f"buffers need load < capacity = {cap:.6g} (tasks per server per unit time when "
                "all are busy: the sum over the pools of count * speed / mean, over n_servers); "
                "give a finite buffer for a heavier load"
            )
    elif not phases:
        load = check_load(load, buffer)
    else:  # stability is load * mean < 1: check_load checks the rest (a buffer lifts its < 1)
        load = check_load(load, 1 if buffer is None else buffer)
        if buffer is None and load * law.mean >= 1.0:
            raise ValueError(
                f"load={load} is out of range with service={law.label!r} of mean {law.mean:.6g}: "
                f"infinite buffers need load * mean < 1 (here {load * law.mean:.6g}); give a "
                "finite buffer for a heavier load"
            )
    return load


def resolve(model: Model, load, queue_bound) -> Inputs:
    """Check every input of ``model`` at ``load``, in order, before any work; the
    :class:`Inputs`."""
    n = as_count("n_servers", model.n_servers)
    m = as_count("n_dispatchers", model.n_dispatchers)
    buffer = None if model.buffer is None else as_count("buffer", model.buffer)
    d = None if model.d is None else as_count("d", model.d)
    z = None if model.z is None else as_count("z", model.z)
    policy, rule, options = _policy_rule(model.policy, n, m, buffer, d, z, model.order)
    law, phases, pools = _law_and_pools(policy, rule, model.service, model.pools, n)
    load = _checked_load(load, buffer, law, phases, pools, n)
    if queue_bound is not None:
        if buffer is not None:
            raise ValueError(
                "queue_bound applies to infinite buffers only; with buffer="
                f"{buffer} the queues are bounded by the buffer (leave queue_bound=None)"
            )
        queue_bound = at_least("queue_bound", queue_bound, 1)
    return Inputs(policy, rule, options, load, n, m, buffer, queue_bound, law, phases, pools)
