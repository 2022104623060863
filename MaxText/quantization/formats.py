"""Exact round-to-nearest-even and stochastic rounding onto the low-precision grids (E2M1, E4M3, E5M2, E8M0)."""

import dataclasses
import math

import jax
import jax.numpy as jnp

FLT_MAX = float(jnp.finfo(jnp.float32).max)


@dataclasses.dataclass(frozen=True)
class FloatGrid:
  """A small floating-point format described by what rounding needs: mantissa bits, min normal exponent, max."""
  name: str
  mantissa_bits: int
  min_exponent: int  # exponent of the smallest normal; below it the spacing is constant (subnormals)
  max_value: float
  dtype: object  # the jnp dtype every grid value is exactly representable in


E2M1 = FloatGrid("e2m1", 1, 0, 6.0, jnp.float4_e2m1fn)
E4M3 = FloatGrid("e4m3", 3, -6, 448.0, jnp.float8_e4m3fn)
E5M2 = FloatGrid("e5m2", 2, -14, 57344.0, jnp.float8_e5m2)


def _quantum(abs_x, grid: FloatGrid):
  """Spacing of `grid` around |x| (power of two), computed exactly from the f32 exponent."""
  _, exp = jnp.frexp(abs_x)  # abs_x = m * 2**exp with m in [0.5, 1)
  exponent = jnp.maximum(exp - 1, grid.min_exponent)
  return jnp.ldexp(jnp.ones_like(abs_x), exponent - grid.mantissa_bits)


def saturation_threshold(grid: FloatGrid):
  """Magnitudes above max + half the top spacing are clipped, not merely rounded, when saturating."""
  _, exp = math.frexp(grid.max_value)  # the top binade's spacing, as _quantum computes it (in Python: static)
  return grid.max_value + 0.5 * 2.0 ** (max(exp - 1, grid.min_exponent) - grid.mantissa_bits)


def round_to_grid(x, grid: FloatGrid):
  """Round f32 `x` to nearest-even on `grid`, saturating at ±max; NaN stays NaN. Returns f32.

  Done in f32 with exact power-of-two arithmetic rather than a dtype cast, because XLA's
  f32 -> fp8/fp4 converts are not guaranteed single-rounding on every backend.
  """
  x = x.astype(jnp.float32)
  abs_x = jnp.minimum(jnp.abs(x), grid.max_value)
  q = _quantum(abs_x, grid)
  rounded = jnp.minimum(jnp.round(abs_x / q) * q, grid.max_value)  # jnp.round is half-to-even
  return jnp.where(jnp.isnan(x), x, jnp.copysign(rounded, x))


def stochastic_round_to_grid(x, grid: FloatGrid, key):
  """Round f32 `x` up or down to one of its two neighbours on `grid` with probability by distance.

  Unbiased inside the range (E[q(x)] = x); saturates at ±max like round_to_grid.
  """
  x = x.astype(jnp.float32)
  abs_x = jnp.minimum(jnp.abs(x), grid.max_value)
  q = _quantum(abs_x, grid)
  lower = jnp.floor(abs_x / q) * q
  frac = (abs_x - lower) / q  # in [0, 1): exact, lower and q are on the grid
  u = jax.random.uniform(key, x.shape, jnp.float32)
  rounded = jnp.minimum(lower + jnp.where(u < frac, q, 0.0), grid.max_value)
  return jnp.where(jnp.isnan(x), x, jnp.copysign(rounded, x))


def cast_exact(x_on_grid, grid: FloatGrid):
  """Store values already on `grid` in its jnp dtype (lossless)."""
  return x_on_grid.astype(grid.dtype)


def e8m0_scale_at_least(ratio):
  """Smallest power of two >= ratio, exponent clamped to E8M0's [-127, 127]; 1 where ratio is 0.

  The MX block-scale rule TE's reference uses (ceil of log2), so no element of a block saturates.
  """
  ratio = ratio.astype(jnp.float32)
  mantissa, exp = jnp.frexp(ratio)
  exponent = jnp.where(mantissa == 0.5, exp - 1, exp)  # exact powers of two keep their exponent
  exponent = jnp.clip(exponent, -127, 127)
  return jnp.where(ratio > 0, jnp.ldexp(jnp.ones_like(ratio), exponent), 1.0)
