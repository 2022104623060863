"""NVFP4: two-level (FP32 per-tensor, E4M3 per-16) scaled E2M1 quantization, bit-faithful to TE's NVFP4BlockScaling.

Behaviour at the edges (as TE's reference quantizer):
  * all-zero tensor: amax 0, S_enc = FLT_MAX, every scale and value 0.
  * a last axis (or, with 16x16 tiles, a first axis) not divisible by 16 is zero-padded for
    scale computation; `values` keep the input's shape, `scales` have ceil(N / 16) columns.
    The RHT needs whole 16-blocks and raises ValueError otherwise.
  * +-inf: amax is inf, S_enc = 6*448/inf = 0 -> 1.0; the block holding the inf gets scale 448
    and saturates to +-6, other blocks quantize against S_enc = 1 (mostly underflowing to 0).
  * NaN: amax and every scale become NaN, so `dequantize` returns NaN everywhere: a poisoned
    tensor stays visibly poisoned instead of being silently clipped.
`four_over_six="mse" | "mae"` chooses each block's scale by Four Over Six (four_over_six.py), with the global
scale's E4M3 bound 256 instead of 448 (the tensor's `e4m3_max`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.quantization.formats import grids, sr_bits
from MaxText.quantization.formats import four_over_six as fos
from MaxText.quantization.formats.tensor import QuantizedTensor

BLOCK = 16
E2M1_MAX = grids.E2M1.max_value
E4M3_MAX = grids.E4M3.max_value
# TE's fixed random signs for the wgrad RHT.
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


def global_e4m3_max(four_over_six=None):
  """The E4M3 bound of the global scale: 448, or 256 for a Four Over Six tensor (TE's nvfp4_e4m3_max)."""
  return fos.GLOBAL_E4M3_MAX if four_over_six else E4M3_MAX


def _sylvester_hadamard(n):
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h


def rht_matrix():
  """diag(signs) @ H16 / 4: orthonormal, applied on the right of 16-blocks (exact in bfloat16)."""
  return (RHT_SIGNS[:, None] * _sylvester_hadamard(BLOCK)) / 4.0


def hadamard16(x):
  """Random Hadamard Transform along the last axis in blocks of 16: bf16 in, bf16 out (x @ rht_matrix()).

  A fast Walsh-Hadamard butterfly (4 stages of f32 adds in a fixed order, signs and the 1/4 exact)
  rather than a dot, whose summation order is the backend's: where the f32 sums of a block are
  exact (16 bf16 values spanning < 2**20) every order agrees with TE's bf16 matmul, and where they
  are not, this order is still the same on every backend.
  """
  *lead, n = x.shape
  if n % BLOCK:
    raise ValueError(f"hadamard16: last axis of shape {tuple(x.shape)} must be a multiple of {BLOCK}")
  # Blocks as [..., n/16, 16], never flattened across the leading axes: a sharded leading axis (the tokens of a
  # wgrad operand) stays sharded through the butterfly.
  blocks = (*lead, n // BLOCK)
  signed = grids.round_to_bf16(x).astype(jnp.float32).reshape(*blocks, BLOCK) * jnp.asarray(RHT_SIGNS)
  h = signed.reshape(*blocks, 2, 2, 2, 2)  # H16 = H2 (x) H2 (x) H2 (x) H2 (Sylvester order)
  rank = len(blocks) + 4
  for axis in range(len(blocks), rank):
    # [a + b, a - b] along `axis` as a + b * [1, -1] (exact: a - b == a + (-b) in IEEE), broadcast
    # rather than stacked: XLA:CPU doesn't vectorize a concatenate
    a, b = (jax.lax.slice_in_dim(h, i, i + 1, axis=axis) for i in (0, 1))
    h = a + b * np.array([1.0, -1.0], np.float32).reshape([2 if d == axis else 1 for d in range(rank)])
  return grids.round_to_bf16(h.reshape(*lead, n) * 0.25)


def global_encode_scale(amax, e4m3_max=E4M3_MAX):
  """S_enc = 6*448/amax (6*256/amax under 4/6: `e4m3_max`) capped at FLT_MAX, and 1.0 where that comes out 0
  (amax = inf).

  amax = 0 gives FLT_MAX, as in TE's reference; the all-zero tensor then has block scales 0.
  """
  amax = jnp.asarray(amax, jnp.float32)
  s_enc = jnp.minimum(grids.div_rn(E2M1_MAX * e4m3_max, amax), grids.FLT_MAX)
  return jnp.where(s_enc == 0, 1.0, s_enc)


def _pad_to_block(x, rows_multiple):
  m, n = x.shape
  pad_m, pad_n = (-m) % rows_multiple, (-n) % BLOCK
  if pad_m or pad_n:
    x = jnp.pad(x, ((0, pad_m), (0, pad_n)))
  return x


def _block_amax(x_f32, tile):
  """Per-block amax [M, N/16]; with 16x16 tiles each of a tile's 16 rows repeats the tile's amax."""
  m, n = x_f32.shape
  if tile == (1, BLOCK):
    return grids.abs_max(x_f32.reshape(m, n // BLOCK, BLOCK), axis=-1)
  tiles = x_f32.reshape(m // BLOCK, BLOCK, n // BLOCK, BLOCK)
  return jnp.repeat(grids.abs_max(tiles, axis=(1, 3)), BLOCK, axis=0)


def quantize(
  x,
  *,
  tile=(1, 16),
  rht=False,
  stochastic_rounding=False,
  key=None,
  four_over_six=None,
  global_amax=None,
  amax_axes=(),
  draws=None,
) -> QuantizedTensor:
  """Quantize a 2-D x [M, N] to NVFP4 with blocks along the last axis (16x16 tiles if tile=(16, 16)).

  four_over_six: None (every block's max maps to 6), "mse" or "mae" (Four Over Six: the block's max maps to 6 or
  to 4, whichever candidate has the smaller error in that norm; four_over_six.py).
  global_amax: the amax the global scale is computed from, instead of x's own: a scale shared with other tensors
  (gate and up exported for one fused GEMM quantize as their concatenation would). At least x's amax, else
  elements saturate.
  amax_axes, draws: a shard of a larger operand, inside a partitioned GEMM (quantization/partition.py): the amax is
  the largest over these mesh axes (one scalar all-reduce), and `draws` are the stochastic-rounding draws of the
  shard's elements in the whole operand (uint16, x's shape), or where they lie in it (sr_bits.ShardIndex: the draws
  are computed from it), so the shard quantizes to the whole operand's bits.
  """
  return _quantize_jit(
    x,
    tile=tuple(tile),
    rht=rht,
    stochastic_rounding=stochastic_rounding,
    key=key,
    four_over_six=four_over_six,
    out="nvfp4",
    global_amax=global_amax,
    amax_axes=tuple(amax_axes),
    draws=draws,
  )


def quantize_block_scaled(
  x, *, tile=(1, 16), rht=False, stochastic_rounding=False, key=None, four_over_six=None, amax_axes=(), draws=None
) -> QuantizedTensor:
  """`quantize` with the block scales folded in: values * block decode scale [M, N] in bf16 (no `scales`), what the
  emulated GEMM reads, never through the narrow dtypes.

  Exact in bf16: an E2M1 value (2 significant bits) times an E4M3 scale (4 bits) has at most 6
  significant bits and lies in [2**-10, 2688], inside bf16's 8 bits and normal range. amax_axes, draws: as `quantize`.
  """
  values, amax = _quantize_jit(
    x,
    tile=tuple(tile),
    rht=rht,
    stochastic_rounding=stochastic_rounding,
    key=key,
    four_over_six=four_over_six,
    out="block_scaled",
    amax_axes=tuple(amax_axes),
    draws=draws,
  )
  return QuantizedTensor(values, None, amax, jnp.float32(global_e4m3_max(four_over_six)), tuple(tile))


def _fold_block_scales(values_MxN, decode_MxB):
  (m, n), blocks = values_MxN.shape, decode_MxB.shape[1]
  return values_MxN * jnp.broadcast_to(decode_MxB[:, :, None], (m, blocks, BLOCK)).reshape(m, -1)[:, :n]


def _check_arguments(x, tile, stochastic_rounding, key, four_over_six):
  if tile not in ((1, BLOCK), (BLOCK, BLOCK)):
    raise ValueError(f"nvfp4.quantize: tile must be (1, 16) or (16, 16), got {tile}")
  if x.ndim != 2:
    raise ValueError(f"nvfp4.quantize: expects a 2-D array, got shape {tuple(x.shape)}")
  if stochastic_rounding and key is None:
    raise ValueError("nvfp4.quantize: stochastic_rounding=True needs a PRNG key")
  fos.check_mode(four_over_six)


def _round_blocks(x_MxBx16, encode_MxB, draws_MxBx16):
  """x * the block's encode scale, clipped to +-6, rounded to E2M1: to nearest, or stochastically with the 16-bit
  draws (grids.draws16)."""
  scaled = jnp.clip(x_MxBx16.astype(jnp.float32) * encode_MxB[..., None], -E2M1_MAX, E2M1_MAX)
  if draws_MxBx16 is None:
    return grids.round_to_grid(scaled, grids.E2M1)
  return grids.stochastic_round_with_uniforms(scaled, grids.E2M1, grids.uniform_from_draws(draws_MxBx16))


def _map_to_six(x_MxBx16, block_amax, s_enc, s_dec, u_MxBx16):
  """Plain NVFP4: (E2M1 values [M, B, 16], E4M3 decode scales [M, B]) with each block's max mapped to 6."""
  decode = jnp.minimum(block_amax * (s_enc * (1.0 / E2M1_MAX)), grids.FLT_MAX)
  decode = grids.round_to_grid(decode, grids.E4M3)  # saturating at 448
  encode = jnp.minimum(grids.div_rn(1.0, decode * s_dec), grids.FLT_MAX)
  decode, encode = grids.materialize(decode, encode)  # once per block, not once per element
  return _round_blocks(x_MxBx16, encode, u_MxBx16), decode


def _four_over_six(x_MxBx16, block_amax, amax, s_enc, s_dec, u_MxBx16, tile, mode):
  """Four Over Six: both candidates quantized (with the same uniforms under SR), the one with the smaller error
  kept per block, or per 16x16 tile (rows of x a multiple of 16 there)."""
  decode, encode, d = fos.candidate_scales(block_amax, amax, s_enc, s_dec)  # [2, M, B]: map-to-6, map-to-4
  # amax's sign bit (always 0) read back from memory: a barrier keeps its value out of the compiler's sight.
  zero = grids.f32_bits(jax.lax.optimization_barrier(amax)) >> 31
  errors = fos.block_errors(x_MxBx16, decode, encode, d, amax, zero, mode, u_MxBx16)
  if tile != (1, BLOCK):
    errors = fos.tile_errors(errors)
  decode, encode = fos.choose(decode, encode, errors)
  return _round_blocks(x_MxBx16, encode, u_MxBx16), decode


@functools.partial(jax.jit, static_argnames=("tile", "rht", "stochastic_rounding", "four_over_six", "out", "amax_axes"))
def _quantize_jit(
  x, *, tile, rht, stochastic_rounding, key, four_over_six, out, global_amax=None, amax_axes=(), draws=None
):
  """E2M1 values [M, N] and E4M3 block decode scales [M, ceil(N/16)] (f32), returned per `out`."""
  _check_arguments(x, tile, stochastic_rounding, key, four_over_six)
  if rht:
    # The bf16 RHT output, written once: else XLA fuses the butterfly into both consumers (amax and
    # rounding), recomputing it through f32 intermediates (H100, [8192, 16384] RHT+SR: 2.31 -> 1.75 ms).
    x = jax.lax.optimization_barrier(hadamard16(x))
  m, n = x.shape
  x_f32 = x.astype(jnp.float32)
  amax = grids.max_across(grids.abs_max(x_f32) if x.size else jnp.float32(0), amax_axes)
  if global_amax is not None:
    amax = jnp.asarray(global_amax, jnp.float32)
  e4m3_max = global_e4m3_max(four_over_six)
  s_enc = global_encode_scale(amax, e4m3_max)
  s_dec = grids.div_rn(1.0, s_enc)

  # In x's dtype (the conversion to f32 is exact): each pass converts what it reads, no f32 copy is written.
  padded = _pad_to_block(x, tile[0])  # 4/6 on 16x16 tiles sums the errors of zero rows too (all 0)
  rows = padded.shape[0] if four_over_six else m
  x_blocks = padded[:rows].reshape(rows, -1, BLOCK)
  block_amax = _block_amax(padded.astype(jnp.float32), tile)[:rows]  # [rows, ceil(N/16)]
  u_blocks = None
  if stochastic_rounding:  # drawn for [M, N] as before; the padding (zeros) never rounds up
    # 16-bit draws, not the f32 uniforms: the 4/6 error pass and the quantize pass both read them (half the bytes)
    if draws is None:
      u = grids.draws16(key, (m, n))
    elif isinstance(draws, sr_bits.ShardIndex):
      u = sr_bits.draws(key, draws.rows, draws.cols)
    else:
      u = draws
    u_blocks = jnp.pad(u, ((0, rows - m), (0, padded.shape[1] - n))).reshape(rows, -1, BLOCK)
  if four_over_six:
    values, decode = _four_over_six(x_blocks, block_amax, amax, s_enc, s_dec, u_blocks, tile, four_over_six)
  else:
    values, decode = _map_to_six(x_blocks, block_amax, s_enc, s_dec, u_blocks)
  values, decode = values.reshape(rows, -1)[:m, :n], decode[:m]
  if out == "block_scaled":
    return _fold_block_scales(values, decode).astype(jnp.bfloat16), amax
  return QuantizedTensor(
    grids.cast_exact(values, grids.E2M1), grids.cast_exact(decode, grids.E4M3), amax, jnp.float32(e4m3_max), tile
  )


def block_scaled_values(q: QuantizedTensor):
  """values * block decode scale in f32 [M, N]: exact (at most 2 + 4 significant bits); a folded tensor's values."""
  if q.scales is None:
    return q.values.astype(jnp.float32)
  return _fold_block_scales(q.values.astype(jnp.float32), q.scales.astype(jnp.float32))


def decode_scale(q: QuantizedTensor):
  """The global decode scale 1/S_enc (f32 scalar)."""
  return grids.div_rn(1.0, global_encode_scale(q.global_scale, q.e4m3_max))


def dequantize(q: QuantizedTensor):
  """values * block scale * (1/S_enc), f32 [M, N]."""
  return block_scaled_values(q) * decode_scale(q)


def gemm_alpha(amax_a, amax_b, e4m3_max_a=E4M3_MAX, e4m3_max_b=E4M3_MAX):
  """The epilogue scale of an NVFP4 GEMM: amax_a * amax_b / (6*6*448*448), as the tensor core applies it (TE's
  reference GEMM: each operand's own E4M3 bound, 256 for a 4/6 operand; 36 * e_a * e_b is exact in f32)."""
  return grids.div_rn(amax_a * amax_b, (E2M1_MAX * E2M1_MAX * e4m3_max_a) * e4m3_max_b)


def gemm(a: QuantizedTensor, b: QuantizedTensor):
  """a [M, K] . b [N, K]^T (both blocked along K) in f32, global scales applied in the epilogue.

  The block-scaled values are exact in bf16 and their products exact in f32, so this bf16 x bf16
  GEMM with f32 accumulation equals the tensor core's per-16 f32 accumulation up to the order of
  the f32 sum.
  """
  a16, b16 = (block_scaled_values(t).astype(jnp.bfloat16) for t in (a, b))
  out = jax.lax.dot_general(a16, b16, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
  return out * gemm_alpha(a.global_scale, b.global_scale, a.e4m3_max, b.e4m3_max)
