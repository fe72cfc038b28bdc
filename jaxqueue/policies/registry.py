"""The policy registry: one place that knows every policy by name.

Add a policy by writing one class (see :mod:`jaxqueue.policies.base` for what
it declares) and registering it with :func:`register`; the simulator, the
mean field, the exact solver, the default level bounds and the command line
all find it here. A registry-wide test checks that every registered policy
declares each of these paths.
"""

from __future__ import annotations

import dataclasses
import difflib

from jaxqueue.core.system import as_int
from jaxqueue.policies.base import Policy
from jaxqueue.policies.classic import JSEW, JSQ, IdleOneFirst, PowerOfD, Random
from jaxqueue.policies.jiq import JIQ, JIQSQ, IdleFirst, JIQPod
from jaxqueue.policies.per_server import JIQOriginal, JIQThreshold

__all__ = ["register", "available", "make", "policy_class", "option_names"]

_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Add a policy class to the registry under ``cls.name`` (usable as a decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


for _cls in (
    Random,
    JSQ,
    JSEW,
    PowerOfD,
    IdleOneFirst,
    JIQ,
    JIQPod,
    JIQSQ,
    IdleFirst,
    JIQOriginal,
    JIQThreshold,
):
    register(_cls)


def available() -> list[str]:
    """Names of the registered policies."""
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    """The registered class of ``name``, in any case (``JIQ-Pod`` is ``jiq-pod``); the
    error names the closest valid name and lists them all."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    folded = {n.casefold(): cls for n, cls in _REGISTRY.items()}
    if isinstance(name, str) and name.casefold() in folded:
        return folded[name.casefold()]
    close = difflib.get_close_matches(str(name).casefold(), list(folded), n=1)
    hint = f"; did you mean {folded[close[0]].name!r}?" if close else ""
    raise ValueError(f"unknown policy {name!r}; valid names: {', '.join(available())}{hint}")


def option_names(name: str | type[Policy] | Policy) -> tuple[str, ...]:
    """The options a policy takes, e.g. ``("d",)`` for ``pod``."""
    cls = (
        name
        if isinstance(name, type)
        else type(name)
        if isinstance(name, Policy)
        else policy_class(name)
    )
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def make(name: str | Policy, **options) -> Policy:
    """Build a policy from its name and options.

    Options left at ``None`` are not given (so that command lines can pass
    ``d=None``); any other option the policy does not take is an error. A
    Policy instance is returned as it is; options given with it must agree
    with its own.

    Examples:
        >>> make("pod", d=2)
        PowerOfD(d=2)
        >>> make("jiq")
        JIQ()
    """
    given = {k: as_int(v) for k, v in options.items() if v is not None}
    if isinstance(name, Policy):
        clash = {k: v for k, v in given.items() if name.options().get(k, object()) != v}
        if clash:
            raise ValueError(
                f"options {clash} disagree with the policy {name!r}; pass them in the Policy "
                f"(its options: {', '.join(option_names(name)) or 'none'})"
            )
        return name
    cls = policy_class(name)
    accepted = set(option_names(cls))
    unknown = set(given) - accepted
    if unknown:
        valid = ", ".join(sorted(accepted)) or "none"
        raise ValueError(
            f"policy {name!r} takes no option {', '.join(sorted(unknown))}; its options: {valid}"
        )
    return cls(**given)
