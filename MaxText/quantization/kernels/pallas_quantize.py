"""Pallas Triton kernels for the GEMM operand quantizers (NVFP4, per-tensor FP8, MX): bits equal to the XLA path's.

Each operand is read once by a per-tensor amax pass (NVFP4, FP8 current scaling; with the RHT for the
wgrad operands, as TE's amax kernel does), and once more by the quantize pass, which writes what
the GEMM reads (narrow codes, bf16 block-scaled values, or f8) and nothing else: the RHT, block amaxes, E4M3 / E8M0
scales, rounding and the stochastic-rounding draws all stay in registers. MX needs no global amax:
one pass. Transposed operands (x_t, dy_t, the weight) are read from the untransposed array.

Same bits as `nvfp4.quantize` / `quantize_block_scaled`, `fp8.quantize` / `mx.quantize`. The narrow NVFP4 pass (what
the xla backend's GEMM reads) is nvfp4_narrow.py's kernel, built for instruction count (the hardware FP4 conversions
on Blackwell); the block-scaled output and Four Over Six run kernel_math.py's exact rebuild of the XLA path's
arithmetic. The stochastic-rounding draws are sr_bits.py's, computed from each element's row and column.
On CPU the kernels run only in Pallas interpret mode (`interpret=True`), which is how they are tested.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from MaxText.quantization.formats import four_over_six as fos
from MaxText.quantization.formats import grids
from MaxText.quantization.kernels import kernel_math as km
from MaxText.quantization.formats import nvfp4, sr_bits
from MaxText.quantization.kernels import pallas_layout
from MaxText.quantization.kernels import nvfp4_narrow as nvfp4_narrow_kernel

NVFP4_BLOCK = nvfp4.BLOCK
MX_BLOCK = 32
KERNEL_PREFIX = "quantize_"  # every kernel's name starts with it (the custom calls carry it)
_NUM_WARPS = 4


def _call(kernel, layout, out_dtype, name, interpret, scalars=()):
  """pallas_call of kernel(*scalar_refs, x_ref, o_ref) over layout's grid, Triton compiler params."""
  scalar_specs = [pl.BlockSpec(s.shape, lambda i, j: (0,)) for s in scalars]
  return pl.pallas_call(
    kernel,
    out_shape=layout.out_shape(out_dtype),
    grid=layout.grid,
    in_specs=[*scalar_specs, layout.in_spec()],
    out_specs=layout.out_spec(),
    compiler_params=pl_triton.CompilerParams(num_warps=_NUM_WARPS, num_stages=1),
    interpret=interpret,
    name=KERNEL_PREFIX + name,
  )


def _finish(out_3d, layout, rows, cols):
  return out_3d.reshape(layout.rows, layout.cols)[:rows, :cols]


# ---------------------------------------------------------------- amax


def _amax_kernel(x_ref, o_ref, *, layout):
  o_ref[...] = km.amax_bits(layout.load(x_ref)).reshape(1, 1, 1)


def amax_padded(x_padded, *, transpose, rht, interpret):
  """max |operand| (of its RHT if rht) as f32, from per-program maxima (uint32 magnitude bits) reduced by XLA."""
  if rht:  # the butterfly runs along the operand's blocks: read as the quantize pass does
    return nvfp4_narrow_kernel.amax_rht(x_padded, transpose=transpose, interpret=interpret)[0]
  stored_rows, stored_cols = x_padded.shape  # layout-free: read the stored array as it is
  layout = pallas_layout.make_layout(stored_rows, stored_cols, transpose=False)
  grid = layout.grid
  partial = pl.pallas_call(
    functools.partial(_amax_kernel, layout=layout),
    out_shape=jax.ShapeDtypeStruct((1, *grid), jnp.uint32),
    grid=grid,
    in_specs=[layout.in_spec()],
    out_specs=pl.BlockSpec((1, 1, 1), lambda i, j: (0, i, j)),
    compiler_params=pl_triton.CompilerParams(num_warps=_NUM_WARPS, num_stages=1),
    interpret=interpret,
    name=KERNEL_PREFIX + "amax",
  )(layout.view(x_padded))
  return grids.f32_from_bits(jnp.max(partial))


def nvfp4_rht_pass_amax(x, *, transpose, interpret=False):
  """max |operand| (f32) from the RHT amax pass of the operand x (x.T if transpose), padded as nvfp4_narrow pads it:
  for an operand whose other role is quantized with the RHT (x_t, dy_t), whose nvfp4_narrow runs the same pass on
  the same array, the one call XLA keeps of the two (common subexpressions) gives both amaxes from one read."""
  padded = pallas_layout.pad_operand(x, transpose=transpose, row_multiple=1, col_multiple=NVFP4_BLOCK)
  return nvfp4_narrow_kernel.amax_rht(padded, transpose=transpose, interpret=interpret)[1]


# ---------------------------------------------------------------- NVFP4


def _sr_uniforms(layout, key_ref, operand_cols):
  """grids.uniform16's thresholds for this tile, [1, block_rows, block_cols]: sr_bits' draws of its (row, col)."""
  del operand_cols  # the draws depend on the element's row and column only
  row0, col0 = layout.rows_cols_origin()
  rows = row0 + jax.lax.broadcasted_iota(jnp.uint32, layout.tile, 1)
  cols = col0 + jax.lax.broadcasted_iota(jnp.uint32, layout.tile, 2)
  words = sr_bits.word(key_ref[0], key_ref[1], rows, cols >> 2)
  return grids.uniform_from_draws(sr_bits.draws_of_word(words, cols & 3))


def _tile_amax_bits(block_bits):
  """16x16 tiles: every row of a tile gets the tile's max, [pair, rows, blocks] -> same shape."""
  p, rows, blocks = block_bits.shape
  tiles = jnp.max(block_bits.reshape(p, rows // NVFP4_BLOCK, NVFP4_BLOCK, blocks), axis=2, keepdims=True)
  return jnp.broadcast_to(tiles, (p, rows // NVFP4_BLOCK, NVFP4_BLOCK, blocks)).reshape(p, rows, blocks)


def _nvfp4_kernel(scales_ref, *refs, layout, tile_rows, rht, sr, operand_cols, four_over_six):
  """nvfp4._quantize_jit(out="block_scaled") on one tile; scales_ref = (S_enc, 1/S_enc, amax)."""
  key_ref, x_ref, o_ref = refs if sr else (None, *refs)
  values, decode = _nvfp4_tile(scales_ref, key_ref, x_ref, layout, tile_rows, rht, sr, operand_cols, four_over_six)
  p, rows, cols = o_ref.shape
  o_ref[...] = (values * decode[..., None]).reshape(p, rows, cols).astype(o_ref.dtype)


def _nvfp4_narrow_kernel(scales_ref, *refs, layout, tile_rows, rht, sr, operand_cols, four_over_six):
  """nvfp4._quantize_jit(out="nvfp4") on one tile, as the block-scaled GEMM reads it: E2M1 codes two to a byte (element
  2i in the low nibble, as XLA packs float4_e2m1fn) and the E4M3 block scales' codes."""
  key_ref, x_ref, values_ref, scales_out_ref = refs if sr else (None, *refs)
  values, decode = _nvfp4_tile(scales_ref, key_ref, x_ref, layout, tile_rows, rht, sr, operand_cols, four_over_six)
  p, rows, half_cols = values_ref.shape
  low, high = jnp.split(km.e2m1_bits(values).reshape(p, rows, half_cols, 2), 2, axis=-1)
  values_ref[...] = (low | (high << 4))[..., 0].astype(jnp.uint8)
  scales_out_ref[...] = km.fp8_bits(decode, grids.E4M3).astype(jnp.uint8)


def _nvfp4_tile(scales_ref, key_ref, x_ref, layout, tile_rows, rht, sr, operand_cols, four_over_six):
  """(E2M1 values [pair, rows, blocks, 16], E4M3 decode scales [pair, rows, blocks]) of one tile, as f32."""
  x = layout.load(x_ref)
  p, rows, cols = x.shape
  x = x.reshape(p, rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
  if rht:
    x = km.hadamard16(x)
  block_bits = km.amax_bits(x, axis=-1)
  if tile_rows == NVFP4_BLOCK:
    block_bits = _tile_amax_bits(block_bits)
  s_enc, s_dec, amax = scales_ref[0], scales_ref[1], scales_ref[2]
  u = _sr_uniforms(layout, key_ref, operand_cols).reshape(x.shape) if sr else None
  block_amax = grids.f32_from_bits(block_bits)
  if four_over_six:
    decode, encode = _four_over_six_choice(x, block_amax, amax, s_enc, s_dec, u, tile_rows, four_over_six)
  else:
    decode = km.minimum(block_amax * (s_enc * (1.0 / nvfp4.E2M1_MAX)), grids.FLT_MAX)
    decode = km.round_to_grid(km.clip(decode, -nvfp4.E4M3_MAX, nvfp4.E4M3_MAX), grids.E4M3)
    encode = km.minimum(grids.div_rn(1.0, decode * s_dec), grids.FLT_MAX)
  scaled = km.clip(x * encode[..., None], -nvfp4.E2M1_MAX, nvfp4.E2M1_MAX)
  values = km.round_to_grid(scaled, grids.E2M1) if u is None else km.stochastic_round_to_grid(scaled, grids.E2M1, u)
  return values, decode


def _four_over_six_choice(x, block_amax, amax, s_enc, s_dec, u, tile_rows, mode):
  """(decode, encode) [pair, rows, blocks] of the Four Over Six candidate kept per block (or 16x16 tile): both
  candidates' scales, errors and the choice as nvfp4._four_over_six computes them (four_over_six.py's arithmetic
  with kernel_math's NaN-propagating minimum and rounding), all in registers."""
  abs_x = km.abs_(x)
  zero = grids.f32_bits(amax) >> 31  # amax's sign bit (0) from memory: Triton can't fold it (FMA-safe squares)
  candidates = []
  for m in (1.0, 1.5):  # map-to-6, map-to-4
    decode, encode, d0, d1 = fos.scales_and_factors(
      block_amax, m, amax, s_enc, s_dec, minimum=km.minimum, round_to_grid=km.round_to_grid
    )
    terms = fos.element_terms(
      abs_x,
      *(a[..., None] for a in (decode, encode, d0, d1)),
      amax,
      zero,
      mode,
      u,
      minimum=km.minimum,
      round_half_even=km.round_half_even,
    )
    errors = km.sum_in_order(terms)  # [pair, rows, blocks]
    if tile_rows == NVFP4_BLOCK:
      errors = _tile_errors(errors)
    candidates.append((decode, encode, errors))
  (decode_6, encode_6, errors_6), (decode_4, encode_4, errors_4) = candidates
  use_4 = errors_4 < errors_6  # ties and NaN errors keep 6
  return jnp.where(use_4, decode_4, decode_6), jnp.where(use_4, encode_4, encode_6)


def _tile_errors(errors):
  """[pair, rows, blocks] row errors -> every row of a 16x16 tile gets the tile's error (four_over_six.tile_errors)."""
  p, rows, blocks = errors.shape
  tiles = km.tile_sums(errors.reshape(p, rows // NVFP4_BLOCK, NVFP4_BLOCK, blocks))  # [pair, tiles, 1, blocks]
  return jnp.broadcast_to(tiles, (p, rows // NVFP4_BLOCK, NVFP4_BLOCK, blocks)).reshape(p, rows, blocks)


def nvfp4_supported(shape, *, tile=(1, 16), stochastic_rounding=False, key=None):
  """Whether the kernels cover this operand: any non-empty one; stochastic rounding needs 1x16 blocks and a key."""
  rows, cols = shape
  if rows * cols == 0:
    return False
  return not stochastic_rounding or (tile[0] == 1 and key is not None)


def nvfp4_block_scaled(
  x,
  *,
  tile=(1, 16),
  rht=False,
  stochastic_rounding=False,
  key=None,
  four_over_six=None,
  transpose=False,
  interpret=False,
  amax_axes=(),
):
  """nvfp4.quantize_block_scaled(x.T if transpose else x, ...): (bf16 values * block scales [R, C], amax).
  For operands nvfp4_supported covers; four_over_six: None, "mse" or "mae" (Four Over Six in the same kernel).
  `amax_axes`: x is a shard of the operand (inside a partitioned GEMM): the amax is the largest over these mesh axes."""
  options = dict(tile=tile, rht=rht, stochastic_rounding=stochastic_rounding, key=key, four_over_six=four_over_six)
  call, layout, rows, cols, amax = _nvfp4_call(
    x, _nvfp4_kernel, transpose, interpret, "", amax_axes=amax_axes, **options
  )
  out = call([layout.out_shape(jnp.bfloat16)], [layout.out_spec()])[0]
  return _finish(out, layout, rows, cols), amax


def nvfp4_narrow(
  x,
  *,
  tile=(1, 16),
  rht=False,
  stochastic_rounding=False,
  key=None,
  four_over_six=None,
  transpose=False,
  interpret=False,
  amax=None,
  amax_axes=(),
  draws=None,
):
  """nvfp4.quantize(x.T if transpose else x, ...) as the block-scaled GEMM reads it: (E2M1 values [R, C] in
  float4_e2m1fn, E4M3 block scales [R, ceil(C/16)] in float8_e4m3fn, amax); the same bits as the XLA path, written
  once (half a byte and a sixteenth of a byte per element) by one kernel after the amax pass. `amax`: max |x| (of its
  RHT if rht) computed by the caller, exactly grids.abs_max's, instead of the amax pass. `amax_axes`: x is a shard of
  the operand (inside a partitioned GEMM): the amax, the pass's or the caller's (x's own), is the largest over these
  mesh axes. `draws`: with stochastic rounding, where the shard's elements lie in the whole operand
  (sr_bits.ShardIndex, the operand's rows and columns), so that it draws the whole operand's bits."""
  rows, cols = x.shape[::-1] if transpose else x.shape
  _check(rows, cols, tile, rht, stochastic_rounding, key)
  if four_over_six or (draws is not None and not isinstance(draws, sr_bits.ShardIndex)):
    if draws is not None:
      raise ValueError("nvfp4 kernel: Four Over Six draws for the array it is given; use the XLA path for a shard")
    return _nvfp4_narrow_4over6(
      x, tile, rht, stochastic_rounding, key, four_over_six, transpose, interpret, amax, amax_axes
    )
  padded = pallas_layout.pad_operand(x, transpose=transpose, row_multiple=tile[0], col_multiple=NVFP4_BLOCK)
  if amax is None:
    amax = amax_padded(padded, transpose=transpose, rht=rht, interpret=interpret)
  amax = grids.max_across(amax, amax_axes)
  s_enc = nvfp4.global_encode_scale(amax)
  sr_rows = sr_blocks = None
  if stochastic_rounding:
    sr_rows, sr_blocks = _sr_index(padded.shape[::-1] if transpose else padded.shape, draws)
  packed, codes = nvfp4_narrow_kernel.quantize(
    padded,
    s_enc,
    transpose=transpose,
    tile_rows=tile[0],
    rht=rht,
    key=key if stochastic_rounding else None,
    sr_rows=sr_rows,
    sr_blocks=sr_blocks,
    interpret=interpret,
    name=_kernel_name(tile[0], rht, stochastic_rounding, None, "_narrow"),
  )
  padded_rows, padded_cols = packed.shape[0], packed.shape[1] * 2
  values = jax.lax.bitcast_convert_type(packed, jnp.float4_e2m1fn).reshape(padded_rows, padded_cols)
  scales = jax.lax.bitcast_convert_type(codes, jnp.float8_e4m3fn)
  return values[:rows, :cols], scales[:rows, : -(-cols // NVFP4_BLOCK)], amax


def _sr_index(padded_shape, draws):
  """(global row of each row, global 16-block of each block) of the padded operand: its own, or a shard's."""
  rows, cols = padded_shape
  if draws is None:
    return jnp.arange(rows, dtype=jnp.uint32), jnp.arange(cols // NVFP4_BLOCK, dtype=jnp.uint32)
  if draws.rows.shape[0] != rows or draws.cols.shape[0] != cols:
    raise ValueError(
      f"nvfp4 kernel: a shard's index ({draws.rows.shape[0]} rows, {draws.cols.shape[0]} cols) must cover the "
      f"operand {padded_shape} whole, its columns in whole 16-element blocks"
    )
  return draws.rows.astype(jnp.uint32), draws.cols[::NVFP4_BLOCK].astype(jnp.uint32) >> np.uint32(4)


def _nvfp4_narrow_4over6(x, tile, rht, stochastic_rounding, key, four_over_six, transpose, interpret, amax, amax_axes):
  """nvfp4_narrow with Four Over Six: both candidates' errors in the kernel (kernel_math's exact arithmetic)."""
  options = dict(tile=tile, rht=rht, stochastic_rounding=stochastic_rounding, key=key, four_over_six=four_over_six)
  call, layout, rows, cols, amax = _nvfp4_call(
    x, _nvfp4_narrow_kernel, transpose, interpret, "_narrow", amax=amax, amax_axes=amax_axes, **options
  )
  blocks = layout.cols // NVFP4_BLOCK
  half, block_half = layout.cols // 2, layout.block_cols // 2
  shape = lambda n: jax.ShapeDtypeStruct((layout.pair, layout.rows // layout.pair, n), jnp.uint8)
  spec = lambda n: pl.BlockSpec((layout.pair, layout.block_rows, n), lambda i, j: (0, i, j))
  packed, codes = call([shape(half), shape(blocks)], [spec(block_half), spec(layout.block_cols // NVFP4_BLOCK)])
  values = jax.lax.bitcast_convert_type(packed.reshape(layout.rows, half), jnp.float4_e2m1fn)
  scales = jax.lax.bitcast_convert_type(codes.reshape(layout.rows, blocks), jnp.float8_e4m3fn)
  return values.reshape(layout.rows, layout.cols)[:rows, :cols], scales[:rows, : -(-cols // NVFP4_BLOCK)], amax


def _check(rows, cols, tile, rht, stochastic_rounding, key):
  if not nvfp4_supported((rows, cols), tile=tile, stochastic_rounding=stochastic_rounding, key=key):
    raise ValueError(
      f"nvfp4 kernel: operand {(rows, cols)} with tile {tile}, stochastic_rounding="
      f"{stochastic_rounding} is not covered (see nvfp4_supported); use the XLA path"
    )
  if rht and cols % NVFP4_BLOCK:
    raise ValueError(f"hadamard16: last axis of shape {(rows, cols)} must be a multiple of {NVFP4_BLOCK}")


def _kernel_name(tile_rows, rht, sr, four_over_six, suffix):
  return (
    "nvfp4"
    + ("_16x16" if tile_rows > 1 else "")
    + ("_rht" if rht else "")
    + ("_sr" if sr else "")
    + (f"_4over6_{four_over_six}" if four_over_six else "")
    + suffix
  )


def _nvfp4_call(x, kernel, transpose, interpret, suffix, *, tile, rht, stochastic_rounding, key, four_over_six, **amax):
  """(call(out_shapes, out_specs) -> outputs, layout, operand rows, operand cols, amax) of an NVFP4 quantize pass of
  the kernel_math kernels (block-scaled output, Four Over Six): the checks, the padding and the global scales done
  (_nvfp4_scalars), the kernel's scalars and x bound."""
  rows, cols = x.shape[::-1] if transpose else x.shape
  _check(rows, cols, tile, rht, stochastic_rounding, key)
  tile_rows = tile[0]
  padded = pallas_layout.pad_operand(x, transpose=transpose, row_multiple=tile_rows, col_multiple=NVFP4_BLOCK)
  scalars, amax = _nvfp4_scalars(padded, transpose, rht, four_over_six, interpret, **amax)
  if stochastic_rounding:
    scalars.append(sr_bits.key_words(key))
  padded_rows, padded_cols = padded.shape[::-1] if transpose else padded.shape
  layout = pallas_layout.make_layout(padded_rows, padded_cols, transpose=transpose)
  body = functools.partial(
    kernel,
    layout=layout,
    tile_rows=tile_rows,
    rht=rht,
    sr=stochastic_rounding,
    operand_cols=cols,
    four_over_six=four_over_six,
  )
  name = KERNEL_PREFIX + _kernel_name(tile_rows, rht, stochastic_rounding, four_over_six, suffix)
  scalar_specs = [pl.BlockSpec(s.shape, lambda i, j: (0,)) for s in scalars]

  def call(out_shapes, out_specs):
    return pl.pallas_call(
      body,
      out_shape=tuple(out_shapes),
      grid=layout.grid,
      in_specs=[*scalar_specs, layout.in_spec()],
      out_specs=tuple(out_specs),
      compiler_params=pl_triton.CompilerParams(num_warps=_NUM_WARPS, num_stages=1),
      interpret=interpret,
      name=name,
    )(*scalars, layout.view(padded))

  return call, layout, rows, cols, amax


def _nvfp4_scalars(padded, transpose, rht, four_over_six, interpret, amax=None, amax_axes=()):
  """([S_enc, 1/S_enc, amax] f32, amax) of the padded operand: the amax pass's (or the caller's `amax`, x's own),
  the largest over the mesh axes `amax_axes` (x a shard, in a partitioned GEMM: the whole operand's scale)."""
  if amax is None:
    amax = amax_padded(padded, transpose=transpose, rht=rht, interpret=interpret)
  amax = grids.max_across(amax, amax_axes)  # after the shard's own amax: the caller's as well as the pass's
  s_enc = nvfp4.global_encode_scale(amax, nvfp4.global_e4m3_max(four_over_six))
  return [jnp.stack([s_enc, grids.div_rn(1.0, s_enc), amax])], amax


# ---------------------------------------------------------------- per-tensor FP8


def _fp8_kernel(scale_ref, x_ref, o_ref, *, layout, grid):
  q = km.round_to_grid(layout.load(x_ref) * scale_ref[0], grid)
  o_ref[...] = jax.lax.bitcast_convert_type(km.fp8_bits(q, grid).astype(jnp.uint8), o_ref.dtype)


def amax(x, *, transpose=False, interpret=False):
  """max |x| as f32 (the per-tensor amax of x or x.T: the same number)."""
  del transpose
  return amax_padded(x, transpose=False, rht=False, interpret=interpret)


def fp8_per_tensor(x, grid: grids.FloatGrid, scale, *, transpose=False, interpret=False):
  """round_to_grid(operand * scale) stored in grid's f8 dtype, operand = x.T if transpose else x."""
  rows, cols = x.shape[::-1] if transpose else x.shape
  padded = pallas_layout.pad_operand(x, transpose=transpose, row_multiple=1, col_multiple=NVFP4_BLOCK)
  padded_rows, padded_cols = padded.shape[::-1] if transpose else padded.shape
  layout = pallas_layout.make_layout(padded_rows, padded_cols, transpose=transpose)
  scalars = [jnp.reshape(scale, (1,)).astype(jnp.float32)]
  kernel = functools.partial(_fp8_kernel, layout=layout, grid=grid)
  out = _call(kernel, layout, grid.dtype, "fp8_" + grid.name, interpret, scalars)(*scalars, layout.view(padded))
  return _finish(out, layout, rows, cols)


# ---------------------------------------------------------------- MX


def _mx_kernel(x_ref, o_ref, *, layout, grid):
  x = layout.load(x_ref)
  p, rows, cols = x.shape
  x = x.reshape(p, rows, cols // MX_BLOCK, MX_BLOCK)
  block_amax = grids.f32_from_bits(km.amax_bits(x, axis=-1))
  exponent = grids.e8m0_exponent_at_least(grids.div_rn(block_amax, grid.max_value))
  q = km.round_to_grid(x * grids.exp2i(-exponent)[..., None], grid)
  if grid.dtype == jnp.float4_e2m1fn:
    q = km.e2m1_storage(q)
  o_ref[...] = (q * grids.exp2i(exponent)[..., None]).reshape(p, rows, cols).astype(o_ref.dtype)


def mx_block_scaled(x, grid: grids.FloatGrid, *, transpose=False, interpret=False):
  """mx.quantize(operand, grid) with the E8M0 scales folded in, in bf16; operand = x.T if transpose."""
  rows, cols = x.shape[::-1] if transpose else x.shape
  if cols % MX_BLOCK:
    raise ValueError(
      f"MX formats need the contraction axis to be a multiple of {MX_BLOCK}; got an operand of shape {(rows, cols)}"
    )
  layout = pallas_layout.make_layout(rows, cols, transpose=transpose)
  kernel = functools.partial(_mx_kernel, layout=layout, grid=grid)
  out = _call(kernel, layout, jnp.bfloat16, "mx_" + grid.name, interpret)(layout.view(x))
  return _finish(out, layout, rows, cols)
