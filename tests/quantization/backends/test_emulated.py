"""The emulated backend's per-tensor FP8 linear layer (fp8_linear): the same bits as the generic quantize-and-GEMM
path for current scaling, delayed scaling's history scales and update, and who quantizes under each `kernels`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.quantization import get_recipe
from MaxText.quantization.backends import emulated
from MaxText.quantization.backends import base
from MaxText.quantization.formats import fp8, grids
from MaxText.quantization.kernels import quantizer_impl
from MaxText.quantization.kernels.quantizer_impl import Kernels


def _operands(m, k, n, dtype):
  kx, kw, kd = jax.random.split(jax.random.key(m * k + n), 3)
  x = (jax.random.normal(kx, (m, k)) * 3.0).astype(dtype)
  w = jax.random.normal(kw, (k, n)) * 0.05
  dy = (jax.random.normal(kd, (m, n)) * 1e-3).astype(dtype)
  return x, w, dy


def _fwd_bwd(matmul, x, w, dy, *extra):
  y, vjp = jax.vjp(matmul, x, w, *extra)
  return (y, *vjp(dy))


def _same_bits(got, want):
  for g, e in zip(got, want):
    assert g.dtype == e.dtype and g.shape == e.shape
    np.testing.assert_array_equal(np.asarray(g.astype(jnp.float32)), np.asarray(e.astype(jnp.float32)))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("shape", [(64, 96, 48), (33, 17, 9)])
def test_current_scaling_has_the_generic_paths_bits(shape, dtype):
  """fp8_linear (one quantization per operand, scales folded into the GEMM) against the three GEMMs of gemms.py,
  which quantizes each GEMM's operand in its own orientation and scales the f32 sum: y, dx and dw bit for bit."""
  recipe = get_recipe("te_fp8_currentscaling")
  x, w, dy = _operands(*shape, dtype)
  key = jax.random.key(0)  # unused by FP8 (no stochastic rounding); the generic path splits it
  generic = lambda x, w: base.dense(emulated.BACKEND, x, w, recipe, key=key, kernels=Kernels.XLA)
  want = _fwd_bwd(generic, x, w, dy)
  _same_bits(_fwd_bwd(lambda x, w: emulated.fp8_linear(x, w, recipe), x, w, dy), want)
  assert want[0].dtype == dtype and want[2].dtype == jnp.float32


def test_the_backends_dense_takes_the_fp8_layer_with_the_pallas_kernels_bits():
  """The emulated backend's dense runs current scaling through fp8_linear; the Pallas kernels (interpreted) quantize
  to the XLA path's bits there too."""
  recipe = get_recipe("te_fp8_currentscaling")
  x, w, dy = _operands(33, 17, 9, jnp.bfloat16)
  want = _fwd_bwd(lambda x, w: emulated.fp8_linear(x, w, recipe, Kernels.XLA), x, w, dy)
  backend = lambda x, w: emulated.BACKEND.dense(x, w, recipe, key=None, kernels=Kernels.INTERPRET)
  _same_bits(_fwd_bwd(backend, x, w, dy), want)


def test_delayed_scaling_reads_its_scales_from_the_history_and_pushes_the_amaxes():
  """With the operands' own amaxes as the history's largest entries, delayed scaling quantizes with the current
  scales (bit for bit); the history's gradient is the history with this step's amaxes in front."""
  recipe = get_recipe("te_fp8_delayedscaling", amax_history_len=4)
  x, w, dy = _operands(64, 96, 48, jnp.bfloat16)
  amaxes = jnp.stack([grids.abs_max(t.astype(jnp.float32)) for t in (x, w, dy)])
  history = jnp.zeros((3, 4), jnp.float32).at[:, 2].set(amaxes).at[:, 3].set(amaxes / 2)
  y, dx, dw, new_history = _fwd_bwd(lambda x, w, h: emulated.fp8_linear(x, w, recipe, history_3xH=h), x, w, dy, history)
  current = get_recipe("te_fp8_currentscaling")
  _same_bits((y, dx, dw), _fwd_bwd(lambda x, w: emulated.fp8_linear(x, w, current), x, w, dy))
  np.testing.assert_array_equal(new_history, fp8.push_history(history, amaxes))
  np.testing.assert_array_equal(new_history[:, 0], amaxes)
  np.testing.assert_array_equal(new_history[:, 1:], history[:, :-1])


def test_history_scales_follow_the_amax_compute_algo():
  history = jnp.array([[2.0, 8.0], [0.5, 0.25], [0.0, 0.0]], jnp.float32)
  e4m3, e5m2 = 448.0, 57344.0
  scales, decode = fp8.scales_from_history(history, [e4m3, e4m3, e5m2], "max")
  np.testing.assert_array_equal(scales, [e4m3 / 8, e4m3 / 0.5, 1.0])  # amax 0: scale 1
  np.testing.assert_array_equal(decode, 1 / scales)
  scales, _ = fp8.scales_from_history(history, [e4m3, e4m3, e5m2], "most_recent")
  np.testing.assert_array_equal(scales, [e4m3 / 2, e4m3 / 0.5, 1.0])


def test_auto_quantizes_per_tensor_fp8_on_the_xla_path():
  """`auto` keeps per-tensor FP8 on the XLA path (faster on the H100 than the Pallas kernel); an explicit kernels
  choice and every other recipe keep quantizer_impl's answer; the precision plan says which."""
  fp8_recipe, nvfp4 = get_recipe("te_fp8_currentscaling"), get_recipe("te_nvfp4")
  assert emulated.quantizers_for(fp8_recipe, Kernels.AUTO) is Kernels.XLA
  assert emulated.quantizers_for(fp8_recipe, Kernels.INTERPRET) is Kernels.INTERPRET
  assert emulated.quantizers_for(nvfp4, Kernels.AUTO) is quantizer_impl.resolve(Kernels.AUTO)
  assert emulated.BACKEND.quantizers(Kernels.AUTO, fp8_recipe) == "xla"
  assert emulated.BACKEND.quantizers(Kernels.INTERPRET, fp8_recipe) == "interpret"
