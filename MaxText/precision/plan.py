"""The precision plan: which recipe and backend each GEMM of each decoder layer runs, from the config."""

import dataclasses

from MaxText.model import accounting
from MaxText.model.decoder import ATTENTION_GEMMS, MLP_GEMMS
from MaxText.model.layers import GemmPrecision
from MaxText.quantization import backends, get_recipe
from MaxText.quantization.backends import emulated
from MaxText.quantization.kernels import quantizer_impl
from MaxText.quantization import stats as quant_stats

BF16 = GemmPrecision()


@dataclasses.dataclass(frozen=True)
class PrecisionPlan:
  """Layer ranges [(start, stop, {gemm: GemmPrecision})] covering every decoder layer, in order."""
  layer_ranges: tuple

  @property
  def quantized(self):
    return any(p.recipe.quantized for _, _, prec in self.layer_ranges for p in prec.values())


def _recipe(cfg, name):
  """Recipe `name` with the config's TE-named NVFP4 knobs applied."""
  knobs = {}
  if name == "te_fp8_delayedscaling":
    knobs = dict(amax_history_len=cfg.amax_history_len, amax_compute_algo=cfg.amax_compute_algo)
  if name.startswith("te_nvfp4"):
    knobs = dict(disable_rht=cfg.disable_rht or name == "te_nvfp4_no_rht",
                 disable_stochastic_rounding=cfg.disable_stochastic_rounding,
                 disable_2d_quantization=cfg.disable_2d_quantization, nvfp4_4over6=cfg.nvfp4_4over6,
                 nvfp4_4over6_err_mode=cfg.nvfp4_4over6_err_mode, backward_override=cfg.nvfp4_backward_override)
  return get_recipe(name, **knobs)


def _merge_ranges(ranges):
  merged = []
  for start, stop, precision in ranges:
    if stop <= start:
      continue
    if merged and merged[-1][2] == precision:
      merged[-1] = (merged[-1][0], stop, precision)
    else:
      merged.append((start, stop, precision))
  return tuple(merged)


def plan_from_config(cfg, high_precision=False) -> PrecisionPlan:
  """MLP GEMMs in `quantization`; attention projections in `attention_quantization` (or the same
  recipe with quantization_scope=all_dense); BF16 edge layers; everything BF16 if `high_precision`."""
  mlp = GemmPrecision(_recipe(cfg, cfg.quantization), cfg.quantization_backend, cfg.quantization_kernels)
  attn_name = cfg.quantization if cfg.quantization_scope == "all_dense" else cfg.attention_quantization
  attn = GemmPrecision(_recipe(cfg, attn_name), cfg.quantization_backend, cfg.quantization_kernels)
  quantized = {**{g: attn for g in ATTENTION_GEMMS}, **{g: mlp for g in MLP_GEMMS}}
  bf16 = {g: BF16 for g in ATTENTION_GEMMS + MLP_GEMMS}
  n, first, last = cfg.base_num_decoder_layers, cfg.quantization_bf16_first_layers, cfg.quantization_bf16_last_layers
  if high_precision:
    return PrecisionPlan(((0, n, bf16),))
  return PrecisionPlan(_merge_ranges([(0, first, bf16), (first, n - last, quantized), (n - last, n, bf16)]))


def gemm_flops(cfg):
  """Training FLOPs per device per step of one layer's GEMM of each kind (3 x forward), from accounting."""
  f = accounting.training_flops_per_device(cfg)
  layers = cfg.base_num_decoder_layers
  h, kv, dh = cfg.base_num_query_heads, cfg.base_num_kv_heads, cfg.head_dim
  proj_shares = {"q": h * dh, "k": kv * dh, "v": kv * dh, "o": h * dh}
  per_layer_proj = f.attention_projection / layers / sum(proj_shares.values())
  out = {g: per_layer_proj * s for g, s in proj_shares.items()}
  mlp_shares = {"gate": 1, "up": len(cfg.mlp_activations) - 1, "down": 1}
  out.update({g: f.mlp / layers / sum(mlp_shares.values()) * s for g, s in mlp_shares.items()})
  return out, f


def _quantizers(backend, precision):
  """Who quantizes the operands: our Pallas kernels or the XLA path ('-' where nothing or TE does); the kernels
  leave Four Over Six operands to the XLA path."""
  if backend in ("bf16", "te"):
    return "-"
  impl = "xla" if backend == "xla" else quantizer_impl.resolve(precision.kernels)
  four_over_six = [r for r in precision.recipe.quantized_roles if precision.recipe.four_over_six(r)]
  return f"{impl} (4/6 operands: xla)" if impl != "xla" and four_over_six else impl


def rows(plan, cfg):
  """(gemm kind, layers, recipe, backend, quantizers) per GEMM kind and layer range, lm head and attention core
  last."""
  out = []
  for start, stop, precision in plan.layer_ranges:
    for gemm in ATTENTION_GEMMS + MLP_GEMMS:
      p = precision[gemm]
      backend = backends.resolve(p.recipe, p.backend)
      out.append((gemm, f"{start}-{stop - 1}", p.recipe.name or "bf16", backend, _quantizers(backend, p)))
  last = f"0-{cfg.base_num_decoder_layers - 1}"
  out.append(("attention core (QK^T, PV)", last, "bf16", "bf16", "-"))
  out.append(("lm_head", "-", "bf16", "bf16", "-"))
  return out


def flops_share(plan, cfg):
  """{format label: share of training FLOPs}: each recipe's GEMMs, everything else counted as bf16."""
  per_gemm, total = gemm_flops(cfg)
  shares = {}
  for start, stop, precision in plan.layer_ranges:
    for gemm, p in precision.items():
      label = p.recipe.name or "bf16"
      flops = per_gemm[gemm] * (stop - start)
      # A backward_override quantizes fprop only: dgrad and wgrad (2 of the 3 GEMMs) run in the compute dtype.
      quantized = flops if p.recipe.quantized_backward or not p.recipe.quantized else flops / 3
      shares[label] = shares.get(label, 0.0) + quantized
      shares["bf16"] = shares.get("bf16", 0.0) + flops - quantized
  shares["bf16"] = shares.get("bf16", 0.0) + total.embedding + total.attention_core
  return {k: v / total.total for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}


def block_sizes(plan: PrecisionPlan) -> dict:
  """{gemm: elements per scaling block along a contraction axis}: 16 NVFP4, 32 MX, 1 for per-tensor / bf16."""
  return {g: max(emulated.block_size(prec[g].recipe) or 1 for _, _, prec in plan.layer_ranges)
          for g in ATTENTION_GEMMS + MLP_GEMMS}


def stats_record(plan: PrecisionPlan, stats_by_gemm) -> dict:
  """Telemetry as flat metrics: {"quant/<gemm>/<role>/<stat>": mean over the layers where <gemm> is quantized}.

  `stats_by_gemm`: {gemm: [layers, roles, stats]} from the train step.
  """
  record = {}
  for gemm, values in stats_by_gemm.items():
    layers = [i for start, stop, prec in plan.layer_ranges if prec[gemm].recipe.quantized for i in range(start, stop)]
    if not layers:
      continue
    mean = values[layers].mean(axis=0)
    for r, role in enumerate(quant_stats.ROLES):
      for s, stat in enumerate(quant_stats.STATS):
        record[f"quant/{gemm}/{role}/{stat}"] = float(mean[r, s])
  return record


def recipe_options(plan: PrecisionPlan) -> list:
  """One line per NVFP4 recipe of the plan with Four Over Six or a backward_override set: what they change."""
  lines = []
  recipes = {p.recipe for _, _, prec in plan.layer_ranges for p in prec.values()}
  for r in sorted(recipes, key=lambda r: r.name):
    if r.format != "nvfp4" or (r.nvfp4_4over6 == "none" and r.backward_override == "none"):
      continue
    parts = []
    if r.nvfp4_4over6 != "none":
      roles = ", ".join(role for role in r.quantized_roles if r.four_over_six(role))
      parts.append(f"Four Over Six ({r.nvfp4_4over6_err_mode}) on {roles}: each block's max to 6 or 4, the smaller "
                   "error kept; global scale 6*256/amax")
    if r.backward_override == "high_precision":
      parts.append("backward_override=high_precision: dgrad and wgrad in the compute dtype on unquantized x, w, dy")
    elif r.backward_override == "dequantized":
      parts.append("backward_override=dequantized: dgrad and wgrad in the compute dtype on the forward's quantized "
                   "x and w, dequantized, and unquantized dy")
    lines.append(f"{r.name}: " + "; ".join(parts))
  return lines


def format_plan(plan: PrecisionPlan, cfg) -> str:
  lines = [f"{'gemm':<26} {'layers':<8} {'recipe':<24} {'backend':<9} quantizers"]
  lines += [f"{g:<26} {l:<8} {r:<24} {b:<9} {q}" for g, l, r, b, q in rows(plan, cfg)]
  lines += recipe_options(plan)
  share = ", ".join(f"{k} {v:.1%}" for k, v in flops_share(plan, cfg).items())
  lines.append(f"share of training FLOPs: {share}")
  return "\n".join(lines)
