"""Transient estimates: ensemble averages at given times, exact in time.

The uniformized chain makes one step per event of a Poisson clock of rate
``Lambda = N (lambda + gamma)`` (``gamma`` the service rate of uniformization,
1 for exponential service), independent of the path of the embedded chain
``X_0, X_1, ...``. So the state at time ``t`` is ``X_{K(t)}`` with ``K(t)``
Poisson of mean ``Lambda t``, and for any function ``f`` of the state

    E f(X(t)) = sum_n P(K(t) = n) E f(X_n).

Each replica therefore contributes ``Y(t) = sum_n P(K(t) = n) f(X_n)``, an
unbiased estimate of ``E f(X(t))`` with no time discretization: the weights
are the Poisson probabilities, summed up to the step past which their tail is
below ``1e-12``. The replicas are independent, so the across-replica mean and
its Student-t interval are the ensemble estimate and its 95% interval, at
every requested time at once, from one run of the replicas.

``f`` is the occupancy tail ``s_k`` (fractions of servers with at least ``k``
tasks), from which the idle fraction and the mean queue length follow, for
the JIQ family the fraction of empty I-queues ``p0``, and with server pools
each pool's busy fraction and mean queue length (read from the state's
class counts, so exact in time as well). A load step (the
replicas first run ``warmup_time`` at ``start_load``, then the load changes)
and a start from empty are the two classical experiments; compare with the
mean-field ODE, :func:`jaxqueue.theory.generic.meanfield.transient`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxqueue.core.rng import BLOCK, block_keys, step_word_rows
from jaxqueue.core.system import System
from jaxqueue.policies.base import Policy
from jaxqueue.results.display import transient_html, transient_text
from jaxqueue.results.estimates import Estimate
from jaxqueue.sim import runner
from jaxqueue.sim.blocks import block_words, spread
from jaxqueue.sim.classes import class_table
from jaxqueue.sim.state import n_words
from jaxqueue.sim.step import step

__all__ = ["weighted_sums", "TransientResult", "poisson_weights", "MAX_TIMES"]

#: Most times one transient run reports.
MAX_TIMES = 256
#: Blocks per compiled call (the weights of a call are a fixed shape).
CHUNK_BLOCKS = 16
#: The Poisson tail left out past the last step.
TAIL_MASS = 1e-12


@dataclasses.dataclass(frozen=True)
class TransientResult:
    """Ensemble estimates at given times (each an :class:`Estimate` across replicas).

    Attributes:
        times: float ``(T,)``, the times since the start (of the load step).
        tail: ``s_k(t)``, mean ``(T, levels + 1)``.
        idle_fraction: ``1 - s_1(t)``, ``(T,)``.
        mean_queue_length: ``sum_k s_k(t)``, ``(T,)``.
        p0: the fraction of empty I-queues (JIQ family with ``M > 1``; with
            one dispatcher, the probability that no server is idle), or None.
        settings: what produced it (policy, sizes, loads, replicas, steps, versions).
        pool_utilization, pool_mean_queue_length: with server pools, each
            pool's fraction of busy servers and mean tasks per server, ``(T,
            pools)``; else None.
    """

    times: np.ndarray
    tail: Estimate
    idle_fraction: Estimate
    mean_queue_length: Estimate
    p0: Estimate | None
    settings: dict
    pool_utilization: Estimate | None = None
    pool_mean_queue_length: Estimate | None = None

    def __repr__(self) -> str:
        """The run and a row per time of the scalar metrics with their intervals
        (:func:`jaxqueue.results.display.transient_text`); the arrays are in the
        fields and :meth:`to_dict`."""
        return transient_text(self)

    def _repr_html_(self) -> str:
        return transient_html(self)

    def to_dict(self) -> dict:
        """A JSON-ready dict: ``{"mean": [...], "ci95": [...]}`` per metric."""

        def js(e):
            return (
                None
                if e is None
                else {
                    "mean": np.asarray(e.mean).tolist(),
                    "ci95": np.asarray(e.ci95).tolist(),
                    "n": e.n,
                }
            )

        return {
            "source": "transient",
            "times": self.times.tolist(),
            "tail": js(self.tail),
            "idle_fraction": js(self.idle_fraction),
            "mean_queue_length": js(self.mean_queue_length),
            "p0": js(self.p0),
            "pool_utilization": js(self.pool_utilization),
            "pool_mean_queue_length": js(self.pool_mean_queue_length),
            "settings": self.settings,
        }


def poisson_weights(rate_times: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``P(Poisson(mu) = n)`` for each ``mu`` of ``rate_times`` (rows) and ``n`` (columns), float64."""
    mu = np.asarray(rate_times, np.float64)[:, None]
    k = np.asarray(n, np.float64)[None, :]
    lgam = np.vectorize(math.lgamma)(k + 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.where(
            mu > 0,
            k * np.log(np.where(mu > 0, mu, 1.0)) - mu - lgam,
            np.where(k == 0, 0.0, -np.inf),
        )
    return np.exp(logp)


def _last_step(mu_max: float) -> int:
    """A step count past which the Poisson(mu_max) tail is below :data:`TAIL_MASS`."""
    n = int(mu_max + 8.0 * math.sqrt(mu_max) + 40)
    while True:  # the tail past n is below the pmf at n times a geometric factor
        tail = (
            poisson_weights(np.array([mu_max]), np.array([n]))[0, 0]
            * (n + 1)
            / max(1.0, n + 1 - mu_max)
        )
        if tail < TAIL_MASS:
            return n
        n += int(2 * math.sqrt(mu_max) + 10)


def _f0(core, system: System, policy: Policy):
    """``(tail fractions (R, L + 1), p0 indicator (R,), by pool (R, 2, pools))`` of a
    batched state; by pool: each pool's busy fraction and mean queue length
    (zeros without pools)."""
    tail = core.tail.astype(jnp.float32) / system.n_servers
    if policy.uses_iqueues and system.n_dispatchers > 1:
        p0 = 1.0 - core.iq_tail[:, 1].astype(jnp.float32) / system.n_dispatchers
    else:
        p0 = (core.tail[:, 1] >= system.n_servers).astype(jnp.float32)
    return tail, p0, _by_pool(core, system)


def _by_pool(core, system: System):
    """Each pool's busy fraction and mean queue length, ``(R, 2, pools)``
    (``(R, 2, 0)`` without pools), from the class counts."""
    if system.pools is None:
        return jnp.zeros((core.tail.shape[0], 2, 0), jnp.float32)
    table = class_table(system)
    k = jnp.arange(system.levels + 1, dtype=jnp.float32)
    out = []
    for pool, base in zip(table.pools, table.base):
        servers = (
            core.classes[:, :, base : base + pool.law.n_phases].sum(axis=2).astype(jnp.float32)
        )
        out.append(jnp.stack([servers[:, 1:].sum(axis=1), servers @ k], axis=1) / pool.count)
    return jnp.stack(out, axis=2)


def _weighted(core, keys, first_block, n_blocks, load, weights, *, system, policy):
    """Advance by ``n_blocks`` blocks, summing each post-step state weighted by ``weights``.

    ``weights``: float32 ``(CHUNK_BLOCKS, BLOCK, T)``. Returns ``(core, tail
    sums (R, T, L + 1), p0 sums (R, T), by-pool sums (R, T, 2, pools),
    overflows (R,))``.
    """
    nw = n_words(system, policy)
    vstep = jax.vmap(lambda c, w, lam: step(c, w, lam, system, policy))
    lo0, hi0 = first_block[0], first_block[1]
    r, t_count = load.shape[0], weights.shape[-1]

    def block(i, carry):
        core, acc, acc_p0, acc_pool, over = carry
        lo = lo0 + i.astype(jnp.uint32)
        hi = hi0 + (lo < lo0).astype(jnp.uint32)
        bkeys = jax.vmap(lambda k: block_keys(k, lo, hi))(keys)
        w_block = weights[i]

        def body(c, t):
            core, acc, acc_p0, acc_pool, over = c
            words = step_word_rows(bkeys[:, 0], bkeys[:, 1], t, nw)  # (R,) vectors
            if policy.per_server:
                words = jnp.stack(words, axis=1)
            core, ev = vstep(core, words, load)
            tail, p0, pool = _f0(core, system, policy)
            w = w_block[t]
            acc = acc + w[None, :, None] * tail[:, None, :]
            acc_p0 = acc_p0 + w[None, :] * p0[:, None]
            acc_pool = acc_pool + w[None, :, None, None] * pool[:, None]
            over = over + ev["overflow"] + ev["iq_overflow"]
            return (core, acc, acc_p0, acc_pool, over), None

        out, _ = jax.lax.scan(
            body, (core, acc, acc_p0, acc_pool, over), jnp.arange(BLOCK, dtype=jnp.int32)
        )
        return out

    acc = jnp.zeros((r, t_count, system.levels + 1), jnp.float32)
    n_pools = 0 if system.pools is None else len(system.pools)
    start = (
        core,
        acc,
        jnp.zeros((r, t_count), jnp.float32),
        jnp.zeros((r, t_count, 2, n_pools), jnp.float32),
        jnp.zeros((r,), jnp.int32),
    )
    return jax.lax.fori_loop(0, n_blocks, block, start)


@functools.partial(jax.jit, static_argnames=("system", "policy", "mesh"), donate_argnames=("core",))
def _run_weighted(core, keys, first_block, n_blocks, load, weights, *, system, policy, mesh=None):
    run = functools.partial(_weighted, system=system, policy=policy)
    return spread(run, mesh, core, keys, first_block, n_blocks, load, weights)


def weighted_sums(p: runner.Plan, core, first_block: int, t: np.ndarray):
    """Each replica's Poisson-weighted sums at the times ``t``, from ``core`` at block ``first_block``.

    Returns ``(tail, p0, pools, steps, rate)``: float64 ``(replicas, T, levels
    + 1)``, ``(replicas, T)`` and ``(replicas, T, pools, 2)`` (the plan's
    replicas, padding dropped), the steps taken and the steps per unit time.

    Raises:
        LevelOverflowError: a queue or I-queue passed its bound.
    """
    system, pol, load = p.system, p.policy, p.loads[0]
    n_servers = system.n_servers
    mesh, _, keys, lam = runner.placement(p)

    rate = n_servers * (load + system.service_rate)  # steps per unit time
    n_last = _last_step(rate * float(t.max()))
    blocks = -(-n_last // BLOCK)
    tail0, p00, pool0 = (np.asarray(x, np.float64) for x in _f0(core, system, pol))
    w0 = poisson_weights(rate * t, np.array([0]))[:, 0]  # (T,)
    acc = w0[None, :, None] * tail0[:, None, :]
    acc_p0 = w0[None, :] * p00[:, None]
    acc_pool = w0[None, :, None, None] * pool0[:, None]
    over = np.zeros(p.padded, np.int64)
    done = 0
    while done < blocks:
        todo = min(CHUNK_BLOCKS, blocks - done)
        n = np.arange(done * BLOCK + 1, (done + CHUNK_BLOCKS) * BLOCK + 1)  # post-step indices
        w = poisson_weights(rate * t, n).T.reshape(CHUNK_BLOCKS, BLOCK, t.size)
        core, a, a0, ap, o = _run_weighted(
            core,
            keys,
            jnp.asarray(block_words(first_block + done)),
            jnp.int32(todo),
            lam,
            jnp.asarray(w, jnp.float32),
            system=system,
            policy=pol,
            mesh=mesh,
        )
        acc += np.asarray(a, np.float64)
        acc_p0 += np.asarray(a0, np.float64)
        acc_pool += np.asarray(ap, np.float64)
        over += np.asarray(o, np.int64)
        done += todo
    acc, acc_p0, over = acc[: p.n_replicas], acc_p0[: p.n_replicas], over[: p.n_replicas]
    acc_pool = acc_pool[: p.n_replicas]
    if over.sum():
        raise runner.LevelOverflowError(
            f"{int(over.sum())} arrivals or joins passed levels={system.levels} or "
            f"iqueue_levels={system.iqueue_levels} during the transient; rerun with larger bounds"
        )
    return acc, acc_p0, acc_pool, blocks * BLOCK, rate
