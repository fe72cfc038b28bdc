"""JIQ variants whose I-queues can list busy servers: JIQ-Original and JIQ-Threshold(z).

Their state is not exchangeable (a listed server's queue length matters), so
they step on per-server state (:mod:`jaxqueue.sim.per_server`) and have no
mean field here.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxqueue.core.system import check_int
from jaxqueue.policies.base import Policy

__all__ = ["JIQOriginal", "JIQThreshold"]

_NO_MEAN_FIELD = (
    "its I-queues list busy servers, so its state is not exchangeable and the occupancy "
    "mean field does not apply"
)


@dataclasses.dataclass(frozen=True)
class JIQOriginal(Policy):
    """JIQ-Original (Lu et al., "Join-Idle-Queue", Performance Evaluation 2011), as
    compared by Wang, Feng and Cheng (arXiv:1709.10119).

    Semantics (stepped on per-server state, :mod:`jaxqueue.sim.per_server`):

    * A server that becomes idle and is not listed joins a uniformly random
      I-queue (a join request). A server is listed at most once: one that
      becomes idle while still listed does not join again.
    * An arrival goes to a uniformly random dispatcher. If its I-queue is
      non-empty it sends the task to a uniformly random listed server, which
      leaves the I-queue, *even if that server is busy* (a stale pick, counted
      in ``stale_fraction``; a full server's task is blocked all the same).
    * Otherwise it sends the task to a uniformly random server. There are no
      delete requests: a listed server that gets a task this way stays listed.
    """

    name: ClassVar[str] = "jiq-original"
    references: ClassVar[tuple] = ("lu2011", "wang2017")
    uses_iqueues: ClassVar[bool] = True
    engine: ClassVar[str] = "per-server"
    stale_picks: ClassVar[bool] = True
    no_mean_field: ClassVar[str] = _NO_MEAN_FIELD
    #: A fallback task that lands on a listed server sends no delete request.
    delete_requests: ClassVar[bool] = False

    @property
    def threshold(self) -> int:
        """Servers join an I-queue when their queue drops to this length."""
        return 0

    def exact_rule(self):
        return "jiq-original", {}

    def tail_bound(self):
        return 1, True


@dataclasses.dataclass(frozen=True)
class JIQThreshold(Policy):
    """JIQ-Threshold(z) (Wang, Feng and Cheng, arXiv:1709.10119): servers listed
    while holding at most ``z`` tasks.

    Semantics (stepped on per-server state, :mod:`jaxqueue.sim.per_server`): a server
    is listed, in exactly one I-queue, exactly while it holds at most ``z``
    tasks.

    * A server whose queue drops to ``z`` joins a uniformly random I-queue.
    * A dispatcher with a non-empty I-queue sends the task to a uniformly
      random listed server and removes it from its I-queue; if the server
      still holds at most ``z`` tasks it at once joins a uniformly random
      I-queue again (a join request).
    * A dispatcher with an empty I-queue sends the task to a uniformly random
      server; if that takes a listed server past ``z``, a delete request
      removes it from its I-queue.

    ``z = 0`` is JIQ (with delete requests). Mitzenmacher's threshold variant
    (arXiv:1606.01833) differs: FIFO I-queues and no delete requests.
    """

    name: ClassVar[str] = "jiq-threshold"
    references: ClassVar[tuple] = ("wang2017",)
    uses_iqueues: ClassVar[bool] = True
    engine: ClassVar[str] = "per-server"
    no_mean_field: ClassVar[str] = _NO_MEAN_FIELD
    #: A fallback task that takes a listed server past ``z`` sends a delete request.
    delete_requests: ClassVar[bool] = True
    z: int = 1

    def validate(self, system):
        super().validate(system)
        check_int("z", self.z, 0, 10**6)

    @property
    def threshold(self) -> int:
        """Servers are listed exactly while holding at most this many tasks."""
        return self.z

    def exact_rule(self):
        return "jiq-threshold", {"z": self.z}

    def tail_bound(self):
        return 1, True
