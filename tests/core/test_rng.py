"""Random words and integer draws: exactness of the arithmetic and basic statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxqueue.core.rng import BLOCK, block_keys, replica_keys, step_words, uniform_index


def test_uniform_index_is_the_exact_64_bit_product():
    rng = np.random.default_rng(0)
    hi = rng.integers(0, 2**32, 4000, dtype=np.uint64)
    lo = rng.integers(0, 2**32, 4000, dtype=np.uint64)
    edge = np.array([0, 1, 2**31, 2**32 - 1], dtype=np.uint64)
    hi = np.concatenate([hi, np.repeat(edge, 4)])
    lo = np.concatenate([lo, np.tile(edge, 4)])
    for n in (1, 2, 3, 1000, 999_983, 10**6, 2**31 - 1):
        got = np.asarray(uniform_index(jnp.asarray(hi, jnp.uint32), jnp.asarray(lo, jnp.uint32), n))
        want = [((int(h) << 32 | int(lo_)) * n) >> 64 for h, lo_ in zip(hi, lo)]
        np.testing.assert_array_equal(got, np.asarray(want))


def _words(n_blocks=64, replica=0, n_words=4):
    rkey = replica_keys(123, np.array([replica]))[0]

    def block(b):
        bkey = block_keys(rkey, b)
        return jax.vmap(lambda t: step_words(bkey, t, n_words))(jnp.arange(BLOCK))

    return np.asarray(jax.jit(jax.vmap(block))(jnp.arange(n_blocks))).reshape(-1)


def test_words_are_uniform_and_serially_uncorrelated():
    w = _words()  # 65536 words
    # chi-square on the top 8 bits: 255 degrees of freedom, 99.9% point 330.5
    counts = np.bincount(w >> 24, minlength=256)
    expected = w.size / 256
    assert ((counts - expected) ** 2 / expected).sum() < 330.5
    # and on the low 8 bits
    counts = np.bincount(w & 255, minlength=256)
    assert ((counts - expected) ** 2 / expected).sum() < 330.5
    # lag-1 correlation of uniforms: sd 1/sqrt(n); bound at 4.4 sd (99.999%)
    u = w / 2.0**32
    r = np.corrcoef(u[:-1], u[1:])[0, 1]
    assert abs(r) < 4.4 / np.sqrt(u.size)


def test_replica_streams_differ_and_are_uncorrelated():
    a, b = _words(replica=0, n_blocks=16), _words(replica=1, n_blocks=16)
    assert np.mean(a == b) < 1e-3
    r = np.corrcoef(a / 2.0**32, b / 2.0**32)[0, 1]
    assert abs(r) < 4.4 / np.sqrt(a.size)


def test_replica_keys_are_the_positional_fold_ins():
    """fold_in(key, i) per replica, and fold_in(fold_in(key, w), i) with stream words."""
    key = jax.random.key(5)
    got = np.asarray(replica_keys(5, np.array([0, 7])))
    want = np.stack([np.asarray(jax.random.key_data(jax.random.fold_in(key, i))) for i in (0, 7)])
    np.testing.assert_array_equal(got, want)
    got = np.asarray(replica_keys(5, np.array([3]), np.array([99])))[0]
    want = jax.random.key_data(jax.random.fold_in(jax.random.fold_in(key, 99), 3))
    np.testing.assert_array_equal(got, np.asarray(want))


def test_every_63_bit_seed_has_its_own_key():
    """Seeds are not reduced mod 2**32: the key's words are the seed's high and low 32 bits,
    ``jax.random.key(seed)`` with 64-bit integers (and below 2**32 without them)."""
    seeds = [0, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1]
    keys = [np.asarray(replica_keys(s, np.array([0, 1]))) for s in seeds]
    assert len({k.tobytes() for k in keys}) == len(seeds)
    with jax.enable_x64(True):
        for seed, got in zip(seeds, keys):
            want = jax.random.key_data(jax.random.fold_in(jax.random.key(seed), 1))
            np.testing.assert_array_equal(got[1], np.asarray(want))
    for bad in (-1, 2**63):
        with pytest.raises(ValueError, match=f"seed={bad} is out of range"):
            replica_keys(bad, np.array([0]))


def _jax_block_key(replica_key, block, block_hi=None):
    """The block key through jax.random (what block_keys writes out)."""
    k = jax.random.fold_in(jax.random.wrap_key_data(replica_key), block)
    if block_hi is not None:
        later = jax.random.fold_in(k, block_hi)
        k = jax.random.wrap_key_data(
            jnp.where(block_hi == 0, jax.random.key_data(k), jax.random.key_data(later))
        )
    return jax.random.bits(k, (2,), jnp.uint32)


def test_block_keys_are_jax_randoms_fold_ins_and_bits():
    """The written-out Threefry-2x32 gives jax.random's block keys bit for bit,
    low block words alone and with a high word (zero or not), at the edges too."""
    gen = np.random.default_rng(4)
    keys = replica_keys(9, np.arange(600))
    lo = gen.integers(0, 2**32, 600, dtype=np.uint64)
    lo[:4] = [0, 1, 2**31, 2**32 - 1]
    hi = np.where(np.arange(600) % 3 == 0, 0, gen.integers(0, 2**32, 600, dtype=np.uint64))
    hi[4:8] = [1, 2**31, 2**32 - 1, 0]
    lo, hi = jnp.asarray(lo.astype(np.uint32)), jnp.asarray(hi.astype(np.uint32))
    for args in ((keys, lo), (keys, lo, hi)):
        got = jax.jit(jax.vmap(block_keys))(*args)
        want = jax.jit(jax.vmap(_jax_block_key))(*args)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
