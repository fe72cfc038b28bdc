"""The Pallas kernel: the register layout on a GPU, one thread per replica.

Each program of the kernel owns a tile of :data:`TILE` replicas. It loads
their state and sums into a Python tuple of per-level vectors (the register
layout of :mod:`jaxqueue.sim.registers`), runs up to :data:`KEY_BLOCKS`
blocks of ``BLOCK`` steps with the state held in registers, and stores it
back once. The step is :func:`jaxqueue.sim.step.occupancy_step`, the same
function the engine vmaps, and :func:`jaxqueue.sim.registers.run_block` adds
the same exact integer sums, so the kernel's results are bit-identical to the
engine's; the per-block random keys (Threefry-2x32) are computed outside the
kernel and passed in, the per-step words (a 32-bit integer hash) inside.

The kernel is lowered through Triton, selected explicitly by its compiler
parameters. Pallas's default GPU lowering is now Mosaic GPU, and the Triton
lowering is deprecated from JAX 0.11 on. Moving to Mosaic GPU takes the same
kernel body (element-wise ``jnp`` on vectors; nothing here is Triton-specific)
under ``plgpu.kernel`` with Mosaic GPU's compiler parameters, a replica tile
laid out in Mosaic GPU's warpgroup-sized register layout (a multiple of 128),
and the state and key inputs staged to shared memory by explicit copies
instead of Triton's pointer loads. ``interpret=True`` runs the same kernel on
any backend (the tests do so on the CPU).

A warm run on a GPU costs one kernel launch per :data:`KEY_BLOCKS` blocks
(``KEY_BLOCKS * BLOCK`` steps), instead of several kernels a step, and reads
and writes the state in device memory once a launch.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxqueue.core.system import System, arrival_probability
from jaxqueue.policies.base import Policy
from jaxqueue.sim.blocks import spread, zero_rows
from jaxqueue.sim.registers import (
    Regs, block_keys_rows, from_rows, run_block, to_rows, unsupported,
)  # fmt: skip
from jaxqueue.sim.state import Core, Stats

__all__ = ["run_kernel", "advance_kernel", "TILE", "KEY_BLOCKS", "lower_for_cuda", "step_ops"]

#: Replicas per program (one per GPU thread: 4 warps of 32).
TILE = 128
#: Blocks one launch runs (their keys are computed before it, outside the kernel).
KEY_BLOCKS = 16
#: Warps per program.
NUM_WARPS = 4


def _triton_params():
    """Triton's compiler parameters (which select the Triton lowering); its
    deprecation warning, from JAX 0.11 on, is expected and silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.pallas import triton as pltriton

        return pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=1)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _split(leaves: list) -> tuple[list, list]:
    """Indices of the uint32 leaves and of the int32 leaves."""
    u = [i for i, x in enumerate(leaves) if x.dtype == jnp.uint32]
    return u, [i for i, x in enumerate(leaves) if x.dtype != jnp.uint32]


def _pack(rows: list, dtype) -> jax.Array:
    """Rows of ``(R,)`` vectors as a ``(rows padded to a power of two, R)`` matrix."""
    mat = jnp.stack([r.astype(dtype) for r in rows]) if rows else jnp.zeros((1, 0), dtype)
    return jnp.pad(mat, ((0, _pow2(mat.shape[0]) - mat.shape[0]), (0, 0)))


def _launch(count, keys, p, u_mat, i_mat, treedef, u_idx, i_idx, system, policy, tile,
            interpret):  # fmt: skip
    """One launch: ``count`` blocks (at most ``keys.shape[0] // 2``) for every replica."""
    n_leaves = len(u_idx) + len(i_idx)
    replicas = p.shape[1]

    def kernel(count_ref, keys_ref, p_ref, u_ref, i_ref, u_out, i_out):
        leaves = [None] * n_leaves
        for r, i in enumerate(u_idx):
            leaves[i] = u_ref[r, :]
        for r, i in enumerate(i_idx):
            leaves[i] = i_ref[r, :]
        regs, stats = jax.tree.unflatten(treedef, leaves)
        p_arrival = p_ref[0, :]

        def block(b, carry):
            return run_block(*carry, keys_ref[2 * b, :], keys_ref[2 * b + 1, :], p_arrival,
                             system, policy)  # fmt: skip

        regs, stats = jax.lax.fori_loop(0, count_ref[0], block, (regs, stats))
        leaves = jax.tree.leaves((regs, stats))
        for r, i in enumerate(u_idx):
            u_out[r, :] = leaves[i]
        for r, i in enumerate(i_idx):
            i_out[r, :] = leaves[i]
        # rows past the last leaf (padding) are carried through unchanged
        for r in range(len(u_idx), u_ref.shape[0]):
            u_out[r, :] = u_ref[r, :]
        for r in range(len(i_idx), i_ref.shape[0]):
            i_out[r, :] = i_ref[r, :]

    def tiled(rows):
        return pl.BlockSpec((rows, tile), lambda j: (0, j))

    return pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct(u_mat.shape, u_mat.dtype),
                   jax.ShapeDtypeStruct(i_mat.shape, i_mat.dtype)),  # fmt: skip
        grid=(replicas // tile,),
        in_specs=[pl.BlockSpec((1,), lambda j: (0,)), tiled(keys.shape[0]), tiled(1),
                  tiled(u_mat.shape[0]), tiled(i_mat.shape[0])],  # fmt: skip
        out_specs=(tiled(u_mat.shape[0]), tiled(i_mat.shape[0])),
        input_output_aliases={3: 0, 4: 1},
        interpret=interpret,
        compiler_params=None if interpret else _triton_params(),
        name=f"jaxqueue_{policy.name.replace('-', '_')}",
    )(count, keys, p, u_mat, i_mat)


def advance_kernel(core: Core, keys, first_block, n_blocks, load, system: System,
                   policy: Policy, *, interpret: bool = False, tile: int = TILE,
                   key_blocks: int = KEY_BLOCKS):  # fmt: skip
    """:func:`jaxqueue.sim.blocks.advance_blocks` as the Pallas kernel.

    Same arguments and bit-identical results. ``tile`` (a power of two)
    replicas run per program (fewer for a smaller batch); the batch is padded
    to a multiple of it.
    ``key_blocks`` (a power of two) blocks run per launch.
    """
    reason = unsupported(system, policy)
    if reason is not None:
        raise ValueError(f"backend='pallas' cannot run this policy: {reason}")
    replicas = load.shape[0]
    tile = min(tile, _pow2(replicas))
    padded = -(-replicas // tile) * tile
    pad = lambda x: jnp.concatenate([x, jnp.repeat(x[:1], padded - replicas, axis=0)])  # noqa: E731
    core, keys, load = jax.tree.map(pad, (core, keys, load))
    regs, stats = to_rows(core, zero_rows(system, policy, padded))
    leaves, treedef = jax.tree.flatten((regs, stats))
    u_idx, i_idx = _split(leaves)
    u_mat = _pack([leaves[i] for i in u_idx], jnp.uint32)
    i_mat = _pack([leaves[i] for i in i_idx], jnp.int32)
    p = arrival_probability(load)[None, :]
    lo0, hi0 = first_block[0], first_block[1]
    n_launch = (n_blocks + key_blocks - 1) // key_blocks

    def launch(c, mats):
        start = c * key_blocks
        k0, k1 = jax.vmap(lambda b: block_keys_rows(keys, lo0, hi0, start + b))(
            jnp.arange(key_blocks, dtype=jnp.int32)
        )
        # rows 2b, 2b + 1: the two words of block b's keys
        key_rows = jnp.stack([k0, k1], axis=1).reshape(2 * key_blocks, padded)
        count = jnp.minimum(key_blocks, n_blocks - start).astype(jnp.int32)[None]
        return _launch(count, key_rows, p, *mats, treedef, u_idx, i_idx, system, policy,
                       tile, interpret)  # fmt: skip

    u_mat, i_mat = jax.lax.fori_loop(0, n_launch, launch, (u_mat, i_mat))
    leaves = [None] * len(leaves)
    for r, i in enumerate(u_idx):
        leaves[i] = u_mat[r]
    for r, i in enumerate(i_idx):
        leaves[i] = i_mat[r]
    regs, stats = jax.tree.unflatten(treedef, leaves)
    core, stats = from_rows(Regs(*regs), Stats(*stats))
    return jax.tree.map(lambda x: x[:replicas], (core, stats))


@functools.partial(
    jax.jit, static_argnames=("system", "policy", "mesh", "interpret"), donate_argnames=("core",)
)
def run_kernel(core, keys, first_block, n_blocks, load, *, system, policy, mesh=None,
               interpret=False):  # fmt: skip
    """:func:`advance_kernel`, jit-compiled and spread over a mesh (as ``run_blocks``)."""
    run = functools.partial(advance_kernel, system=system, policy=policy, interpret=interpret)
    return spread(run, mesh, core, keys, first_block, n_blocks, load)


def _zero_core(system: System, policy: Policy, replicas: int) -> Core:
    """A batched Core of zeros with the engine's shapes."""
    width = system.iqueue_levels + 1 if policy.uses_iqueues and system.n_dispatchers > 1 else 1
    z = lambda n: jnp.zeros((replicas, n), jnp.int32)  # noqa: E731
    return Core(z(system.levels + 1), z(width), z(width))


def lower_for_cuda(system: System, policy: Policy, replicas: int = 2 * TILE):
    """Lower the kernel for CUDA (no GPU needed) and return the lowered program.

    A construct the Triton lowering rejects fails here, on any machine.
    """
    core = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                        _zero_core(system, policy, replicas))  # fmt: skip
    args = (core, jax.ShapeDtypeStruct((replicas, 2), jnp.uint32),
            jax.ShapeDtypeStruct((2,), jnp.uint32), jax.ShapeDtypeStruct((), jnp.int32),
            jax.ShapeDtypeStruct((replicas,), jnp.float32))  # fmt: skip
    fn = functools.partial(advance_kernel, system=system, policy=policy)
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


def _count_eqns(jaxpr) -> int:
    """Equations of a jaxpr, those of its sub-jaxprs (calls, loops, branches) included."""
    total = 0
    for eqn in jaxpr.eqns:
        subs = [v for v in eqn.params.values() if hasattr(v, "jaxpr") or hasattr(v, "eqns")]
        subs += [b for v in eqn.params.values() if isinstance(v, tuple) for b in v
                 if hasattr(b, "jaxpr") or hasattr(b, "eqns")]  # fmt: skip
        if subs:
            total += sum(_count_eqns(getattr(s, "jaxpr", s)) for s in subs)
        else:
            total += 1
    return total


def step_ops(system: System, policy: Policy) -> int:
    """Element-wise operations per replica in one step of the kernel (its block loop's body).

    Each is one vector operation over a tile, one element per GPU thread,
    so this is the count of operations per replica-step as JAX hands them to
    the Triton compiler (before its own simplification; about one machine
    instruction each, more for the 64-bit products of the exact draws). It
    needs no GPU.
    """
    width = 8
    regs, stats = to_rows(_zero_core(system, policy, width), zero_rows(system, policy, width))
    vec = lambda dtype: jnp.zeros((width,), dtype)  # noqa: E731

    def one_block(regs, stats, k0, k1, p):
        return run_block(regs, stats, k0, k1, p, system, policy)

    jaxpr = jax.make_jaxpr(one_block)(regs, stats, vec(jnp.uint32), vec(jnp.uint32),
                                      vec(jnp.float32))  # fmt: skip
    loops = [e for e in jaxpr.jaxpr.eqns if e.primitive.name in ("while", "scan")]
    params = loops[0].params
    body = params["body_jaxpr"] if "body_jaxpr" in params else params["jaxpr"]
    return _count_eqns(body.jaxpr)
