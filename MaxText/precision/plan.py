"""The precision plan: which recipe, backend and quantizers each GEMM of each decoder layer runs, made from the config.

The model asks the plan (a GemmPrecision per GEMM and layer range), never a recipe's name: this package and the
quantization library are the only places that know recipe names. BF16 edge layers, the late all-BF16 switch
(high_precision_from_step) and the attention projections' recipe are decided here.
"""

import dataclasses
import typing

from MaxText.config import models
from MaxText.quantization import backends
from MaxText.quantization import stats as quant_stats
from MaxText.quantization.formats import Format
from MaxText.quantization.kernels.quantizer_impl import Kernels
from MaxText.quantization.recipes import Recipe, get_recipe

ATTENTION_GEMMS, MLP_GEMMS = tuple(models.ATTENTION_GEMMS), tuple(models.MLP_GEMMS)  # the decoder layer's (config)
GEMMS = ATTENTION_GEMMS + MLP_GEMMS


class GemmPrecision(typing.NamedTuple):
  """How one GEMM runs: the recipe, the backend request (a backends.Choice or a registered Backend) and the operand
  quantizers' implementation. Static (hashable)."""

  recipe: Recipe = get_recipe("")
  backend: typing.Any = backends.Choice.AUTO
  kernels: Kernels = Kernels.AUTO


BF16 = GemmPrecision()
# How each GEMM of a decoder layer runs, {gemm: GemmPrecision}: what the decoder layer, its attention, MLP and every
# Dense layer take.
LayerPrecision = typing.Mapping[str, GemmPrecision]


def uniform(precision: GemmPrecision = BF16) -> LayerPrecision:
  """The same GemmPrecision for every GEMM of a layer."""
  return {g: precision for g in GEMMS}


@dataclasses.dataclass(frozen=True)
class PrecisionPlan:
  """Layer ranges [(start, stop, LayerPrecision)] covering every decoder layer, in order."""

  layer_ranges: tuple

  @property
  def quantized(self):
    return any(p.recipe.quantized for _, _, prec in self.layer_ranges for p in prec.values())


def recipe_for(cfg, name) -> Recipe:
  """Recipe `name` with the config's TE-named knobs applied (the NVFP4 ones to NVFP4 recipes, the amax history's to
  stateful ones)."""
  base = get_recipe(name)
  knobs = {}
  if base.stateful:
    knobs = dict(amax_history_len=cfg.amax_history_len, amax_compute_algo=cfg.amax_compute_algo)
  if base.format is Format.NVFP4:
    knobs = dict(
      disable_rht=cfg.disable_rht or base.disable_rht,
      disable_stochastic_rounding=cfg.disable_stochastic_rounding,
      disable_2d_quantization=cfg.disable_2d_quantization,
      nvfp4_4over6=cfg.nvfp4_4over6,
      nvfp4_4over6_err_mode=cfg.nvfp4_4over6_err_mode,
      backward_override=cfg.nvfp4_backward_override,
    )
  return get_recipe(name, **knobs)


def configured_recipes(cfg):
  """(the MLP GEMMs' recipe, the attention projections' recipe) of the quantized layers."""
  attention = cfg.quantization if cfg.quantization_scope == "all_dense" else cfg.attention_quantization
  return recipe_for(cfg, cfg.quantization), recipe_for(cfg, attention)


def amax_history_len(cfg) -> int:
  """Length of the amax history every Dense layer keeps: only where quantization or attention_quantization names a
  stateful (delayed-scaling) recipe, else 0 (none kept, and none in checkpoints)."""
  names = (cfg.quantization, cfg.attention_quantization)
  return cfg.amax_history_len if any(get_recipe(n).stateful for n in names) else 0


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
  mlp_recipe, attention_recipe = configured_recipes(cfg)
  backend, kernels = backends.request(cfg.quantization_backend), Kernels(cfg.quantization_kernels)
  attention_backend = backends.request(cfg.attention_quantization_backend or cfg.quantization_backend)
  mlp, attn = GemmPrecision(mlp_recipe, backend, kernels), GemmPrecision(attention_recipe, attention_backend, kernels)
  quantized = {**{g: attn for g in ATTENTION_GEMMS}, **{g: mlp for g in MLP_GEMMS}}
  bf16 = uniform(BF16)
  n, first, last = cfg.base_num_decoder_layers, cfg.quantization_bf16_first_layers, cfg.quantization_bf16_last_layers
  if high_precision:
    return PrecisionPlan(((0, n, bf16),))
  return PrecisionPlan(_merge_ranges([(0, first, bf16), (first, n - last, quantized), (n - last, n, bf16)]))


def backend_error_for_key(cfg, error):
  """A BackendError from the attention projections' backend request said with the key the user set for it: the
  quantization library knows one key, quantization_backend, and names it (advising a value that may be in force);
  with attention_quantization_backend set, a refusal of its backend (one the MLP GEMMs don't request, or of the
  attention's own recipe) is attention_quantization_backend's. Any other error is returned as it is."""
  asked = cfg.attention_quantization_backend
  prefix, advice = f"quantization_backend={asked}: ", "; use quantization_backend=auto or emulate"
  message = str(error)
  mlp_recipe, attention_recipe = configured_recipes(cfg)
  attention_only = asked != cfg.quantization_backend or (
    mlp_recipe.name != attention_recipe.name and f": {attention_recipe.name}: " in f": {message}"
  )
  if not asked or not message.startswith(prefix) or not attention_only:
    return error
  reason = message[len(prefix) :].removesuffix(advice)
  return type(error)(
    f"attention_quantization_backend={asked}: {reason}; use attention_quantization_backend=auto or emulate, or drop "
    f"it (the attention projections then follow quantization_backend={cfg.quantization_backend})"
  )


def block_sizes(plan: PrecisionPlan) -> dict:
  """{gemm: elements per scaling block along a contraction axis}: 16 NVFP4, 32 MX, 1 for per-tensor / bf16."""
  return {g: max(prec[g].recipe.block_size or 1 for _, _, prec in plan.layer_ranges) for g in GEMMS}


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
