"""The register layout: a tile of replicas as tuples of per-level vectors.

The engine of :mod:`jaxqueue.sim.blocks` holds one replica's occupancy tail
as an array and vmaps the step over replicas; a level lookup is a reduction
and an update a scatter-add. In the register layout a tile of replicas is
held level by level instead: ``tail[k]`` is the vector, over the block's
replicas, of the servers holding at least ``k`` tasks, and the whole state is
a Python tuple of such vectors. A level lookup is then a sum of compares and
an update a ``where`` per level: element-wise work only, with no gathers,
scatters, iotas or reductions, which is what a GPU kernel that keeps each
replica's state in registers needs (:mod:`jaxqueue.sim.kernel`).

The step itself is :func:`jaxqueue.sim.step.occupancy_step`, the same function
the engine vmaps, so every path takes the same decisions from the same random
words; :func:`run_block` adds the same exact integer sums as
:func:`jaxqueue.sim.blocks.run_blocks`, so the three paths (the engine, this
layout in plain XLA, the Pallas kernel) return bit-identical states and
:class:`~jaxqueue.sim.state.Stats`.

Time sums: the engine adds ``BLOCK - t`` at each change; here every level
adds its post-step value at every step (one add a level) and the block's
``BLOCK * tail_0`` is subtracted at its end. The per-block sum wraps modulo
``2**32`` on the way, but its true value after the subtraction is at most
``BLOCK * (BLOCK + 1) / 2`` in size, so the result is exact.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxqueue.core.rng import BLOCK, block_keys, step_word_rows
from jaxqueue.core.system import System, arrival_probability
from jaxqueue.policies.base import Dispatchers, Policy, Servers
from jaxqueue.policies.probes import draws_by_table
from jaxqueue.sim.blocks import add64, spread, zero_rows
from jaxqueue.sim.state import COUNTERS, Core, Stats, n_words
from jaxqueue.sim.step import occupancy_step

__all__ = [
    "Regs",
    "unsupported",
    "to_rows",
    "from_rows",
    "run_block",
    "advance_registers",
    "run_registers",
    "block_keys_rows",
    "UNROLLED_PROBES",
    "MAX_LEVELS",
]

#: Largest ``d`` whose distinct probes are drawn by unrolled compares (above
#: it the engine loops over an array of picks, which this layout does not do).
UNROLLED_PROBES = 8
#: Bits of one count in the packed response-time histogram of a block: a block
#: counts at most ``BLOCK`` arrivals at a level, and three counts share a word.
SEEN_BITS = 10
assert BLOCK < 2**SEEN_BITS and 3 * SEEN_BITS <= 31
#: Largest ``levels`` (and ``iqueue_levels``) the layout holds: every level is
#: a register of each GPU thread (about six a level with the sums), and the
#: compile time grows with the number of levels.
MAX_LEVELS = 128


class Regs(NamedTuple):
    """A tile of replicas' Markov state: tuples of int32 ``(B,)`` vectors, one a level
    (``sizes``: each replica's ``N`` and ``M``, and its buffer where buffers differ,
    where they differ across the batch, constant through the run; empty otherwise)."""

    tail: tuple
    iq_tail: tuple
    iq_listed: tuple
    sizes: tuple = ()


def unsupported(
    system: System, policy: Policy, *, kernel: bool = True, sized: bool = False
) -> str | None:
    """Why the Pallas kernel (``kernel``), or else the register layout in plain
    XLA, cannot run ``policy``, or None. ``sized``: each replica reads its own
    ``N`` and ``M`` (``Core.sizes``) as numbers, not as constants of the step."""
    if policy.per_server:
        return (
            f"{policy.label()} steps on per-server state (each dispatcher's list of "
            "servers), not on occupancy tails"
        )
    if system.classes:
        return "phase-type service and server pools keep per-class counts"
    if system.arrivals is not None:
        return "time-varying and trace-driven arrivals keep a per-replica clock"
    for name in ("levels", "iqueue_levels"):
        if getattr(system, name) > MAX_LEVELS:
            return (
                f"{name}={getattr(system, name)} > {MAX_LEVELS}: the register layout holds "
                f"every level in registers (pass {name} <= {MAX_LEVELS})"
            )
    for draw in policy.draws(system) + policy.join_draws(system):
        d = getattr(draw, "d", 1)
        exhaustive = isinstance(draw, Servers) and draw.exhaustive
        if isinstance(draw, (Servers, Dispatchers)) and draw.from_tail:
            why = _tail_draw(system, policy, draw, kernel, sized)
            if why is not None:
                return why
            continue
        if isinstance(draw, (Servers, Dispatchers)) and d > UNROLLED_PROBES and not exhaustive:
            return (
                f"{policy.label()} probes d={d} > {UNROLLED_PROBES}, drawn by a loop over "
                "an array of picks"
            )
    return None


def _tail_draw(system: System, policy: Policy, draw, kernel: bool, sized: bool) -> str | None:
    """Why a draw past ``MAX_PROBES`` (read off the tail) cannot run, or None.

    At a static ``N`` (``M`` for dispatchers) with a table of ``C(t, d) / C(N, d)``
    the level is a count of table entries above ``u``: no logarithms, the same in
    the register layout as in the engine, but the table is a constant of the step,
    which a Pallas kernel does not capture. Elsewhere the formula takes float32
    logarithms, which a GPU's math library may round otherwise than the engine's."""
    name, n = ("N", system.n_servers) if isinstance(draw, Servers) else ("M", system.n_dispatchers)
    if sized or not draws_by_table(n, draw.d):
        per_load = " (read per replica: the loads' sizes or buffers differ)" if sized else ""
        return (
            f"{policy.label()} draws the shortest of d={draw.d} probes from float32 "
            f"logarithms of the tail at {name}={n}{per_load}, which a GPU's math library "
            "may round otherwise than the engine's"
        )
    if kernel:
        return (
            f"{policy.label()} draws the shortest of d={draw.d} probes from a table of "
            f"C(t, d) / C({name}, d) at {name}={n}, a constant of the compiled step that the Pallas "
            "kernel does not capture (it takes arrays as inputs only); "
            "backend='registers' runs it"
        )
    return None


def _rows(x: jax.Array) -> tuple:
    return tuple(x[:, k] for k in range(x.shape[1]))


def to_rows(core: Core, stats: Stats) -> tuple[Regs, Stats]:
    """Batched ``Core`` and ``Stats`` (leading replica axis) in the register layout."""
    sizes = () if core.sizes is None else _rows(core.sizes)
    regs = Regs(_rows(core.tail), _rows(core.iq_tail), _rows(core.iq_listed), sizes)
    return regs, Stats(*(_rows(x) if x is not None and x.ndim == 2 else x for x in stats))


def from_rows(regs: Regs, stats: Stats) -> tuple[Core, Stats]:
    """The inverse of :func:`to_rows`."""
    stack = lambda rows: jnp.stack(rows, axis=1)  # noqa: E731
    core = Core(
        stack(regs.tail),
        stack(regs.iq_tail),
        stack(regs.iq_listed),
        sizes=stack(regs.sizes) if regs.sizes else None,
    )
    return core, Stats(*(stack(x) if isinstance(x, tuple) else x for x in stats))


def _add64(lo: tuple, hi: tuple, x: tuple):
    """:func:`jaxqueue.sim.blocks.add64` level by level."""
    pairs = [add64(a, b, v) for a, b, v in zip(lo, hi, x)]
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def listed_of(iq_tail: tuple) -> tuple:
    """``iq_listed`` from ``iq_tail``: the listed servers in I-queues of size at
    least ``j`` are ``j * iq_tail[j] + sum(iq_tail[j + 1:])`` (an I-queue of
    size s lists s servers), a suffix sum of about two operations a level.

    The step loop recomputes it instead of carrying it: JIQ with 64 levels and
    32 I-queue levels carried about 260 values a replica, past the 255
    registers of a GPU thread, and the compiled kernel spilled in every step."""
    out, above = [], jnp.zeros_like(iq_tail[0])
    for j in range(len(iq_tail) - 1, -1, -1):
        out.append(iq_tail[j] * j + above if j else above)
        above = above + iq_tail[j]
    return tuple(reversed(out))


def _sum_since(acc: tuple, start: tuple, delta: tuple) -> tuple:
    """``delta + acc - BLOCK * start``, level by level (wrapping int32; exact, see above)."""
    return tuple(d + a - jnp.int32(BLOCK) * s for d, a, s in zip(delta, acc, start))


def _block_carry(regs: Regs, stats: Stats, system: System, policy: Policy) -> tuple:
    """What :func:`run_block`'s step loop carries from step to step, at the
    block's start: the state (without ``iq_listed`` where it follows from
    ``iq_tail``), the block's time sums, its packed response-time histogram
    and the counters. Each leaf is a vector over the tile: on a GPU, one
    register of each thread (:func:`jaxqueue.sim.kernel.step_values` counts them)."""
    by_changes = policy.uses_iqueues and system.n_dispatchers > 1
    idle_view = policy.uses_iqueues and system.n_dispatchers == 1
    zero = jnp.zeros_like(regs.tail[0])
    n_iq = 2 if idle_view else len(regs.iq_tail)
    n_seen = len(stats.seen) - 1
    if by_changes:
        regs = regs._replace(iq_listed=())
    return (
        regs,
        tuple(zero for _ in regs.tail),
        tuple(zero for _ in range(n_iq)),
        tuple(zero for _ in range(-(-n_seen // 3))),
        tuple(getattr(stats, name) for name in COUNTERS),
    )


def run_block(regs: Regs, stats: Stats, k0, k1, p_arrival, system: System, policy: Policy):
    """One block of ``BLOCK`` steps for a tile of replicas in the register layout.

    Args:
        regs: the replicas' state (:class:`Regs`).
        stats: their sums so far, a :class:`Stats` of tuples of vectors
            (:func:`to_rows`), counters as vectors.
        k0, k1: uint32 ``(B,)``, the two words of each replica's block key.
        p_arrival: float32 ``(B,)``, each replica's ``lambda / (lambda + 1)``.
        system, policy: static.

    Returns:
        ``(regs, stats)`` after the block.
    """
    nw = n_words(system, policy)
    by_changes = policy.uses_iqueues and system.n_dispatchers > 1
    idle_view = policy.uses_iqueues and system.n_dispatchers == 1
    zero = jnp.zeros_like(regs.tail[0])

    n = regs.sizes[0] if regs.sizes else jnp.int32(system.n_servers)

    def iq_now(tail, iq_tail):
        if idle_view:  # the I-queue tail [1, idle > 0] of one dispatcher
            idle = n - tail[1]
            return (zero + 1, (idle > 0).astype(jnp.int32))
        return iq_tail

    # accepted arrivals find at most levels - 1 tasks: seen[levels] stays 0. The
    # block's counts of levels 3j, 3j + 1, 3j + 2 share word j (SEEN_BITS each),
    # a third of the registers of one count a level (_block_carry)
    field = jnp.int32(SEEN_BITS)

    def body(t, carry):
        regs, acc_tail, acc_iq, packed, cnt = carry
        words = step_word_rows(k0, k1, t, nw)
        if by_changes:  # iq_listed follows from iq_tail: not carried (fewer registers)
            regs = regs._replace(iq_listed=listed_of(regs.iq_tail))
        tail, iq_tail, iq_listed, ev = occupancy_step(
            regs.tail,
            regs.iq_tail,
            regs.iq_listed,
            words,
            p_arrival,
            system,
            policy,
            sizes=regs.sizes or None,
        )
        if by_changes:
            iq_listed = ()
        acc_tail = acc_tail[:1] + tuple(a + x for a, x in zip(acc_tail[1:], tail[1:]))
        acc_iq = tuple(a + x for a, x in zip(acc_iq, iq_now(tail, iq_tail)))
        shift = ev["seen"] * field  # levels + 1 (none) falls past every word
        one = jnp.ones_like(shift)
        packed = tuple(
            w
            + jnp.where(
                (shift - 3 * j * field).astype(jnp.uint32) < 3 * SEEN_BITS,
                jnp.left_shift(one, shift - 3 * j * field),
                0,
            )
            for j, w in enumerate(packed)
        )
        cnt = tuple(c + ev[name] for c, name in zip(cnt, COUNTERS))
        return Regs(tail, iq_tail, iq_listed, regs.sizes), acc_tail, acc_iq, packed, cnt

    carry = _block_carry(regs, stats, system, policy)
    new, acc_tail, acc_iq, packed, cnt = jax.lax.fori_loop(0, BLOCK, body, carry)
    if by_changes:
        new = new._replace(iq_listed=listed_of(new.iq_tail))
    mask = jnp.int32(2**SEEN_BITS - 1)
    seen = (
        tuple(
            c + (jnp.right_shift(packed[k // 3], (k % 3) * SEEN_BITS) & mask)
            for k, c in enumerate(stats.seen[:-1])
        )
        + stats.seen[-1:]
    )

    tail_lo, tail_hi = _add64(stats.tail_lo, stats.tail_hi, regs.tail)
    # level 0 holds N servers at every step: its delta is 0
    tail_delta = stats.tail_delta[:1] + _sum_since(
        acc_tail[1:], regs.tail[1:], stats.tail_delta[1:]
    )
    if by_changes:
        iq_lo, iq_hi = _add64(stats.iq_lo, stats.iq_hi, regs.iq_tail)
        iq_delta = _sum_since(acc_iq, regs.iq_tail, stats.iq_delta)
    else:
        iq_lo, iq_hi = stats.iq_lo, stats.iq_hi
        iq_delta = tuple(d + a for d, a in zip(stats.iq_delta, acc_iq))
    return new, Stats(
        tail_lo=tail_lo,
        tail_hi=tail_hi,
        tail_delta=tail_delta,
        iq_lo=iq_lo,
        iq_hi=iq_hi,
        iq_delta=iq_delta,
        seen=seen,
        steps=stats.steps + BLOCK,
        **dict(zip(COUNTERS, cnt)),
    )


def block_keys_rows(keys: jax.Array, lo0, hi0, index) -> tuple:
    """The block keys of block ``first + index`` of every replica, as two uint32 rows.

    ``first`` is the 64-bit block index ``(hi0, lo0)``; ``keys`` the replicas'
    key data ``(R, 2)``. The same keys as :func:`jaxqueue.sim.blocks.advance_blocks`.
    """
    lo = lo0 + jnp.asarray(index).astype(jnp.uint32)
    hi = hi0 + (lo < lo0).astype(jnp.uint32)
    bk = jax.vmap(block_keys, in_axes=(0, None, None))(keys, lo, hi)
    return bk[:, 0], bk[:, 1]


def advance_registers(
    core: Core, keys, first_block, n_blocks, load, system: System, policy: Policy
):
    """:func:`jaxqueue.sim.blocks.advance_blocks` in the register layout, in plain XLA.

    Same arguments and the same (bit-identical) results.
    """
    p = arrival_probability(load)
    regs, stats = to_rows(core, zero_rows(system, policy, load.shape[0]))
    lo0, hi0 = first_block[0], first_block[1]

    def body(i, carry):
        k0, k1 = block_keys_rows(keys, lo0, hi0, i)
        return run_block(*carry, k0, k1, p, system, policy)

    regs, stats = jax.lax.fori_loop(0, n_blocks, body, (regs, stats))
    return from_rows(regs, stats)


@functools.partial(jax.jit, static_argnames=("system", "policy", "mesh"), donate_argnames=("core",))
def run_registers(core, keys, first_block, n_blocks, load, *, system, policy, mesh=None):
    """:func:`advance_registers`, jit-compiled and spread over a mesh (as ``run_blocks``)."""
    run = functools.partial(advance_registers, system=system, policy=policy)
    return spread(run, mesh, core, keys, first_block, n_blocks, load)
