"""Time-varying and trace-driven arrivals in the uniformized step.

A replica with an arrival source (:mod:`jaxqueue.core.arrivals`) carries a
:class:`Clock`: the segment it is in (a profile's segment, an MMPP's state,
the index of a trace's next arrival) and the time left in it, in units of
uniformized steps, as an int32 whole part and a float32 fraction (a segment
may be millions of steps long, and a float32 alone would lose the
fraction). Each step spends one exponential gap of mean one step
(``-log u`` from one random word; at most :data:`GAP_LIMIT`).

* Profile: the steps are the candidate events of a Poisson process at the
  constant rate ``N (lambda * peak + gamma)``, so the gap may pass the end of
  the segment; the clock then moves on (several segments if they are short,
  a static number of times, :func:`crossings`), and the step is an arrival
  with probability ``lambda * shape[segment] / (lambda * peak + gamma)``,
  a service event with probability ``gamma / (lambda * peak + gamma)``, and
  nothing otherwise. Exact, and time averages remain step averages.
* MMPP: no clock; the state changes at the modulation events, candidate
  events of rate ``q`` (the largest exit rate) thinned by the uniformized
  jump law ``I + Q / q`` (thresholds on one word).
* Trace: the steps are the candidate service events (rate ``N gamma``) and
  the trace's arrivals. A gap that reaches the next arrival makes the step
  that arrival; the overshoot is dropped, which memorylessness makes exact,
  and the clock is set to the next gap, scaled so that the trace's mean rate
  is ``lambda * N``. Time averages are taken over the service candidates
  (:func:`jaxqueue.sim.blocks.time_sum_scale`).

The step itself (:func:`jaxqueue.sim.step.step`) then takes the arrival
probability and whether a service candidate is real from here.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.arrivals import GAP_LIMIT, MMPP, Profile, Trace
from jaxqueue.core.rng import BLOCK, bernoulli
from jaxqueue.core.system import System
from jaxqueue.sim.classes import count_at_least, select, thresholds

__all__ = [
    "Clock",
    "SOURCE_WORDS",
    "MAX_CROSSINGS",
    "crossings",
    "init_clock",
    "advance_source",
    "check_source",
]

#: Random words a step with an arrival source adds (the gap, or the MMPP's jump).
SOURCE_WORDS = 1

#: Most segment ends one step may pass (a static unroll): segments must hold
#: at least ``GAP_LIMIT / (MAX_CROSSINGS - 1)`` steps each.
MAX_CROSSINGS = 16


class Clock(NamedTuple):
    """A replica's position in its arrival source."""

    seg: jax.Array  # int32: profile segment, MMPP state, or the trace's next arrival
    whole: jax.Array  # int32: whole steps left in the segment
    frac: jax.Array  # float32 in [0, 1): the fraction of a step left


def _split(x):
    """A non-negative float32 as (int32 whole part, float32 fraction)."""
    w = jnp.floor(x)
    return w.astype(jnp.int32), x - w


def _spend(whole, frac, g):
    """The time left after spending ``g >= 0`` steps (negative: the segment ended)."""
    gw, gf = _split(g)
    f = frac - gf
    borrow = f < 0
    return whole - gw - borrow.astype(jnp.int32), jnp.where(borrow, f + 1.0, f)


def _extend(whole, frac, length):
    """The time left after adding a segment of ``length >= 0`` steps."""
    lw, lf = _split(length)
    f = frac + lf
    carry = f >= 1.0
    return whole + lw + carry.astype(jnp.int32), jnp.where(carry, f - 1.0, f)


def _gap(word):
    """An exponential gap of mean 1 from one word: ``-log((w + 1/2) / 2**32)``."""
    u = (word.astype(jnp.float32) + 0.5) * jnp.float32(2.0**-32)
    return jnp.maximum(-jnp.log(u), 0.0)


def crossings(system: System) -> int:
    """Segment ends a profile step must be able to pass: ``1 + GAP_LIMIT /
    (shortest segment in steps)`` at the slowest uniformization (``lambda =
    0``)."""
    src = system.arrivals
    if not isinstance(src, Profile):
        return 0
    shortest = system.n_servers * system.service_rate * float(src.durations.min())
    return 1 + int(math.floor(GAP_LIMIT / shortest))


def check_source(system: System, loads) -> None:
    """Raise (before anything compiles) if the clock cannot hold this source's segments."""
    src = system.arrivals
    if isinstance(src, Trace) and system.n_servers * BLOCK >= 2**31:
        raise ValueError(
            f"arrivals: a trace run adds (service candidates of a block) x (servers) in 32-bit "
            f"integers: n_servers={system.n_servers} is out of range, need 1 <= n_servers <= "
            f"{(2**31 - 1) // BLOCK}"
        )
    if isinstance(src, Profile):
        need = crossings(system)
        if need > MAX_CROSSINGS:
            shortest = float(src.durations.min())
            raise ValueError(
                f"arrivals: the profile's shortest segment ({shortest:g} time units) spans "
                f"only {system.n_servers * system.service_rate * shortest:.3g} uniformized steps "
                f"at N = {system.n_servers}; each must span at least "
                f"{GAP_LIMIT / (MAX_CROSSINGS - 1):.3g}: merge short segments"
            )
        longest = system.n_servers * system.step_rate(max(loads)) * float(src.durations.max())
        if longest >= 2**31 - 64:
            raise ValueError(
                f"arrivals: the profile's longest segment spans {longest:.3g} uniformized steps "
                f"at N = {system.n_servers}; at most 2**31: split long segments"
            )


def init_clock(system: System, loads: np.ndarray) -> Clock:
    """Each replica's clock at the start (host side; ``loads`` per replica).

    Profiles start at time 0 of the period and traces at their first arrival;
    an MMPP's replicas start in its states in the stationary proportions
    (replica ``i`` of ``R`` in the state where the cumulative law passes
    ``(i + 1/2) / R``); warm-up does the rest.
    """
    src = system.arrivals
    r = loads.shape[0]
    zero_i, zero_f = np.zeros(r, np.int32), np.zeros(r, np.float32)
    if isinstance(src, Profile):
        first = system.n_servers * system.step_rate(loads) * src.durations[0]
        whole = np.floor(first)
        return Clock(zero_i, whole.astype(np.int32), (first - whole).astype(np.float32))
    if isinstance(src, MMPP):
        # (replicas of each load share the layout; the loads' blocks are contiguous)
        cum = np.cumsum(src.stationary)
        where = (np.arange(r) + 0.5) / r
        state = np.minimum(np.searchsorted(cum, where, side="right"), len(cum) - 1)
        return Clock(state.astype(np.int32), zero_i, zero_f)
    return Clock(zero_i, zero_i, zero_f)


@functools.lru_cache(maxsize=16)
def _tables(src):
    if isinstance(src, Profile):
        return (np.asarray(src.shape, np.float32), np.asarray(src.durations, np.float32))
    if isinstance(src, MMPP):
        jump = np.cumsum(src.jump_table(), axis=1)[:, :-1]
        return (np.asarray(src.shape, np.float32), tuple(thresholds(row) for row in jump))
    return (np.asarray(src.gaps, np.float32),)


def advance_source(clock: Clock, w0, word, load, system: System):
    """One step of a replica's arrival source.

    Args:
        clock: the replica's :class:`Clock`.
        w0: the step's event-type word (the arrival and service decisions
            of :func:`jaxqueue.sim.step.occupancy_step` compare it with
            ``p_arrival``; a modulation is decided on it here too).
        word: the source's own random word.
        load: float32, the replica's ``lambda``.
        system: static; ``system.arrivals`` is the source.

    Returns:
        ``(clock, p_arrival, serves)``: the new clock, the probability that
        this step is an arrival (float32; 0 or 1 for a trace) and whether a
        service candidate drawn on this step is real (bool).
    """
    src = system.arrivals
    gamma = jnp.float32(system.service_rate)
    if isinstance(src, Trace):
        (gaps,) = _tables(src)
        gaps = jnp.asarray(gaps)
        whole, frac = _spend(clock.whole, clock.frac, _gap(word))
        arrive = whole < 0
        seg = jnp.where(arrive, (clock.seg + 1) % gaps.shape[0], clock.seg)
        nw, nf = _split(gaps[seg] * (gamma / load))
        clock = Clock(seg, jnp.where(arrive, nw, whole), jnp.where(arrive, nf, frac))
        return clock, arrive.astype(jnp.float32), ~arrive
    rate = system.step_rate(load)  # the uniformization rate per server
    p_serve = gamma / rate
    serves = ~bernoulli(w0, 1.0 - p_serve)
    if isinstance(src, Profile):
        shape, dur = (jnp.asarray(t) for t in _tables(src))
        per_step = jnp.float32(system.n_servers) * rate
        seg = clock.seg
        whole, frac = _spend(clock.whole, clock.frac, _gap(word))
        for _ in range(crossings(system)):
            ended = whole < 0
            seg = jnp.where(ended, (seg + 1) % shape.shape[0], seg)
            ew, ef = _extend(whole, frac, per_step * dur[seg])
            whole, frac = jnp.where(ended, ew, whole), jnp.where(ended, ef, frac)
        return Clock(seg, whole, frac), load * shape[seg] / rate, serves
    # MMPP
    shape, bounds = _tables(src)
    shape = jnp.asarray(shape)
    p_arrival = load * shape[clock.seg] / rate
    p_switch = jnp.float32(src.extra_rate() / system.n_servers) / rate
    switch = bernoulli(w0, p_arrival + p_switch) & ~bernoulli(w0, p_arrival)
    target = select(clock.seg, tuple(count_at_least(word, row) for row in bounds))
    seg = jnp.where(switch, target, clock.seg)
    return Clock(seg, clock.whole, clock.frac), p_arrival, serves
