"""Tiled lm-head cross-entropy: the same loss and gradients as the plain path, f32 and bf16, eval and train."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from MaxText import config
from MaxText.model import vocab_tiling
from MaxText.quantization import dots
from tests.conftest import REPO

B, L, D, V = 2, 24, 16, 96


def _plain(x, w, targets, weights, compute_dtype):
  logits = dots.einsum("bld,dv->blv", x, w, jnp.float32, compute_dtype)
  return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets) * weights)


def _inputs(dtype):
  k = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(k[0], (B, L, D)).astype(dtype)
  w = 0.3 * jax.random.normal(k[1], (D, V))
  targets = jax.random.randint(k[2], (B, L), 0, V)
  weights = (jax.random.uniform(k[3], (B, L)) > 0.25).astype(jnp.float32)  # padding has weight 0
  return x, w, targets, weights


def _loss_and_grads(fn, x, w, targets, weights):
  return jax.jit(jax.value_and_grad(lambda x, w, m: fn(x, w, targets, m), argnums=(0, 1, 2)))(x, w, weights)


@pytest.mark.parametrize("num_tiles", [3, 8])
def test_f32_loss_and_gradients_equal_the_plain_path(num_tiles):
  x, w, targets, weights = _inputs(jnp.float32)
  tiled = lambda x, w, t, m: vocab_tiling.xent_sum(x, w, t, m, num_tiles, jnp.float32)
  plain = lambda x, w, t, m: _plain(x, w, t, m, jnp.float32)
  (loss, grads), (want_loss, want_grads) = (_loss_and_grads(f, x, w, targets, weights) for f in (tiled, plain))
  assert loss == pytest.approx(float(want_loss), rel=1e-6)
  for got, want in zip(grads, want_grads):  # dx, dW and d weights (= each token's cross-entropy)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert float(jnp.abs(grads[0][weights == 0]).max()) == 0.0  # a weight-0 token gets no gradient


def test_bf16_matches_the_plain_path_to_bf16_rounding():
  """The plain path rounds dW once from its bf16 GEMM; the tiles accumulate their f32 partial dW: the two agree
  to bf16's 2^-8 relative, dx and the loss (f32 log-softmax on the same bf16 GEMM) closer."""
  x, w, targets, weights = _inputs(jnp.bfloat16)
  tiled = lambda x, w, t, m: vocab_tiling.xent_sum(x, w, t, m, 4, jnp.bfloat16)
  plain = lambda x, w, t, m: _plain(x, w, t, m, jnp.bfloat16)
  (loss, (dx, dw, dm)), (want_loss, (want_dx, want_dw, want_dm)) = (
    _loss_and_grads(f, x, w, targets, weights) for f in (tiled, plain)
  )
  assert loss == pytest.approx(float(want_loss), rel=1e-6)
  assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
  np.testing.assert_allclose(np.float32(dx), np.float32(want_dx), rtol=0, atol=2**-8 * float(jnp.abs(want_dx).max()))
  np.testing.assert_allclose(dw, want_dw, rtol=0, atol=2**-8 * float(jnp.abs(want_dw).max()))
  np.testing.assert_allclose(dm, want_dm, rtol=1e-6)
  # The tiled dW is the more exact one: against an f32 reference on the same bf16 operands.
  exact = jax.jit(
    jax.grad(
      lambda w: _plain(x.astype(jnp.float32), w.astype(jnp.bfloat16).astype(jnp.float32), targets, weights, jnp.float32)
    )
  )(w)
  assert float(jnp.abs(dw - exact).max()) < float(jnp.abs(want_dw - exact).max())


def test_tiles_are_strided_positions_and_invert():
  a = jnp.arange(2 * 12).reshape(2, 12)
  tiles = vocab_tiling._tiles(a, 3)  # pylint: disable=protected-access
  assert tiles[0, :, 1].tolist() == [1, 4, 7, 10]
  stacked = jnp.moveaxis(tiles, 2, 0)  # [n, B, L/n] as the scan emits them
  assert (vocab_tiling._untile(stacked, 12) == a).all()  # pylint: disable=protected-access


def test_without_a_gradient_only_the_loss_runs():
  """Eval: no gradient GEMMs in the lowered loss (one dot, the logits), the loss equal to the plain one."""
  x, w, targets, weights = _inputs(jnp.bfloat16)
  fn = jax.jit(lambda x, w: vocab_tiling.xent_sum(x, w, targets, weights, 4, jnp.bfloat16))
  assert fn.lower(x, w).as_text().count("stablehlo.dot_general") == 1
  assert float(fn(x, w)) == pytest.approx(float(_plain(x, w, targets, weights, jnp.bfloat16)), rel=1e-6)


def test_tiles_must_divide_the_sequence():
  with pytest.raises(
    config.ConfigError, match=r"num_vocab_tiling=5 must be -1 \(auto\), or >= 1 and divide max_target_length=32"
  ):
    config.load(REPO / "configs" / "llama3_tiny.yml", ["max_target_length=32", "num_vocab_tiling=5"])
  with pytest.raises(config.ConfigError, match="num_vocab_tiling=0"):
    config.load(REPO / "configs" / "llama3_tiny.yml", ["num_vocab_tiling=0"])
  assert config.load(REPO / "configs" / "llama3_tiny.yml", ["max_target_length=32", "num_vocab_tiling=8"])
