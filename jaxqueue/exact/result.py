"""The result of the exact solver, in the package's one result schema."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxqueue.results.schema import Result

__all__ = ["ExactResult"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExactResult(Result):
    """Stationary metrics of one small system, solved exactly (:func:`~jaxqueue.exact.solve_exact`).

    The metric names and meanings are those of :class:`~jaxqueue.results.schema.Result`;
    here every metric is a Python float or a float64 array (no sampling
    error). Vectors are indexed by queue length ``k = 0..levels``, where
    ``levels`` is the buffer (finite buffers) or the queue bound used
    (infinite buffers, truncated there).

    Attributes:
        tail: ``(levels + 1,)``; ``tail[i]`` = expected fraction of servers
            with ``>= i`` tasks (``tail[0] = 1``).
        occupancy: ``(levels + 1,)``; expected fraction with exactly ``k``.
        arrival_seen: ``(levels + 1,)``; law of the number of tasks an
            accepted arrival finds at its server (PASTA). The last entry is 0:
            an accepted arrival never finds a full server.
        iqueue_distribution: ``(N + 1,)``; expected fraction of I-queues
            listing exactly ``j`` servers (JIQ family; ``None`` otherwise).
        mean_queue_length: expected tasks per server.
        mean_response_time: mean sojourn time of accepted tasks (Little's law
            on the accepted throughput; checked against the PASTA form
            ``sum_k (k + 1) arrival_seen[k]`` with exp(1) service, and with
            phase-type service against the mean over the ``(k, phase)`` an
            arrival finds of the residual service, ``k - 1`` services and its
            own).
        waiting_probability: ``1 - arrival_seen[0]``.
        blocking_probability: probability that an arrival is blocked (finite
            buffers; 0 for infinite buffers, see ``truncation_loss``).
        p0: expected fraction of empty I-queues (JIQ family; ``None`` otherwise).
        join_rate, delete_rate, probe_rate: messages per server per unit time
            (join-I-queue requests, delete requests, probes).
        stale_fraction: fraction of all arrivals sent to a listed server that
            was no longer idle (policies with ``stale_picks``, i.e.
            JIQ-Original; ``None`` otherwise).
        response_quantiles: ``{q: t}`` for ``q`` in
            :data:`~jaxqueue.results.schema.QUANTILES`, quantiles of the
            response time of accepted tasks: the Erlang mixture of
            ``arrival_seen`` (a task that finds ``k`` tasks stays an
            Erlang(``k + 1``, ``mu``) time, FIFO with exp(``mu``) service).
            With phase-type service, the mixture of phase-type laws given by
            the tasks found and the phase of the one in service (see
            :mod:`jaxqueue.exact.solver`), not a function of ``arrival_seen``;
            with pools, the mixture of these over the pools, each with the
            pool's law at its speed.
        settings: ``policy``, ``policy_label``, ``options``, ``n_servers``,
            ``n_dispatchers``, ``ratio``, ``load``, ``buffer``, ``levels``,
            ``queue_bound`` (``None`` for finite buffers), ``symmetry``,
            ``rule`` (the chain rule of :mod:`jaxqueue.exact.chain` solved),
            ``versions`` (:func:`jaxqueue.core.versions.versions`), and
            ``service`` (the law's
            :meth:`~jaxqueue.core.service.PhaseType.to_dict`) when a service
            law was given, and ``pools`` (a list of ``{"servers", "speed",
            "service"}``, ``service`` the pool's own law's ``to_dict()`` or
            ``None``) when pools were given.
        diagnostics: ``truncated_mass`` (probability that some server is at
            the queue bound; 0 for finite buffers), ``truncation_loss``
            (probability that an arrival is dropped at the bound; 0 for finite
            buffers), ``n_states`` (states solved, after symmetry lumping when
            ``symmetry``). With pools the result's ``pool_occupancy`` is a
            ``(pools, levels + 1)`` array: row ``i`` is the expected fraction
            of pool ``i``'s servers with exactly ``k`` tasks (the pools' rows,
            weighted by their server counts, average to ``occupancy``).

    Settings and diagnostics read as attributes too: ``res.truncated_mass``,
    ``res.n_states``, ``res.queue_bound``, ``res.load``.
    """

    source: ClassVar[str] = "exact"
