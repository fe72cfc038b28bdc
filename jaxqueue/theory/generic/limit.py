"""A system in the mean-field limit as one value: what the generic mean field's
solves by class, its periodic regime and its refusals take in place of the
policy and its options given one by one."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxqueue.core.service import as_law
from jaxqueue.policies import make
from jaxqueue.policies.base import Policy

__all__ = ["Limit"]


@dataclasses.dataclass(frozen=True)
class Limit:
    """The mean-field limit of a system: ``N, M -> inf`` with ``r = N / M`` fixed.

    Attributes:
        policy: a policy name or :class:`~jaxqueue.policies.Policy`.
        ratio: ``r = N / M`` for the JIQ family; ``None``: one dispatcher.
        d: the policy's probes (``None``: its default).
        buffer: places per server; ``None``: infinite buffers.
        service: a phase-type law or its text (``"erlang:3"``); ``None``: exp(1).
        pools: server pools (:func:`~jaxqueue.core.service.make_pools`'s forms);
            ``None``: identical servers.
        arrivals: a periodic rate profile (a
            :class:`~jaxqueue.core.arrivals.Profile` or a ``time,rate`` CSV
            file); ``None``: a constant load.
    """

    policy: Any
    ratio: float | None = None
    d: int | None = None
    buffer: int | None = None
    service: Any = None
    pools: Any = None
    arrivals: Any = None

    def built(self) -> Policy:
        """The policy with its ``d`` (:func:`jaxqueue.policies.make`)."""
        return make(self.policy, d=self.d)

    def by_class(self) -> bool:
        """Whether the state is by class: pools, or a service law other than exp(1)."""
        if self.pools is not None:
            return True
        law = as_law(self.service)
        return law is not None and not law.is_unit_exponential

    def replace(self, **changes) -> Limit:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)
