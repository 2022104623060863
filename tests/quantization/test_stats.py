"""Quantization telemetry: relative error, saturated and underflowed blocks, carried as a sink's gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.quantization.backends import emulated
from MaxText.quantization.formats import grids, nvfp4
from MaxText.quantization import get_recipe, qmatmul, stats

NVFP4 = get_recipe("te_nvfp4")
FP8 = get_recipe("te_fp8_currentscaling")


def test_saturation_threshold_is_max_plus_half_the_top_spacing():
  assert grids.saturation_threshold(grids.E2M1) == 7.0  # 4, 6: spacing 2
  assert grids.saturation_threshold(grids.E4M3) == 464.0  # 416, 448: spacing 32
  assert grids.saturation_threshold(grids.E5M2) == 61440.0  # 49152, 57344: spacing 8192


def test_values_on_the_grid_quantize_exactly():
  # Every 16-block holds 6 (its amax) and E2M1 values, tensor amax 6 -> S_enc 448, block scale 448/448 = 1.
  grid_values = np.array([6, 4, 3, 2, 1.5, 1, 0.5, 0, -6, -4, -3, -2, -1.5, -1, -0.5, 0], np.float32)
  x = jnp.asarray(np.tile(grid_values, (8, 4)))
  rel_err, saturated, underflow = np.asarray(stats.operand_stats(x, NVFP4, "x"))
  assert rel_err < 1e-6 and saturated == 0.0 and underflow == 0.0  # only 1/S_enc = 1/448 rounds in f32


def test_underflowed_block_is_counted_once_and_not_as_saturated():
  x = jax.random.normal(jax.random.key(0), (8, 64))
  # Block (0, 0) is 1e-9 next to a 1e4 outlier: its E4M3 scale rounds to 0, so it quantizes to zeros.
  x = x.at[0, :16].set(1e-9).at[1, 0].set(1e4)
  rel_err, saturated, underflow = np.asarray(stats.operand_stats(x, NVFP4, "x"))
  assert underflow == 1 / 32 and saturated == 0.0 and 0 < rel_err < 0.01


def test_per_tensor_scale_too_large_saturates_the_right_blocks():
  x = jnp.ones((4, 32)).at[0, 3].set(10.0).at[2, 20].set(-10.0)  # 2 of 8 blocks of 16 exceed 1.0
  q = emulated.quantize_operand(x, FP8, "x", scale=jnp.float32(448.0))  # a stale (delayed) scale: amax 1
  rel_err, saturated, underflow = np.asarray(stats.operand_stats(x, FP8, "x", q))
  assert saturated == 2 / 8 and underflow == 0.0
  assert rel_err == pytest.approx(np.sqrt(2 * 9.0**2 / (126 + 200)), rel=1e-6)


def test_rht_roles_are_measured_against_the_rotated_operand():
  x = jax.random.normal(jax.random.key(1), (32, 64))
  err_rht = stats.operand_stats(x, NVFP4, "x_t")[0]
  q = nvfp4.quantize(x, rht=True)
  ref = nvfp4.hadamard16(x).astype(jnp.float32)
  expected = jnp.linalg.norm(nvfp4.dequantize(q) - ref) / jnp.linalg.norm(ref)
  assert err_rht == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.slow
def test_sink_gradient_carries_stats_and_leaves_the_gemm_unchanged():
  x = jax.random.normal(jax.random.key(2), (32, 64), jnp.bfloat16)
  w = jax.random.normal(jax.random.key(3), (64, 48)) * 0.05
  key = jax.random.key(4)

  def loss(x, w, sink):
    return jnp.sum(qmatmul(x, w, NVFP4, key=key, stats_sink=sink).astype(jnp.float32) ** 2)

  plain = jax.jit(
    jax.grad(lambda x, w: jnp.sum(qmatmul(x, w, NVFP4, key=key).astype(jnp.float32) ** 2), argnums=(0, 1))
  )(x, w)
  dx, dw, sink_grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, stats.empty_sink())
  np.testing.assert_array_equal(dx, plain[0])
  np.testing.assert_array_equal(dw, plain[1])
  assert sink_grad.shape == (6, 3)
  roles = list(stats.ROLES)
  operand_stats = jax.jit(stats.operand_stats, static_argnums=(1, 2))  # one compile, not one per op
  np.testing.assert_allclose(sink_grad[roles.index("x")], operand_stats(x, NVFP4, "x"), rtol=1e-6)
  np.testing.assert_allclose(sink_grad[roles.index("w")], operand_stats(w.T, NVFP4, "w"), rtol=1e-6)
  # 2D weight tiles: the transposed view is the same numbers, so the same error.
  np.testing.assert_allclose(sink_grad[roles.index("w_t")], sink_grad[roles.index("w")], rtol=1e-6)
  assert 0.05 < float(sink_grad[roles.index("dy"), 0]) < 0.25  # E2M1's ~10% relative error on gaussians
