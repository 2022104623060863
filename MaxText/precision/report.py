"""The precision plan as the run prints it: one row per GEMM kind and layer range (recipe, backend, quantizers), what
the NVFP4 options change, and the share of training FLOPs in each format."""

from MaxText.precision.plan import GEMMS, GemmPrecision, PrecisionPlan
from MaxText.quantization import backends, partition
from MaxText.quantization.formats import Format


def _quantizers(backend, precision: GemmPrecision):
  """Who quantizes the operands: our Pallas kernels (Four Over Six included) or the XLA path ('-' where nothing or TE
  does); for a partitioned GEMM (every stateless recipe's Dense under a mesh) the kernels each device runs on its
  shard (quantization/partition.py)."""
  kernels = precision.kernels if precision.recipe.stateful else partition.per_shard_kernels(precision.kernels)
  impl = backend.quantizers(kernels)
  return "-" if impl is None else impl


def rows(plan: PrecisionPlan, cfg):
  """(gemm kind, layers, recipe, backend, quantizers) per GEMM kind and layer range, lm head and attention core
  last; fused_mlp's one gate and up GEMM is one row."""
  out = []
  for start, stop, precision in plan.layer_ranges:
    for gemm in GEMMS:
      if cfg.fused_mlp and gemm == "up":
        continue
      p = precision[gemm]
      backend = backends.resolve(p.recipe, p.backend)
      name = "gate+up (fused_mlp)" if cfg.fused_mlp and gemm == "gate" else gemm
      out.append((name, f"{start}-{stop - 1}", p.recipe.name or "bf16", backend.name, _quantizers(backend, p)))
  last = f"0-{cfg.base_num_decoder_layers - 1}"
  out.append(("attention core (QK^T, PV)", last, "bf16", "bf16", "-"))
  head = "f32" if cfg.logits_dot_in_fp32 else "bf16"  # logits_dot_in_fp32
  out.append(("lm_head", "-", head, head, "-"))
  return out


def flops_share(plan: PrecisionPlan, gemm_flops):
  """{format label: share of training FLOPs}: each recipe's GEMMs, everything else counted as bf16.

  `gemm_flops`: (per-layer training FLOPs of each GEMM kind, the step's TrainingFlops), accounting.gemm_flops.
  """
  per_gemm, total = gemm_flops
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


def recipe_options(plan: PrecisionPlan) -> list:
  """One line per NVFP4 recipe of the plan with Four Over Six or a backward_override set: what they change."""
  lines = []
  recipes = {p.recipe for _, _, prec in plan.layer_ranges for p in prec.values()}
  for r in sorted(recipes, key=lambda r: r.name):
    if r.format is not Format.NVFP4 or (r.nvfp4_4over6 == "none" and r.backward_override == "none"):
      continue
    parts = []
    if r.nvfp4_4over6 != "none":
      roles = ", ".join(role for role in r.quantized_roles if r.four_over_six(role))
      parts.append(
        f"Four Over Six ({r.nvfp4_4over6_err_mode}) on {roles}: each block's max to 6 or 4, the smaller "
        "error kept; global scale 6*256/amax"
      )
    if r.backward_override == "high_precision":
      parts.append("backward_override=high_precision: dgrad and wgrad in the compute dtype on unquantized x, w, dy")
    elif r.backward_override == "dequantized":
      parts.append(
        "backward_override=dequantized: dgrad and wgrad in the compute dtype on the forward's quantized "
        "x and w, dequantized, and unquantized dy"
      )
    lines.append(f"{r.name}: " + "; ".join(parts))
  return lines


def format_plan(plan: PrecisionPlan, cfg, gemm_flops) -> str:
  """The printed plan; `gemm_flops` as for flops_share."""
  lines = [f"{'gemm':<26} {'layers':<8} {'recipe':<24} {'backend':<9} quantizers"]
  lines += [f"{g:<26} {l:<8} {r:<24} {b:<9} {q}" for g, l, r, b, q in rows(plan, cfg)]
  lines += recipe_options(plan)
  share = ", ".join(f"{k} {v:.1%}" for k, v in flops_share(plan, gemm_flops).items())
  lines.append(f"share of training FLOPs: {share}")
  return "\n".join(lines)


def plan_summary(plan: PrecisionPlan) -> str:
  """The plan in a few words: each layer range's MLP and attention recipes ('layers 0-3: mlp te_nvfp4, attention
  bf16')."""

  def range_text(start, stop, prec):
    mlp, attention = prec["gate"].recipe.name or "bf16", prec["q"].recipe.name or "bf16"
    what = mlp if mlp == attention else f"mlp {mlp}, attention {attention}"
    return f"layers {start}-{stop - 1}: {what}"

  return "; ".join(range_text(*r) for r in plan.layer_ranges)


def _plan_at(cfg, step):
  from MaxText.precision.plan import plan_from_config  # pylint: disable=import-outside-toplevel

  return plan_from_config(cfg, high_precision=0 <= cfg.high_precision_from_step <= step)


def _recipe_label(cfg):
  return f"quantization={cfg.quantization or 'bf16'}" + (
    f", attention_quantization={cfg.attention_quantization}" if cfg.attention_quantization else ""
  )


def change_on_resume(stored_config: dict, cfg, step):
  """(one line, a metrics record) when the checkpoint of `step`, written under `stored_config` (its meta's), ran
  another recipe or plan than `cfg` runs from `step` on; None when they agree (or the checkpoint doesn't say)."""
  own = cfg.to_dict()
  changed = {k: v for k, v in stored_config.items() if k in own and v != own[k]}
  try:
    old_cfg = cfg.replace(**changed)
  except Exception:  # pylint: disable=broad-except  (a value today's schema refuses: compare what the plan reads)
    old_cfg = cfg.replace(**{k: v for k, v in changed.items() if "quantization" in k})
  old, new = _plan_at(old_cfg, step), _plan_at(cfg, step)
  if old == new:
    return None
  before = {"recipe": _recipe_label(old_cfg), "plan": plan_summary(old)}
  after = {"recipe": _recipe_label(cfg), "plan": plan_summary(new)}
  line = (
    f"recipe change on resume at step {step}: the checkpoint was trained with {before['recipe']} "
    f"({before['plan']}); this run goes on with {after['recipe']} ({after['plan']})"
  )
  return line, {"step": step, "from": before, "to": after}
