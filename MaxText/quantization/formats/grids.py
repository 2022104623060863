"""Exact rounding onto the low-precision grids (E2M1, E4M3, E5M2, E8M0) and the f32 arithmetic it needs.

Backend independence: every result here is a function of the input bits alone, the same on CPU
and on NVIDIA GPUs. Quantization uses only operations IEEE 754 and XLA define exactly on every
backend: integer arithmetic, bit casts, comparisons, max/min/abs, f32 add/sub/mul (correctly
rounded in hardware), and multiplications by exact powers of two. It never uses f32 division,
reciprocal, pow/exp2 or an f32 -> narrow-float convert, whose rounding is the backend's choice
(XLA lowers f32 division on NVIDIA GPUs to `div.full.f32`, up to 2 ulp off, and rewrites x / c
into x * (1/c) everywhere). Instead: `div_rn` divides by integer long division of the mantissas,
`exp2i` builds powers of two from the exponent field, `round_to_bf16` rounds on the bits, and the
grid roundings scale by exact powers of two and use round/floor (exact by definition). FMA
contraction can't change a result either: every product that feeds an addition is exact.
Outside the guarantee: f32 subnormal inputs, which XLA on CPU flushes to zero in float ops.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.quantization.formats import sr_bits

FLT_MAX = float(jnp.finfo(jnp.float32).max)
_SIGN_BIT = np.uint32(0x80000000)
_ABS_MASK = np.uint32(0x7FFFFFFF)
_INF_BITS = np.uint32(0x7F800000)
_NAN_BITS = np.uint32(0x7FC00000)


def f32_bits(x):
  """The IEEE bits of f32 `x` as uint32."""
  return jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.uint32)


def f32_from_bits(bits):
  return jax.lax.bitcast_convert_type(jnp.asarray(bits, jnp.uint32), jnp.float32)


def exponent_field(x):
  """floor(log2|x|) for normal f32 x, exactly (from the bits); -127 for zero and subnormals."""
  return ((f32_bits(x) >> 23) & 0xFF).astype(jnp.int32) - 127


@jax.jit
def exp2i(e):
  """2**e as f32 for integer e in [-149, 127], built from the bits (exact; e outside is clamped)."""
  e = jnp.asarray(e, jnp.int32)
  normal = jnp.clip(e + 127, 1, 254).astype(jnp.uint32) << 23
  subnormal = jnp.uint32(1) << jnp.clip(e + 149, 0, 22).astype(jnp.uint32)
  return f32_from_bits(jnp.where(e >= -126, normal, subnormal))


def _leading_zeros(m):
  """clz(m) for uint32 m < 2**24, from the exponent of m as an f32 (exact below 2**24); 32 for 0.

  Not lax.clz: Triton's GPU conversion rejects math.ctlz, and the kernels share this code.
  """
  top_bit = exponent_field(m.astype(jnp.float32))  # floor(log2 m); -127 for 0
  return jnp.where(m == 0, 32, 31 - top_bit)


def _mantissa_and_exponent(bits):
  """(m, e) with |x| = m * 2**e and m in [2**23, 2**24) for finite nonzero x (subnormals normalised)."""
  field = ((bits >> 23) & 0xFF).astype(jnp.int32)
  fraction = bits & 0x7FFFFF
  m = jnp.where(field == 0, fraction, fraction | 0x800000)
  shift = _leading_zeros(m) - 8  # 0 for normals
  return m << jnp.maximum(shift, 0).astype(jnp.uint32), jnp.maximum(field, 1) - 150 - shift


@jax.jit
def div_rn(a, b):
  """a / b in f32, correctly rounded to nearest-even (IEEE 754, subnormals and specials included).

  From the bits by integer long division of the 24-bit mantissas (8 quotient bits per uint32
  step), so it is the same on every backend whatever its own division does.
  """
  a_bits, b_bits = jnp.broadcast_arrays(f32_bits(a), f32_bits(b))
  sign = (a_bits ^ b_bits) & _SIGN_BIT
  a_abs, b_abs = a_bits & _ABS_MASK, b_bits & _ABS_MASK
  ma, ea = _mantissa_and_exponent(a_bits)
  mb, eb = _mantissa_and_exponent(b_bits)
  below = ma < mb  # make the mantissa quotient lie in [1, 2)
  ma = jnp.where(below, ma << 1, ma)
  e = ea - eb - below.astype(jnp.int32)  # weight of the quotient's leading bit
  q = jnp.ones_like(ma)
  r = ma - mb
  for _ in range(3):  # r < mb < 2**24, so r << 8 fits in uint32
    r = r << 8
    digit = r // jnp.maximum(mb, 1)
    r = r - digit * mb
    q = (q << 8) | digit
  # q in [2**24, 2**25): 25 quotient bits; the exact quotient is (q + r/mb) * 2**(e - 24).
  shift = jnp.clip(-125 - e, 1, 26).astype(jnp.uint32)  # 1 for normal results, more for subnormals
  kept = q >> shift
  dropped = q & ((jnp.uint32(1) << shift) - 1)
  half = jnp.uint32(1) << (shift - 1)
  round_up = (dropped > half) | ((dropped == half) & ((r != 0) | ((kept & 1) == 1)))
  kept = kept + round_up.astype(jnp.uint32)
  # kept carries the implicit bit, so adding it bumps the exponent field by one (and a carry out
  # of the mantissa rounds up into the next binade); subnormals have exponent field 0.
  magnitude = (jnp.clip(e + 126, 0, 253).astype(jnp.uint32) << 23) + kept
  magnitude = jnp.where(e > 127, _INF_BITS, magnitude)
  a_nan, b_nan = a_abs > _INF_BITS, b_abs > _INF_BITS
  a_inf, b_inf = a_abs == _INF_BITS, b_abs == _INF_BITS
  a_zero, b_zero = a_abs == 0, b_abs == 0
  magnitude = jnp.where(a_inf | b_zero, _INF_BITS, jnp.where(a_zero | b_inf, 0, magnitude))
  out = jnp.where(a_nan | b_nan | (a_inf & b_inf) | (a_zero & b_zero), _NAN_BITS, sign | magnitude)
  return f32_from_bits(out)


def abs_max(x, axis=None, keepdims=False):
  """max |x| over `axis` (f32), NaN if any element is NaN, on every backend.

  An integer max of the magnitude bits, which order like the magnitudes with NaN above inf: XLA:CPU's
  vectorized float max reductions drop NaNs (jnp.max of a [64, 64] array holding one NaN is finite there),
  while GPUs propagate them; a poisoned tensor must stay poisoned everywhere.
  """
  return f32_from_bits(jnp.max(f32_bits(x) & _ABS_MASK, axis=axis, keepdims=keepdims))


def max_across(amax, axis_names):
  """The largest of an amax (f32 >= 0, or NaN) over the mesh axes `axis_names`, inside a shard_map: one scalar
  all-reduce, of the bits, so a NaN on any shard wins as in abs_max. Without axes, amax itself."""
  if not axis_names:
    return amax
  return f32_from_bits(jax.lax.pmax(f32_bits(amax), tuple(axis_names)))


_HALVES = np.uint32([0xFFFF0000, 0x0000FFFF])


def materialize(*arrays):
  """The same 32-bit arrays (f32 / int32 / uint32), computed once where XLA would otherwise recompute them inside
  each consumer.

  XLA fuses cheap producers into every consumer that reads them, so per-block and per-tensor scales (dozens of
  integer ops each) would be recomputed for every element of a block. It never fuses a reduction into a consumer
  that reads its elements repeatedly, so the arrays' bits (stacked, per shape) go through one: each value's high
  and low 16 bits, or-ed back together (exact, and a fusion boundary), the halves on the major axis so XLA:CPU
  vectorizes it. Not a reduction that XLA folds away: max(b, 0) over a stack, or of b and b >> 1, are simplified to
  b. (An integer division by a 1 the compiler can't see, before: XLA:CPU divides element by element, and 4/6
  materializes ~10 values per block.)
  """
  out = list(arrays)
  for shape in dict.fromkeys(a.shape for a in arrays):  # one reduction per shape, over its arrays stacked
    which = [i for i, a in enumerate(arrays) if a.shape == shape]
    bits = jnp.stack([jax.lax.bitcast_convert_type(arrays[i], jnp.uint32) for i in which])
    halves = bits[None] & _HALVES.reshape((2,) + (1,) * bits.ndim)  # the halves on the major axis: vectorized
    kept = jax.lax.reduce(halves, np.uint32(0), jax.lax.bitwise_or, (0,))
    for k, i in enumerate(which):
      out[i] = jax.lax.bitcast_convert_type(kept[k], arrays[i].dtype)
  return tuple(out)


def round_to_dtype(x, dtype):
  """f32 `x` in `dtype`: bfloat16 by round_to_bf16 (one rounding on every backend), any other dtype by a cast."""
  return round_to_bf16(x) if jnp.dtype(dtype) == jnp.bfloat16 else x.astype(dtype)


@jax.jit
def round_to_bf16(x):
  """f32 -> bfloat16, round to nearest-even on the bits (NaN stays NaN, overflow -> inf)."""
  bits = f32_bits(x)
  rounded = bits + 0x7FFF + ((bits >> 16) & 1)
  bits = jnp.where((bits & _ABS_MASK) > _INF_BITS, bits | 0x400000, rounded) & np.uint32(0xFFFF0000)
  return f32_from_bits(bits).astype(jnp.bfloat16)  # exact: the low 16 bits are zero


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


def _quantum_exponent(abs_x, grid: FloatGrid):
  """log2 of the spacing of `grid` around |x| (an integer), exactly from the f32 exponent field."""
  return jnp.maximum(exponent_field(abs_x), grid.min_exponent) - grid.mantissa_bits


def saturation_threshold(grid: FloatGrid):
  """Magnitudes above max + half the top spacing are clipped, not merely rounded, when saturating."""
  _, exp = math.frexp(grid.max_value)  # the top binade's spacing, as _quantum_exponent computes it (static)
  return grid.max_value + 0.5 * 2.0 ** (max(exp - 1, grid.min_exponent) - grid.mantissa_bits)


def e2m1_spacing(abs_x):
  """(spacing, 1 / spacing) of E2M1 around 0 <= abs_x <= 6: 0.5 below 2, 1 below 4, 2 from 4 (powers of two).

  The same numbers as _quantum_exponent and exp2i give for E2M1, by two compares: rounding to E2M1 is most of a
  quantizer's per-element work, and this is a third of those ops. (NaN gets 2: its rounding stays NaN.)"""
  below_2, below_4 = abs_x < 2.0, abs_x < 4.0
  spacing = jnp.where(below_2, np.float32(0.5), jnp.where(below_4, np.float32(1.0), np.float32(2.0)))
  inverse = jnp.where(below_2, np.float32(2.0), jnp.where(below_4, np.float32(1.0), np.float32(0.5)))
  return spacing, inverse


def _spacing(abs_x, grid: FloatGrid):
  """(spacing, 1 / spacing) of `grid` around 0 <= abs_x <= grid.max_value, exact powers of two."""
  if grid == E2M1:
    return e2m1_spacing(abs_x)
  e = _quantum_exponent(abs_x, grid)
  return exp2i(e), exp2i(-e)


def round_to_grid(x, grid: FloatGrid):
  """Round f32 `x` to nearest-even on `grid`, saturating at ±max; NaN stays NaN. Returns f32.

  |x| times the inverse spacing (a power of two: exact), rounded half-to-even, times the spacing
  (exact), rather than a dtype cast: XLA's f32 -> fp8/fp4 converts are not guaranteed
  single-rounding on every backend.
  """
  x = x.astype(jnp.float32)
  abs_x = jnp.minimum(jnp.abs(x), grid.max_value)
  spacing, inverse = _spacing(abs_x, grid)
  rounded = jnp.minimum(jnp.round(abs_x * inverse) * spacing, grid.max_value)
  return jnp.where(jnp.isnan(x), x, jnp.copysign(rounded, x))


def stochastic_round_to_grid(x, grid: FloatGrid, key):
  """Round f32 `x` up or down to one of its two neighbours on `grid` with probability by distance.

  Unbiased inside the range up to the draw's 16-bit resolution (the fraction of the step is truncated to 16 bits,
  so |E[q(x)] - x| < 2**-16 of a grid step); saturates at ±max like round_to_grid. The draws are bit-identical on
  every backend: 16 bits per element from a counter hash of (key, row, column) (sr_bits.py), as Blackwell's
  stochastic-rounding conversion reads them. `x` is [rows, cols] (or 1-D: one row).
  """
  shape = jnp.shape(x)
  rows_cols = shape if len(shape) == 2 else (1, math.prod(shape))
  return stochastic_round_with_uniforms(x, grid, uniform16(key, rows_cols).reshape(shape))


def stochastic_round_with_uniforms(x, grid: FloatGrid, u):
  """stochastic_round_to_grid given its thresholds u in (0, 1] (x's shape): up where u <= the fraction of the step.

  For rounding several candidates of one tensor with the same draws (Four Over Six's two block scales).
  """
  x = x.astype(jnp.float32)
  abs_x = jnp.minimum(jnp.abs(x), grid.max_value)
  q, inv_q = _spacing(abs_x, grid)
  lower = jnp.floor(abs_x * inv_q) * q
  frac = (abs_x - lower) * inv_q  # in [0, 1): exact, lower and q are on the grid
  rounded = jnp.minimum(lower + jnp.where(u <= frac, q, 0.0), grid.max_value)
  return jnp.where(jnp.isnan(x), x, jnp.copysign(rounded, x))


def uniform16(key, shape):
  """The thresholds 1 - r / 2**16 of the 16-bit draws r of an operand of `shape` [rows, cols] (exact in f32)."""
  return uniform_from_draws(draws16(key, shape))


def draws16(key, shape):
  """The 16-bit draws r (uint16) of an operand of `shape` [rows, cols]: sr_bits.operand_draws."""
  return sr_bits.operand_draws(key, shape)


def uniform_from_draws(r):
  """1 - r / 2**16 in f32 (exact) for 16-bit draws r: rounding up where it is <= the step's fraction f is rounding up
  where floor(f * 2**16) + r >= 2**16, the carry out of adding r to f's top 16 bits (PTX's .rs rounding)."""
  return 1.0 - r.astype(jnp.float32) * 2.0**-16


def cast_exact(x_on_grid, grid: FloatGrid):
  """Store values already on `grid` in its jnp dtype (lossless)."""
  return x_on_grid.astype(grid.dtype)


def e8m0_exponent_at_least(ratio):
  """log2 of the smallest power of two >= ratio >= 0, clamped to E8M0's [-127, 127]; 0 (scale 1) where
  ratio is 0 or not finite. From the bits: exact powers of two keep their exponent.

  The MX block-scale rule TE's reference uses (ceil of log2), so no element of a block saturates.
  """
  bits = f32_bits(ratio) & _ABS_MASK
  field = (bits >> 23).astype(jnp.int32)
  fraction = bits & 0x7FFFFF
  normal = field - 127 + (fraction != 0).astype(jnp.int32)
  subnormal = jnp.where(fraction <= 0x400000, -127, -126)  # ratio <= 2**-127, or in (2**-127, 2**-126)
  exponent = jnp.clip(jnp.where(field == 0, subnormal, normal), -127, 127)
  return jnp.where((bits == 0) | (bits >= _INF_BITS), 0, exponent)
