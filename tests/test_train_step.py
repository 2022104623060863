"""The train step as XLA receives it: every GEMM on tensor-core dtypes, FP8 MLP GEMMs on f8, the FLOPs formula
checked against the HLO, and each operand quantized once per step (remat included)."""

import jax
import jax.numpy as jnp
import pytest
from jax.extend import core as jex_core

from MaxText import accounting, config, hlo_dots, optimizer, precision, train, train_step
from tests.conftest import REPO
from tests.test_train import SMALL

# Unrolled layers and one micro-batch: every dot of the step appears once in the HLO.
UNROLLED = SMALL + ["scan_layers=false", "gradient_accumulation_steps=1"]


def _cfg(*extra):
  return config.load(REPO / "configs" / "llama3_tiny.yml", UNROLLED + list(extra))


def _step_and_args(cfg):
  graphdef, params, rest = train.abstract_model(cfg)
  tx = optimizer.make_optimizer(cfg)
  step = train_step.make_train_step(graphdef, tx, precision.plan_from_config(cfg), 1, cfg.seed)
  b, l = int(cfg.per_device_batch_size), cfg.max_target_length
  tokens = jax.ShapeDtypeStruct((b, l), jnp.int32)
  batch = {"inputs": tokens, "positions": tokens, "segment_ids": tokens, "targets": tokens,
           "weights": jax.ShapeDtypeStruct((b, l), jnp.float32)}
  return step, (params, rest, jax.eval_shape(tx.init, params), batch, jax.ShapeDtypeStruct((), jnp.int32))


def _dot_flops(cfg):
  step, args = _step_and_args(cfg)
  return hlo_dots.dot_flops_by_dtype(step.lower(*args).as_text())


@pytest.mark.parametrize("quantization", ["", "te_nvfp4", "te_fp8_currentscaling", "mxfp4"])
def test_every_gemm_runs_on_tensor_core_dtypes(quantization):
  cfg = _cfg(f"quantization={quantization}")
  by_dtype = _dot_flops(cfg)
  flops = accounting.training_flops_per_device(cfg)
  # The HLO's dots are MaxText's FLOPs formula plus the masked half of causal attention XLA computes.
  assert sum(by_dtype.values()) == pytest.approx(flops.total + flops.attention_core, rel=1e-9)
  assert hlo_dots.tensor_core_share(by_dtype) >= 0.99, by_dtype
  f8 = sum(f for (a, b), f in by_dtype.items() if a.startswith("f8") and b.startswith("f8"))
  if quantization == "te_fp8_currentscaling":
    assert f8 == pytest.approx(flops.mlp, rel=1e-9)  # fprop, dgrad and wgrad of every MLP GEMM: f8 x f8
    assert ("f8E5M2", "f8E5M2") not in by_dtype  # HYBRID: gradients E5M2 against E4M3, never both
  else:
    assert f8 == 0


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
