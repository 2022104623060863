"""threefry.py: jax.random.bits' words recomputed from their index, and when that holds."""

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.quantization.kernels import threefry


def test_words_are_jax_random_bits():
  for key in (jax.random.key(0), jax.random.split(jax.random.key(42))[1], jax.random.fold_in(jax.random.key(7), 3)):
    for n in (1, 77, 4096):
      want = jax.random.bits(key, (n,), jnp.uint32)
      k0, k1 = threefry.key_words(key)
      got = jax.jit(threefry.random_bits_word)(k0, k1, jnp.arange(n, dtype=jnp.uint32))
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  # any index on its own, as a kernel computes it
  key = jax.random.key(9)
  want = jax.random.bits(key, (100_000,), jnp.uint32)
  idx = np.array([0, 1, 65_535, 65_536, 99_999], np.uint32)
  np.testing.assert_array_equal(
    threefry.random_bits_word(*threefry.key_words(key), jnp.asarray(idx)), np.asarray(want)[idx]
  )


def test_reproducible_only_for_partitionable_threefry_keys():
  key = jax.random.key(0)
  assert threefry.reproducible(key, 10)
  assert threefry.reproducible(jax.random.key_data(key), 10)
  assert not threefry.reproducible(None, 10)
  assert not threefry.reproducible(key, threefry.MAX_WORDS + 1)
  assert not threefry.reproducible(jax.random.key(0, impl="rbg"), 10)
  with jax.threefry_partitionable(False):
    assert not threefry.reproducible(key, 10)
