"""The Pallas kernel: the register layout on a GPU, one thread per replica.

Each program of the kernel owns a tile of :data:`TILE` replicas. It loads
their state and sums (two matrices, one row a level) and takes them apart
into a Python tuple of per-level vectors (the register layout of
:mod:`jaxqueue.sim.registers`), runs up to :data:`KEY_BLOCKS` blocks of
``BLOCK`` steps with the state held in registers, and stores it back once.
One load and one store a matrix keep Triton's compile short (see
:func:`_launch`). The step is :func:`jaxqueue.sim.step.occupancy_step`, the same
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

import contextlib
import functools
import io
import re
import warnings

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxqueue.core.rng import BLOCK
from jaxqueue.core.system import System, arrival_probability
from jaxqueue.policies.base import Policy
from jaxqueue.sim.blocks import spread, zero_rows
from jaxqueue.sim.registers import (
    Regs,
    block_keys_rows,
    from_rows,
    run_block,
    to_rows,
    unsupported,
)
from jaxqueue.sim.state import Core, Stats

__all__ = [
    "run_kernel",
    "advance_kernel",
    "TILE",
    "KEY_BLOCKS",
    "lower_for_cuda",
    "step_ops",
    "step_values",
    "AUTO_MAX_VALUES",
    "triton_module",
    "GROUP_ROWS",
    "eqns",
]

#: Replicas per program (one per GPU thread: 4 warps of 32).
TILE = 128
#: Blocks one launch runs (their keys are computed before it, outside the kernel).
KEY_BLOCKS = 16
#: Warps per program.
NUM_WARPS = 4
#: ``backend="auto"`` runs the kernel only while the step loop carries at most
#: this many values a replica (:func:`step_values`), and the XLA engine above.
#: Measured on an H200 (JAX 0.11.2, N = 1000, load 0.9, 2^17 replicas):
#: Pod(2) at 64 levels carries 160 values and ran 5.9 times as fast as the
#: engine, JIQ (M = 100, 32 I-queue levels) at 32 levels 182 (before the step
#: stopped carrying ``iq_listed``) and ran 8.7 times as fast, and JIQ at 64
#: levels carries 224 and ran at 0.66 times the engine's speed (1.24e9
#: against 1.86e9 replica-events a second): its compiled step spills.
AUTO_MAX_VALUES = 184
#: Rows a group holds when the kernel takes a state matrix apart (and puts it
#: together): first a group, then a row of it, each by masked sums, so the
#: work (and the compile time) grows as rows * (GROUP_ROWS + height /
#: GROUP_ROWS), not as rows * height.
GROUP_ROWS = 32


def _triton_params():
    """Triton's compiler parameters (which select the Triton lowering); its
    deprecation warning, from JAX 0.11 on, is expected and silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.pallas import triton as pltriton

        return pltriton.CompilerParams(num_warps=NUM_WARPS, num_stages=1)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _groups(leaves: list) -> list[tuple[list[int], jnp.dtype]]:
    """The leaves' indices by dtype (uint32, int32): one matrix of rows each."""
    is_u = [x.dtype == jnp.uint32 for x in leaves]
    return [
        ([i for i, u in enumerate(is_u) if u == want], dtype)
        for want, dtype in ((True, jnp.uint32), (False, jnp.int32))
        if want in is_u
    ]


def _pack(rows: list, dtype) -> jax.Array:
    """Rows of ``(R,)`` vectors as a ``(rows padded to a power of two, R + 1)`` matrix.

    The one extra column is never read (the grid covers the first ``R``). It
    makes the rows' length odd, so that no row but the first starts on a
    16-byte boundary: Triton's coalescing then lays a ``(rows, tile)`` block
    out one column, one replica, per thread, and the rows taken from it keep
    that layout through the step loop. With aligned rows it picks four columns
    a thread and replicates them over the warps, which makes each thread do
    the work of four replicas four times over.
    """
    mat = jnp.stack([r.astype(dtype) for r in rows])
    return jnp.pad(mat, ((0, _pow2(mat.shape[0]) - mat.shape[0]), (0, 1)))


def _unpack(mat: jax.Array, rows: int, first=0) -> tuple:
    """The first ``rows`` rows (from row ``first``, which may be traced) of a
    ``(rows', tile)`` block as ``(tile,)`` vectors: each a masked sum over the
    row axis."""
    row = jax.lax.broadcasted_iota(jnp.int32, mat.shape, 0)
    zero = jnp.zeros_like(mat)
    return tuple(jnp.sum(jnp.where(row == first + r, mat, zero), axis=0) for r in range(rows))


def _unpack_rows(mat: jax.Array, rows: int) -> tuple:
    """:func:`_unpack` in two steps: groups of :data:`GROUP_ROWS` rows, then their rows."""
    height, width = mat.shape
    size = min(GROUP_ROWS, height)
    groups = mat.reshape(height // size, size, width)
    index = jax.lax.broadcasted_iota(jnp.int32, groups.shape, 0)
    out = []
    for g in range(-(-rows // size)):
        group = jnp.sum(jnp.where(index == g, groups, jnp.zeros_like(groups)), axis=0)
        out += _unpack(group, min(size, rows - g * size))
    return tuple(out)


def _stack_rows(vectors: list, shape, dtype) -> jax.Array:
    """``(tile,)`` vectors as the first rows of a ``shape`` block (zeros below)."""
    row = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    mat = jnp.zeros(shape, dtype)
    for r, v in enumerate(vectors):
        mat = jnp.where(row == r, jnp.broadcast_to(v.astype(dtype)[None, :], shape), mat)
    return mat


def _pack_rows(vectors: list, shape, dtype) -> jax.Array:
    """The inverse of :func:`_unpack_rows`: the rows into groups, the groups into a block."""
    height, width = shape
    size = min(GROUP_ROWS, height)
    grouped = (height // size, size, width)
    index = jax.lax.broadcasted_iota(jnp.int32, grouped, 0)
    mat = jnp.zeros(grouped, dtype)
    for g in range(0, len(vectors), size):
        group = _stack_rows(vectors[g : g + size], (size, width), dtype)
        mat = jnp.where(index == g // size, jnp.broadcast_to(group[None], grouped), mat)
    return mat.reshape(shape)


def _launch(count, keys, p, mats, treedef, groups, system, policy, tile, interpret, debug=False):
    """One launch: ``count`` blocks (at most ``keys.shape[0] // 2``) for every replica.

    The state is two matrices (uint32 and int32 rows), each read with one
    load and written with one store; their rows are taken apart and put
    together by masked sums and ``where`` (:func:`_unpack_rows`,
    :func:`_pack_rows`; once a launch, a small cost beside the ``KEY_BLOCKS *
    BLOCK`` steps). Triton's coalescing pass walks, for every load and store,
    everything connected to it, which here is the whole kernel: loading the
    state row by row (about 260 rows for JIQ at 32 I-queue levels) took it
    more than 2 minutes (measured with ``benchmarks/kernel_compile.py``).
    """
    n_leaves = sum(len(idx) for idx, _ in groups)
    replicas = p.shape[1] - 1  # without the odd column (see _pack)
    n_mats = len(mats)

    def kernel(count_ref, keys_ref, p_ref, *refs):
        ins, outs = refs[:n_mats], refs[n_mats:]
        leaves = [None] * n_leaves
        for (idx, _), ref in zip(groups, ins):
            for i, v in zip(idx, _unpack_rows(ref[...], len(idx))):
                leaves[i] = v
        regs, stats = jax.tree.unflatten(treedef, leaves)
        (p_arrival,) = _unpack(p_ref[...], 1)
        key_mat = keys_ref[...]

        def block(b, carry):
            k0, k1 = _unpack(key_mat, 2, 2 * b)
            return run_block(*carry, k0, k1, p_arrival, system, policy)

        regs, stats = jax.lax.fori_loop(0, count_ref[0], block, (regs, stats))
        leaves = jax.tree.leaves((regs, stats))
        for (idx, _), ref in zip(groups, outs):
            ref[...] = _pack_rows([leaves[i] for i in idx], ref.shape, ref.dtype)

    def tiled(rows):
        return pl.BlockSpec((rows, tile), lambda j: (0, j))

    return pl.pallas_call(
        kernel,
        out_shape=tuple(jax.ShapeDtypeStruct(m.shape, m.dtype) for m in mats),
        grid=(replicas // tile,),
        in_specs=[
            pl.BlockSpec((1,), lambda j: (0,)),
            tiled(keys.shape[0]),
            tiled(1),
            *(tiled(m.shape[0]) for m in mats),
        ],
        out_specs=tuple(tiled(m.shape[0]) for m in mats),
        input_output_aliases={3 + g: g for g in range(n_mats)},
        interpret=interpret,
        debug=debug,
        compiler_params=None if interpret else _triton_params(),
        name=f"jaxqueue_{policy.name.replace('-', '_')}",
    )(count, keys, p, *mats)


def advance_kernel(
    core: Core,
    keys,
    first_block,
    n_blocks,
    load,
    system: System,
    policy: Policy,
    *,
    interpret: bool = False,
    tile: int = TILE,
    key_blocks: int = KEY_BLOCKS,
    debug: bool = False,
):
    """:func:`jaxqueue.sim.blocks.advance_blocks` as the Pallas kernel.

    Same arguments and bit-identical results. ``tile`` (a power of two)
    replicas run per program (fewer for a smaller batch); the batch is padded
    to a multiple of it.
    ``key_blocks`` (a power of two) blocks run per launch. ``debug`` prints the
    kernel's jaxpr and, as it lowers for a GPU, its Triton module (Pallas's
    debug output, on stdout).
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
    leaves_dtypes = [x.dtype for x in leaves]
    groups = _groups(leaves)
    mats = tuple(_pack([leaves[i] for i in idx], dtype) for idx, dtype in groups)
    p = _pack([arrival_probability(load)], jnp.float32)
    lo0, hi0 = first_block[0], first_block[1]
    n_launch = (n_blocks + key_blocks - 1) // key_blocks

    def launch(c, mats):
        start = c * key_blocks
        k0, k1 = jax.vmap(lambda b: block_keys_rows(keys, lo0, hi0, start + b))(
            jnp.arange(key_blocks, dtype=jnp.int32)
        )
        # rows 2b, 2b + 1: the two words of block b's keys
        key_rows = jnp.pad(
            jnp.stack([k0, k1], axis=1).reshape(2 * key_blocks, padded), ((0, 0), (0, 1))
        )
        count = jnp.minimum(key_blocks, n_blocks - start).astype(jnp.int32)[None]
        return _launch(
            count, key_rows, p, mats, treedef, groups, system, policy, tile, interpret, debug
        )

    mats = jax.lax.fori_loop(0, n_launch, launch, mats)
    leaves = [None] * len(leaves)
    for (idx, _), mat in zip(groups, mats):
        for r, i in enumerate(idx):
            leaves[i] = mat[r, :padded].astype(leaves_dtypes[i])
    regs, stats = jax.tree.unflatten(treedef, leaves)
    core, stats = from_rows(Regs(*regs), Stats(*stats))
    return jax.tree.map(lambda x: x[:replicas], (core, stats))


@functools.partial(
    jax.jit, static_argnames=("system", "policy", "mesh", "interpret"), donate_argnames=("core",)
)
def run_kernel(
    core, keys, first_block, n_blocks, load, *, system, policy, mesh=None, interpret=False
):
    """:func:`advance_kernel`, jit-compiled and spread over a mesh (as ``run_blocks``)."""
    run = functools.partial(advance_kernel, system=system, policy=policy, interpret=interpret)
    return spread(run, mesh, core, keys, first_block, n_blocks, load)


def _zero_core(system: System, policy: Policy, replicas: int) -> Core:
    """A batched Core of zeros with the engine's shapes."""
    width = system.iqueue_levels + 1 if policy.uses_iqueues and system.n_dispatchers > 1 else 1
    z = lambda n: jnp.zeros((replicas, n), jnp.int32)  # noqa: E731
    return Core(z(system.levels + 1), z(width), z(width))


def lower_for_cuda(
    system: System, policy: Policy, replicas: int = 2 * TILE, *, debug: bool = False
):
    """Lower the kernel for CUDA (no GPU needed) and return the lowered program.

    A construct the Triton lowering rejects fails here, on any machine.
    ``debug`` prints the kernel's Triton module (:func:`triton_module`).
    """
    core = jax.eval_shape(lambda: _zero_core(system, policy, replicas))
    args = (
        core,
        jax.ShapeDtypeStruct((replicas, 2), jnp.uint32),
        jax.ShapeDtypeStruct((2,), jnp.uint32),
        jax.ShapeDtypeStruct((), jnp.int32),
        jax.ShapeDtypeStruct((replicas,), jnp.float32),
    )
    fn = functools.partial(advance_kernel, system=system, policy=policy, debug=debug)
    with _cuda_target():
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


#: The GPU a lowering for CUDA targets where no GPU is attached (the kernel's
#: Triton lowering reads the target's compute capability from the device).
CUDA_TARGET = "NVIDIA H200"


@contextlib.contextmanager
def _cuda_target():
    """Where no GPU is attached, a context that names :data:`CUDA_TARGET` as
    the device to lower for (JAX 0.11 on: Pallas's Triton lowering asks the
    device for its compute capability, and lowering without one needs an
    abstract device); elsewhere, or on a JAX without abstract devices (0.10,
    whose Triton lowering needs none), nothing."""
    abstract = getattr(jax.sharding, "AbstractDevice", None)
    if abstract is None or jax.devices()[0].platform == "gpu":
        yield
        return
    device = abstract(device_kind=CUDA_TARGET, num_cores=132, platform="gpu")
    mesh = jax.sharding.AbstractMesh(
        (1,), ("replica",), (jax.sharding.AxisType.Explicit,), abstract_device=device
    )
    with jax.sharding.use_abstract_mesh(mesh):
        yield


def triton_module(system: System, policy: Policy) -> str:
    """The kernel's Triton module (text) as Pallas hands it to the Triton
    compiler, lowered for CUDA on any machine (from Pallas's debug output).

    ``benchmarks/kernel_compile.py`` compiles it with a stand-alone Triton to
    time the compile without a GPU. Locations are left out.
    """
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        lower_for_cuda(system, policy, debug=True)
    text = out.getvalue()
    start = text.find("\nmodule")
    if "The Triton module" not in text or start < 0:
        raise RuntimeError("Pallas printed no Triton module (its debug output has changed)")
    # drop the printed locations (not valid MLIR in this pretty form)
    lines = [
        re.sub(r' (\[unknown\]|"[^"]*"\(#loc\d*\))', "", ln)
        for ln in text[start + 1 :].splitlines()
    ]
    return "\n".join(lines[: lines.index("}") + 1]) + "\n"  # without the location table after it


def eqns(jaxpr):
    """Every equation of a jaxpr, those of its sub-jaxprs (calls, loops,
    branches) after the equation that holds them."""
    for eqn in jaxpr.eqns:
        yield eqn
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from eqns(inner)


def _count_eqns(jaxpr) -> int:
    """Equations of a jaxpr that hold no sub-jaxpr, those of its sub-jaxprs included."""
    return sum(
        1
        for e in eqns(jaxpr)
        if not any(
            hasattr(getattr(sub, "jaxpr", sub), "eqns")
            for v in e.params.values()
            for sub in (v if isinstance(v, (tuple, list)) else (v,))
        )
    )


@functools.lru_cache(maxsize=64)
def _step_loop(system: System, policy: Policy):
    """The jaxpr equation of the block's step loop (traced on a tile of 8, no GPU)."""
    width = 8
    regs, stats = to_rows(_zero_core(system, policy, width), zero_rows(system, policy, width))
    vec = lambda dtype: jnp.zeros((width,), dtype)  # noqa: E731

    def one_block(regs, stats, k0, k1, p):
        return run_block(regs, stats, k0, k1, p, system, policy)

    jaxpr = jax.make_jaxpr(one_block)(
        regs, stats, vec(jnp.uint32), vec(jnp.uint32), vec(jnp.float32)
    )
    return next(e for e in jaxpr.jaxpr.eqns if e.primitive.name in ("while", "scan"))


def step_ops(system: System, policy: Policy) -> int:
    """Element-wise operations per replica in one step of the kernel (its block loop's body).

    Each is one vector operation over a tile, one element per GPU thread,
    so this is the count of operations per replica-step as JAX hands them to
    the Triton compiler (before its own simplification; about one machine
    instruction each, more for the 64-bit products of the exact draws). It
    needs no GPU.
    """
    params = _step_loop(system, policy).params
    body = params["body_jaxpr"] if "body_jaxpr" in params else params["jaxpr"]
    return _count_eqns(body.jaxpr)


def step_values(system: System, policy: Policy) -> int:
    """Values a replica carries through the kernel's step loop (the loop's
    carry: state, time sums, packed histogram, counters, and the loop's own
    counter), each a register of its GPU thread while they fit. Past about
    255 (the registers of a thread, less what the step needs besides) the
    compiled step spills to local memory; see :data:`AUTO_MAX_VALUES`.

    Counted as JAX traces the loop: the outputs of the block's step loop,
    which has no per-step outputs, so all of them are carried (JAX drops
    what the step never changes, such as level 0 of the tail). No loop
    parameter is read: JAX 0.11's scan has no ``num_carry``. Needs no GPU."""
    eqn = _step_loop(system, policy)
    if any(getattr(v.aval, "shape", ())[:1] == (BLOCK,) for v in eqn.outvars):
        raise RuntimeError(
            "the block's step loop has per-step outputs: step_values cannot "
            "tell its carry from them"
        )
    if eqn.primitive.name == "scan":
        return len(eqn.outvars)
    return len(eqn.outvars) - 1  # a while loop's carry holds its upper bound too
