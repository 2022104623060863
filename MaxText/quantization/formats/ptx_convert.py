"""NVIDIA's narrow-float conversion instructions as the PTX ISA defines them, in pure JAX (the kernels' twins).

The Pallas kernels convert with these instructions where the target has them (kernels/ptx.py); on CPU, in Pallas'
interpret mode (which cannot run inline PTX) and on targets without them, the kernels call these functions instead,
so every test on this machine runs the instruction's definition:

  cvt.rn.satfinite.e2m1x2.f32   round to nearest even onto E2M1, |x| > 6 -> +-6, NaN -> +6 (sm_100a+)
  cvt.rs.satfinite.e2m1x4.f32   round up or down by the carry out of adding 16 random bits to the top 16 bits of
                                the discarded fraction, then saturate as above; the 32-bit rbits operand split into
                                four 16-bit draws as sr_bits.draws_of_word lays them out (sm_100a, sm_103a)
  cvt.rn.satfinite.e4m3x2.f32   round to nearest even onto E4M3, |x| > 448 -> +-448, NaN -> NaN (sm_89+)
  cvt.rn.bf16x2.f32             round to nearest even onto bfloat16 (sm_80+)
  rcp.rn.f32                    the correctly rounded reciprocal (grids.div_rn(1, x))

Codes are uint32 (E2M1: 4 bits, sign in bit 3; E4M3: 8 bits). Every function is built from integer and exact f32
operations that Triton lowers too, so it is also what the kernels run on a target without the instruction.
"""

import jax.numpy as jnp
import numpy as np

from MaxText.quantization.formats import grids

_ABS = np.uint32(0x7FFFFFFF)
E2M1_NAN_CODE = np.uint32(7)  # satfinite turns NaN into +MAX_NORM (+6)


def _abs(x):
  return grids.f32_from_bits(grids.f32_bits(x) & _ABS)


def _e2m1_code(k, a, x):
  """The E2M1 code of the grid value k * spacing(a) (k from the magnitude a in [0, 6]) with x's sign."""
  offset = jnp.where(a < 2.0, np.uint32(0), jnp.where(a < 4.0, np.uint32(2), np.uint32(4)))
  code = k.astype(jnp.uint32) + offset  # 2a (< 2), a + 2 (< 4), a / 2 + 4: the code of the rounded value
  sign = (grids.f32_bits(x) >> np.uint32(28)) & np.uint32(8)
  return jnp.where(jnp.isnan(x), E2M1_NAN_CODE, sign | code)


def _round_half_even(t):
  """jnp.round(t) for 0 <= t < 2**22 from floor and compares (jnp.round has no Triton lowering)."""
  f = jnp.floor(t)
  d = t - f  # exact
  odd = jnp.floor(f * 0.5) != f * 0.5
  return f + jnp.where((d > 0.5) | ((d == 0.5) & odd), np.float32(1.0), np.float32(0.0))


def e2m1_rn(x):
  """cvt.rn.satfinite.e2m1x2.f32 of each element of f32 x: its E2M1 code."""
  a = jnp.minimum(_abs(x), np.float32(6.0))
  _, inverse = grids.e2m1_spacing(a)
  return _e2m1_code(_round_half_even(a * inverse), a, x)  # a * inverse: exact (a power of two)


def e2m1_rs(x, r16):
  """cvt.rs.satfinite.e2m1x4.f32 of each element of f32 x with its 16-bit draw r16 (uint32 < 2**16): its E2M1 code.

  Rounds away from zero where floor(f * 2**16) + r16 >= 2**16 for f the fraction of the E2M1 step (grids'
  stochastic rounding with thresholds 1 - r16 / 2**16)."""
  a = jnp.minimum(_abs(x), np.float32(6.0))
  _, inverse = grids.e2m1_spacing(a)
  t = a * inverse  # exact
  low = jnp.floor(t)
  up = grids.uniform_from_draws(r16) <= t - low
  return _e2m1_code(low + jnp.where(up, np.float32(1.0), np.float32(0.0)), a, x)


def e2m1_value(code):
  """The f32 value of an E2M1 code (uint32 < 16)."""
  magnitude = code & np.uint32(7)
  value = jnp.where(
    magnitude < 4, magnitude.astype(jnp.float32) * 0.5, jnp.where(magnitude < 6, magnitude - 2, 2 * magnitude - 8)
  ).astype(jnp.float32)
  return jnp.where((code & np.uint32(8)) != 0, -value, value)


def pack_nibbles(codes):
  """[..., 8] E2M1 codes -> [...] uint32 words, element i in bits 4i..4i+3 (how float4_e2m1fn packs, low first)."""
  word = jnp.zeros(codes.shape[:-1], jnp.uint32)
  for i in range(codes.shape[-1]):
    word = word | (codes[..., i].astype(jnp.uint32) << np.uint32(4 * i))
  return word


def e4m3_rn(x):
  """cvt.rn.satfinite.e4m3x2.f32 of each element of f32 x: (its E4M3 code, the code's f32 value)."""
  q = grids.round_to_grid(jnp.clip(x, -grids.E4M3.max_value, grids.E4M3.max_value), grids.E4M3)
  return e4m3_code(q), q


def e4m3_code(q):
  """The 8-bit code of q, a value on the E4M3 grid, or NaN (0x7F)."""
  bits = grids.f32_bits(q)
  sign = (bits >> np.uint32(24)) & np.uint32(0x80)
  field = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(jnp.int32)
  normal = (jnp.maximum(field - 120, 0).astype(jnp.uint32) << np.uint32(3)) | ((bits & np.uint32(0x7FFFFF)) >> 20)
  subnormal = (_abs(q) * 2.0**9).astype(jnp.uint32)  # below 2**-6: a multiple of 2**-9, exactly
  code = jnp.where(field >= 121, normal, subnormal)
  return jnp.where(jnp.isnan(q), np.uint32(0x7F), sign | code)


def bf16_rn(x):
  """cvt.rn.bf16x2.f32 of each element, returned as f32 (grids.round_to_bf16)."""
  return grids.round_to_bf16(x).astype(jnp.float32)


def rcp_rn(x):
  """rcp.rn.f32: 1 / x correctly rounded."""
  return grids.div_rn(1.0, x)
