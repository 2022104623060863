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
"""

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.quantization.formats import grids

MODES = ("mse", "mae")
GLOBAL_E4M3_MAX = 256.0  # TE's nvfp4_e4m3_max for 4/6 tensors (nvfp4_4over6_e4m3_use_256="all", its default)
_E2M1_MAX = grids.E2M1.max_value
_ERROR_DENOMINATOR = _E2M1_MAX * GLOBAL_E4M3_MAX  # 1536: TE's err_denom
_EXPONENT_AND_SIGN = np.uint32(0xFF800000)
_FRACTION = np.uint32(0x007FFFFF)


def check_mode(mode):
  if mode not in (None,) + MODES:
    raise ValueError(f"four_over_six must be None or one of {MODES}, got {mode!r}")


def candidate_scales(block_amax_MxB, s_enc, s_dec):
  """(decode, encode), each [2, M, B]: the E4M3 block decode scales of the map-to-6 (index 0) and map-to-4 (1)
  candidates and the encode scales x is multiplied by (TE's compute_scale_pair). The candidates are stacked, not
  computed twice: one graph for both keeps compile time down."""
  base = grids.div_rn(block_amax_MxB, _E2M1_MAX) * s_enc
  # round_to_grid saturates at E4M3's 448; base * 1 = base, exactly.
  decode = grids.round_to_grid(base * np.float32([1.0, 1.5]).reshape(2, 1, 1), grids.E4M3)
  encode = jnp.minimum(grids.div_rn(1.0, decode * s_dec), grids.FLT_MAX)
  return grids.materialize(decode, encode)


def _values_in_input_domain(q_CxMxBx16, decode_CxMxB, amax):
  """RN(RN(RN(q * decode) * amax) / 1536) per element, from two divisions per block.

  q = +-2**k * m with m in {1, 1.5}: q * decode is exact, and RN(2**k * y) = 2**k * RN(y) in the normal range, so
  the element is 2**k times the block's RN(RN(m * decode * amax) / 1536). m = 1 uses amax / 2 (exact) so that
  k = -1 (q = 0.5) never sees an intermediate overflow TE's chain doesn't. Where TE's RN(q * decode * amax)
  overflows, f * c below overflows too (inf / 1536 = inf). One difference can't change a choice: q = 0 in a block
  whose c is inf gives NaN here and 0 in TE, but that block's max element (q != 0) makes its error inf either way.
  """
  # [m = 1, m = 1.5] x the candidates' blocks; 1.5 * decode is exact (E4M3 has 4 significant bits).
  c = jnp.stack([decode_CxMxB * (amax * 0.5), (decode_CxMxB * 1.5) * amax])
  c, d = (a[..., None] for a in grids.materialize(c, grids.div_rn(c, _ERROR_DENOMINATOR)))
  bits = grids.f32_bits(q_CxMxBx16)
  is_15 = (bits & _FRACTION) != 0  # |q| in {1.5, 3, 6}
  power = grids.f32_from_bits(bits & _EXPONENT_AND_SIGN)  # +-2**k (+-0 for 0)
  f = jnp.where(is_15, power, power * 2.0)  # RN(q * decode * amax) = f * c, exactly
  product = f * jnp.where(is_15, c[1], c[0])
  return jnp.where(jnp.isinf(product), product, f * jnp.where(is_15, d[1], d[0]))


def _rounded_on_its_own(product, zero):
  """`product` unchanged (its bits or-ed with a uint32 0 the compiler can't see is 0): a product that only feeds an
  integer op is rounded on its own, so no backend can contract it with the add it feeds into one FMA."""
  return grids.f32_from_bits(grids.f32_bits(product) | zero)


def block_errors(q_CxMxBx16, decode_CxMxB, x_MxBx16, amax, mode):
  """Each candidate's 1x16 block errors [C, M, B]: sum over the block's elements, in order, of (value - x)**2 (mse)
  or |value - x| (mae)."""
  diff = _values_in_input_domain(q_CxMxBx16, decode_CxMxB, amax) - x_MxBx16
  if mode == "mse":
    # amax's sign bit (always 0) read back from memory: a barrier keeps its value out of the compiler's sight.
    zero = grids.f32_bits(jax.lax.optimization_barrier(amax)) >> 31
    per_element = _rounded_on_its_own(diff * diff, zero)
  else:
    per_element = jnp.abs(diff)
  total = per_element[..., 0]
  for i in range(1, per_element.shape[-1]):  # element order (TE's per-thread loop), not a reduce of XLA's order
    total = total + per_element[..., i]
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
  NaN errors keep 6). Materialized, so the errors are computed once per block, not once per element that reads
  them; the kept values are then rounded again from x with the kept scale (the same bits as the candidate's, and
  cheaper than keeping both candidates' values in memory)."""
  use_4 = errors_CxMxB[1] < errors_CxMxB[0]
  return grids.materialize(
    jnp.where(use_4, decode_CxMxB[1], decode_CxMxB[0]), jnp.where(use_4, encode_CxMxB[1], encode_CxMxB[0])
  )
