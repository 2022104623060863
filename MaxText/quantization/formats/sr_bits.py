"""Stochastic rounding's random bits: one 32-bit word per 4 elements of a row, a function of (key, row, group).

An operand [rows, cols] is rounded in groups of 4 consecutive elements along its contraction axis (cols): group g
of row r takes the word `word(key, r, g)`, and each element of the group a 16-bit draw from that word, laid out as
Blackwell's `cvt.rs.satfinite.e2m1x4.f32` reads its `rbits` operand (`draws_of_word`), so the conversion instruction
consumes the word as it is. The word depends only on the key and the element's (row, group) in the whole operand,
never on how the operand is tiled or sharded: a kernel draws for its tile, a device for its shard, and both get the
bits one device would draw for the whole operand.

The hash is a keyed counter hash of integer multiplies, shifts and xors (any backend, any kernel language): the row
is mixed with the key's first word by a full 32-bit finalizer (murmur3's fmix32 constants), the group scattered by
an odd multiplier (Weyl) and mixed with that row key and the key's second word by a second finalizer, ten integer
operations per word and eight more per row. Two keys give unrelated streams (the finalizers avalanche), not shifted
copies of one: keys for different tensors and steps come from jax.random (split / fold_in), as the recipes derive
them.
"""

import typing

import jax
import jax.numpy as jnp
import numpy as np

GROUP = 4  # elements per 32-bit word (cvt.rs.satfinite.e2m1x4.f32 converts four)
_WEYL = np.uint32(0x9E3779B9)
_M1, _M2 = np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)


class ShardIndex(typing.NamedTuple):
  """Where a shard's elements lie in the whole operand: global row (uint32 [rows]) and column (uint32 [cols]) of
  each of its rows and columns, from which its draws are computed (`draws`) where it lies."""

  rows: jax.Array
  cols: jax.Array


def fmix32(h):
  """A bijective 32-bit finalizer (every input bit flips each output bit with probability ~1/2), uint32 in and out."""
  h = h ^ (h >> np.uint32(16))
  h = h * _M1
  h = h ^ (h >> np.uint32(13))
  h = h * _M2
  return h ^ (h >> np.uint32(16))


def key_words(key):
  """Two uint32 words of a key (typed, or raw uint32 key data): threefry's two words as they are, a longer key's
  words xor-folded into two."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  key = jnp.asarray(key).reshape(-1)
  if key.dtype != jnp.uint32 or key.size < 2 or key.size % 2:
    raise ValueError(f"stochastic rounding needs a PRNG key (uint32 key data), got {key.dtype}{list(key.shape)}")
  words = key.reshape(-1, 2)
  return jax.lax.reduce(words, np.uint32(0), jax.lax.bitwise_xor, (0,)) if words.shape[0] > 1 else words[0]


def row_key(k0, k1, rows):
  """The per-row part of `word`: computed once per row and shared by the row's groups."""
  return fmix32(rows ^ k0) ^ k1


def word_of_row_key(row_keys, groups):
  """word(key, row, group) given row_key(key, row): uint32, broadcasting."""
  return fmix32((groups * _WEYL) ^ row_keys)


def row_mix(row_keys):
  """row_key's contribution to the first xor-shift of `word`'s finalizer: (a ^ r) ^ ((a ^ r) >> 16) is
  (a ^ (a >> 16)) ^ (r ^ (r >> 16)), so the row's half is computed once per row (by whoever computes row_key)."""
  return row_keys ^ (row_keys >> np.uint32(16))


def word_of_row_mix(row_mixes, groups, xor3=lambda a, b, c: a ^ b ^ c):
  """word(key, row, group) given row_mix(row_key(key, row)): uint32, broadcasting. `xor3(a, b, c)` = a ^ b ^ c (a
  kernel's one three-input logic instruction)."""
  scattered = groups * _WEYL
  h = xor3(scattered, scattered >> np.uint32(16), row_mixes)
  h = h * _M1
  h = h ^ (h >> np.uint32(13))
  h = h * _M2
  return h ^ (h >> np.uint32(16))


def word(k0, k1, rows, groups):
  """The random word of group `groups` (element cols 4g..4g+3) of row `rows`, uint32, broadcasting."""
  return word_of_row_key(row_key(k0, k1, rows), groups)


def reverse16(v):
  """The 16 low bits of v in reverse order (bit i -> bit 15 - i), uint32."""
  v = ((v >> np.uint32(1)) & np.uint32(0x5555)) | ((v & np.uint32(0x5555)) << np.uint32(1))
  v = ((v >> np.uint32(2)) & np.uint32(0x3333)) | ((v & np.uint32(0x3333)) << np.uint32(2))
  v = ((v >> np.uint32(4)) & np.uint32(0x0F0F)) | ((v & np.uint32(0x0F0F)) << np.uint32(4))
  return ((v >> np.uint32(8)) & np.uint32(0x00FF)) | ((v & np.uint32(0x00FF)) << np.uint32(8))


def draws_of_word(w, lane):
  """The 16-bit draw (uint32 < 2**16) element `lane` (0..3, its column mod 4) of a group takes from the group's word.

  As cvt.rs.satfinite.e2m1x4.f32 d, {a, b, e, f}, rbits reads rbits with the group's elements as f, e, b, a (lane 0
  in d's low nibble, which is how float4_e2m1fn packs): the pair (e, f) takes the low bytes of rbits' two 16-bit
  halves, (b2 << 8) | b0, and the pair (a, b) the high bytes, (b3 << 8) | b1 (PTX ISA, cvt, the random-bits layout
  for .e2m1x4); within a pair the lower lane takes that value and the upper lane the value bit-reversed."""
  w = jnp.asarray(w, jnp.uint32)
  lane = jnp.asarray(lane, jnp.uint32)
  high_pair = lane >= 2
  shift = jnp.where(high_pair, np.uint32(8), np.uint32(0))
  value = ((w >> shift) & np.uint32(0xFF)) | (((w >> (shift + np.uint32(16))) & np.uint32(0xFF)) << np.uint32(8))
  return jnp.where((lane & np.uint32(1)) == 1, reverse16(value), value)


def draws(key, rows_u32, cols_u32):
  """The 16-bit draws (uint16) of the elements at global rows `rows_u32` [R] and columns `cols_u32` [C] of an
  operand: [R, C], whatever part of the operand those indices pick (a shard's, a tile's)."""
  k0, k1 = key_words(key)
  rows_u32 = jnp.asarray(rows_u32, jnp.uint32)[:, None]
  cols_u32 = jnp.asarray(cols_u32, jnp.uint32)[None, :]
  w = word(k0, k1, rows_u32, cols_u32 >> np.uint32(2))
  return draws_of_word(w, cols_u32 & np.uint32(3)).astype(jnp.uint16)


def operand_draws(key, shape):
  """draws() of a whole operand of `shape` [rows, cols]."""
  rows, cols = shape
  return draws(key, jnp.arange(rows, dtype=jnp.uint32), jnp.arange(cols, dtype=jnp.uint32))
