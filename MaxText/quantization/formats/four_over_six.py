"""Four Over Six (4/6, Cook et al., arXiv 2512.02010): per NVFP4 block, the scale that maps its max to 6 or to 4,
whichever quantizes the block with the smaller error.

E2M1 has nothing between 4 and 6, so a block's near-maximal values (4.x after scaling) carry NVFP4's largest
errors. 4/6 quantizes every block twice, once with the usual scale (block amax -> 6) and once with a scale 1.5x
larger (block amax -> 4, where the grid is twice as fine relative to the max), and keeps the candidate whose
dequantized values are closer to the input. Definitions follow Transformer Engine 2.20's `nvfp4_4over6`
(transformer_engine/pytorch/custom_recipes/reference_nvfp4.py, `_quantize_blockwise_4over6_reference`, and
common/cast/nvfp4/quantize_4over6_nvfp4.cuh), which follow the paper's code:
  * global scale: S_enc = 6 * 256 / amax (TE's `nvfp4_e4m3_max=256`, its default for 4/6 tensors), so the
    map-to-4 scale, 1.5x the map-to-6 one, stays inside E4M3's 448 (<= 1.5 * 256 = 384 up to rounding).
  * candidate scales: base = RN(block_amax / 6) * S_enc; map-to-6 = e4m3(min(base, 448)), map-to-4 =
    e4m3(min(RN(base * 1.5), 448)); each candidate's values are then quantized as plain NVFP4 quantizes them.
  * error: per element, the candidate's value in the input's domain, RN(RN(RN(q * scale) * amax) / (6 * 256)),
    minus the input (f32; the RHT output where the RHT is on); per 1x16 block the sum, in element order, of
    the squares (mse) or of the magnitudes (mae); for 16x16 tiles the 16 row sums added as a tree (rows
    i + i+8, then + i+4, + i+2, + i+1: TE's warp reduction). The candidate with the smaller error is kept;
    ties (and NaN errors) keep 6.
Beyond TE (whose 4/6 kernels take neither): the RHT (the error is measured against the transformed input) and
stochastic rounding (both candidates round with the same uniforms). The paper quantizes gradients with 4/6 too.

Exact on every backend like the rest (grids.py): the per-element value is q's power of two times a per-block
RN(RN(m * scale * amax) / 1536), m in {1, 1.5} (scaling by a power of two commutes with rounding), which is TE's
per-element rounding chain exactly, overflow to inf included; the divisions are grids.div_rn, once per block.
Each square feeds an integer op before it is summed, so no backend can contract square and add into an FMA (which
would round once instead of twice). Outside the guarantee, as for plain NVFP4: f32 subnormal
intermediates (tensors with amax below ~1e-32), which XLA on CPU flushes to zero.

Cost (XLA): one extra pass over x that rounds both candidates and sums their errors in registers, the per-block
scales of both, and the usual quantize pass with the kept scale (block_errors says how; benchmarks/RESULTS.md,
"Four Over Six", the numbers).
"""

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.quantization.formats import grids

MODES = ("mse", "mae")
GLOBAL_E4M3_MAX = 256.0  # TE's nvfp4_e4m3_max for 4/6 tensors (nvfp4_4over6_e4m3_use_256="all", its default)
_E2M1_MAX = grids.E2M1.max_value
_ERROR_DENOMINATOR = _E2M1_MAX * GLOBAL_E4M3_MAX  # 1536: TE's err_denom
_MAGNITUDE = np.uint32(0x7FFFFFFF)


def check_mode(mode):
  if mode not in (None,) + MODES:
    raise ValueError(f"four_over_six must be None or one of {MODES}, got {mode!r}")


def candidate_scales(block_amax_MxB, amax, s_enc, s_dec):
  """(decode, encode, d) of the map-to-6 (index 0 of C) and map-to-4 (1) candidates per block: the E4M3 block decode
  scales [C, M, B], the encode scales x is multiplied by [C, M, B] (TE's compute_scale_pair), and the error's
  factors d [2, C, M, B] (_value_magnitude). The candidates are stacked, not computed twice: one graph for both
  keeps compile time down. Materialized: computed once per block, not per element."""
  decode, encode, d0, d1 = scales_and_factors(
    block_amax_MxB, np.float32([1.0, 1.5]).reshape(2, 1, 1), amax, s_enc, s_dec
  )
  return grids.materialize(decode, encode, jnp.stack([d0, d1]))


def scales_and_factors(block_amax, m, amax, s_enc, s_dec, *, minimum=jnp.minimum, round_to_grid=grids.round_to_grid):
  """(decode, encode, d0, d1) per block of the candidate whose block max maps to 6 / m (m = 1: map-to-6, 1.5:
  map-to-4; broadcast): TE's compute_scale_pair, and d = RN(c / 1536) for m = 1, 1.5 (_c). `minimum`
  (NaN-propagating) and `round_to_grid` are the XLA path's here; the Triton kernel passes kernel_math's."""
  base = grids.div_rn(block_amax, _E2M1_MAX) * s_enc
  decode = round_to_grid(base * m, grids.E4M3)  # saturating at E4M3's 448; base * 1 = base, exactly
  encode = minimum(grids.div_rn(1.0, decode * s_dec), grids.FLT_MAX)
  c0, c1 = _c(decode, amax)
  return decode, encode, grids.div_rn(c0, _ERROR_DENOMINATOR), grids.div_rn(c1, _ERROR_DENOMINATOR)


def _c(decode, amax):
  """RN(m * decode * amax) for m = 1, as decode * (amax / 2) (exact; see _value_magnitude), and m = 1.5 (1.5 * decode
  is exact: E4M3 has 4 significant bits)."""
  return decode * (amax * 0.5), (decode * 1.5) * amax


def _rounded_magnitude(abs_scaled, uniforms, minimum, round_half_even):
  """(k, spacing) with min(abs_scaled, 6) rounded to E2M1 = k * spacing, k in {0, ..., 4}: to nearest-even, or
  stochastically with the uniforms; the arithmetic of grids.round_to_grid and stochastic_round_with_uniforms on the
  magnitude (k = NaN for NaN)."""
  a = minimum(abs_scaled, _E2M1_MAX)
  spacing, inverse = grids.e2m1_spacing(a)
  t = a * inverse  # exact: a power of two
  if uniforms is None:
    return round_half_even(t), spacing
  low = jnp.floor(t)
  return low + jnp.where(uniforms <= t - low, np.float32(1.0), np.float32(0.0)), spacing


def _value_magnitude(k, spacing, decode, amax, d0, d1):
  """|RN(RN(RN(q * decode) * amax) / 1536)| for |q| = k * spacing, from the block's decode and d = RN(c / 1536)
  (_c; d0 for m = 1, d1 for m = 1.5).

  |q| = 2**e * m with m in {1, 1.5}: q * decode is exact, and RN(2**e * y) = 2**e * RN(y) in the normal range, so
  the value is 2**e times the block's RN(RN(m * decode * amax) / 1536). k = 3 is m = 1.5 (1.5, 3, 6 = 1.5 * 2 *
  spacing); k = 1, 2, 4 are powers of two, m = 1, taken as 2|q| times decode * amax / 2 so that q = 0.5 never sees an
  intermediate overflow TE's chain doesn't. Where TE's RN(q * decode * amax) overflows, f * c below overflows too
  (inf / 1536 = inf). One difference can't change a choice: q = 0 in a block whose c is inf gives NaN here and 0 in
  TE, but that block's max element (q != 0) makes its error inf either way. c is recomputed here (three products)
  rather than read: it only detects the overflow. Every product is exact or feeds no add (FMA-safe).
  """
  is_15 = k == 3.0
  f = spacing * jnp.where(is_15, np.float32(2.0), k * 2.0)  # RN(|q| * decode * amax) = f * c, exactly
  c0, c1 = _c(decode, amax)
  product = f * jnp.where(is_15, c1, c0)
  return jnp.where(jnp.isinf(product), product, f * jnp.where(is_15, d1, d0))


def _rounded_on_its_own(product, zero):
  """`product` unchanged (its bits or-ed with a uint32 0 the compiler can't see is 0): a product that only feeds an
  integer op is rounded on its own, so no backend can contract it with the add it feeds into one FMA."""
  return grids.f32_from_bits(grids.f32_bits(product) | zero)


def element_terms(
  abs_x, decode, encode, d0, d1, amax, zero, mode, uniforms=None, *, minimum=jnp.minimum, round_half_even=jnp.round
):
  """Per element (broadcast shapes) the block error's term for one candidate: (value - x)**2 (mse) or |value - x|
  (mae), value = x * encode clipped to +-6, rounded to E2M1 (to nearest, or stochastically with the uniforms), in
  the input's domain; from |x|, the candidate's per-block decode, encode, d0, d1 (candidate_scales) and the
  tensor's amax. `zero`: a uint32 0 the compiler can't see (_rounded_on_its_own). `minimum` (NaN-propagating) and
  `round_half_even` are jnp's here; the Triton kernel passes its own (kernel_math), with the same bits.

  On magnitudes: value and x have the same sign, so value - x = +-(|value| - |x|) exactly and neither its square nor
  its magnitude depends on the sign."""
  k, spacing = _rounded_magnitude(abs_x * encode, uniforms, minimum, round_half_even)
  diff = _value_magnitude(k, spacing, decode, amax, d0, d1) - abs_x
  if mode == "mse":
    return _rounded_on_its_own(diff * diff, zero)
  return grids.f32_from_bits(grids.f32_bits(diff) & _MAGNITUDE)  # not jnp.abs: Triton's flushes subnormals


def _lanes(x_MxBx16):
  """i -> x[..., i] as f32 [M, B] (the i-th element of every block). bf16 is read as uint32 pairs of neighbours, half
  the slices of x that XLA copies out, each widened to f32 by a shift (bf16 is f32's top half: exact)."""
  if x_MxBx16.dtype != jnp.bfloat16:
    return lambda i: x_MxBx16[..., i].astype(jnp.float32)
  *lead, blocks, block = x_MxBx16.shape
  pairs = jax.lax.bitcast_convert_type(x_MxBx16.reshape(*lead, blocks, block // 2, 2), jnp.uint32)
  low_first = lambda pair, i: pair << 16 if i % 2 == 0 else pair & np.uint32(0xFFFF0000)  # little-endian
  return lambda i: grids.f32_from_bits(low_first(pairs[..., i // 2], i))


def block_errors(x_MxBx16, decode_CxMxB, encode_CxMxB, d_2xCxMxB, amax, zero, mode, draws_MxBx16=None):
  """Each candidate's 1x16 block errors [C, M, B]: the sum over the block's elements, in order, of element_terms
  (stochastic rounding with the 16-bit draws, grids.draws16).

  Element by element over [C, M, B] arrays (x's i-th element of every block), so XLA fuses both candidates'
  rounding, values, errors and the 16 in-order sums into one loop: nothing per element is written to memory (as
  [C, M, B, 16] arrays it was: 32 bytes per element, since XLA doesn't fuse the sum's 16 slices)."""
  lanes, total = _lanes(x_MxBx16), None
  for i in range(x_MxBx16.shape[-1]):  # element order (TE's per-thread loop), not a reduce of XLA's order
    abs_x = grids.f32_from_bits(grids.f32_bits(lanes(i)) & _MAGNITUDE)
    u = None if draws_MxBx16 is None else grids.uniform_from_draws(draws_MxBx16[..., i])
    term = element_terms(abs_x, decode_CxMxB, encode_CxMxB, d_2xCxMxB[0], d_2xCxMxB[1], amax, zero, mode, u)
    total = term if total is None else total + term
  (total,) = grids.materialize(total)  # once per block, not once per element of the blocks that read the choice
  return total


def tile_errors(row_errors_CxMxB):
  """16x16 tiles: each tile's 16 row errors summed as TE's warp reduction does, repeated on the tile's rows."""
  *lead, m, b = row_errors_CxMxB.shape
  rows = row_errors_CxMxB.reshape(*lead, m // 16, 16, b)
  for half in (8, 4, 2, 1):
    rows = rows[..., :half, :] + rows[..., half : 2 * half, :]
  return jnp.repeat(rows[..., 0, :], 16, axis=-2)


def choose(decode_CxMxB, encode_CxMxB, errors_CxMxB):
  """(decode, encode) [M, B] of the candidate kept per block: map-to-4 where its error is strictly smaller (ties and
  NaN errors keep 6), materialized. The kept values are then rounded again from x with the kept scale (the same bits
  as the candidate's): on CPU cheaper than writing both candidates' values and reading one back."""
  use_4 = errors_CxMxB[1] < errors_CxMxB[0]
  return grids.materialize(
    jnp.where(use_4, decode_CxMxB[1], decode_CxMxB[0]), jnp.where(use_4, encode_CxMxB[1], encode_CxMxB[0])
  )
