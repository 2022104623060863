"""Recipe definitions: which low-precision format each GEMM operand uses, under TE's recipe names and knobs.

One source of truth: `RECIPES` maps every user-facing name to its definition; `get_recipe`
applies the TE-named knobs (disable_rht, disable_stochastic_rounding, disable_2d_quantization,
amax_history_len, amax_compute_algo; for NVFP4 also TE 2.20's nvfp4_4over6, nvfp4_4over6_err_mode and
backward_override).
"""

import dataclasses
import typing

from MaxText.quantization.errors import RecipeError
from MaxText.quantization.formats import Format

# Operand roles of the three GEMMs of a linear layer y = x . w (w in [K, N] kernel layout):
#   fprop  y  = x      . w          operands "x" [M,K] and "w" (w^T [N,K])
#   dgrad  dx = dy     . w^T        operands "dy" [M,N] and "w_t" (w [K,N])
#   wgrad  dw = x^T    . dy         operands "x_t" (x^T [K,M]) and "dy_t" (dy^T [N,M])
# Every operand is handed to its quantizer as [rows, contraction], blocks along the last axis.
ROLES = ("x", "w", "dy", "w_t", "x_t", "dy_t")
WEIGHT_ROLES = ("w", "w_t")
GRAD_ROLES = ("dy", "dy_t")
WGRAD_ROLES = ("x_t", "dy_t")

# NVFP4 Four Over Six scopes (TE's names; "gradients" and a gradient-including "all" are ours: TE's "all" is
# weights and activations) and the operand roles each covers.
FOUR_OVER_SIX_SCOPES = {
  "none": (),
  "weights": WEIGHT_ROLES,
  "activations": ("x", "x_t"),
  "gradients": GRAD_ROLES,
  "all": ROLES,
}
FOUR_OVER_SIX_ERR_MODES = ("mse", "mae")
# none; high_precision: dgrad and wgrad on the unquantized x, w, dy; dequantized: on the forward's quantized x and w,
# dequantized, and the unquantized dy. Both backward GEMMs in the compute dtype (TE's backward_override).
BACKWARD_OVERRIDES = ("none", "high_precision", "dequantized")


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A precision recipe: a format for every GEMM operand plus TE's knobs. Callers ask it what it does (`format`,
  `stateful`, `needs_rht`, `te_name`, ...) rather than matching its name."""

  name: str
  format: Format
  summary: str
  te_name: typing.Optional[str] = None  # TE's recipe class (transformer_engine.common.recipe); None: TE has none
  disable_rht: bool = False
  disable_stochastic_rounding: bool = False
  disable_2d_quantization: bool = False
  amax_history_len: int = 1024
  amax_compute_algo: str = "max"  # or "most_recent"
  nvfp4_4over6: str = "none"  # a FOUR_OVER_SIX_SCOPES key
  nvfp4_4over6_err_mode: str = "mse"  # the paper's; TE's default is "mae"
  backward_override: str = "none"  # one of BACKWARD_OVERRIDES

  @property
  def quantized(self) -> bool:
    return self.format is not Format.BF16

  @property
  def stateful(self) -> bool:
    """Whether the recipe keeps state across steps (delayed scaling's amax history)."""
    return self.format is Format.FP8_DELAYED

  @property
  def needs_rng(self) -> bool:
    """Whether it rounds stochastically (NVFP4 gradients), so its GEMMs need a PRNG key."""
    return self.format is Format.NVFP4 and not self.disable_stochastic_rounding

  @property
  def needs_rht(self) -> bool:
    """Whether its wgrad operands go through the Random Hadamard Transform."""
    return self.format is Format.NVFP4 and not self.disable_rht

  @property
  def block_size(self):
    """Elements per scaling block along a contraction axis: 16 NVFP4, 32 MX, None per tensor / BF16."""
    return self.format.block_size

  def rht(self, role: str) -> bool:
    """RHT only on the two wgrad operands (TE's NVFP4 recipe)."""
    return self.needs_rht and role in WGRAD_ROLES

  def stochastic_rounding(self, role: str) -> bool:
    """SR only on output gradients."""
    return self.needs_rng and role in GRAD_ROLES

  def tile_2d(self, role: str) -> bool:
    """16x16 tiles for the weight (both views the same numbers)."""
    return self.format is Format.NVFP4 and not self.disable_2d_quantization and role in WEIGHT_ROLES

  def four_over_six(self, role: str):
    """The Four Over Six error mode ("mse" / "mae") where `role` is quantized with 4/6, else None."""
    if self.format is Format.NVFP4 and role in FOUR_OVER_SIX_SCOPES[self.nvfp4_4over6]:
      return self.nvfp4_4over6_err_mode
    return None

  @property
  def quantized_backward(self) -> bool:
    """Whether dgrad and wgrad run on quantized operands (no backward_override)."""
    return self.quantized and self.backward_override == "none"

  @property
  def quantized_roles(self) -> tuple:
    """The operand roles this recipe quantizes: all six, only fprop's x and w with a backward_override, none for
    BF16."""
    if not self.quantized:
      return ()
    return ROLES if self.quantized_backward else ("x", "w")

  def shares_transpose(self, operand: str) -> bool:
    """Whether operand ("x", "w" or "dy") and its transposed role quantize to the same numbers, so one
    quantization serves both GEMMs: per-tensor FP8 (one scale, no blocks), NVFP4 weights in 16x16 tiles."""
    if self.format.per_tensor_fp8:
      return True
    return operand == "w" and self.tile_2d("w") and self.tile_2d("w_t")

  def fp8_dtype_name(self, role: str) -> str:
    """HYBRID format for per-tensor FP8: E4M3 forward operands, E5M2 gradients."""
    if self.format.per_tensor_fp8 and role in GRAD_ROLES:
      return "e5m2"
    return "e4m3"


RECIPES = {
  "": Recipe("", Format.BF16, "no quantization: BF16 GEMMs with f32 accumulation"),
  "te_nvfp4": Recipe(
    "te_nvfp4",
    Format.NVFP4,
    "NVFP4 (E2M1, E4M3 per 16, f32 per tensor); 16x16 weight tiles, RHT on wgrad, SR on gradients",
    te_name="NVFP4BlockScaling",
  ),
  "te_nvfp4_no_rht": Recipe(
    "te_nvfp4_no_rht",
    Format.NVFP4,
    "te_nvfp4 without the wgrad Random Hadamard Transform",
    te_name="NVFP4BlockScaling",
    disable_rht=True,
  ),
  "te_fp8_currentscaling": Recipe(
    "te_fp8_currentscaling",
    Format.FP8_CURRENT,
    "per-tensor FP8, E4M3 forward / E5M2 gradients, scale = fp8_max / current amax",
    te_name="Float8CurrentScaling",
  ),
  "te_fp8_delayedscaling": Recipe(
    "te_fp8_delayedscaling",
    Format.FP8_DELAYED,
    "per-tensor FP8, E4M3 forward / E5M2 gradients, scale from an amax history (stateful)",
    te_name="DelayedScaling",
  ),
  "te_mxfp8": Recipe(
    "te_mxfp8",
    Format.MXFP8,
    "MXFP8: E4M3 with an E8M0 power-of-two scale per 32 along the contraction",
    te_name="MXFP8BlockScaling",
  ),
  "mxfp4": Recipe(
    "mxfp4",
    Format.MXFP4,
    "MXFP4: E2M1 with an E8M0 scale per 32, scale = 2^ceil(log2(block_amax / 6)) (TE reference rule:"
    " no element saturates); no RHT, SR or 2D tiles",
  ),
}
# Other names of recipes. fp8 is MaxText's quantization=fp8: Flax's Fp8DirectDotGeneralOp, per-tensor FP8 with
# delayed scaling (a 1024-step amax history, its max), E4M3 forward / E5M2 gradients.
ALIASES = {"bf16": "", "none": "", "fp8": "te_fp8_delayedscaling"}
KNOBS = (
  "disable_rht",
  "disable_stochastic_rounding",
  "disable_2d_quantization",
  "amax_history_len",
  "amax_compute_algo",
  "nvfp4_4over6",
  "nvfp4_4over6_err_mode",
  "backward_override",
)
_NVFP4_KNOBS = {
  "nvfp4_4over6": tuple(FOUR_OVER_SIX_SCOPES),
  "nvfp4_4over6_err_mode": FOUR_OVER_SIX_ERR_MODES,
  "backward_override": BACKWARD_OVERRIDES,
}


def recipe_names():
  return [n for n in RECIPES if n] + list(ALIASES)


def get_recipe(name: str, **overrides) -> Recipe:
  """The recipe called `name` ("" = BF16) with TE-named knobs overridden; a RecipeError (a ValueError) lists the valid
  choices."""
  key = ALIASES.get(name, name)
  if key not in RECIPES:
    raise RecipeError(f'unknown quantization recipe {name!r}; valid: "" (bf16), ' + ", ".join(recipe_names()))
  unknown = sorted(set(overrides) - set(KNOBS))
  if unknown:
    raise RecipeError(f"unknown recipe knob(s) {unknown}; valid: {', '.join(KNOBS)}")
  if overrides.get("amax_compute_algo", "max") not in ("max", "most_recent"):
    raise RecipeError("amax_compute_algo must be 'max' or 'most_recent'")
  if int(overrides.get("amax_history_len", 1)) < 1:
    raise RecipeError("amax_history_len must be >= 1")
  recipe = RECIPES[key]
  for knob, choices in _NVFP4_KNOBS.items():
    value = overrides.get(knob, getattr(recipe, knob))
    if value not in choices:
      raise RecipeError(f"{knob} must be one of {', '.join(choices)}, got {value!r}")
    if value != getattr(recipe, knob) and recipe.format is not Format.NVFP4:
      raise RecipeError(f"{knob}={value} applies to the NVFP4 recipes only, not to {recipe.name or 'bf16'}")
  return dataclasses.replace(recipe, **overrides) if overrides else recipe
