"""Exact f32 arithmetic from the bits (division, powers of two, bf16 rounding) and backend-independent quantizers."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from MaxText.quantization import RECIPES, delayed, get_recipe, qmatmul
from MaxText.quantization.backends import emulated
from MaxText.quantization.formats import grids
from tests.quantization.gpu_division import gpu_like_division


def _random_f32(rng, n):
  """Uniform over all f32 bit patterns: every binade, subnormals, infs and NaNs."""
  return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def _same_bits(got, want):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))


def test_div_rn_is_ieee_division_bit_for_bit():
  rng = np.random.default_rng(0)
  n = 200_000
  specials = np.array(
    [
      0,
      -0.0,
      np.inf,
      -np.inf,
      np.nan,
      1e-45,
      -3e-42,
      1.1754942e-38,
      1.1754944e-38,
      grids.FLT_MAX,
      1,
      6,
      448,
      2688,
      3.0,
    ],
    np.float32,
  )
  sa, sb = (s.ravel() for s in np.meshgrid(specials, specials))
  typical = (rng.standard_normal((2, n)) * rng.lognormal(0, 8, (2, n))).astype(np.float32)
  a = np.concatenate([_random_f32(rng, n), typical[0], sa, np.full(n, 2688, np.float32)])
  random_b = _random_f32(rng, n)
  huge = np.minimum(rng.lognormal(0, 30, n), 3e38).astype(np.float32)
  b = np.concatenate([random_b, typical[1], sb, huge])
  with np.errstate(all="ignore"):
    want = a / b  # numpy: IEEE round-to-nearest-even, subnormals kept
  got = grids.div_rn(a, b)
  assert np.all(_same_bits(got, want))
  assert np.sum((want != 0) & (np.abs(want) < 1.1754944e-38)) > 1000  # subnormal quotients were covered


def test_div_rn_ignores_how_the_backend_divides():
  a, b = np.float32([2688.0, 1.0, 7.0]), np.float32([3.3e-5, 0.1, 448.0])
  with gpu_like_division():
    got = grids.div_rn(a, b)
  assert np.all(_same_bits(got, a / b))


def test_round_to_bf16_exp2i_and_exponents_from_bits():
  rng = np.random.default_rng(1)
  x = np.concatenate([_random_f32(rng, 100_000), np.float32([0.0, -0.0, 1.00390625, 1.01171875, 3.3961e38])])
  x = x[np.isfinite(x)]
  want = x.astype(ml_dtypes.bfloat16).astype(np.float32)  # round to nearest-even
  assert np.all(_same_bits(np.asarray(grids.round_to_bf16(x)).astype(np.float32), want))
  e = np.arange(-149, 128)
  np.testing.assert_array_equal(grids.exp2i(e), np.ldexp(np.float32(1), e).astype(np.float32))
  np.testing.assert_array_equal(grids.exponent_field(np.float32([1, 1.5, 2, 6, 448, 1e-38])), [0, 0, 1, 2, 8, -127])
  ratios = np.float32([0, 1, 0.75, 2**-127, 2**-126, 1.5 * 2**-127, 2**126, np.inf])
  np.testing.assert_array_equal(grids.e8m0_exponent_at_least(ratios), [0, 0, 0, -127, -126, -126, 126, 0])


def test_e2m1_spacing_is_the_exponent_fields_power_of_two():
  """The compare-based E2M1 spacing round_to_grid uses equals exp2i(+-_quantum_exponent) on every f32 in [0, 6] at
  a stride that visits every binade, the boundaries 2 and 4 and their neighbours, and NaN."""
  bits = np.arange(0, np.float32(6.0).view(np.uint32) + 1, 997, dtype=np.uint32)
  edges = np.float32([0, 2, 4, 6, 1e-45, 1.1754942e-38]).view(np.uint32)
  bits = np.concatenate([bits, edges, edges + 1, edges[1:] - 1]).view(np.float32)
  e = grids._quantum_exponent(bits, grids.E2M1)  # pylint: disable=protected-access
  spacing, inverse = grids.e2m1_spacing(bits)
  np.testing.assert_array_equal(spacing, grids.exp2i(e))
  np.testing.assert_array_equal(inverse, grids.exp2i(-e))
  q = np.asarray(grids.round_to_grid(np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.9, 7.0, -3.0]), grids.E2M1))
  np.testing.assert_array_equal(q, [0, 1, 1, 2, 2, 4, 4, 6, 6, -3])  # ties to even, saturation, sign


def test_materialize_returns_every_bit_pattern_unchanged():
  rng = np.random.default_rng(2)
  x = _random_f32(rng, 4096).reshape(64, 64)
  i = rng.integers(-(2**31), 2**31, (2, 64, 64), dtype=np.int64).astype(np.int32)
  u = rng.integers(0, 2**32, (64, 64), dtype=np.uint64).astype(np.uint32)
  got = jax.jit(grids.materialize)(x, i, u)
  np.testing.assert_array_equal(np.asarray(got[0]).view(np.uint32), x.view(np.uint32))  # NaN payloads included
  np.testing.assert_array_equal(got[1], i)
  np.testing.assert_array_equal(got[2], u)


def _operand(key, shape):
  """Lognormal magnitudes with a few large outliers: spread over many binades, blocks of every scale."""
  k1, k2, k3 = jax.random.split(key, 3)
  x = jax.random.normal(k1, shape) * jnp.exp(2.0 * jax.random.normal(k2, shape))
  return jnp.where(jax.random.uniform(k3, shape) < 0.01, x * 300, x).astype(jnp.bfloat16)


def _everything_a_recipe_computes(name):
  """Every quantized operand (data and scales as f32) and the linear layer's y, dx, dw, as one flat list."""
  kx, kw, kd = jax.random.split(jax.random.key(7), 3)
  x, w, dy = _operand(kx, (64, 64)), _operand(kw, (64, 32)).astype(jnp.float32), _operand(kd, (64, 32))
  recipe = get_recipe(name)
  operands = {"x": x, "w": w.T, "dy": dy, "w_t": w, "x_t": x.T, "dy_t": dy.T}
  out = []
  if recipe.stateful:
    history = delayed.init_history(recipe).at[:, 0].set(jnp.float32([0.7, 3.1, 41.0]))
    y, vjp = jax.vjp(lambda x, w, h: delayed.qmatmul_delayed(x, w, recipe, h), x, w, history)
    return out + [y, *vjp(dy)]
  for role, operand in operands.items():
    q = emulated.quantize_operand(operand, recipe, role, jax.random.key(3))
    scales = q.global_scale if q.scales is None else q.scales.astype(jnp.float32)
    out += [q.values.astype(jnp.float32), scales, emulated.dequantize_operand(q)]
  y, vjp = jax.vjp(lambda x, w: qmatmul(x, w, recipe, key=jax.random.key(5)), x, w)
  return out + [y, *vjp(dy)]


@pytest.mark.heavy
@pytest.mark.parametrize("name", [n for n, r in RECIPES.items() if r.quantized])
def test_every_quantizer_gives_the_same_bits_with_gpu_like_division(name):
  ieee = jax.jit(_everything_a_recipe_computes, static_argnums=0)(name)
  with gpu_like_division():
    gpu = jax.jit(_everything_a_recipe_computes, static_argnums=0)(name)
  for i, (a, b) in enumerate(zip(ieee, gpu)):
    assert np.all(_same_bits(a, b)), f"{name}: output {i} differs"
