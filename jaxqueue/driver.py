"""The simulation driver: batched replicas, chunked host loop, warm-up, results.

Typical use::

    import jaxqueue as jq
    res = jq.simulate("jiq-pod", n_servers=1000, n_dispatchers=100, load=0.9,
                      d=2, replicas=64, steps=2_000_000, warmup=500_000)
    print(res.mean_response_time)

:func:`sweep` runs several loads in one compiled batch (one load per group of
replicas) and returns one result per load.
"""

from __future__ import annotations

import functools
import math
import platform
import sys
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from jaxqueue import engine
from jaxqueue.config import MAX_SERVERS, MAX_STEPS, System, check_int, check_load
from jaxqueue.estimators import SimulationResult, from_stats
from jaxqueue.levels import default_iqueue_levels, default_levels, required_levels
from jaxqueue.policies import Policy, make
from jaxqueue.rng import BLOCK

__all__ = [
    "simulate", "sweep", "run_blocks", "initial_counts", "versions", "LevelOverflowError",
    "steps_per_time_unit",
]  # fmt: skip


class LevelOverflowError(RuntimeError):
    """A queue or an I-queue passed its tracked bound; the run is not valid."""


def steps_per_time_unit(n_servers: int, load: float) -> float:
    """Uniformized steps per unit of time: ``N * (lambda + 1)``."""
    return n_servers * (load + 1.0)


@functools.partial(jax.jit, static_argnames=("system", "policy", "mesh"), donate_argnames=("state",))
def run_blocks(state, key, replicas, first_block, n_blocks, load, *, system, policy, mesh=None):
    """:func:`jaxqueue.engine.run_blocks`, jit-compiled and spread over a mesh.

    With a ``mesh`` (axis ``"replica"``), each device advances its own shard
    of replicas (``shard_map``; no communication). On a CPU, XLA runs each
    device on its own thread, so this is what puts every core to work.
    """
    run = functools.partial(engine.run_blocks, system=system, policy=policy)
    if mesh is None or mesh.size == 1:
        return run(state, key, replicas, first_block, n_blocks, load)
    spec, rep = PartitionSpec("replica"), PartitionSpec()
    return jax.shard_map(
        run, mesh=mesh, in_specs=(spec, rep, spec, rep, rep, spec), out_specs=spec, check_vma=False
    )(state, key, replicas, first_block, n_blocks, load)


def initial_counts(init, system: System, policy: Policy, load: float):
    """Occupancy counts, and I-queue counts where the state has them, of a start.

    Args:
        init: ``"empty"``, ``"mean-field"`` or an occupancy array (see :func:`sweep`).

    Returns:
        ``(counts, iq_counts)`` for :func:`jaxqueue.engine.init`; idle servers
        are spread over the I-queues as evenly as possible.
    """
    n, m, levels = system.n_servers, system.n_dispatchers, system.levels
    if isinstance(init, str):
        if init == "empty":
            counts = np.zeros(levels + 1, np.int64)
            counts[0] = n
        elif init == "mean-field":
            from jaxqueue import theory

            try:
                mf = theory.mean_field(policy.name, load, system.ratio, **policy.options())
            except NotImplementedError as err:
                raise ValueError(
                    f"init='mean-field' needs a closed-form mean field: {err}; "
                    "start 'empty' or pass an occupancy array"
                ) from None
            return initial_counts(np.asarray(mf.occupancy, np.float64), system, policy, load)
        else:
            raise ValueError(f"init={init!r} is not valid: use 'empty', 'mean-field' or an array")
    else:
        occ = np.asarray(init, np.float64)
        if occ.ndim != 1 or occ.size == 0 or np.any(occ < 0) or occ.sum() <= 0:
            raise ValueError(
                "init must be a non-negative 1-D occupancy (fractions or counts of servers "
                "with exactly k tasks, k = 0, 1, ...)"
            )
        occ = occ / occ.sum()
        beyond = occ[levels + 1 :].sum()
        if beyond * n >= 0.5:
            raise ValueError(
                f"init puts {beyond * n:.3g} servers past levels={levels}; raise levels or "
                "give an occupancy with less mass past the bound"
            )
        full = np.zeros(levels + 1)
        full[: min(occ.size, levels + 1)] = occ[: levels + 1]
        counts = _round_counts(full, n)
    iq_counts = None
    if policy.uses_iqueues and m > 1 and not policy.per_server:
        idle = int(counts[0])
        q, extra = divmod(idle, m)
        if q + (extra > 0) > system.iqueue_levels:
            raise ValueError(
                f"iqueue_levels={system.iqueue_levels} is too small for the initial state: "
                f"{idle} idle servers over {m} I-queues need at least {q + (extra > 0)}"
            )
        iq_counts = np.zeros(system.iqueue_levels + 1, np.int64)
        iq_counts[q] += m - extra
        if extra:
            iq_counts[q + 1] += extra
    return counts, iq_counts


def _round_counts(frac: np.ndarray, n: int) -> np.ndarray:
    """Integer counts summing to ``n`` closest to ``n * frac`` (largest remainders)."""
    raw = frac / frac.sum() * n
    counts = np.floor(raw).astype(np.int64)
    short = n - counts.sum()
    order = np.argsort(-(raw - counts))
    counts[order[:short]] += 1
    return counts


def versions() -> dict:
    """Versions of jaxqueue and what it runs on, recorded with every result."""
    from jaxqueue import __version__

    return {
        "jaxqueue": __version__,
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or _jaxlib_version(),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def _jaxlib_version():
    try:
        import jaxlib

        return jaxlib.__version__
    except Exception:  # pragma: no cover
        return None


def sweep(
    policy: str | Policy,
    n_servers: int,
    n_dispatchers: int = 1,
    loads: Sequence[float] = (0.9,),
    *,
    d: int | None = None,
    z: int | None = None,
    buffer: int | None = None,
    replicas: int = 32,
    steps: int = 1_000_000,
    warmup: int | None = None,
    seed: int = 0,
    levels: int | None = None,
    iqueue_levels: int | None = None,
    init="empty",
    on_overflow: str = "raise",
    progress: bool = False,
    devices: Sequence | None = None,
) -> list[SimulationResult]:
    """Simulate one policy at several loads in one compiled batch.

    ``replicas`` independent replicas run at each load; all replicas of all
    loads step together. Every argument is checked before anything compiles.

    Args:
        policy: a name from :func:`jaxqueue.available` or a Policy.
        n_servers: ``N``.
        n_dispatchers: ``M`` (``r = N / M``).
        loads: the values of ``lambda`` (each > 0; < 1 for infinite buffers).
        d, z: policy options (probes, threshold), where the policy takes them.
        buffer: places per server ``b``, or None for infinite buffers.
        replicas: replicas per load.
        steps: measured uniformized steps per replica (rounded up to whole
            blocks of 256; the result records the steps run).
        warmup: discarded uniformized steps per replica before measuring;
            default: 100 units of time at the largest load (see NOTES on the
            bias of a short warm-up from an empty start).
        seed: the run's integer seed; replica ``i`` of load ``j`` uses the
            stream of global replica ``j * replicas + i``.
        levels: the largest tracked queue length (infinite buffers); default
            from the mean-field tail of the largest load.
        iqueue_levels: largest tracked I-queue size (JIQ family, ``M > 1``).
        init: ``"empty"``, ``"mean-field"`` (start at the mean-field
            occupancy, where a closed form exists) or an occupancy array.
        on_overflow: ``"raise"`` (default) fails the run with advice if a
            queue or I-queue passes its bound; ``"report"`` returns the
            result with the ``overflow`` counts set.
        progress: print progress at chunk boundaries to stderr.
        devices: devices to spread replicas over (default: all of the default
            backend's devices).

    Returns:
        One :class:`SimulationResult` per load, in order.
    """
    pol = make(policy, d=d, z=z)
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
        warmup = int(math.ceil(100 * steps_per_time_unit(n_servers, lmax)))
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

    if buffer is not None:
        lv = buffer
        if levels is not None and levels != buffer:
            raise ValueError(f"levels={levels} must equal buffer={buffer} (or be omitted)")
    else:
        need = required_levels(pol, n_servers, n_dispatchers, lmax)
        if levels is None:
            lv = default_levels(pol, n_servers, n_dispatchers, lmax)
        else:
            check_int("levels", levels, 1, 10**6)
            if levels < need:
                raise ValueError(
                    f"levels={levels} is too small for load={lmax} under {pol.label()}: the "
                    f"mean-field tail puts about one server at queue length {need} or more; "
                    f"need levels >= {need} (default {default_levels(pol, n_servers, n_dispatchers, lmax)})"
                )
            lv = levels
    iq = 0
    if pol.uses_iqueues and (n_dispatchers > 1 or pol.per_server):
        iq = iqueue_levels if iqueue_levels is not None else default_iqueue_levels(
            pol, n_servers, n_dispatchers, min(loads)
        )
        check_int("iqueue_levels", iq, 1, n_servers)
    system = System(n_servers, n_dispatchers, buffer, lv, iq)
    pol.validate(system)

    # ---- state, keys, sharding ------------------------------------------------
    devs = list(devices) if devices is not None else jax.devices()
    total = replicas * len(loads)
    padded = -(-total // len(devs)) * len(devs)
    load_vec = np.repeat(np.asarray(loads, np.float32), replicas)
    load_vec = np.concatenate([load_vec, np.full(padded - total, load_vec[-1], np.float32)])
    # each load's replicas start from that load's initial state
    starts = [engine.init(*initial_counts(init, system, pol, lam), system, pol) for lam in loads]
    group = np.minimum(np.arange(padded) // replicas, len(loads) - 1)
    state = jax.tree.map(lambda *xs: jnp.stack(xs)[group], *starts)
    mesh = jax.sharding.Mesh(np.asarray(devs), ("replica",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("replica"))
    state = jax.device_put(state, sharded)
    replica_ids = jax.device_put(jnp.arange(padded, dtype=jnp.int32), sharded)
    load_arr = jax.device_put(jnp.asarray(load_vec), sharded)
    key = jax.random.key(int(seed))

    def advance(state, first, count, phase):
        done = 0
        chunk = 1
        t_start = time.perf_counter()
        while done < count:
            n = min(chunk, count - done)
            t0 = time.perf_counter()
            state = run_blocks(state, key, replica_ids, jnp.int32(first + done), jnp.int32(n),
                               load_arr, system=system, policy=pol, mesh=mesh)  # fmt: skip
            over = int(jnp.sum(state.stats.overflow)) + int(jnp.sum(state.stats.iq_overflow))
            dt = time.perf_counter() - t0
            done += n
            if over and on_overflow == "raise":
                raise LevelOverflowError(_overflow_advice(state, system, pol))
            if progress:
                rate = done * BLOCK * padded / max(time.perf_counter() - t_start, 1e-9)
                print(f"[jaxqueue] {pol.label()} {phase}: {done}/{count} blocks "
                      f"({rate:.3g} replica-steps/s)", file=sys.stderr, flush=True)  # fmt: skip
            # aim for chunks of about half a second
            if dt > 0:
                chunk = max(1, min(4 * chunk, int(chunk * 0.5 / dt) or 1))
        return state

    t_run = time.perf_counter()
    state = advance(state, 0, warm_blocks, "warm-up")
    warm_overflow = state.stats.overflow, state.stats.iq_overflow
    zero = engine.zero_stats(system, pol)
    stats = jax.tree.map(lambda x: jnp.broadcast_to(x, (padded,) + x.shape), zero)
    stats = stats._replace(overflow=warm_overflow[0], iq_overflow=warm_overflow[1])
    state = engine.State(state.core, jax.device_put(stats, sharded))
    state = advance(state, warm_blocks, measure_blocks, "measure")
    wall = time.perf_counter() - t_run

    host = {name: np.asarray(v)[:total] for name, v in state.stats._asdict().items()}
    results = []
    for j, lam in enumerate(loads):
        sl = slice(j * replicas, (j + 1) * replicas)
        settings = {
            "policy": pol.name,
            "policy_label": pol.label(),
            "options": pol.options(),
            "n_servers": n_servers,
            "n_dispatchers": n_dispatchers,
            "ratio": n_servers / n_dispatchers,
            "load": lam,
            "buffer": buffer,
            "levels": lv,
            "iqueue_levels": iq,
            "replicas": replicas,
            "steps": measure_blocks * BLOCK,
            "warmup": warm_blocks * BLOCK,
            "time_measured": measure_blocks * BLOCK / steps_per_time_unit(n_servers, lam),
            "time_warmup": warm_blocks * BLOCK / steps_per_time_unit(n_servers, lam),
            "seed": int(seed),
            "init": init if isinstance(init, str) else "array",
            "devices": len(devs),
            "platform": devs[0].platform,
            "wall_seconds": wall,
            "versions": versions(),
        }
        part = {k: v[sl] for k, v in host.items()}
        results.append(
            from_stats(part, load_vec[sl].astype(np.float64), pol.uses_iqueues,
                       n_dispatchers == 1 and not pol.per_server, settings,
                       stale=pol.name == "jiq-original")  # fmt: skip
        )
    return results


def _overflow_advice(state, system: System, pol: Policy) -> str:
    over = int(jnp.sum(state.stats.overflow))
    iq_over = int(jnp.sum(state.stats.iq_overflow))
    parts = []
    if over:
        parts.append(
            f"{over} arrivals found a queue at the level bound levels={system.levels} "
            f"under {pol.label()}; rerun with a larger levels= (e.g. {2 * system.levels})"
        )
    if iq_over:
        parts.append(
            f"{iq_over} idle servers found their I-queue at iqueue_levels={system.iqueue_levels}; "
            f"rerun with a larger iqueue_levels= (e.g. {2 * system.iqueue_levels})"
        )
    return "; ".join(parts) + " (or pass on_overflow='report' to keep the counts in the result)"


def simulate(
    policy: str | Policy,
    n_servers: int,
    n_dispatchers: int = 1,
    load: float = 0.9,
    **kwargs,
) -> SimulationResult:
    """Simulate one policy at one load. Arguments as in :func:`sweep`.

    Examples:
        >>> res = simulate("pod", n_servers=100, load=0.8, d=2, replicas=8, steps=100_000)
        >>> res.mean_response_time.mean  # doctest: +SKIP
        1.59...
    """
    return sweep(policy, n_servers, n_dispatchers, [load], **kwargs)[0]
