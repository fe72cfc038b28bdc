"""Random words and exact integer draws for the lockstep simulator.

Keys by position (:func:`replica_keys`, :func:`block_keys`), a counter hash for
each step's words, and indices exact to ``2**-64`` (docs/simulation.md, "Keys by
position" and "Exact sampling").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "BLOCK",
    "replica_keys",
    "block_keys",
    "threefry2x32",
    "step_words",
    "step_word_rows",
    "uniform_index",
    "bernoulli",
]

#: Uniformized steps per random block (the unit of key derivation and of the
#: exact integer accumulation of time averages).
BLOCK = 256

_U32 = jnp.uint32


def _mix(x: jax.Array) -> jax.Array:
    """A 32-bit bijective avalanche mixer (triple32 constants)."""
    x = x ^ (x >> 17)
    x = x * _U32(0xED5AD4BB)
    x = x ^ (x >> 11)
    x = x * _U32(0xAC4C1B51)
    x = x ^ (x >> 15)
    x = x * _U32(0x31848BAB)
    return x ^ (x >> 14)


def replica_keys(seed: int, replicas, streams=None) -> jax.Array:
    """The raw key data of each replica (host call; what :func:`block_keys` takes).

    ``jax.random``'s fold-ins, bit for bit, computed with NumPy
    (:func:`threefry2x32`), so a new batch size compiles nothing.

    Args:
        seed: the run's integer seed, ``0 <= seed < 2**63``: the key's two
            words are its high and low 32 bits (``jax.random.key(seed)``
            with 64-bit integers on; below ``2**32`` the same with them off).
        replicas: int ``(R,)`` replica indices.
        streams: ``None`` (replica ``i`` gets ``fold_in(key, i)``) or int
            ``(R,)`` stream words (``fold_in(fold_in(key, w), i)``).

    Returns:
        uint32 ``(R, 2)``, the replicas' key data.
    """
    seed = int(seed)
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed={seed} is out of range: need 0 <= seed < 2**63")
    key = np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32)
    replicas = np.asarray(replicas).astype(np.uint32)
    zero = np.zeros_like(replicas)
    if streams is None:
        k0, k1 = key[0] + zero, key[1] + zero
    else:  # fold_in(key, w): on the host, as below, no program to compile
        k0, k1 = _threefry(key[0], key[1], zero, np.asarray(streams).astype(np.uint32), np.uint32)
    k0, k1 = _threefry(k0, k1, zero, replicas, np.uint32)
    return jnp.asarray(np.stack([k0, k1], axis=-1))


def block_keys(
    replica_key: jax.Array, block: jax.Array, block_hi: jax.Array | None = None
) -> jax.Array:
    """The 64-bit key (two uint32 words) of one replica's block.

    Args:
        replica_key: uint32 ``(2,)``, the replica's key data (:func:`replica_keys`).
        block: int scalar, the block's index from the start of the run, or its
            low 32 bits (as uint32) when ``block_hi`` is given.
        block_hi: optional uint32 scalar, the high 32 bits of the block's index.
            Blocks below ``2**32`` (``block_hi = 0``) draw from
            ``fold_in(replica key, block)``; later ones from
            ``fold_in(fold_in(replica key, low), high)``, so a run has no
            ceiling on its length and no block's words repeat another's.

    Returns:
        uint32 array of shape ``(2,)``: ``jax.random.bits(k, (2,), uint32)``
        of that folded key ``k``, bit for bit.

    ``jax.random`` with its default threefry keys computes the same, but its
    CPU lowering is a loop that costs about 0.4 s of compile time in every
    simulation program; here the hash is written out (:func:`threefry2x32`)
    and XLA fuses it into one loop. It also keeps the stream independent of
    ``jax.random``'s settings (``jax_threefry_partitionable``).
    """
    zero = jnp.zeros((), _U32)
    k0, k1 = threefry2x32(replica_key[0], replica_key[1], zero, jnp.asarray(block).astype(_U32))
    if block_hi is not None:
        later = threefry2x32(k0, k1, zero, block_hi)
        first = block_hi == 0
        k0, k1 = jnp.where(first, k0, later[0]), jnp.where(first, k1, later[1])
    # jax.random.bits(k, (2,), uint32): word i is the xor of the hash of the counter (0, i)
    h0, h1 = threefry2x32(k0, k1, jnp.zeros((2,), _U32), jnp.arange(2, dtype=_U32))
    return h0 ^ h1


#: Threefry-2x32's rotations, alternating by group of four rounds.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k0, k1, x0, x1):
    """The Threefry-2x32 block cipher, 20 rounds (Salmon et al., "Parallel random
    numbers: as easy as 1, 2, 3", SC 2011), as ``jax.random`` applies it.

    Args:
        k0, k1: uint32 arrays, the key's two words.
        x0, x1: uint32 arrays, the counter's two words (broadcast with the key).

    Returns:
        the two uint32 words of the encrypted counter. ``fold_in(k, d)`` is
        ``threefry2x32(k, 0, d)`` and word ``i`` of ``bits(k)`` the xor of
        ``threefry2x32(k, 0, i)`` (tests/core/test_rng.py compares them with
        ``jax.random``).
    """
    return _threefry(k0, k1, x0, x1, _U32)


def _threefry(k0, k1, x0, x1, u32):
    """:func:`threefry2x32` on jax arrays (``u32 = jnp.uint32``) or NumPy arrays
    (``numpy.uint32``; the counters must be arrays, whose sums wrap silently)."""
    ks = (k0, k1, k0 ^ k1 ^ u32(0x1BD11BDA))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = x0 ^ ((x1 << u32(r)) | (x1 >> u32(32 - r)))
        x0, x1 = x0 + ks[(i + 1) % 3], x1 + ks[(i + 2) % 3] + u32(i + 1)
    return x0, x1


def step_words(bkey: jax.Array, step_in_block: jax.Array, n_words: int) -> jax.Array:
    """The ``n_words`` uint32 words of one step inside a block.

    Args:
        bkey: uint32 ``(2,)`` block key from :func:`block_keys`.
        step_in_block: int scalar in ``[0, BLOCK)``.
        n_words: static number of words the step consumes.

    Returns:
        uint32 array of shape ``(n_words,)``.
    """
    return jnp.stack(step_word_rows(bkey[0], bkey[1], step_in_block, n_words))


def step_word_rows(k0: jax.Array, k1: jax.Array, step_in_block: jax.Array, n_words: int) -> tuple:
    """:func:`step_words` for a tile of replicas in the register layout.

    Args:
        k0, k1: uint32 ``(B,)``, the two words of each replica's block key.
        step_in_block: int scalar in ``[0, BLOCK)``.
        n_words: static number of words the step consumes.

    Returns:
        a tuple of ``n_words`` uint32 ``(B,)`` vectors, word ``w`` of replica
        ``i`` equal to ``step_words(block key of i, step_in_block, n_words)[w]``.
    """
    base = step_in_block.astype(_U32) * _U32(n_words)
    return tuple(_mix(_mix((base + _U32(w)) ^ k0) ^ k1) for w in range(n_words))


def _mulhi(a: jax.Array, b: jax.Array) -> jax.Array:
    """High 32 bits of the 64-bit product of two uint32 arrays."""
    a_lo, a_hi = a & _U32(0xFFFF), a >> 16
    b_lo, b_hi = b & _U32(0xFFFF), b >> 16
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    cross = (lo_lo >> 16) + (hi_lo & _U32(0xFFFF)) + lo_hi
    return a_hi * b_hi + (hi_lo >> 16) + (cross >> 16)


def uniform_index(hi: jax.Array, lo: jax.Array, n: jax.Array | int) -> jax.Array:
    """An index uniform on ``[0, n)`` from two random words, exact to ``2**-64``.

    Computes ``floor((hi * 2**32 + lo) * n / 2**64)``.

    Args:
        hi, lo: uint32 random words.
        n: positive int (traced or static), at most ``2**31 - 1``. For ``n = 0``
            the result is 0.

    Returns:
        int32 array of the broadcast shape.
    """
    n = jnp.asarray(n).astype(_U32)
    top = _mulhi(hi, n)
    mid = hi * n  # low 32 bits of hi * n
    carry = (mid + _mulhi(lo, n)) < mid
    return (top + carry.astype(_U32)).astype(jnp.int32)


def bernoulli(word: jax.Array, p: jax.Array) -> jax.Array:
    """True with probability ``p`` (to within ``2**-24``) from one random word.

    The top 24 bits of the word are compared with ``p * 2**24`` in float32,
    where both sides are exact, so the event has probability
    ``ceil(p * 2**24) / 2**24``.
    """
    return (word >> 8).astype(jnp.float32) < p * 16777216.0
