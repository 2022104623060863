"""NVFP4 quantizer: bit-exact with TE's reference on the golden cases, edge cases, SR statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.quantization.formats import nvfp4
from tests.conftest import division_modes, golden_params

E2M1_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)


def _f32(a):
  return np.asarray(jnp.asarray(a).astype(jnp.float32))


@pytest.mark.parametrize("division", division_modes())
@pytest.mark.parametrize("case", golden_params("quantize"))
def test_quantize_bit_exact_with_te_reference(case, division):
  """Both sides of every case, with IEEE f32 division and with a GPU's (see gpu_division.py)."""
  _, meta, d = case
  with division():
    for side in ("row", "col"):
      x = d["x"] if side == "row" else d["x"].T
      rht = meta["rht"] and side == "col"
      q = nvfp4.quantize(jnp.asarray(x), tile=tuple(meta["tile"]), rht=rht)
      assert q.values.dtype == jnp.float4_e2m1fn and q.scales.dtype == jnp.float8_e4m3fn
      assert q.scales.shape == (x.shape[0], x.shape[1] // 16)
      np.testing.assert_array_equal(_f32(q.values), d[f"{side}_values"], err_msg=side)  # +0 == -0 as numbers
      np.testing.assert_array_equal(_f32(q.scales), d[f"{side}_scales"], err_msg=side)
      assert float(q.global_scale) == float(d[f"{side}_amax"])
      np.testing.assert_array_equal(np.asarray(nvfp4.dequantize(q)), d[f"{side}_dequant"], err_msg=side)
      if rht:
        np.testing.assert_array_equal(_f32(nvfp4.hadamard16(jnp.asarray(x))), d["col_input"])


def test_hand_computed_block():
  # amax 12 -> S_enc = 2688/12 = 224; block scale = e4m3(12 * 224/6 = 448) = 448;
  # encode = 1/(448/224) = 0.5, so x*0.5 = [6, 1.25->1, 0.3->0.5, -0.75->-1(RNE, even mantissa)]
  x = jnp.array([[12.0, 2.5, 0.6, -1.5] + [0.0] * 12], jnp.float32)
  q = nvfp4.quantize(x)
  assert float(q.global_scale) == 12.0 and float(q.scales[0, 0].astype(jnp.float32)) == 448.0
  np.testing.assert_array_equal(_f32(q.values)[0, :4], [6.0, 1.0, 0.5, -1.0])
  np.testing.assert_allclose(np.asarray(nvfp4.dequantize(q))[0, :4], [12.0, 2.0, 1.0, -2.0], rtol=1e-6)


def test_2d_tiles_give_identical_forward_and_transposed_numbers():
  w = jax.random.normal(jax.random.key(0), (64, 48)) * jnp.linspace(0.1, 10, 48)
  fwd = nvfp4.dequantize(nvfp4.quantize(w, tile=(16, 16)))
  bwd = nvfp4.dequantize(nvfp4.quantize(w.T, tile=(16, 16)))
  np.testing.assert_array_equal(np.asarray(fwd), np.asarray(bwd).T)
  # 1x16 blocks differ between the two views (the reason for 2D weight tiles).
  assert not np.array_equal(
    np.asarray(nvfp4.dequantize(nvfp4.quantize(w))), np.asarray(nvfp4.dequantize(nvfp4.quantize(w.T))).T
  )


def test_rht_is_orthonormal_and_reduces_outlier_blocks():
  h = nvfp4.rht_matrix()
  np.testing.assert_allclose(h @ h.T, np.eye(16), atol=0)
  x = np.zeros((4, 32), np.float32)
  x[:, 3], x[:, 20] = 100.0, 1.0
  y = _f32(nvfp4.hadamard16(jnp.asarray(x)))
  np.testing.assert_allclose(np.abs(y[:, :16]), 25.0)  # outlier spread evenly over its block
  np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-3)


@pytest.mark.parametrize("magnitude", [0.0, 1e-30, 3e38])
def test_extreme_magnitudes(magnitude):
  x = jnp.full((16, 32), magnitude, jnp.float32).at[0, 0].set(magnitude * 0.5)
  q = nvfp4.quantize(x)
  dq = np.asarray(nvfp4.dequantize(q))
  assert np.all(np.isfinite(dq))
  np.testing.assert_allclose(dq, np.asarray(x), rtol=0.1)


def test_nan_and_inf_do_not_crash():
  x = jnp.ones((2, 32)).at[0, 5].set(jnp.inf)
  q = nvfp4.quantize(x)
  assert float(q.scales[0, 0].astype(jnp.float32)) == 448.0 and float(_f32(q.values)[0, 5]) == 6.0
  q = nvfp4.quantize(jnp.ones((2, 32)).at[1, 1].set(jnp.nan))
  assert np.all(np.isnan(np.asarray(nvfp4.dequantize(q))))


def test_padding_of_ragged_last_axis_matches_explicit_zero_padding():
  x = jax.random.normal(jax.random.key(1), (5, 40))
  q = nvfp4.quantize(x)
  assert q.values.shape == (5, 40) and q.scales.shape == (5, 3)
  q_pad = nvfp4.quantize(jnp.pad(x, ((0, 0), (0, 8))))
  np.testing.assert_array_equal(_f32(q.values), _f32(q_pad.values)[:, :40])
  np.testing.assert_array_equal(_f32(q.scales), _f32(q_pad.scales))
  q2d = nvfp4.quantize(x, tile=(16, 16))
  assert q2d.values.shape == (5, 40) and q2d.scales.shape == (5, 3)


def test_bad_shapes_are_clear_errors():
  with pytest.raises(ValueError, match=r"\(3, 24\)"):
    nvfp4.hadamard16(jnp.ones((3, 24)))
  with pytest.raises(ValueError, match="2-D"):
    nvfp4.quantize(jnp.ones((2, 3, 16)))
  with pytest.raises(ValueError, match="tile"):
    nvfp4.quantize(jnp.ones((2, 16)), tile=(2, 16))
  with pytest.raises(ValueError, match="key"):
    nvfp4.quantize(jnp.ones((2, 16)), stochastic_rounding=True)


def test_stochastic_rounding_is_unbiased_and_neighbour_only():
  # One block whose amax (6.0) pins encode scale to exactly 1, so scaled values are the inputs.
  row = np.array([6.0, 0.1, 0.7, 1.2, 1.8, 2.2, 2.6, 3.3, 3.9, 4.4, 5.1, 5.7, -0.3, -2.9, -4.9, 0.0], np.float32)
  n = 4000
  x = jnp.asarray(np.tile(row, (n, 1)))
  q = nvfp4.quantize(x, stochastic_rounding=True, key=jax.random.key(42))
  assert np.all(_f32(q.scales) == _f32(nvfp4.quantize(x).scales))  # scales as without SR
  v = _f32(q.values)
  lo = np.array([E2M1_GRID[E2M1_GRID <= abs(r)].max() for r in row]) * np.sign(row)
  hi = np.array([E2M1_GRID[E2M1_GRID >= abs(r)].min() for r in row]) * np.sign(row)
  assert np.all((v == lo) | (v == hi))  # only the two neighbours
  mean = v.mean(axis=0)
  spacing = np.abs(hi - lo)
  stderr = np.maximum(spacing / 2 / np.sqrt(n), 1e-12)
  assert np.all(np.abs(mean - row) < 5 * stderr), (mean, row)  # unbiased, 5 sigma
  # and not round-to-nearest in disguise: 0.7 must land on 0.5 about 60% of the time
  assert 0.55 < np.mean(v[:, 2] == 0.5) < 0.65
