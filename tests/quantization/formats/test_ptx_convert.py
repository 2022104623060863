"""ptx_convert: the PTX conversions' twins are the instructions' definitions: round to nearest even and saturate (NaN
to +6 for E2M1, NaN kept for E4M3), stochastic rounding by the carry out of the 16 random bits."""

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.quantization.formats import grids
from MaxText.quantization.formats import ptx_convert as cvt

E2M1_GRID = np.float32([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def _values():
  rng = np.random.default_rng(0)
  grid = np.concatenate([E2M1_GRID, (E2M1_GRID[1:] + E2M1_GRID[:-1]) / 2])  # every value and midpoint
  near = np.concatenate([np.nextafter(grid, np.float32(-1)), np.nextafter(grid, np.float32(9))])
  wide = (rng.standard_normal(20_000) * np.exp(rng.standard_normal(20_000) * 2)).astype(np.float32)
  x = np.concatenate([grid, near, wide, np.float32([6.5, 7.0, 1e30, np.inf, 1e-40, 0.0])])
  return np.concatenate([x, -x]).astype(np.float32)


def test_e2m1_rn_is_nearest_even_saturating_and_nan_to_six():
  x = _values()
  got = np.asarray(cvt.e2m1_rn(jnp.asarray(x)))
  want = grids.round_to_grid(jnp.clip(x, -6.0, 6.0), grids.E2M1)
  np.testing.assert_array_equal(np.asarray(cvt.e2m1_value(jnp.asarray(got))), np.asarray(want))
  # the code's bits are what float4_e2m1fn stores (sign of zero included)
  want_codes = np.asarray(jax.lax.bitcast_convert_type(want.astype(jnp.float4_e2m1fn), jnp.uint4)).astype(np.uint32)
  np.testing.assert_array_equal(got, want_codes)
  assert int(cvt.e2m1_rn(jnp.float32(np.nan))) == 7


def test_e2m1_rs_rounds_by_the_carry_of_the_draw():
  x = _values()
  x = x[np.isfinite(x)]
  for r in (0, 1, 0x8000, 0xFFFF):
    got = cvt.e2m1_value(cvt.e2m1_rs(jnp.asarray(x), jnp.full(x.shape, r, jnp.uint32)))
    want = grids.stochastic_round_with_uniforms(
      jnp.clip(x, -6.0, 6.0), grids.E2M1, grids.uniform_from_draws(jnp.uint16(r))
    )
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  a = np.abs(np.clip(x, -6, 6))
  down = np.abs(np.asarray(cvt.e2m1_value(cvt.e2m1_rs(jnp.asarray(x), jnp.zeros(x.shape, jnp.uint32)))))
  assert np.all(down <= a)  # r = 0 never carries: toward zero
  t = np.float32(1.25)  # a quarter step above 1 in E2M1: floor(0.5 * 2**16) + r carries from r = 2**15
  ups = [float(cvt.e2m1_value(cvt.e2m1_rs(t, jnp.uint32(r)))) for r in (0x7FFF, 0x8000)]
  assert ups == [1.0, 1.5]
  assert int(cvt.e2m1_rs(jnp.float32(np.nan), jnp.uint32(5))) == 7


def test_e4m3_rn_is_nearest_even_saturating_with_xlas_codes():
  rng = np.random.default_rng(1)
  x = np.abs(rng.standard_normal(20_000) * np.exp(rng.standard_normal(20_000) * 4)).astype(np.float32)
  x = np.concatenate([x, np.float32([0, 448, 464, 480, 1e30, np.inf, 2**-9, 2**-10, 3 * 2**-11])])
  code, value = cvt.e4m3_rn(jnp.asarray(x))
  want = grids.round_to_grid(jnp.clip(x, -448.0, 448.0), grids.E4M3)
  np.testing.assert_array_equal(np.asarray(value), np.asarray(want))
  want_codes = np.asarray(jax.lax.bitcast_convert_type(want.astype(jnp.float8_e4m3fn), jnp.uint8))
  np.testing.assert_array_equal(np.asarray(code), want_codes)
  assert int(cvt.e4m3_rn(jnp.float32(np.nan))[0]) == 0x7F


def test_pack_nibbles_is_float4_e2m1fns_packing():
  codes = jnp.asarray(np.arange(16, dtype=np.uint32).reshape(2, 8))
  words = np.asarray(cvt.pack_nibbles(codes))
  values = cvt.e2m1_value(codes).astype(jnp.float4_e2m1fn)
  packed = np.asarray(jax.lax.bitcast_convert_type(values.reshape(2, 4, 2), jnp.uint8)).view(np.uint32).ravel()
  np.testing.assert_array_equal(words, packed)
