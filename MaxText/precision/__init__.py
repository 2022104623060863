"""The precision plan: which recipe, backend and quantizers each GEMM of each decoder layer runs (plan.py), and how the
run prints it (report.py). Outside the quantization library, the only package that knows recipe names."""

from MaxText.precision.plan import (
  ATTENTION_GEMMS,
  BF16,
  GEMMS,
  MLP_GEMMS,
  GemmPrecision,
  LayerPrecision,
  PrecisionPlan,
  amax_history_len,
  backend_error_for_key,
  block_sizes,
  configured_recipes,
  plan_from_config,
  recipe_for,
  stats_record,
  uniform,
)
from MaxText.precision.report import change_on_resume, flops_share, format_plan, plan_summary, recipe_options, rows

__all__ = [
  "ATTENTION_GEMMS",
  "BF16",
  "GEMMS",
  "MLP_GEMMS",
  "GemmPrecision",
  "LayerPrecision",
  "PrecisionPlan",
  "amax_history_len",
  "backend_error_for_key",
  "block_sizes",
  "change_on_resume",
  "configured_recipes",
  "flops_share",
  "format_plan",
  "plan_from_config",
  "plan_summary",
  "recipe_for",
  "recipe_options",
  "rows",
  "stats_record",
  "uniform",
]
