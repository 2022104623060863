"""The train step as XLA receives it: every GEMM on tensor-core dtypes, FP8 MLP GEMMs on f8, the FLOPs formula
checked against the HLO, each operand quantized once per step (remat included), cuDNN attention without a mask
where rows hold one document, and the tiled lm head equal to the plain one."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.extend import core as jex_core

from MaxText.model import accounting
from MaxText import config, data, precision
from tests import stablehlo
from MaxText.trainer import optimizer, train_step
from MaxText.model.decoder import Transformer, abstract_model
from tests.conftest import REPO
from tests.trainer.test_train import SMALL

# Unrolled layers and one micro-batch: every dot of the step appears once in the HLO.
UNROLLED = SMALL + ["scan_layers=false", "gradient_accumulation_steps=1"]


def _cfg(*extra):
  return config.load(REPO / "configs" / "llama3_tiny.yml", UNROLLED + list(extra))


def _step_and_args(cfg):
  graphdef, params, rest = abstract_model(cfg)
  tx = optimizer.make_optimizer(cfg)
  step = train_step.make_train_step(graphdef, tx, precision.plan_from_config(cfg), 1, packed=data.packed_documents(cfg))
  b, l = int(cfg.per_device_batch_size), cfg.max_target_length
  tokens = jax.ShapeDtypeStruct((b, l), jnp.int32)
  batch = {
    "inputs": tokens,
    "positions": tokens,
    "segment_ids": tokens,
    "targets": tokens,
    "weights": jax.ShapeDtypeStruct((b, l), jnp.float32),
  }
  step_index = jax.ShapeDtypeStruct((), jnp.int32)
  return step, (params, rest, jax.eval_shape(tx.init, params), batch, step_index, jax.random.key(cfg.seed))


def _dot_flops(cfg, platform=None):
  """GEMM FLOPs by operand dtypes of the step lowered for `platform` (default: this machine's); for CUDA a dequantized
  f8 operand counts as f8 (XLA's GEMM rewriter makes it an FP8 GEMM's)."""
  step, args = _step_and_args(cfg)
  lowered = step.lower(*args) if platform is None else step.trace(*args).lower(lowering_platforms=(platform,))
  return stablehlo.dot_flops_by_dtype(lowered.as_text(), f8_dequantized=platform == "cuda")


@pytest.mark.parametrize("quantization", ["", "te_nvfp4", "te_fp8_currentscaling", "mxfp4"])
def test_every_gemm_runs_on_tensor_core_dtypes(quantization):
  cfg = _cfg(f"quantization={quantization}")
  by_dtype = _dot_flops(cfg, platform="cuda")
  flops = accounting.training_flops_per_device(cfg)
  # The HLO's dots are MaxText's FLOPs formula plus the masked half of causal attention XLA computes.
  assert sum(by_dtype.values()) == pytest.approx(flops.total + flops.attention_core, rel=1e-9)
  assert stablehlo.tensor_core_share(by_dtype) >= 0.99, by_dtype
  f8 = sum(f for (a, b), f in by_dtype.items() if a.startswith("f8") and b.startswith("f8"))
  if quantization == "te_fp8_currentscaling":
    assert f8 == pytest.approx(flops.mlp, rel=1e-9)  # fprop, dgrad and wgrad of every MLP GEMM: f8 x f8
    assert ("f8E5M2", "f8E5M2") not in by_dtype  # HYBRID: gradients E5M2 against E4M3, never both
  else:
    assert f8 == 0


@pytest.mark.parametrize("choice, dtype", [("bfloat16", "bf16"), ("float32", "f32")])
@pytest.mark.parametrize("quantization", ["", "te_fp8_currentscaling"])
def test_a_cpu_runs_every_gemm_on_the_operand_dtype_cpu_gemm_picks(cpu_gemm_choice, quantization, choice, dtype):
  """On a CPU every GEMM of the step (the bf16 ones, FP8's f8 ones) reads the same values in cpu_gemm's dtype: bf16
  where the CPU multiplies it natively, f32 elsewhere (cpu_gemm_dtype); a GPU's lowering is the same either way."""
  cfg = _cfg(f"quantization={quantization}")
  cpu_gemm_choice(choice)
  by_dtype = _dot_flops(cfg, platform="cpu")
  flops = accounting.training_flops_per_device(cfg)
  assert set(by_dtype) == {(dtype, dtype)}, by_dtype
  assert by_dtype[(dtype, dtype)] == pytest.approx(flops.total + flops.attention_core, rel=1e-9)
  gpu = _dot_flops(cfg, platform="cuda")
  cpu_gemm_choice("bfloat16" if choice == "float32" else "float32")
  assert _dot_flops(cfg, platform="cuda") == gpu


def _count_calls(jaxpr, name):
  """How many times a jitted function called `name` runs in `jaxpr` (sub-jaxprs included, scans by length)."""
  count = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("pjit", "jit") and eqn.params.get("name") == name:
      count += 1
      continue
    times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, jex_core.ClosedJaxpr):
          sub = sub.jaxpr
        if isinstance(sub, jex_core.Jaxpr):
          count += times * _count_calls(sub, name)
  return count


@pytest.mark.parametrize("quantization,per_gemm", [("te_nvfp4", 5), ("te_fp8_currentscaling", 3)])
def test_each_operand_is_quantized_once_per_step(quantization, per_gemm):
  """NVFP4: x, w, dy, x_t, dy_t (w_t is w's 16x16 tiles transposed); FP8: x, w, dy (one scale per tensor)."""

  def quantizations(remat_policy):
    step, args = _step_and_args(_cfg(f"quantization={quantization}", f"remat_policy={remat_policy}"))
    return _count_calls(jax.make_jaxpr(step)(*args).jaxpr, "quantize_for_gemm")

  mlp_gemms = 3 * 2  # gate, up, down x 2 layers
  assert quantizations("none") == per_gemm * mlp_gemms
  assert quantizations("minimal_with_quantization") == per_gemm * mlp_gemms
  assert quantizations("full") > per_gemm * mlp_gemms  # the recomputed forward quantizes again


# -- attention: no mask tensor where the rows hold one document -------------------------------------------------


@pytest.fixture
def cudnn_version_probe(monkeypatch):
  """jax asks the installed cuDNN for its version before lowering its flash attention; this CPU machine has
  none, so answer as cuDNN 9.8 would: the rest is jax's real lowering of the step for CUDA."""
  from jax._src.cudnn import fused_attention_stablehlo  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 90800)


def _cudnn_calls(cfg):
  """[(custom-call target, operand count)] of the cuDNN attention calls in the step lowered for CUDA, and its text."""
  step, args = _step_and_args(cfg)
  text = step.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  return [
    (m.group(1), len(m.group(2).split(",")))
    for m in re.finditer(r"stablehlo\.custom_call @(__cudnn\$\w+)\(([^)]*)\)", text)
  ], text


def test_unpacked_rows_run_cudnn_attention_causal_without_a_mask(cudnn_version_probe):
  b, l = 8, 32  # SMALL's micro-batch and sequence
  dense_mask = re.compile(rf"tensor<{b}x1x{l}x{l}x(bf16|i1)>")
  for keys in ([], ["dataset_type=grain", "grain_train_files=unused-*.array_record", "packing=false"]):
    calls, text = _cudnn_calls(_cfg("attention=cudnn_flash", *keys))
    # Forward: q, k, v only; backward: q, k, v, softmax stats, dO, O. Causal inside the kernel, no bias.
    assert sorted(set(calls)) == [("__cudnn$fmhaSoftmax", 3), ("__cudnn$fmhaSoftmaxBackward", 6)], calls
    assert len(calls) == 2 * 2 and "\\22mask_type\\22: \\22CAUSAL\\22" in text
    assert not dense_mask.search(text)
  # Packed documents still mask per document: the dense [B, 1, L, L] bias the public API takes (its cost).
  calls, text = _cudnn_calls(_cfg("attention=cudnn_flash", "dataset_type=grain", "grain_train_files=unused-*"))
  assert sorted(set(calls)) == [("__cudnn$fmhaScaleBiasSoftmax", 4), ("__cudnn$fmhaScaleBiasSoftmaxBackward", 7)]
  assert dense_mask.search(text)


# -- vocabulary tiling ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_tiles", [4])
def test_tiled_lm_head_runs_its_three_gemms_per_tile_on_bf16(num_tiles):
  """The HLO counts a loop body once: the tiled step's dots are the plain step's with the lm head's three GEMMs
  (logits, dgrad, wgrad; no recomputed forward) at 1/num_tiles of their size, all on bf16 operands."""
  plain_cfg, tiled_cfg = _cfg(), _cfg(f"num_vocab_tiling={num_tiles}")
  plain, tiled = _dot_flops(plain_cfg, platform="cuda"), _dot_flops(tiled_cfg, platform="cuda")
  flops = accounting.training_flops_per_device(plain_cfg)
  lm_head = flops.embedding  # 3 x 2 x tokens x D x V
  assert sum(tiled.values()) == pytest.approx(sum(plain.values()) - lm_head * (1 - 1 / num_tiles), rel=1e-9)
  assert stablehlo.tensor_core_share(tiled) >= 0.99, tiled


def test_tiled_loss_gradients_and_eval_equal_the_plain_ones():
  """The whole model in f32, with and without tiling: the same loss and gradient of every parameter; the tiled
  eval step (no gradient) the same loss."""
  results = {}
  for tiles in (1, 4):
    cfg = config.load(
      REPO / "configs" / "llama3_tiny.yml",
      SMALL + ["dtype=float32", "base_num_decoder_layers=1", "remat_policy=none", f"num_vocab_tiling={tiles}"],
    )
    graphdef, params, rest = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)
    plan, batch = precision.plan_from_config(cfg), _batch(cfg)
    loss = lambda p, g=graphdef, r=rest, b=batch, pl=plan: train_step.loss_terms(
      nnx.merge(g, p, r), b, pl.layer_ranges, None
    )[0]
    results[tiles] = jax.jit(jax.value_and_grad(loss))(params)
  eval_loss, eval_weights = train_step.make_eval_step(graphdef, plan)(params, rest, batch)
  (value_a, grads_a), (value_b, grads_b) = results[1], results[4]
  assert float(value_b) == pytest.approx(float(value_a), rel=1e-6)
  assert float(eval_loss) == pytest.approx(float(value_a), rel=1e-6)
  assert float(eval_weights) == float(batch["weights"].sum()) == 8 * 27
  for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _batch(cfg):
  b, l = int(cfg.per_device_batch_size), cfg.max_target_length
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.vocab_size, (b, l + 1)).astype(np.int32)
  weights = np.ones((b, l), np.float32)
  weights[:, -5:] = 0.0  # padding
  return {
    "inputs": jnp.asarray(tokens[:, :-1]),
    "targets": jnp.asarray(tokens[:, 1:]),
    "positions": jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l)),
    "segment_ids": jnp.ones((b, l), jnp.int32),
    "weights": jnp.asarray(weights),
  }


@pytest.mark.parametrize(
  "policy, forwards_per_layer",
  [("minimal_with_context_and_quantization", 1), ("minimal_with_context", 1), ("minimal_with_quantization", 2)],
)
def test_context_policies_keep_cudnn_attention_residuals(cudnn_version_probe, policy, forwards_per_layer):
  """With '_with_context' the backward reads the forward kernel's saved output and softmax statistics; without,
  remat runs the forward kernel again in the backward (MaxText's behaviour for these policies)."""
  calls, _ = _cudnn_calls(_cfg("attention=cudnn_flash", f"remat_policy={policy}"))
  layers = 2
  assert [c for c, _ in calls].count("__cudnn$fmhaSoftmax") == forwards_per_layer * layers
  assert [c for c, _ in calls].count("__cudnn$fmhaSoftmaxBackward") == layers
