"""The words of `jax.random.bits(key, (n,), uint32)` recomputed from their index, for kernels that draw in place.

With `jax_threefry_partitionable` (the default since jax 0.5, so in 0.10 and 0.11) word i of a 1-D draw is
threefry2x32(key, (hi(i), lo(i))) with the two output words xor-ed, where (hi, lo) are the 32-bit halves
of the 64-bit flat index: `jax._src.random.threefry2x32._threefry_random_bits_partitionable` over
`prng.iota_2x32_shape`. The hash is integer adds, rotations and xors, so any backend, and any kernel
language that has them, reproduces the same bits. Without the flag jax draws words another way, and
with another PRNG implementation (rbg) they are not threefry at all: `reproducible` says when this applies.
"""

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)
MAX_WORDS = 2**32  # hi(i) = 0 below this: kernels pass only the low counter


def _rotate_left(v, r):
  return (v << np.uint32(r)) | (v >> np.uint32(32 - r))


def threefry2x32(k0, k1, c0, c1):
  """Threefry-2x32 with 20 rounds of key (k0, k1) on counters (c0, c1), all uint32; as jax's unrolled lowering."""
  ks = (k0, k1, k0 ^ k1 ^ _PARITY)
  x0, x1 = c0 + ks[0], c1 + ks[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x0 = x0 + x1
      x1 = x0 ^ _rotate_left(x1, r)
    x0 = x0 + ks[(i + 1) % 3]
    x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x0, x1


def random_bits_word(k0, k1, index):
  """Word `index` (uint32, < MAX_WORDS) of jax.random.bits(key, (n,), jnp.uint32) for key data (k0, k1)."""
  x0, x1 = threefry2x32(k0, k1, jnp.zeros_like(index), index)
  return x0 ^ x1


def key_words(key):
  """The two uint32 words of a threefry key (typed or raw uint32[2])."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  return key.astype(jnp.uint32).reshape(2)


def reproducible(key, words):
  """Whether random_bits_word reproduces jax.random.bits(key, (words,), uint32) under the current config."""
  if key is None or not jax.config.jax_threefry_partitionable or words > MAX_WORDS:
    return False
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return str(jax.random.key_impl(key)) == "threefry2x32"
  return key.dtype == jnp.uint32 and key.shape == (2,)
