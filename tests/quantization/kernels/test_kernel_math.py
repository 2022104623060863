"""kernel_math.py: the Triton-lowerable arithmetic equals grids.py / nvfp4.py bit for bit (run here through XLA)."""

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.quantization.formats import grids, nvfp4
from MaxText.quantization.kernels import kernel_math as km
from tests.quantization.formats.test_grids import _random_f32, _same_bits


def _values(n=100_000):
  rng = np.random.default_rng(0)
  typical = (rng.standard_normal(n) * rng.lognormal(0, 4, n)).astype(np.float32)
  ties = np.float32([0.25, 0.75, 1.25, 2.5, 3.5, 5, -0.25, 6.5, 0.5 + 2**-23, 448, 464, 480, 57344, 61440])
  specials = np.float32([0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, 1.1754944e-38, grids.FLT_MAX])
  return np.concatenate([_random_f32(rng, n), typical, ties, ties * 2.0**-9, specials])


def test_rounding_min_max_and_fp8_codes():
  x = _values()
  for grid in (grids.E2M1, grids.E4M3, grids.E5M2):
    q = jax.jit(km.round_to_grid, static_argnums=1)(x, grid)
    assert np.all(_same_bits(q, grids.round_to_grid(x, grid))), grid.name
    if grid is grids.E2M1:
      assert np.all(_same_bits(km.e2m1_storage(q), q.astype(jnp.float4_e2m1fn).astype(jnp.float32)))
    else:
      want = jax.lax.bitcast_convert_type(q.astype(grid.dtype), jnp.uint8)
      np.testing.assert_array_equal(jax.jit(km.fp8_bits, static_argnums=1)(q, grid), want)
  v = np.abs(x[np.isfinite(x)])
  v = v[v < 2**22]
  np.testing.assert_array_equal(jax.jit(km.round_half_even)(v), np.round(v))
  normal = x[~((x != 0) & (np.abs(x) < 1.1754944e-38))]  # XLA:CPU flushes subnormals in float min/max
  a, b = normal[: len(normal) // 2], normal[len(normal) // 2 : 2 * (len(normal) // 2)]
  assert np.all(_same_bits(km.minimum(a, b), jnp.minimum(a, b)))
  assert np.all(_same_bits(km.maximum(a, b), jnp.maximum(a, b)))
  assert np.isnan(float(grids.f32_from_bits(km.amax_bits(jnp.float32([1.0, np.nan, np.inf])))))


def test_stochastic_rounding_from_given_uniforms():
  x = _values(20_000)
  key = jax.random.key(3)
  u = grids.uniform16(key, (1, x.size)).reshape(x.shape)
  got = km.stochastic_round_to_grid(jnp.asarray(x), grids.E2M1, u)
  assert np.all(_same_bits(got, grids.stochastic_round_to_grid(x, grids.E2M1, key)))


def test_hadamard_butterfly_is_the_xla_paths():
  rng = np.random.default_rng(1)
  x = np.concatenate([_random_f32(rng, 16 * 4000), (rng.standard_normal(16 * 4000) * 3).astype(np.float32)])
  x = jnp.asarray(x[np.isfinite(x)][: 16 * 6000].reshape(-1, 160)).astype(jnp.bfloat16)
  got = jax.jit(lambda a: km.hadamard16(a.astype(jnp.float32).reshape(a.shape[0], -1, 16)).reshape(a.shape))(x)
  assert np.all(_same_bits(got, nvfp4.hadamard16(x).astype(jnp.float32)))
