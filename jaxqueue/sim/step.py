"""The step kernel of the lockstep uniformized simulator (one replica, one step).

The state is a replica's occupancy tails (:mod:`jaxqueue.sim.state`), so one
event costs O(levels + iqueue_levels), whatever ``N`` and ``M`` are; the
per-server policies step on their lists instead (:mod:`jaxqueue.sim.per_server`).

Uniformization: the total event rate is bounded by ``N * (lambda + mu)``. Each
step is an arrival with probability ``lambda / (lambda + mu)``, otherwise a
potential departure from a uniformly random server (a no-op if it is idle).
The embedded chain has the CTMC's stationary law, so time averages are step
averages, and one unit of time is ``N * (lambda + mu)`` steps
(:func:`jaxqueue.core.system.steps_per_time_unit`). Every replica takes the
same steps, so replicas advance together as batched array updates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxqueue.core.rng import bernoulli, uniform_index
from jaxqueue.core.system import System, arrival_probability
from jaxqueue.policies.base import Policy, View, level_of
from jaxqueue.sim.classes import classes_after, service_outcome
from jaxqueue.sim.events import move, step_event
from jaxqueue.sim.per_server import step_listed
from jaxqueue.sim.source import advance_source
from jaxqueue.sim.state import Core

__all__ = ["step", "occupancy_step"]


def step(
    core: Core,
    words: jax.Array,
    load: jax.Array,
    system: System,
    policy: Policy,
    p_arrival=None,
    idle=None,
):
    """One uniformized step of one replica.

    Args:
        core: the replica's Markov state.
        words: uint32 ``(n_words(system, policy),)`` random words.
        load: float32 scalar, ``lambda``.
        system, policy: static.
        p_arrival: float32, the probability that the step is an arrival;
            default ``lambda / (lambda + gamma)`` (:func:`arrival_probability`),
            or the arrival source's (:mod:`jaxqueue.sim.source`), which also
            says whether a service candidate is real.
        idle: int32, the number of idle servers, where the caller carries it
            (exchangeable policies; see :func:`occupancy_step`); default
            ``N - tail[1]``.

    Returns:
        ``(new_core, event)`` where ``event`` is a dict of int32 scalars: the
        levels gaining and losing a server (``up``, ``down``), the level an
        accepted arrival found (``seen``; ``levels + 1`` for none), with
        server classes also the level and class it found, or a service
        candidate drew (``by_class``, :func:`~jaxqueue.sim.classes.classes_after`),
        and the event counts,
        consumed by :func:`run_blocks`.
    """
    serves, clock = None, core.clock
    if system.arrivals is not None:  # a time-varying or trace source: jaxqueue.sim.source
        clock, p_arrival, serves = advance_source(clock, words[0], words[-1], load, system)
    if policy.per_server:
        tail, iq_tail, lists, event = step_listed(
            core.tail,
            core.iq_tail,
            core.lists,
            words,
            load,
            system,
            policy.threshold,
            deletes=policy.delete_requests,
            fifo=policy.fifo,
            join_d=policy.join_choices,
            p_arrival=p_arrival,
            serves=serves,
        )
        return core._replace(tail=tail, iq_tail=iq_tail, lists=lists, clock=clock), event
    if p_arrival is None:
        p_arrival = arrival_probability(load, system.service_rate)
    if system.classes:  # phase-type service or pools: jaxqueue.sim.classes
        own = words[:-1] if clock is not None else words  # the class words end there
        service = service_outcome(core.classes, core.tail, own, system)
        if serves is not None:  # a service candidate the source thinned out: nothing happens
            service = service[:2] + (jnp.where(serves, service[2], -1),)
        given = dict(serves=service[2] == 0, classes=core.classes)  # the class counts
    else:
        given = dict(serves=serves, sizes=core.sizes)  # each replica's N, M
    tail, iq_tail, iq_listed, event = occupancy_step(
        core.tail,
        core.iq_tail,
        core.iq_listed,
        words,
        p_arrival,
        system,
        policy,
        idle=idle,
        **given,
    )
    if not system.classes:
        return Core(tail, iq_tail, iq_listed, None, None, clock, core.sizes), event
    classes, event["by_class"] = classes_after(
        core.classes,
        core.tail,
        own,
        event["arrivals"] > 0,
        event["up"],
        service,
        system,
        event.pop("arrival_class", None),
    )
    return Core(tail, iq_tail, iq_listed, None, classes, clock), event


def _shift(tail, up, down):
    """``tail`` with one more item at level ``up`` or one fewer at ``down``
    (never both: an index past the end means no change); one replica's array
    (one scatter-add) or the register layout (a tuple of per-level vectors,
    whose level 0 never changes)."""
    if isinstance(tail, tuple):
        one = lambda c: c.astype(jnp.int32)  # noqa: E731
        return tail[:1] + tuple(t + one(up == k) - one(down == k) for k, t in enumerate(tail) if k)
    return move(tail, up, down)


def _relist(iq_listed, leave, s_out, join, s_in):
    """``iq_listed`` after an I-queue of size ``s_out`` loses a server (if
    ``leave``) or one of size ``s_in - 1`` gains one (if ``join``): an
    I-queue of size s holds s listed servers, counted in ``iq_listed[0..s]``.

    ``leave`` and ``join`` never hold together (a server leaves an I-queue on
    an arrival step and joins one on a departure step), so one signed change
    at one size does both."""
    size = jnp.where(leave, s_out, s_in)
    sign = jnp.where(leave, -1, join.astype(jnp.int32))

    def change(j):
        return jnp.where(j < size, sign, jnp.where(j == size, sign * size, 0))

    if isinstance(iq_listed, tuple):
        return tuple(x + change(j) for j, x in enumerate(iq_listed))
    return iq_listed + change(jnp.arange(iq_listed.shape[0], dtype=jnp.int32))


def occupancy_step(
    tail,
    iq_tail,
    iq_listed,
    words,
    p_arrival,
    system: System,
    policy: Policy,
    serves=None,
    classes=None,
    idle=None,
    sizes=None,
):
    """One uniformized step of an exchangeable policy, in either layout.

    The same function steps one replica's arrays (vmapped over replicas by
    :func:`jaxqueue.sim.blocks.run_blocks`) and a tile of replicas in the
    register layout (tuples of per-level vectors, :mod:`jaxqueue.sim.registers`,
    in plain XLA or in the Pallas kernel), so the three paths take the same
    decisions from the same words.

    Args:
        tail, iq_tail, iq_listed: the occupancy tails (see :class:`Core`).
        words: the step's random words (an array, or a tuple of vectors).
        p_arrival: float32, ``lambda / (lambda + mu)`` (computed outside, so
            that every path rounds it alike).
        system, policy: static.
        serves: with server classes, whether the service event a departure
            step draws is a completion (:mod:`jaxqueue.sim.classes`);
            ``None``: every busy server drawn completes (exponential service).
        classes: the class counts (server classes only), which a policy
            defined on speeds sees; it then names the class of the server it
            picked, returned as ``event["arrival_class"]``.
        idle: int32, the number of idle servers, ``N - tail[1]`` (the
            default). The engine's blocks pass it in, carried from the
            previous step: JIQ's listed-server draw reads it, and when
            that read of ``tail`` was not ordered before the update of
            ``tail``, XLA's CPU compiler copied the whole tail array twice
            a step to keep the update in place (JIQ at 10^4 replicas, N =
            1000: 2.9e7 -> 3.2e7 replica-events/s on 2 cores).
        sizes: ``(N, M)`` of this replica, or ``(N, M, buffer)`` (int32
            scalars, or vectors in the register layout) where they differ
            across the batch; ``None``: the System's ``n_servers``,
            ``n_dispatchers`` and buffer.

    Returns:
        ``(tail, iq_tail, iq_listed, event)``.
    """
    n = system.n_servers if sizes is None else sizes[0]
    levels = system.levels
    if idle is None:
        idle = jnp.int32(n) - tail[1]
    view = View(
        tail,
        iq_tail,
        iq_listed,
        idle,
        classes,
        *((None, None) if sizes is None else (sizes[0], sizes[1])),
    )
    is_arrival = bernoulli(words[0], p_arrival)

    # Departure branch: a uniformly random server completes a task if busy.
    k_dep = level_of(tail, uniform_index(words[1], words[2], n))
    departs = ~is_arrival & (k_dep >= 1)
    if serves is not None:
        departs = departs & serves
    to_idle = departs & (k_dep == 1)

    # Arrival branch.
    route = policy.route(view, words[1:], system)
    k = route.level
    # a finite buffer is the level bound, or this replica's own below it (sizes[2])
    full = k >= (sizes[2] if sizes is not None and len(sizes) > 2 else levels)
    accepted = is_arrival & ~full

    # Changes at one index each (a scatter-add, O(1), for one replica's
    # arrays; a where per level in the register layout); an index past the
    # end (``levels + 1``) changes nothing.
    nowhere = levels + 1
    up = jnp.where(accepted, k + 1, nowhere)
    down = jnp.where(departs, k_dep, nowhere)
    new_tail = _shift(tail, up, down)

    joins = jnp.int32(0)
    iq_up = iq_down = jnp.int32(len(iq_tail))  # nowhere
    probes = jnp.where(is_arrival, route.probes, 0)
    iq_overflow = jnp.bool_(False)
    new_iq, new_listed = iq_tail, iq_listed
    if policy.uses_iqueues:
        join_size, join_probes = policy.on_idle(view, words[3:], system)
        joins = to_idle.astype(jnp.int32)
        probes = probes + jnp.where(to_idle, join_probes, 0)
        if system.n_dispatchers > 1:
            top = system.iqueue_levels
            iq_overflow = to_idle & (join_size >= top)
            leave = is_arrival & (route.iq_remove >= 1)
            join = to_idle & ~iq_overflow
            s_out, s_in = route.iq_remove, join_size + 1  # sizes before / after the change
            iq_up = jnp.where(join, s_in, top + 1)
            iq_down = jnp.where(leave, s_out, top + 1)
            new_iq = _shift(iq_tail, iq_up, iq_down)
            new_listed = _relist(iq_listed, leave, s_out, join, s_in)

    event = step_event(
        system,
        up=up,
        down=down,
        iq_up=iq_up,
        iq_down=iq_down,
        accepted=accepted,
        level=k,
        is_arrival=is_arrival,
        full=full,
        iq_overflow=iq_overflow,
        joins=joins,
        deletes=jnp.where(is_arrival, route.deletes, 0),
        probes=probes,
        stale=jnp.int32(0),
    )
    if route.server_class is not None:
        event["arrival_class"] = route.server_class
    return new_tail, new_iq, new_listed, event
