"""The simulation runner: plan, initial state, advance, collect.

A run is split so that ``(plan, state, next block)`` is an exact checkpoint:

* :func:`plan` checks every argument (before anything compiles) and fixes the
  static configuration: the policy, the :class:`~jaxqueue.core.system.System`,
  the loads, the replicas, the warm-up and measured blocks, the seed, the start;
* :func:`initial_state` builds the batched state of all replicas of all loads,
  sharded over the devices;
* :func:`advance` runs blocks ``[first_block, first_block + n_blocks)`` in
  chunks of about half a second (the chunk boundary is where progress,
  overflow checks and, later, checkpoints live). Keys are by position (replica
  ``i`` block ``b`` draws from ``fold_in(fold_in(key, i), b)``; see
  :func:`jaxqueue.core.rng.replica_keys` for grid points) and the running
  sums are reset exactly when block ``warmup_blocks`` starts, so any split of
  the blocks into calls gives the same result;
* :func:`collect` turns the running sums into one result per load.

:func:`run` does all four; :func:`jaxqueue.simulate` and :func:`jaxqueue.sweep`
are built on it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.rng import BLOCK, replica_keys
from jaxqueue.core.system import (
    DEFAULT_WARMUP_TIME, MAX_SERVERS, MAX_STEPS, System, check_int, check_load,
    steps_per_time_unit,
)  # fmt: skip
from jaxqueue.core.versions import versions
from jaxqueue.policies.base import Policy
from jaxqueue.policies.registry import make
from jaxqueue.results.simulation import SimulationResult, from_stats
from jaxqueue.sim.blocks import run_blocks
from jaxqueue.sim.bounds import default_iqueue_levels, default_levels, required_levels
from jaxqueue.sim.initial import initial_counts
from jaxqueue.sim.state import State, init, zero_stats

__all__ = [
    "Plan", "plan", "initial_state", "advance", "collect", "run", "placement", "LevelOverflowError",
]  # fmt: skip


class LevelOverflowError(RuntimeError):
    """A queue or an I-queue passed its tracked bound; the run is not valid."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything static about a run (hashable; derived from validated arguments).

    Attributes:
        policy: the Policy.
        system: the System (N, M, buffer, level bounds).
        loads: the values of ``lambda``; ``replicas`` replicas run at each.
        replicas: replicas per load.
        warmup_blocks: discarded blocks of :data:`~jaxqueue.core.rng.BLOCK` steps.
        measure_blocks: measured blocks.
        seed: the run's integer seed.
        init: ``"empty"``, ``"mean-field"`` or an occupancy as a tuple of floats.
        on_overflow: ``"raise"`` or ``"report"``.
        devices: the devices replicas are spread over.
        streams: ``None``: replica ``i`` of load ``j`` draws from the stream of
            global replica ``j * replicas + i`` (keys by position); or one
            stream word per load: its replicas ``0 .. replicas - 1`` draw from
            ``fold_in(fold_in(key, word), i)``, which does not depend on the
            other loads of the batch or their order (grid points).
    """

    policy: Policy
    system: System
    loads: tuple
    replicas: int
    warmup_blocks: int
    measure_blocks: int
    seed: int
    init: str | tuple = "empty"
    on_overflow: str = "raise"
    devices: tuple = ()
    streams: tuple | None = None

    @property
    def total_blocks(self) -> int:
        """Blocks from the start to the end of the run."""
        return self.warmup_blocks + self.measure_blocks

    @property
    def n_replicas(self) -> int:
        """Replicas of all loads (before padding to the device count)."""
        return self.replicas * len(self.loads)

    @property
    def padded(self) -> int:
        """Replicas of all loads, padded to a multiple of the device count."""
        n = len(self.devices)
        return -(-self.n_replicas // n) * n

    def load_vector(self) -> np.ndarray:
        """float32 ``(padded,)``: each replica's load (padding repeats the last)."""
        vec = np.repeat(np.asarray(self.loads, np.float32), self.replicas)
        return np.concatenate([vec, np.full(self.padded - vec.size, vec[-1], np.float32)])


def plan(
    policy: str | Policy,
    loads: Sequence[float],
    n_servers: int,
    n_dispatchers: int = 1,
    *,
    d: int | None = None,
    z: int | None = None,
    order: str | None = None,
    buffer: int | None = None,
    replicas: int = 32,
    steps: int = 1_000_000,
    warmup: int | None = None,
    seed: int = 0,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    init="empty",
    on_overflow: str = "raise",
    devices: Sequence | None = None,
    streams: Sequence[int] | None = None,
) -> Plan:
    """Check the arguments of a run and fix its static configuration (nothing compiles).

    Arguments as in :func:`jaxqueue.sweep`.
    """
    pol = make(policy, d=d, z=z, order=order)
    check_int("n_servers", n_servers, 1, MAX_SERVERS)
    check_int("n_dispatchers", n_dispatchers, 1, n_servers)
    loads = [check_load(x, buffer) for x in np.atleast_1d(np.asarray(loads, dtype=object))]
    if not loads:
        raise ValueError("loads is empty: give at least one load")
    if buffer is not None:
        check_int("buffer", buffer, 1, 10**6)
    check_int("replicas", replicas, 1, 10**8)
    check_int("steps", steps, 1, MAX_STEPS)
    if on_overflow not in ("raise", "report"):
        raise ValueError(f"on_overflow={on_overflow!r} is not valid: use 'raise' or 'report'")
    lmax = max(loads)
    if warmup is None:
        warmup = int(math.ceil(DEFAULT_WARMUP_TIME * steps_per_time_unit(n_servers, lmax)))
    check_int("warmup", warmup, 0, MAX_STEPS)
    measure_blocks = -(-steps // BLOCK)
    warm_blocks = -(-warmup // BLOCK)
    if (measure_blocks + warm_blocks) * BLOCK > MAX_STEPS:
        raise ValueError(
            f"steps + warmup = {steps + warmup} is out of range: need at most {MAX_STEPS} "
            "per replica; run more replicas instead"
        )
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    # the policy's options first: the level bounds below may solve (and compile) the mean field
    pol.validate(System(n_servers, n_dispatchers, buffer, buffer or 1, 0))
    system = System(n_servers, n_dispatchers, buffer,
                    _levels(pol, n_servers, n_dispatchers, buffer, levels, lmax),
                    _iqueue_levels(pol, n_servers, n_dispatchers, iqueue_levels, min(loads)))  # fmt: skip
    pol.validate(system)
    if isinstance(init, str):
        if init not in ("empty", "mean-field"):
            raise ValueError(f"init={init!r} is not valid: use 'empty', 'mean-field' or an array")
        start = init
    else:
        start = tuple(float(x) for x in np.asarray(init, np.float64).ravel())
        if np.ndim(init) != 1:
            raise ValueError("init must be a 1-D occupancy (fractions of servers with k tasks)")
    if streams is not None:
        streams = tuple(int(w) for w in streams)
        if len(streams) != len(loads) or any(not 0 <= w < 2**32 for w in streams):
            raise ValueError(
                f"streams must give one word in [0, 2**32) per load: {len(loads)} loads, "
                f"got {len(streams)} words"
            )
    devs = tuple(devices) if devices is not None else tuple(jax.devices())
    return Plan(pol, system, tuple(loads), replicas, warm_blocks, measure_blocks, int(seed),
                start, on_overflow, devs, streams)  # fmt: skip


def _levels(pol, n, m, buffer, levels, lmax) -> int:
    if buffer is not None:
        if levels is not None and levels != buffer:
            raise ValueError(f"levels={levels} must equal buffer={buffer} (or be omitted)")
        return buffer
    need = required_levels(pol, n, m, lmax)
    if levels is None:
        return default_levels(pol, n, m, lmax)
    check_int("levels", levels, 1, 10**6)
    if levels < need:
        raise ValueError(
            f"levels={levels} is too small for load={lmax} under {pol.label()}: the "
            f"mean-field tail puts about one server at queue length {need} or more; "
            f"need levels >= {need} (default {default_levels(pol, n, m, lmax)})"
        )
    return levels


def _iqueue_levels(pol, n, m, iqueue_levels, lmin) -> int:
    if not (pol.uses_iqueues and (m > 1 or pol.per_server)):
        return 0
    iq = iqueue_levels if iqueue_levels is not None else default_iqueue_levels(pol, n, m, lmin)
    check_int("iqueue_levels", iq, 1, n)
    return iq


@functools.lru_cache(maxsize=8)
def placement(p: Plan):
    """The mesh, and the sharded replica keys and loads of a plan."""
    mesh = jax.sharding.Mesh(np.asarray(p.devices), ("replica",))
    if len(p.devices) > 1:
        sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("replica"))
    else:  # what a one-device program returns: inputs and outputs alike, one compile
        sharded = jax.sharding.SingleDeviceSharding(p.devices[0])
    index = np.arange(p.padded)
    if p.streams is None:
        keys = replica_keys(p.seed, index)
    else:
        group = np.minimum(index // p.replicas, len(p.loads) - 1)
        keys = replica_keys(p.seed, index - group * p.replicas, np.asarray(p.streams)[group])
    loads = jax.device_put(jnp.asarray(p.load_vector()), sharded)
    return mesh, sharded, jax.device_put(keys, sharded), loads


def initial_state(p: Plan) -> State:
    """The batched State of every replica (leading axis ``padded``), sharded over the devices.

    Each load's replicas start from that load's initial state.
    """
    init_arg = p.init if isinstance(p.init, str) else np.asarray(p.init)
    starts = [init(*initial_counts(init_arg, p.system, p.policy, lam), p.system, p.policy)
              for lam in p.loads]  # fmt: skip
    group = np.minimum(np.arange(p.padded) // p.replicas, len(p.loads) - 1)
    state = jax.tree.map(lambda *xs: jnp.stack(xs)[group], *starts)
    return jax.device_put(state, placement(p)[1])


def _reset_stats(p: Plan, state: State) -> State:
    """Zero the running sums at the end of the warm-up, keeping the overflow counts."""
    zero = zero_stats(p.system, p.policy)
    stats = jax.tree.map(lambda x: jnp.broadcast_to(x, (p.padded,) + x.shape), zero)
    stats = stats._replace(overflow=state.stats.overflow, iq_overflow=state.stats.iq_overflow)
    return State(state.core, jax.device_put(stats, placement(p)[1]))


def advance(p: Plan, state: State, first_block: int, n_blocks: int, *,
            progress: bool = False) -> State:  # fmt: skip
    """Run blocks ``[first_block, first_block + n_blocks)`` of the plan on ``state``.

    The running sums are zeroed as block ``p.warmup_blocks`` starts. Raises
    :class:`LevelOverflowError` at the first chunk that overflowed when the
    plan says ``on_overflow="raise"``. ``state`` is consumed (its buffers are
    donated to the result).
    """
    check_int("first_block", first_block, 0, p.total_blocks)
    check_int("n_blocks", n_blocks, 0, p.total_blocks - first_block)
    end = first_block + n_blocks
    mesh, _, keys, loads = placement(p)
    at = first_block
    while at < end:
        if at == p.warmup_blocks:
            state = _reset_stats(p, state)
        stop = min(p.warmup_blocks, end) if at < p.warmup_blocks else end
        phase = "warm-up" if at < p.warmup_blocks else "measure"
        state = _run_chunks(p, state, keys, loads, mesh, at, stop, phase, progress)
        at = stop
    return state


def _run_chunks(p, state, keys, loads, mesh, start, stop, phase, progress):
    done, chunk = start, 1
    t_start = time.perf_counter()
    while done < stop:
        n = min(chunk, stop - done)
        t0 = time.perf_counter()
        state = run_blocks(state, keys, jnp.int32(done), jnp.int32(n), loads,
                           system=p.system, policy=p.policy, mesh=mesh)  # fmt: skip
        over = int(jnp.sum(state.stats.overflow)) + int(jnp.sum(state.stats.iq_overflow))
        dt = time.perf_counter() - t0
        done += n
        if over and p.on_overflow == "raise":
            raise LevelOverflowError(_overflow_advice(state, p))
        if progress:
            rate = (done - start) * BLOCK * p.padded / max(time.perf_counter() - t_start, 1e-9)
            print(f"[jaxqueue] {p.policy.label()} {phase}: block {done}/{p.total_blocks} "
                  f"({rate:.3g} replica-steps/s)", file=sys.stderr, flush=True)  # fmt: skip
        if dt > 0:  # aim for chunks of about half a second
            chunk = max(1, min(4 * chunk, int(chunk * 0.5 / dt) or 1))
    return state


def _overflow_advice(state: State, p: Plan) -> str:
    over = int(jnp.sum(state.stats.overflow))
    iq_over = int(jnp.sum(state.stats.iq_overflow))
    system, parts = p.system, []
    if over:
        parts.append(
            f"{over} arrivals found a queue at the level bound levels={system.levels} "
            f"under {p.policy.label()}; rerun with a larger levels= (e.g. {2 * system.levels})"
        )
    if iq_over:
        parts.append(
            f"{iq_over} idle servers found their I-queue at iqueue_levels={system.iqueue_levels}; "
            f"rerun with a larger iqueue_levels= (e.g. {2 * system.iqueue_levels})"
        )
    return "; ".join(parts) + " (or pass on_overflow='report' to keep the counts in the result)"


def collect(p: Plan, state: State, wall_seconds: float | None = None) -> list[SimulationResult]:
    """One :class:`~jaxqueue.results.simulation.SimulationResult` per load, from the running sums."""
    host = {name: np.asarray(v)[: p.n_replicas] for name, v in state.stats._asdict().items()}
    load_vec = p.load_vector()
    system, pol = p.system, p.policy
    recorded = versions()
    results = []
    for j, lam in enumerate(p.loads):
        sl = slice(j * p.replicas, (j + 1) * p.replicas)
        per_time = steps_per_time_unit(system.n_servers, lam)
        settings = {
            "policy": pol.name,
            "policy_label": pol.label(),
            "options": pol.options(),
            "n_servers": system.n_servers,
            "n_dispatchers": system.n_dispatchers,
            "ratio": system.ratio,
            "load": lam,
            "buffer": system.buffer,
            "levels": system.levels,
            "iqueue_levels": system.iqueue_levels,
            "replicas": p.replicas,
            "steps": p.measure_blocks * BLOCK,
            "warmup": p.warmup_blocks * BLOCK,
            "time_measured": p.measure_blocks * BLOCK / per_time,
            "time_warmup": p.warmup_blocks * BLOCK / per_time,
            "seed": p.seed,
            "init": p.init if isinstance(p.init, str) else "array",
            "devices": len(p.devices),
            "platform": p.devices[0].platform,
            "wall_seconds": wall_seconds,
            "versions": dict(recorded),
        }
        part = {k: v[sl] for k, v in host.items()}
        single = system.n_dispatchers == 1 and not pol.per_server
        results.append(from_stats(part, load_vec[sl].astype(np.float64), pol, single, settings))
    return results


def run(p: Plan, *, progress: bool = False) -> list[SimulationResult]:
    """Run a plan from its initial state to the end; one result per load."""
    t0 = time.perf_counter()
    state = initial_state(p)
    state = advance(p, state, 0, p.total_blocks, progress=progress)
    return collect(p, state, wall_seconds=time.perf_counter() - t0)
