"""The precision plan: which recipe and backend each GEMM of each decoder layer runs, from the config."""

import dataclasses

from MaxText.model.decoder import ATTENTION_GEMMS, MLP_GEMMS
from MaxText.model.layers import GemmPrecision
from MaxText.quantization import backends, get_recipe

BF16 = GemmPrecision()


@dataclasses.dataclass(frozen=True)
class PrecisionPlan:
  """Layer ranges [(start, stop, {gemm: GemmPrecision})] covering every decoder layer."""
  layer_ranges: tuple

  def rows(self):
    """(gemm kind, layers, recipe name, backend) for the printed plan."""
    out = []
    for start, stop, precision in self.layer_ranges:
      for gemm in ATTENTION_GEMMS + MLP_GEMMS:
        p = precision[gemm]
        out.append((gemm, f"{start}-{stop - 1}", p.recipe.name or "bf16", backends.resolve(p.recipe, p.backend)))
    return out


def recipe_from_config(cfg):
  """The MLP recipe with the config's TE-named knobs applied."""
  knobs = {}
  if cfg.quantization.startswith("te_nvfp4"):
    knobs = dict(disable_rht=cfg.disable_rht or cfg.quantization == "te_nvfp4_no_rht",
                 disable_stochastic_rounding=cfg.disable_stochastic_rounding,
                 disable_2d_quantization=cfg.disable_2d_quantization)
  return get_recipe(cfg.quantization, **knobs)


def plan_from_config(cfg) -> PrecisionPlan:
  """`quantization` on the MLP GEMMs of every layer (the published recipe); attention stays BF16."""
  mlp = GemmPrecision(recipe_from_config(cfg), cfg.quantization_backend)
  precision = {**{g: BF16 for g in ATTENTION_GEMMS}, **{g: mlp for g in MLP_GEMMS}}
  return PrecisionPlan(((0, cfg.base_num_decoder_layers, precision),))


def format_plan(plan: PrecisionPlan) -> str:
  lines = [f"{'gemm':<6} {'layers':<8} {'recipe':<24} backend"]
  lines += [f"{g:<6} {l:<8} {r:<24} {b}" for g, l, r, b in plan.rows()]
  return "\n".join(lines)
