"""Our te backend calls Transformer Engine the way TE's own Flax DenseGeneral does: for each TE recipe and option, the
quantized matmul with its backward, lowered for CUDA, has the custom calls (targets, backend configs, operand and
result types) of DenseGeneral's under TE's autocast, call for call; and the options change the calls as they should."""

import jax
import jax.numpy as jnp
import pytest

from MaxText.quantization import backends, get_recipe, qdot, qmatmul
from MaxText.quantization.errors import BackendError
from MaxText.quantization.formats import Format
from tests.te.conftest import SM_FOR_FORMAT, export_for_cuda, pinned_te_version
from tests.stablehlo import custom_calls, producer

pytestmark = pytest.mark.te

# x [M, K] . w [K, N]: the RHT needs rows % 64 and columns % 128 of x and dy; NVFP4 2D tiles 16 x 16.
M, K, N = 256, 512, 384
ARGS = (
  jax.ShapeDtypeStruct((M, K), jnp.bfloat16),
  jax.ShapeDtypeStruct((K, N), jnp.float32),
  jax.ShapeDtypeStruct((M, N), jnp.bfloat16),
  jax.eval_shape(lambda: jax.random.key(0)),
)


def _te_recipe(kind, **kw):
  """TE's recipe object, built here from TE's own names (not through te_backend.te_recipe, which is under test)."""
  r = __import__("transformer_engine.common.recipe", fromlist=["recipe"])
  if kind == "fp8_current":
    return r.Float8CurrentScaling(fp8_format=r.Format.HYBRID)
  return {"nvfp4": r.NVFP4BlockScaling, "mxfp8": r.MXFP8BlockScaling}[kind](**kw)


CASES = [  # (our recipe, our knobs, TE's recipe kind and options)
  ("te_nvfp4", {}, ("nvfp4", {})),
  ("te_nvfp4_no_rht", {}, ("nvfp4", {"disable_rht": True})),
  ("te_nvfp4", {"disable_stochastic_rounding": True}, ("nvfp4", {"disable_stochastic_rounding": True})),
  (
    "te_nvfp4_no_rht",
    {"disable_2d_quantization": True},
    ("nvfp4", {"disable_rht": True, "disable_2d_quantization": True}),
  ),
  ("te_fp8_currentscaling", {}, ("fp8_current", {})),
  ("te_mxfp8", {}, ("mxfp8", {})),
]


def _ours(recipe):
  def fwd_bwd(x, w, dy, key):
    y, vjp = jax.vjp(lambda x, w: qmatmul(x, w, recipe, key=key, backend=backends.Choice.TE), x, w)
    return (y, *vjp(dy))

  return fwd_bwd


def _te_dense_general(te_recipe):
  """TE's DenseGeneral (no bias, f32 kernel as our master weights) under autocast, its SR from the sr_rng stream."""
  te_flax = __import__("transformer_engine.jax.flax", fromlist=["flax"])
  te_quantize = __import__("transformer_engine.jax.quantize", fromlist=["quantize"])
  module = te_flax.DenseGeneral(
    features=N, use_bias=False, dtype=jnp.float32, quantization_checkpoint_name=qdot.REMAT_NAME
  )

  def fwd_bwd(x, w, dy, key):
    with te_quantize.autocast(enabled=True, recipe=te_recipe):
      y, vjp = jax.vjp(lambda x, w: module.apply({"params": {"kernel": w}}, x, rngs={"sr_rng": key}), x, w)
    return (y, *vjp(dy))

  return fwd_bwd


def _te_calls(fn):
  return [c for c in custom_calls(export_for_cuda(fn, *ARGS)) if c.target.startswith("te_")]


def test_the_installed_transformer_engine_is_the_pinned_one():
  import transformer_engine  # pylint: disable=import-outside-toplevel

  assert transformer_engine.__version__ == pinned_te_version()


@pytest.mark.parametrize(
  "name, knobs, te",
  CASES,
  ids=[
    "te_nvfp4",
    "te_nvfp4_no_rht",
    "te_nvfp4-no_sr",
    "te_nvfp4_no_rht-1d_weights",
    "te_fp8_currentscaling",
    "te_mxfp8",
  ],
)
def test_qmatmul_makes_the_custom_calls_of_te_dense_general(gpu_of, name, knobs, te):
  recipe = get_recipe(name, **knobs)
  gpu_of(SM_FOR_FORMAT[recipe.format])
  assert backends.resolve(recipe, backends.Choice.TE) is backends.TE
  ours, theirs = _te_calls(_ours(recipe)), _te_calls(_te_dense_general(_te_recipe(te[0], **te[1])))
  assert [c.signature() for c in ours] == [c.signature() for c in theirs]

  # What the comparison covers: fprop, dgrad, wgrad as TE GEMMs on the recipe's operands, with its options.
  gemms = [c for c in ours if c.target == "te_gemm_v2_ffi"]
  assert [c.result_types[0] for c in gemms] == [
    f"tensor<{M}x{N}xbf16>",
    f"tensor<{M}x{K}xbf16>",
    f"tensor<{K}x{N}xbf16>",
  ]
  operand = {Format.NVFP4: "f4E2M1FN", Format.MXFP8: "f8E4M3FN", Format.FP8_CURRENT: "f8E"}[recipe.format]
  for gemm in gemms:
    assert operand in gemm.operand_types[0] and operand in gemm.operand_types[2], gemm.operand_types
  quantizes = [c for c in ours if c.target == "te_dbias_quantize_ffi"]
  assert len(quantizes) == 3  # x, w, dy: each once, both layouts from one call
  x_q, w_q, dy_q = (q.backend_config for q in quantizes)
  if recipe.format is not Format.NVFP4:
    assert not any(c.target == "te_rht_amax_ffi" for c in ours)
    return
  for gemm in gemms:
    assert "f8E4M3FN" in gemm.operand_types[1] and "f8E4M3FN" in gemm.operand_types[3], gemm.operand_types
  rht = not recipe.disable_rht
  assert [x_q["use_rht"], w_q["use_rht"], dy_q["use_rht"]] == [str(rht).lower(), "false", str(rht).lower()]
  assert sum(c.target == "te_rht_amax_ffi" for c in ours) == 2 * rht  # post-RHT amax of x and dy
  assert [x_q["stochastic_rounding"], w_q["stochastic_rounding"], dy_q["stochastic_rounding"]] == [
    "false",
    "false",
    str(recipe.needs_rng).lower(),
  ]
  assert w_q["scaling_mode"] == ("4" if recipe.disable_2d_quantization else "5")  # NVFP4 1D or 2D (16 x 16)
  # The RHT'd outputs (colwise, result 1) feed the wgrad GEMM and nothing else.
  for gemm, wants_rht in zip(gemms, (False, False, rht)):
    for side in (0, 2):
      quantize, index = producer(ours, gemm, side)
      assert quantize is not None and quantize.target == "te_dbias_quantize_ffi"
      assert (quantize.backend_config["use_rht"] == "true" and index == 1) == wants_rht


def test_nvfp4_rht_with_1d_weights_is_refused_as_te_itself_fails(gpu_of):
  """TE 2.20's JAX NVFP4 puts the RHT on 1D-quantized weights (disable_2d_quantization) too; its fprop GEMM then
  pairs an RHT'd weight with an un-RHT'd x and TE raises. Our te backend says so up front, in one line."""
  gpu_of(100)
  with pytest.raises((AssertionError, ValueError)):
    _te_calls(_te_dense_general(_te_recipe("nvfp4", disable_2d_quantization=True)))
  with pytest.raises(BackendError, match="disable_2d_quantization.*disable_rht"):
    backends.resolve(get_recipe("te_nvfp4", disable_2d_quantization=True), backends.Choice.TE)
