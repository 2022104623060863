"""The train step with quantization_backend=te, exported for CUDA: the MLP GEMMs (gate, up, down x fprop, dgrad, wgrad)
of every layer the printed precision plan puts in te_nvfp4 are TE GEMMs on FP4 operands with E4M3 scales, nothing
else of the step calls TE, the RHT is on exactly the wgrad operands, and the counts are the plan's, layer for layer.
llama3_tiny unrolled (each layer its own ops), llama3_8b as configured (scanned layer ranges, full remat) from
abstract inputs (lowering only)."""

import collections
import math
import re

import pytest

from MaxText import config, precision
from MaxText.model import accounting
from MaxText.aot import hlo
from MaxText.precision import GEMMS, MLP_GEMMS
from tests.conftest import REPO
from tests.te.conftest import export_for_cuda
from tests.stablehlo import custom_calls, producer
from tests.trainer.test_train_step import _step_and_args

pytestmark = pytest.mark.te

# The named scope of each GEMM kind's Dense (its remat name) in the HLO: the per-layer GEMMs of hlo.GEMM_SCOPES.
GEMM_OF_SCOPE = {scope: gemm for scope, gemm in hlo.GEMM_SCOPES.items() if gemm in GEMMS}
LAYER_SCOPE = re.compile(r"layers_(\d+)(?:-(\d+))?")
# Bf16 edge layers at both ends, so the plan has BF16 and NVFP4 layer ranges.
EDGES = ["quantization_bf16_first_layers=1", "quantization_bf16_last_layers=1"]


def _cfg(model, *extra):
  return config.load(
    REPO / "configs" / f"{model}.yml",
    ["dataset_type=synthetic", "quantization_backend=te", "enable_tensorboard=false", *EDGES, *extra],
  )


def _step_and_args_flat(cfg):
  step, args = _step_and_args(cfg)
  return (step, *args)


def planned(cfg):
  """{(layer, gemm): (recipe, backend)} read from the precision plan as the trainer prints it."""
  plan_text = precision.format_plan(precision.plan_from_config(cfg), cfg, accounting.gemm_flops(cfg))
  out = {}
  for line in plan_text.splitlines()[1:]:
    fields = line.split()
    if fields and fields[0] in GEMMS and re.fullmatch(r"\d+-\d+", fields[1]):
      first, last = map(int, fields[1].split("-"))
      out.update({(layer, fields[0]): (fields[2], fields[3]) for layer in range(first, last + 1)})
  assert len(out) == cfg.base_num_decoder_layers * len(GEMMS), plan_text
  return out


def _where(call):
  """(layers, gemm) of the call's scope: the layer range its loop runs it for (one layer unrolled), the GEMM kind."""
  layers = LAYER_SCOPE.findall(call.scope)
  gemms = [GEMM_OF_SCOPE[s] for s in call.scope.split("/") if s in GEMM_OF_SCOPE]
  if len(layers) != 1 or len(gemms) != 1:
    return None, None
  first, last = int(layers[0][0]), int(layers[0][1] or layers[0][0])
  return range(first, last + 1), gemms[0]


def _role(call, cfg, gemm):
  """fprop / dgrad / wgrad from the GEMM's output shape ([M, N], [M, K], [K, N]); fprop_recomputed under remat."""
  m = int(cfg.per_device_batch_size) * cfg.max_target_length // cfg.gradient_accumulation_steps
  d, f = cfg.base_emb_dim, cfg.base_mlp_dim
  k, n = (f, d) if gemm == "down" else (d, f)
  shapes = {(m, n): "fprop", (m, k): "dgrad", (k, n): "wgrad"}
  assert len(shapes) == 3, "ambiguous GEMM shapes: pick sizes with M, K, N distinct"
  # TE's GEMMs take x as [batch, length, K] (TE partitions them itself): its tokens are every dimension but the last.
  *leading, cols = map(int, re.match(r"tensor<((?:\d+x)+)", call.result_types[0]).group(1).rstrip("x").split("x"))
  role = shapes[(math.prod(leading), cols)]
  return f"{role}_recomputed" if "rematted_computation" in call.scope else role


def _rht(calls, gemm_call, side):
  """Whether the GEMM's operand (0: lhs, 2: rhs) is an RHT'd quantization: a TE quantize's colwise output (result 1)
  with use_rht."""
  quantize, index = producer(calls, gemm_call, side)
  assert quantize is not None and quantize.target == "te_dbias_quantize_ffi", (gemm_call.scope, side)
  config_ = quantize.backend_config
  assert config_["q_layout"] == "2", config_  # rowwise and colwise from one call: result 1 is the colwise data
  return config_["use_rht"] == "true" and index == 1


def check_te_gemms_follow_the_plan(cfg, rht):
  """The step's TE calls against the printed plan; returns {(layer, gemm, role): runs} for the report."""
  plan = planned(cfg)
  calls = custom_calls(export_for_cuda(*_step_and_args_flat(cfg)))
  te_calls = [c for c in calls if c.target.startswith("te_")]
  assert te_calls, "no Transformer Engine call in the step"
  runs = collections.Counter()
  for call in te_calls:
    layers, gemm = _where(call)
    assert layers is not None, f"a TE call outside the decoder layers' GEMMs: {call.scope}"
    for layer in layers:
      # Nothing but the plan's te GEMMs calls TE: not attention, not the lm head, not a BF16 edge layer.
      assert plan[(layer, gemm)] == ("te_nvfp4" if rht else "te_nvfp4_no_rht", "te"), (layer, gemm, call.scope)
    if call.target == "te_gemm_v2_ffi":
      role = _role(call, cfg, gemm)
      lhs, lhs_scales, rhs, rhs_scales = call.operand_types[:4]
      assert "f4E2M1FN" in lhs and "f4E2M1FN" in rhs, (call.scope, call.operand_types)
      assert "f8E4M3FN" in lhs_scales and "f8E4M3FN" in rhs_scales, (call.scope, call.operand_types)
      assert call.backend_config["scaling_mode"] == "4", call.backend_config  # NVFP4_1D_SCALING
      wants_rht = rht and role == "wgrad"
      assert _rht(calls, call, 0) == wants_rht and _rht(calls, call, 2) == wants_rht, (role, call.scope)
      runs.update((layer, gemm, role) for layer in layers)
    if call.target == "te_rht_amax_ffi":
      assert rht, call.scope
  for (layer, gemm), (recipe, backend) in plan.items():
    want = {"fprop": 1, "dgrad": 1, "wgrad": 1} if backend == "te" and gemm in MLP_GEMMS else {}
    got = {role: n for (l, g, role), n in runs.items() if (l, g) == (layer, gemm) and not role.endswith("recomputed")}
    assert got == want, (layer, gemm, recipe, backend, got)
    assert runs[(layer, gemm, "fprop_recomputed")] <= (cfg.remat_policy == "full"), (layer, gemm)
  te_layers = {layer for (layer, gemm), (_, backend) in plan.items() if backend == "te"}
  assert te_layers == set(range(1, cfg.base_num_decoder_layers - 1))  # the plan's BF16 edges: first and last
  return runs


@pytest.mark.parametrize("quantization", ["te_nvfp4", "te_nvfp4_no_rht"])
def test_llama3_tiny_step_runs_the_plans_mlp_gemms_on_te_nvfp4(gpu_of, quantization):
  gpu_of(100)
  cfg = _cfg("llama3_tiny", f"quantization={quantization}", "scan_layers=false")
  runs = check_te_gemms_follow_the_plan(cfg, rht=quantization == "te_nvfp4")
  assert sum(runs.values()) == 3 * 3 * (cfg.base_num_decoder_layers - 2)  # 2 NVFP4 layers x 3 GEMMs x 3


@pytest.mark.parametrize("quantization", ["te_nvfp4", "te_nvfp4_no_rht"])
def test_llama3_8b_step_lowers_with_te_nvfp4_on_the_plans_mlp_gemms(gpu_of, quantization):
  gpu_of(100)
  cfg = _cfg("llama3_8b", f"quantization={quantization}", "remat_policy=full")
  assert cfg.scan_layers and cfg.remat_policy == "full"
  runs = check_te_gemms_follow_the_plan(cfg, rht=quantization == "te_nvfp4")
  te_layers = cfg.base_num_decoder_layers - 2
  assert sum(n for (_, _, role), n in runs.items() if not role.endswith("recomputed")) == 3 * 3 * te_layers
  # Full remat recomputes the forward in the backward: gate's and up's fprop (their outputs feed the activation's
  # backward); down's output isn't needed there, and jax drops its recomputation.
  recomputed = collections.Counter(
    g for (_, g, role), n in runs.items() if role == "fprop_recomputed" for _ in range(n)
  )
  assert recomputed == {"gate": te_layers, "up": te_layers}


def test_remat_keeps_tes_quantized_operands_by_our_name(gpu_of):
  """remat_policy=minimal_with_quantization saves what TE quantized (te_backend names it qdot.REMAT_NAME): the
  backward quantizes only dy, where full remat quantizes x and w again."""
  gpu_of(100)

  def backward_quantizations(policy):
    cfg = _cfg("llama3_tiny", "quantization=te_nvfp4", "scan_layers=false", f"remat_policy={policy}")
    calls = custom_calls(export_for_cuda(*_step_and_args_flat(cfg)))
    return sum(c.target == "te_dbias_quantize_ffi" and "transpose(" in c.scope for c in calls)

  mlp_gemms = 3 * 2
  assert backward_quantizations("minimal_with_quantization") == mlp_gemms  # dy
  assert backward_quantizations("full") == 3 * mlp_gemms  # x and w recomputed, and dy
