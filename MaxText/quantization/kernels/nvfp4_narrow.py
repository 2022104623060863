"""The NVFP4 quantize pass as the block-scaled GEMM reads it (E2M1 codes two to a byte, E4M3 block scales), and the
RHT amax pass, written so that almost every instruction is one element's arithmetic.

Layout: a program owns [rows, blocks] 16-element blocks and holds them as sixteen position tensors P[0..15] of that
shape (P[i] = element i of every block), each loaded with its own strided load: the operand's transpose (x_t, dy_t,
w) as [blocks, rows] tensors contiguous along the rows (vector loads), the operand as stored as [rows, blocks]
tensors of uint32 bf16 pairs (or f32). Then everything a block needs is arithmetic between tensors of one register
layout: the RHT's butterfly (four adds per element, in the XLA path's stage order, the signs folded into the first
stage's adds; two elements per instruction on Blackwell), the block amax (bf16 values: one packed maximum of
magnitudes per two elements), the block scale (once per block, not once per element), the scaling and the conversion
(ptx.py: the hardware FP4 conversions on Blackwell, their twins elsewhere), the stochastic-rounding words (sr_bits: one
hash per 4 elements, its per-row part computed outside the kernel). No register tensor is reshaped, sliced or
reduced across threads except for 16x16 tiles' row maxima and the transposes of the two output words and the scale
per block.

Same bits as nvfp4.quantize (out="nvfp4") for the 1x16 and 16x16 recipes with and without RHT and SR; one
exception by design: the RHT's 1/4 is applied to the bf16-rounded sums (exact) instead of before their rounding,
which differs only where a sum is below 2**-124 (f32 subnormal results, outside grids.py's guarantee).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from MaxText.quantization.formats import grids, nvfp4, sr_bits
from MaxText.quantization.kernels import pallas_layout, ptx

BLOCK = nvfp4.BLOCK
KERNEL_PREFIX = "quantize_"
_NUM_WARPS = 4
BLOCKS_PER_PROGRAM = 512  # 8192 elements: 64 per thread at 4 warps (fewer address computations per element)
_NAN_WORD = np.uint32(0x88888888)  # eight E2M1 NaNs as XLA's convert writes them (-0)
_RHT_NEGATIVE = tuple(i for i, s in enumerate(nvfp4.RHT_SIGNS) if s < 0)


@dataclasses.dataclass(frozen=True)
class Tiling:
  """A program's [rows, blocks] of an operand [rows, 16 * blocks] (padded), read from x = operand or operand.T."""

  rows: int
  blocks: int
  transpose: bool
  dtype: object
  block_rows: int
  block_blocks: int

  @property
  def grid(self):
    return (self.rows // self.block_rows, self.blocks // self.block_blocks)

  @property
  def shape(self):
    """The position tensors' shape: [rows, blocks], or [blocks, rows] when reading the transpose."""
    t = (self.block_rows, self.block_blocks)
    return t[::-1] if self.transpose else t

  @property
  def packed(self):
    """Stored as is, bf16: loaded as uint32 pairs (positions 2j, 2j+1)."""
    return not self.transpose and self.dtype == jnp.bfloat16

  def view(self, x):
    if self.transpose:
      return x.reshape(self.blocks, BLOCK, self.rows)
    if self.packed:
      return jax.lax.bitcast_convert_type(x.reshape(self.rows, self.blocks, BLOCK // 2, 2), jnp.uint32)
    return x.reshape(self.rows, self.blocks, BLOCK)

  def in_spec(self):
    if self.transpose:
      return pl.BlockSpec((self.block_blocks, BLOCK, self.block_rows), lambda i, j: (j, 0, i))
    return pl.BlockSpec((self.block_rows, self.block_blocks, 8 if self.packed else BLOCK), lambda i, j: (i, j, 0))

  def load(self, x_ref, isa=ptx.Isa(False, False)):
    """The sixteen position tensors, f32 (`isa`: the instructions bf16 pairs are unpacked with)."""
    if self.transpose:
      return [x_ref[:, i, :].astype(jnp.float32) for i in range(BLOCK)]
    if self.packed:
      return [v for pair in self.load_pairs(x_ref) for v in ptx.bf16x2_unpack(isa, pair)]
    return [x_ref[:, :, i].astype(jnp.float32) for i in range(BLOCK)]

  def load_pairs(self, x_ref):
    """`packed` only: the eight uint32 tensors of bf16 pairs (positions 2j, 2j+1) as stored."""
    return [x_ref[:, :, j] for j in range(BLOCK // 2)]

  def to_stored(self, t):
    """A per-block tensor in the outputs' [rows, blocks] order."""
    return t.T if self.transpose else t

  def row_block_iota(self):
    """(row index within the program, block index within the program) tensors, uint32, of `shape`."""
    axes = (1, 0) if self.transpose else (0, 1)
    return tuple(jax.lax.broadcasted_iota(jnp.uint32, self.shape, a) for a in axes)


def make_tiling(rows, blocks, *, transpose, dtype, tile_rows=1):
  """Tiles of about BLOCKS_PER_PROGRAM blocks; rows a multiple of tile_rows (16x16 tiles stay whole)."""
  if transpose:
    block_rows = pallas_layout.pow2_divisor(rows, 128)
    block_blocks = pallas_layout.pow2_divisor(blocks, max(1, BLOCKS_PER_PROGRAM // block_rows))
  else:
    block_blocks = pallas_layout.pow2_divisor(blocks, 8)
    block_rows = pallas_layout.pow2_divisor(rows, max(tile_rows, BLOCKS_PER_PROGRAM // block_blocks))
  if block_rows % tile_rows:
    raise ValueError(f"nvfp4 kernel: rows {rows} are not a multiple of the tile's {tile_rows}")
  return Tiling(rows, blocks, transpose, jnp.dtype(dtype), block_rows, block_blocks)


# ---------------------------------------------------------------- the per-element arithmetic


def hadamard16_pairs(isa, p):
  """nvfp4.hadamard16 of the blocks whose positions are p[0..15], without its final 1/4: round_to_bf16(H16 @ (signs *
  x)) as eight packed bf16 pairs (positions 2j, 2j+1; uint32), for the caller to scale by 1/4 exactly. The butterfly
  runs over index bits 3, 2, 1, 0, as the XLA path."""
  h = list(p)
  for i in range(BLOCK // 2):  # bit 3, the signs folded in
    negative = (i in _RHT_NEGATIVE, i + 8 in _RHT_NEGATIVE)
    h[i], h[i + 8] = _signed_sum(p[i], p[i + 8], *negative), _signed_sum(p[i], p[i + 8], negative[0], not negative[1])
  for bit in (4, 2, 1):
    for i in range(BLOCK):
      if not i & bit:
        h[i], h[i | bit] = ptx.butterfly_x2(isa, h[i], h[i | bit])
  return [ptx.bf16x2_rn(isa, h[i], h[i + 1]) for i in range(0, BLOCK, 2)]


def _signed_sum(a, b, negate_a, negate_b):
  """(-a if negate_a else a) + (-b if negate_b else b) with IEEE's bits (signed zeros included) in one add where one
  term is negated (x + (-y) is x - y); both negated takes the exact product a * -1 (the XLA path's sign) first."""
  if negate_a and negate_b:
    return a * np.float32(-1.0) - b
  if negate_a:
    return b - a
  return a - b if negate_b else a + b


def bf16_inputs(isa, tiling: Tiling, x_ref):
  """The sixteen position tensors rounded to bf16 (the XLA path rounds the RHT's input), f32."""
  return rounded_to_bf16(isa, tiling, tiling.load(x_ref, isa))


def rounded_to_bf16(isa, tiling: Tiling, p):
  """Position tensors p (f32) rounded to bf16: p itself where the operand is bf16."""
  if tiling.dtype == jnp.bfloat16:
    return p
  return [v for i in range(0, BLOCK, 2) for v in ptx.bf16_rn_pair(isa, p[i], p[i + 1])]


def positions_and_amax_bits(isa, tiling: Tiling, x_ref, rht):
  """(the sixteen f32 position tensors to convert: the RHT's unscaled if rht, else the operand's; the blocks' max
  magnitude bits): from packed bf16 pairs where the values are bf16 (two magnitudes per maximum)."""
  if rht:
    pairs = hadamard16_pairs(isa, bf16_inputs(isa, tiling, x_ref))
  elif tiling.packed:
    pairs = tiling.load_pairs(x_ref)
  else:
    p = tiling.load(x_ref, isa)
    return p, magnitude_max_bits(p)
  return [v for pair in pairs for v in ptx.bf16x2_unpack(isa, pair)], ptx.bf16x2_magnitude_max_bits(isa, pairs)


def magnitude_max_bits(p):
  """max |p[i]| over the positions as uint32 magnitude bits (NaN above inf: an integer max propagates it)."""
  m = grids.f32_bits(p[0]) & np.uint32(0x7FFFFFFF)
  for v in p[1:]:
    m = jnp.maximum(m, grids.f32_bits(v) & np.uint32(0x7FFFFFFF))
  return m


def tile_max(bits, tiling: Tiling):
  """16x16 tiles: every row of a tile gets the tile's block maximum (rows are axis 0, or axis 1 when transposed)."""
  a, b = bits.shape
  if tiling.transpose:
    t = jnp.max(bits.reshape(a, b // BLOCK, BLOCK), axis=2, keepdims=True)
    return jnp.broadcast_to(t, (a, b // BLOCK, BLOCK)).reshape(a, b)
  t = jnp.max(bits.reshape(a // BLOCK, BLOCK, b), axis=1, keepdims=True)
  return jnp.broadcast_to(t, (a // BLOCK, BLOCK, b)).reshape(a, b)


def block_scales(isa, block_amax, s_enc, s_dec):
  """(E4M3 code, encode scale) per block: decode = E4M3(amax_b * S_enc / 6), encode = 1 / (decode / S_enc) capped at
  FLT_MAX, NaN kept (nvfp4._map_to_six)."""
  code, decode = ptx.e4m3_rn(isa, block_amax * (s_enc * np.float32(1.0 / nvfp4.E2M1_MAX)))
  encode = ptx.rcp_rn(isa, decode * s_dec)
  encode = jnp.where(jnp.isnan(encode) | (encode < grids.FLT_MAX), encode, np.float32(grids.FLT_MAX))
  return code, encode


def sr_words(isa, mixes_ref, blocks_ref, tiling: Tiling):
  """The four random words of every block (groups 4b .. 4b + 3 of its row), sr_bits.word, from its row's
  sr_bits.row_mix (computed outside the kernel, once per row)."""
  mixes = mixes_ref[...]
  blocks = blocks_ref[...]
  if tiling.transpose:
    mixes, blocks = mixes[None, :], blocks[:, None]
  else:
    mixes, blocks = mixes[:, None], blocks[None, :]
  groups = blocks * np.uint32(4)
  xor3 = functools.partial(ptx.xor3, isa)
  return [sr_bits.word_of_row_mix(mixes, groups + np.uint32(q), xor3) for q in range(4)]


def quantize_body(isa, scalars_ref, mixes_ref, blocks_ref, x_ref, words_ref, codes_ref, *, tiling, rht, tile_rows):
  """One program: the blocks' packed E2M1 words and E4M3 scale codes; scalars_ref = (S_enc, 1/S_enc); with stochastic
  rounding, mixes_ref / blocks_ref = the program's rows' sr_bits.row_mix and blocks' global indices."""
  p, bits = positions_and_amax_bits(isa, tiling, x_ref, rht)
  if tile_rows == BLOCK:
    bits = tile_max(bits, tiling)
  block_amax = grids.f32_from_bits(bits)
  if rht:
    block_amax = block_amax * np.float32(0.25)  # exact: the bf16 sums' 1/4
  code, encode = block_scales(isa, block_amax, scalars_ref[0], scalars_ref[1])
  nan = jnp.isnan(encode)
  scale = encode * np.float32(0.25) if rht else encode
  values = [ptx.paired(isa, "mul", v, scale) for v in p]
  if mixes_ref is None:
    words = [ptx.e2m1_word_rn(isa, values[h * 8 : h * 8 + 8]) for h in range(2)]
  else:
    w = sr_words(isa, mixes_ref, blocks_ref, tiling)
    words = [ptx.e2m1_word_rs(isa, values[h * 8 : h * 8 + 8], w[2 * h : 2 * h + 2]) for h in range(2)]
  for h, word in enumerate(words):
    words_ref[:, :, h] = tiling.to_stored(jnp.where(nan, _NAN_WORD, word))
  codes_ref[...] = tiling.to_stored(code).astype(jnp.uint8)


def amax_rht_body(isa, x_ref, rht_ref, plain_ref, *, tiling):
  """One program's max |RHT(x)| (of the bf16 sums; the caller applies the 1/4) and max |x|, as magnitude bits."""
  p = tiling.load(x_ref, isa)
  pairs = hadamard16_pairs(isa, rounded_to_bf16(isa, tiling, p))
  rht_ref[...] = jnp.max(ptx.bf16x2_magnitude_max_bits(isa, pairs)).reshape(1, 1, 1)
  plain_ref[...] = jnp.max(magnitude_max_bits(p)).reshape(1, 1, 1)


# ---------------------------------------------------------------- the calls


def _params():
  return pl_triton.CompilerParams(num_warps=_NUM_WARPS, num_stages=1)


def amax_rht(x_padded, *, transpose, interpret):
  """(max |nvfp4.hadamard16(operand)|, max |operand|) (f32) of the operand x_padded (.T if transpose), rows a multiple
  of 16: one read for the RHT'd operand's global scale and the plain one's (the same operand's other role)."""
  rows, cols = x_padded.shape[::-1] if transpose else x_padded.shape
  tiling = make_tiling(rows, cols // BLOCK, transpose=transpose, dtype=x_padded.dtype)
  isa = ptx.isa_for(interpret)
  rht_bits, plain_bits = pl.pallas_call(
    functools.partial(amax_rht_body, isa, tiling=tiling),
    out_shape=(jax.ShapeDtypeStruct((1, *tiling.grid), jnp.uint32),) * 2,
    grid=tiling.grid,
    in_specs=[tiling.in_spec()],
    out_specs=(pl.BlockSpec((1, 1, 1), lambda i, j: (0, i, j)),) * 2,
    compiler_params=_params(),
    interpret=interpret,
    name=KERNEL_PREFIX + "amax_rht",
  )(tiling.view(x_padded))
  return grids.f32_from_bits(jnp.max(rht_bits)) * np.float32(0.25), grids.f32_from_bits(jnp.max(plain_bits))


def quantize(x_padded, s_enc, *, transpose, tile_rows, rht, key, sr_rows, sr_blocks, interpret, name):
  """(packed E2M1 codes uint8 [rows, cols / 2], E4M3 scale codes uint8 [rows, cols / 16]) of the operand x_padded
  (.T if transpose) for the global scale s_enc; with `key`, stochastic rounding with the draws of the operand's rows
  `sr_rows` (uint32 [rows]) and 16-element blocks `sr_blocks` (uint32 [cols / 16]) in the whole operand."""
  rows, cols = x_padded.shape[::-1] if transpose else x_padded.shape
  tiling = make_tiling(rows, cols // BLOCK, transpose=transpose, dtype=x_padded.dtype, tile_rows=tile_rows)
  isa = ptx.isa_for(interpret)
  scalars = jnp.stack([s_enc, grids.div_rn(1.0, s_enc)])
  inputs, specs = [scalars], [pl.BlockSpec((2,), lambda i, j: (0,))]
  if key is not None:
    k0, k1 = sr_bits.key_words(key)
    inputs += [sr_bits.row_mix(sr_bits.row_key(k0, k1, sr_rows)), sr_blocks]
    specs += [
      pl.BlockSpec((tiling.block_rows,), lambda i, j: (i,)),
      pl.BlockSpec((tiling.block_blocks,), lambda i, j: (j,)),
    ]
  br, bb = tiling.block_rows, tiling.block_blocks

  def body(*refs):
    scalars_ref, *rest = refs
    sr_refs = rest[:2] if key is not None else (None, None)
    x_ref, words_ref, codes_ref = rest[-3:]
    quantize_body(isa, scalars_ref, *sr_refs, x_ref, words_ref, codes_ref, tiling=tiling, rht=rht, tile_rows=tile_rows)

  words, codes = pl.pallas_call(
    body,
    out_shape=(
      jax.ShapeDtypeStruct((rows, cols // BLOCK, 2), jnp.uint32),
      jax.ShapeDtypeStruct((rows, cols // BLOCK), jnp.uint8),
    ),
    grid=tiling.grid,
    in_specs=[*specs, tiling.in_spec()],
    out_specs=(
      pl.BlockSpec((br, bb, 2), lambda i, j: (i, j, 0)),
      pl.BlockSpec((br, bb), lambda i, j: (i, j)),
    ),
    compiler_params=_params(),
    interpret=interpret,
    name=KERNEL_PREFIX + name,
  )(*inputs, tiling.view(x_padded))
  packed = jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(rows, cols // 2)
  return packed, codes
