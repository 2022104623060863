"""Transformer Engine backend: the te_* recipes on TE's native kernels. Imported lazily, never on CPU.

Only `unavailable_reason()` is safe to call anywhere; everything else needs `transformer_engine.jax`.
"""

import functools
import importlib

import jax
import jax.numpy as jnp

from MaxText.quantization.formats import Format
from MaxText.quantization.recipes import Recipe

NVFP4_MIN_SM = 100  # Blackwell
FP8_MIN_SM = 89  # Ada / Hopper


def gpu_compute_capability():
  """Major*10+minor of the first GPU, or None without one."""
  try:
    gpus = jax.devices("gpu")
  except RuntimeError:
    return None
  cap = getattr(gpus[0], "compute_capability", None) if gpus else None
  if not cap:
    return None
  major, minor = str(cap).split(".")
  return int(major) * 10 + int(minor)


@functools.lru_cache(maxsize=None)
def _import_te():
  try:
    return importlib.import_module("transformer_engine.jax")
  except Exception:  # ImportError, or a TE build that fails to load its CUDA library
    return None


def min_sm(recipe: Recipe) -> int:
  return NVFP4_MIN_SM if recipe.format in (Format.NVFP4, Format.MXFP8) else FP8_MIN_SM


def _options_reason(recipe: Recipe):
  """Why TE can't run the recipe's Four Over Six / backward_override settings, or None without them.

  TE 2.20 has both in its PyTorch NVFP4BlockScaling only (transformer_engine.jax reads neither), and even there
  applies 4/6 to weights and activations only (never to gradients) and without the RHT or stochastic rounding.
  """
  if recipe.nvfp4_4over6 == "none" and recipe.backward_override == "none":
    return None
  settings = ", ".join(f"{k}={getattr(recipe, k)}" for k in ("nvfp4_4over6", "backward_override")
                       if getattr(recipe, k) != "none")
  why = "Transformer Engine's JAX bindings (2.20) read neither nvfp4_4over6 nor backward_override"
  if recipe.nvfp4_4over6 in ("gradients", "all"):
    why += "; TE never applies Four Over Six to gradients"
  elif recipe.nvfp4_4over6 == "activations" and not recipe.disable_rht:
    why += "; TE's Four Over Six doesn't take the RHT its activation quantizer applies"
  return f"{settings}: {why}"


def unavailable_reason(recipe: Recipe):
  """None when TE can run `recipe` here, else why not (one line)."""
  if recipe.te_name is None:
    return f"{recipe.name} has no Transformer Engine kernel"
  if recipe.stateful:
    return "the trainer carries the amax history itself (TE would keep it in its own variable collection)"
  options = _options_reason(recipe)
  if options is not None:
    return options
  sm = gpu_compute_capability()
  need = min_sm(recipe)
  kind = "NVFP4" if recipe.format is Format.NVFP4 else "FP8"
  if sm is None or sm < need:
    return f"Transformer Engine {kind} needs an SM{need}+ GPU"
  if _import_te() is None:
    return "transformer_engine.jax is not importable"
  return None


def te_recipe(recipe: Recipe):
  """The TE recipe object for one of our te_* recipes."""
  r = importlib.import_module("transformer_engine.common.recipe")
  if recipe.format is Format.NVFP4:
    return r.NVFP4BlockScaling(disable_rht=recipe.disable_rht,
                               disable_stochastic_rounding=recipe.disable_stochastic_rounding,
                               disable_2d_quantization=recipe.disable_2d_quantization)
  if recipe.format is Format.FP8_CURRENT:
    return r.Float8CurrentScaling(fp8_format=r.Format.HYBRID)
  if recipe.format is Format.FP8_DELAYED:
    return r.DelayedScaling(fp8_format=r.Format.HYBRID, amax_history_len=recipe.amax_history_len,
                            amax_compute_algo=recipe.amax_compute_algo)
  if recipe.format is Format.MXFP8:
    return r.MXFP8BlockScaling()
  raise ValueError(f"{recipe.name} has no Transformer Engine recipe")


def _sr_rng_state(key):
  """TE's NVFP4 SR state: uint32[4] per call. TE's Flax modules draw it from the `sr_rng` rng stream;
  we draw it from our (seed, step, layer, GEMM) key, so TE and emulated runs share one seed discipline."""
  return jax.random.bits(key, (4,), jnp.uint32)


def _configure_nvfp4(quantizer_set, recipe: Recipe, key):
  """What TE's TransformerEngineBase puts in the quantizers' QuantizeMeta and create_set(fp8_recipe=...)
  alone leaves at its defaults: the RHT on the 1D (x, dgrad) quantizers, whose colwise outputs are
  the wgrad operands (never on 2D weight tiles), and the SR state on the dgrad quantizer only."""
  for quantizer in (quantizer_set.x, quantizer_set.dgrad):
    quantizer.use_rht = not recipe.disable_rht
  if recipe.needs_rng and key is not None:
    quantizer_set.dgrad.stochastic_rounding_rng_state = _sr_rng_state(key)


def qmatmul(x, w, recipe: Recipe, *, key=None):
  """x [M, K] . w [K, N] through TE's dense with the recipe's quantizer set."""
  te_dense = importlib.import_module("transformer_engine.jax.dense")
  te_quantize = importlib.import_module("transformer_engine.jax.quantize")
  quantizer_set = te_quantize.QuantizerFactory.create_set(fp8_recipe=te_recipe(recipe))
  if recipe.format is Format.NVFP4:
    _configure_nvfp4(quantizer_set, recipe, key)
  return te_dense.dense(x, w, contracting_dims=((1,), (0,)), quantizer_set=quantizer_set)


class TEBackend:
  """Transformer Engine's dense (its quantizers, GEMMs and backward) for the recipes TE has (`recipe.te_name`)."""
  name = "te"

  def unavailable_reason(self, recipe: Recipe):
    return unavailable_reason(recipe)

  def matmul(self, x_MxK, w_KxN, recipe: Recipe, *, key, kernels):
    del kernels  # TE quantizes with its own kernels
    return qmatmul(x_MxK, w_KxN, recipe, key=key)

  def quantizers(self, kernels):
    return None  # TE's own, inside its dense

  def __repr__(self):
    return "<te backend>"


BACKEND = TEBackend()
