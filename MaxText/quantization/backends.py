"""Backend choice (Transformer Engine or the pure-JAX emulation) per recipe, said once in the log."""

import functools
import logging

from MaxText.quantization import te_backend
from MaxText.quantization.recipes import Recipe

BACKENDS = ("auto", "te", "emulate")
log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def resolve(recipe: Recipe, requested: str = "auto") -> str:
  """'bf16', 'te' or 'emulated' for `recipe`; `requested='te'` where TE can't run is a ValueError."""
  if requested not in BACKENDS:
    raise ValueError(f"quantization_backend must be one of {BACKENDS}, got {requested!r}")
  if not recipe.quantized:
    return "bf16"
  if requested == "emulate":
    return "emulated"
  reason = te_backend.unavailable_reason(recipe)
  if reason is None:
    return "te"
  if requested == "te":
    raise ValueError(f"quantization_backend=te: {recipe.name}: {reason}; use quantization_backend=auto "
                     "or emulate")
  what = {"nvfp4": "NVFP4", "mxfp8": "MXFP8", "mxfp4": "MXFP4"}.get(recipe.format, "FP8")
  if recipe.name.startswith("te_"):
    log.warning("%s: %s; running emulated %s numerics", recipe.name, reason, what)
  return "emulated"
