"""The quantizers' exact per-element arithmetic in the operations Pallas lowers to Triton, same bits as grids.py.

Inside a Triton kernel three of the XLA path's tools are missing or differ, so they are rebuilt here
from exact operations (each function names the one in grids.py / nvfp4.py it equals bit for bit):
  * `jnp.round` (round-half-even) has no Triton lowering: rounding is floor plus an exact compare.
  * float min/max lower to `minnumf`/`maxnumf`, which drop a NaN where XLA propagates it: `minimum`,
    `maximum` and `clip` select explicitly, and maxima of |x| are integer maxima of the magnitude
    bits (monotone for non-negative floats, NaN above inf).
  * slices of a register tensor don't exist: the RHT butterfly halves blocks with `jnp.split` and
    interleaves with `jnp.stack` on the last axis (tt.split / tt.join), in the XLA path's stage order.
  * jnp.abs lowers to abs.ftz.f32 (subnormals flushed): `abs_` clears the sign bit instead.
Everything else (integer division `grids.div_rn`, `grids.exp2i`, bit casts) is shared as is; every
product that feeds an add is exact (a power-of-two scaling or a sign), so Triton's FMA contraction can't
change a result.
"""

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.quantization.formats import grids
from MaxText.quantization.formats import nvfp4

_ABS_MASK = np.uint32(0x7FFFFFFF)
_SIGN_BIT = np.uint32(0x80000000)
# Bit i set where nvfp4.RHT_SIGNS[i] is -1 (no array constants inside a kernel).
_RHT_NEGATIVE_MASK = sum(1 << i for i, s in enumerate(nvfp4.RHT_SIGNS) if s < 0)


def magnitude_bits(x):
  """|x|'s bits as uint32: ordered like |x| for every f32, NaN above inf (so integer max propagates NaN)."""
  return grids.f32_bits(x) & _ABS_MASK


def amax_bits(x, axis=None):
  """max |x| over `axis` as magnitude bits (jnp.max(jnp.abs(x)) with XLA's NaN propagation)."""
  return jnp.max(magnitude_bits(x), axis=axis)


def abs_(x):
  """|x| by clearing the sign bit: Triton lowers jnp.abs to abs.ftz.f32, which flushes subnormals to 0."""
  return grids.f32_from_bits(magnitude_bits(x))


def minimum(a, b):
  """XLA's jnp.minimum: NaN if either is NaN."""
  return jnp.where(jnp.isnan(a) | (a < b), a, b)


def maximum(a, b):
  """XLA's jnp.maximum: NaN if either is NaN."""
  return jnp.where(jnp.isnan(a) | (a > b), a, b)


def clip(x, lo, hi):
  return minimum(maximum(x, lo), hi)


def round_half_even(v):
  """jnp.round(v) for finite 0 <= v < 2**23: floor, then up past the half or at the half to an even integer."""
  f = jnp.floor(v)
  d = v - f  # exact: v and f share the binade's spacing, which is <= 1 here
  half = f * 0.5
  odd = jnp.floor(half) != half
  return f + jnp.where((d > 0.5) | ((d == 0.5) & odd), 1.0, 0.0)


def _copysign(magnitude, x):
  return grids.f32_from_bits(grids.f32_bits(magnitude) | (grids.f32_bits(x) & _SIGN_BIT))


def round_to_grid(x, grid: grids.FloatGrid):
  """grids.round_to_grid: nearest-even on `grid`, saturating at ±max, NaN stays NaN."""
  abs_x = minimum(abs_(x), grid.max_value)
  e = grids._quantum_exponent(abs_x, grid)  # pylint: disable=protected-access
  rounded = minimum(round_half_even(abs_x * grids.exp2i(-e)) * grids.exp2i(e), grid.max_value)
  return jnp.where(jnp.isnan(x), x, _copysign(rounded, x))


def stochastic_round_to_grid(x, grid: grids.FloatGrid, u):
  """grids.stochastic_round_to_grid given its uniforms `u` (same shape as x)."""
  abs_x = minimum(abs_(x), grid.max_value)
  e = grids._quantum_exponent(abs_x, grid)  # pylint: disable=protected-access
  q, inv_q = grids.exp2i(e), grids.exp2i(-e)
  lower = jnp.floor(abs_x * inv_q) * q
  frac = (abs_x - lower) * inv_q
  rounded = minimum(lower + jnp.where(u <= frac, q, 0.0), grid.max_value)
  return jnp.where(jnp.isnan(x), x, _copysign(rounded, x))


def hadamard16(x):
  """nvfp4.hadamard16 along a last axis of exactly 16: bf16-rounded f32 in, bf16-rounded f32 out.

  The XLA path runs the Sylvester butterfly over index bits 3, 2, 1, 0 (as axes 1..4 of a
  [.., 2, 2, 2, 2] view). Here each stage splits on the top index bit (first half, second half)
  and joins (a + b, a - b) as the new lowest bit, so after four stages every bit was processed in
  the same order with the same adds and lies back in its own position.
  """
  if x.shape[-1] != nvfp4.BLOCK:
    raise ValueError(f"hadamard16: last axis must be {nvfp4.BLOCK}, got shape {x.shape}")
  index = jax.lax.broadcasted_iota(jnp.uint32, x.shape, x.ndim - 1)
  negative = ((np.uint32(_RHT_NEGATIVE_MASK) >> index) & 1) == 1
  h = grids.round_to_bf16(x).astype(jnp.float32) * jnp.where(negative, -1.0, 1.0)
  for _ in range(4):
    a, b = jnp.split(h, 2, axis=-1)
    h = jnp.stack([a + b, a - b], axis=-1).reshape(x.shape)
  return grids.round_to_bf16(h * 0.25).astype(jnp.float32)


def sum_in_order(x):
  """x[..., 0] + x[..., 1] + ... over the last axis, left to right (Four Over Six's per-block error, TE's per-thread
  loop): jnp.sum's order is the compiler's. The parts come from halving splits (slices of a register tensor don't
  exist)."""
  parts = jnp.split(x, x.shape[-1], axis=-1)
  total = parts[0]
  for part in parts[1:]:
    total = total + part
  return total[..., 0]


def tile_sums(rows_x16):
  """16x16 tiles: the 16 rows of axis -2 (length 16) summed as four_over_six.tile_errors does (rows i + i+8, then
  + i+4, + i+2, + i+1), each step a sum over a length-2 axis: one add, in no particular order but commutative."""
  *lead, n, cols = rows_x16.shape
  while n > 1:
    n //= 2
    rows_x16 = jnp.sum(rows_x16.reshape(*lead, 2, n, cols), axis=-3)
  return rows_x16


def e2m1_storage(q):
  """What an E2M1 value on the grid reads back as after the XLA path's f32 -> float4_e2m1fn -> f32
  round trip: itself, except NaN (E2M1 has none), which XLA converts to -0."""
  return jnp.where(jnp.isnan(q), -0.0, q)


def e2m1_bits(q):
  """The 4-bit code (uint32 < 16) of q, a value on the E2M1 grid or NaN: what q.astype(float4_e2m1fn) stores (NaN,
  which E2M1 lacks, as XLA's convert writes it: -0, code 8)."""
  a = abs_(q)
  # 0, 0.5, 1, 1.5 -> 0..3 (2a); 2, 3 -> 4, 5 (a + 2); 4, 6 -> 6, 7 (a / 2 + 4): exact in f32
  magnitude = jnp.where(a < 2.0, a * 2.0, jnp.where(a < 4.0, a + 2.0, a * 0.5 + 4.0))
  magnitude = jnp.where(jnp.isnan(q), 0.0, magnitude).astype(jnp.uint32)
  sign = (grids.f32_bits(q) >> 28) & np.uint32(8)
  return jnp.where(jnp.isnan(q), np.uint32(8), sign | magnitude)


_FP8_CODES = {  # grid name: (exponent bias, NaN code as XLA's convert writes it)
  "e4m3": (7, 0x7F),
  "e5m2": (15, 0x7E),
}


def fp8_bits(q, grid: grids.FloatGrid):
  """The 8-bit code (uint32 < 256) of q, a value already on `grid` (|q| <= max) or NaN: what q.astype(grid.dtype)
  stores, built from the bits so no backend's f32 -> fp8 conversion is involved."""
  bias, nan_code = _FP8_CODES[grid.name]
  bits = grids.f32_bits(q)
  sign = (bits >> 24) & 0x80
  field = ((bits >> 23) & 0xFF).astype(jnp.int32)
  normal_field = jnp.maximum(field - 127 + bias, 0).astype(jnp.uint32)
  normal = (normal_field << grid.mantissa_bits) | ((bits & 0x7FFFFF) >> (23 - grid.mantissa_bits))
  # Below the smallest normal q is an integer multiple of the subnormal spacing (exact product).
  is_normal = field >= 127 + grid.min_exponent
  small = jnp.where(is_normal, 0.0, abs_(q))  # NaN is "normal": never converted to an integer
  subnormal = (small * 2.0 ** (grid.mantissa_bits - grid.min_exponent)).astype(jnp.uint32)
  code = jnp.where(is_normal, normal, subnormal)
  return sign | jnp.where(jnp.isnan(q), np.uint32(nan_code), code)
