"""Backend choice per recipe (Transformer Engine, XLA's block-scaled dot, or the pure-JAX emulation), said once in the log."""

import functools
import logging

from MaxText.quantization.backends import te as te_backend
from MaxText.quantization.backends import xla as xla_backend
from MaxText.quantization.errors import BackendError
from MaxText.quantization.recipes import Recipe

BACKENDS = ("auto", "te", "xla", "emulate")
log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def resolve(recipe: Recipe, requested: str = "auto") -> str:
  """'bf16', 'te', 'xla' or 'emulated' for `recipe`; asking for one that can't run here is a BackendError.

  auto: TE where it can run the recipe, else the xla backend where its block-scaled dot is a native
  FP4 GEMM (SM100+), else the emulation.
  """
  if requested not in BACKENDS:
    raise BackendError(f"quantization_backend must be one of {BACKENDS}, got {requested!r}")
  if not recipe.quantized:
    return "bf16"
  if requested == "emulate":
    return "emulated"
  if requested == "xla":
    reason = xla_backend.unavailable_reason(recipe)
    if reason is not None:
      raise BackendError(f"quantization_backend=xla: {reason}; use quantization_backend=auto or emulate")
    return "xla"
  reason = te_backend.unavailable_reason(recipe)
  if reason is None:
    return "te"
  if requested == "te":
    raise BackendError(f"quantization_backend=te: {recipe.name}: {reason}; use quantization_backend=auto "
                       "or emulate")
  if xla_backend.native(recipe):
    return "xla"
  what = {"nvfp4": "NVFP4", "mxfp8": "MXFP8", "mxfp4": "MXFP4"}.get(recipe.format, "FP8")
  if recipe.name.startswith("te_"):
    log.warning("%s: %s; running emulated %s numerics", recipe.name, reason, what)
  return "emulated"
