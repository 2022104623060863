"""qmatmul: golden NVFP4 linear layers, every recipe's gradients, SR keys, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.quantization import backends, delayed, get_recipe, qdense, qmatmul, recipe_names
from MaxText.quantization.backends import emulated
from MaxText.quantization.formats import grids, nvfp4
from MaxText.quantization.kernels.quantizer_impl import Kernels
from tests.conftest import division_modes, golden_params


def _rel(a, b):
  a = np.asarray(jnp.asarray(a).astype(jnp.float32))
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("division", division_modes())
@pytest.mark.parametrize("case", golden_params("linear"))
def test_golden_linear_fprop_dgrad_wgrad(case, division):
  _, meta, d = case
  recipe = get_recipe("te_nvfp4" if meta["rht"] else "te_nvfp4_no_rht", disable_stochastic_rounding=True)
  with division():
    for dtype in (jnp.float32, jnp.bfloat16):
      y, vjp = jax.vjp(lambda x, w: qmatmul(x, w, recipe), jnp.asarray(d["x"], dtype), jnp.asarray(d["w"]))
      dx, dw = vjp(jnp.asarray(d["dy"], dtype))
      assert y.dtype == dtype and dx.dtype == dtype and dw.dtype == jnp.float32
      tol = 1e-6 if dtype == jnp.float32 else 5e-3  # f32 outputs: only the f32 sum order differs
      for name, got, want in (("y", y, d["y"]), ("dx", dx, d["dx"]), ("dw", dw, d["dw"])):
        assert _rel(got, want) < tol, (name, dtype, _rel(got, want))


def test_rht_changes_only_the_wgrad():
  kx, kw, kd = jax.random.split(jax.random.key(0), 3)
  x, w, dy = jax.random.normal(kx, (64, 96)), jax.random.normal(kw, (96, 32)), jax.random.normal(kd, (64, 32))
  outs = {}
  for name in ("te_nvfp4", "te_nvfp4_no_rht"):
    r = get_recipe(name, disable_stochastic_rounding=True)
    y, vjp = jax.vjp(lambda x, w: qmatmul(x, w, r), x, w)
    outs[name] = (y, *vjp(dy))
  a, b = outs["te_nvfp4"], outs["te_nvfp4_no_rht"]
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.array_equal(a[2], b[2])
  exact_dw = x.T @ dy
  assert _rel(a[2], exact_dw) < 0.2 and _rel(b[2], exact_dw) < 0.2


@pytest.mark.parametrize("name", ["te_nvfp4", "te_nvfp4_no_rht", "te_fp8_currentscaling", "te_mxfp8", "mxfp4", ""])
def test_every_recipe_approximates_the_exact_gradients(name):
  kx, kw, kd = jax.random.split(jax.random.key(1), 3)
  x, w, dy = jax.random.normal(kx, (64, 128)), jax.random.normal(kw, (128, 64)), jax.random.normal(kd, (64, 64))
  r = get_recipe(name)
  y, vjp = jax.vjp(lambda x, w: qmatmul(x, w, r, key=jax.random.key(3)), x, w)
  dx, dw = vjp(dy)
  # Expected relative error of the product: ~1e-6 (f32), 2-7% (fp8: E5M2 gradients), ~10-15% (fp4).
  tol = {"": 1e-5, "te_fp8_currentscaling": 0.1, "te_mxfp8": 0.06}.get(name, 0.2)
  floor = {"": 0, "te_fp8_currentscaling": 1e-3, "te_mxfp8": 1e-3}.get(name, 0.02)
  for got, want in ((y, x @ w), (dx, dy @ w.T), (dw, x.T @ dy)):
    assert floor <= _rel(got, want) < tol, name


def test_stochastic_rounding_key_controls_gradients_only():
  x, w = jax.random.normal(jax.random.key(0), (32, 64)), jax.random.normal(jax.random.key(1), (64, 32))
  r = get_recipe("te_nvfp4")
  c = jax.random.normal(jax.random.key(2), (32, 32))  # a cotangent off the E2M1 grid
  grad = lambda k: jax.grad(lambda x, w: (qmatmul(x, w, r, key=k) * c).sum(), argnums=(0, 1))(x, w)
  g1, g1b, g2 = grad(jax.random.key(5)), grad(jax.random.key(5)), grad(jax.random.key(6))
  np.testing.assert_array_equal(g1[0], g1b[0])
  assert not np.array_equal(g1[0], g2[0]) and not np.array_equal(g1[1], g2[1])
  np.testing.assert_array_equal(qmatmul(x, w, r, key=jax.random.key(5)), qmatmul(x, w, r, key=jax.random.key(6)))
  with pytest.raises(ValueError, match="PRNG key"):
    qmatmul(x, w, r)


def test_qdense_flattens_leading_axes():
  x = jax.random.normal(jax.random.key(0), (2, 8, 32)).astype(jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (32, 16))
  r = get_recipe("te_nvfp4_no_rht", disable_stochastic_rounding=True)
  y = qdense(x, w, r)
  assert y.shape == (2, 8, 16) and y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(y.reshape(16, 16), qmatmul(x.reshape(16, 32), w, r))


def test_delayed_scaling_history_is_returned_as_gradient():
  r = get_recipe("te_fp8_delayedscaling", amax_history_len=4)
  x, w = jax.random.normal(jax.random.key(0), (16, 32)) * 3, jax.random.normal(jax.random.key(1), (32, 16))
  hist = delayed.init_history(r)
  _, _, new = jax.grad(lambda x, w, h: delayed.qmatmul_delayed(x, w, r, h).sum(), argnums=(0, 1, 2))(x, w, hist)
  np.testing.assert_allclose(new[:, 0], [jnp.abs(x).max(), jnp.abs(w).max(), 1.0])
  assert np.all(new[:, 1:] == 0)
  y = delayed.qmatmul_delayed(x, w, r, new)
  assert _rel(y, x @ w) < 0.06
  with pytest.raises(ValueError, match="amax history"):
    qmatmul(x, w, r)


def test_recipe_registry_and_errors():
  for name in (
    "",
    "te_nvfp4",
    "te_nvfp4_no_rht",
    "te_fp8_currentscaling",
    "te_fp8_delayedscaling",
    "te_mxfp8",
    "mxfp4",
  ):
    assert get_recipe(name).name == name
  assert get_recipe("te_nvfp4_no_rht") == get_recipe("te_nvfp4", disable_rht=True).__class__(
    **{
      **get_recipe("te_nvfp4", disable_rht=True).__dict__,
      "name": "te_nvfp4_no_rht",
      "summary": get_recipe("te_nvfp4_no_rht").summary,
    }
  )
  with pytest.raises(ValueError, match="te_nvfp4"):
    get_recipe("te_nvfp5")
  with pytest.raises(ValueError, match="disable_rht"):
    get_recipe("te_nvfp4", disable_rhtt=True)
  assert "mxfp4" in recipe_names()


def test_backend_falls_back_to_emulation_without_te(caplog):
  r = get_recipe("te_nvfp4")
  backends.resolve.cache_clear()
  with caplog.at_level("WARNING"):
    assert backends.resolve(r, backends.Choice.AUTO) is backends.EMULATED
  assert "running emulated NVFP4 numerics" in caplog.text
  assert backends.resolve(get_recipe(""), backends.Choice.AUTO) is backends.BF16
  with pytest.raises(ValueError, match="quantization_backend=te"):
    backends.resolve(r, backends.Choice.TE)


def test_mx_needs_blocks_of_32():
  with pytest.raises(ValueError, match="multiple of 32"):
    emulated.quantize_operand(jnp.ones((4, 48)), get_recipe("mxfp4"), "x")


# -- NVFP4 recipe options: Four Over Six and backward_override ------------------------------------------------------


def _operands(seed=0):
  kx, kw, kd = jax.random.split(jax.random.key(seed), 3)
  return (
    jax.random.normal(kx, (64, 96), jnp.bfloat16),
    jax.random.normal(kw, (96, 32)) * 0.1,
    jax.random.normal(kd, (64, 32), jnp.bfloat16),
  )


def _bf16_dot(a, b, dims):
  return jax.lax.dot_general(a, b, (dims, ((), ())), preferred_element_type=jnp.float32).astype(jnp.bfloat16)


def _quantizations(recipe, x, w, dy):
  """How many operand quantizations one forward + backward of qmatmul runs (quantize_for_gemm calls)."""
  from tests.trainer.test_train_step import _count_calls  # pylint: disable=import-outside-toplevel

  grads = lambda x, w: jax.vjp(lambda x, w: qmatmul(x, w, recipe, key=jax.random.key(1)), x, w)[1](dy)
  return _count_calls(jax.make_jaxpr(grads)(x, w).jaxpr, "quantize_for_gemm")


def test_backward_override_high_precision_runs_dgrad_and_wgrad_on_the_unquantized_operands():
  x, w, dy = _operands()
  recipe = get_recipe("te_nvfp4", backward_override="high_precision")
  y, vjp = jax.vjp(lambda x, w: qmatmul(x, w, recipe, key=jax.random.key(1)), x, w)
  dx, dw = vjp(dy)
  np.testing.assert_array_equal(y, qmatmul(x, w, get_recipe("te_nvfp4"), key=jax.random.key(1)))  # fprop as before
  np.testing.assert_array_equal(dx, _bf16_dot(dy, w.T.astype(jnp.bfloat16), ((1,), (0,))))
  np.testing.assert_array_equal(dw, _bf16_dot(x, dy, ((0,), (0,))).astype(jnp.float32))
  assert _quantizations(recipe, x, w, dy) == 2 and _quantizations(get_recipe("te_nvfp4"), x, w, dy) == 5


def test_backward_override_dequantized_reuses_the_forward_quantized_operands():
  x, w, dy = _operands()
  recipe = get_recipe("te_nvfp4", backward_override="dequantized", nvfp4_4over6="weights")
  _, vjp = jax.vjp(lambda x, w: qmatmul(x, w, recipe, key=jax.random.key(1)), x, w)
  dx, dw = vjp(dy)
  # The forward's operands, dequantized independently: x in 1x16 blocks, w^T in 16x16 tiles with Four Over Six.
  x_hat = grids.round_to_bf16(nvfp4.dequantize(nvfp4.quantize(x)))
  w_hat = grids.round_to_bf16(nvfp4.dequantize(nvfp4.quantize(w.T, tile=(16, 16), four_over_six="mse")))
  np.testing.assert_array_equal(dx, _bf16_dot(dy, w_hat, ((1,), (0,))))
  np.testing.assert_array_equal(dw, _bf16_dot(x_hat, dy, ((0,), (0,))).astype(jnp.float32))
  assert _quantizations(recipe, x, w, dy) == 2
  high = jax.vjp(
    lambda x, w: qmatmul(x, w, get_recipe("te_nvfp4", backward_override="high_precision"), key=jax.random.key(1)), x, w
  )[1](dy)
  assert 0.03 < _rel(dx, np.asarray(high[0], np.float32)) < 0.3  # the quantization error of w, not noise


def test_four_over_six_forward_puts_both_operands_on_the_256_bound():
  x, w, _ = _operands(2)
  y_46 = qmatmul(x, w, get_recipe("te_nvfp4", nvfp4_4over6="all"), key=jax.random.key(1))
  x_46, w_46 = nvfp4.quantize(x, four_over_six="mse"), nvfp4.quantize(w.T, tile=(16, 16), four_over_six="mse")
  # A 448 left in the epilogue would scale y by (256/448)^2; y itself is rounded to bf16.
  assert _rel(y_46, np.asarray(nvfp4.dequantize(x_46) @ nvfp4.dequantize(w_46).T)) < 5e-3


@pytest.mark.slow
def test_four_over_six_reaches_dgrad_and_wgrad():
  x, w, dy = _operands(2)
  run = lambda recipe: jax.vjp(lambda x, w: qmatmul(x, w, recipe, key=jax.random.key(1)), x, w)[1](dy)
  for a, b in zip(run(get_recipe("te_nvfp4")), run(get_recipe("te_nvfp4", nvfp4_4over6="gradients"))):
    assert not np.array_equal(a, b) and _rel(a, np.asarray(b, np.float32)) < 0.2


def test_four_over_six_operands_take_the_pallas_kernels_with_the_xla_paths_bits():
  x, _, _ = _operands()
  recipe = get_recipe("te_nvfp4", nvfp4_4over6="activations")
  jaxpr = jax.make_jaxpr(lambda x: emulated.quantize_for_gemm(x, recipe, "x", kernels=Kernels.INTERPRET))(x)
  assert "quantize_nvfp4_4over6_mse" in str(jaxpr)
  got = emulated.quantize_for_gemm(x, recipe, "x", kernels=Kernels.INTERPRET)
  want = emulated.quantize_for_gemm(x, recipe, "x", kernels=Kernels.XLA)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  assert float(got.e4m3_max) == 256.0


def test_recipe_options_are_validated_and_te_refuses_them():
  with pytest.raises(ValueError, match="nvfp4_4over6 must be one of none, weights, activations, gradients, all"):
    get_recipe("te_nvfp4", nvfp4_4over6="weight")
  with pytest.raises(ValueError, match="applies to the NVFP4 recipes only, not to te_fp8_currentscaling"):
    get_recipe("te_fp8_currentscaling", backward_override="dequantized")
  recipe = get_recipe("te_nvfp4", nvfp4_4over6="all")
  assert [recipe.four_over_six(r) for r in ("x", "w", "dy")] == ["mse"] * 3
  assert get_recipe("te_nvfp4", nvfp4_4over6="weights", nvfp4_4over6_err_mode="mae").four_over_six("w_t") == "mae"
  assert get_recipe("te_nvfp4", nvfp4_4over6="weights").four_over_six("x") is None
  backends.resolve.cache_clear()
  with pytest.raises(
    ValueError,
    match="quantization_backend=te: te_nvfp4: nvfp4_4over6=all: Transformer Engine's JAX bindings .* read neither",
  ):
    backends.resolve(recipe, backends.Choice.TE)
  assert backends.resolve(recipe, backends.Choice.AUTO) is backends.EMULATED
