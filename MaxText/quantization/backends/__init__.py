"""Who runs a quantized GEMM: one Backend protocol (base.py), three backends (emulated, xla, te) and a BF16 one,
chosen per recipe from a `Choice` by `resolve`, said once in the log.

    Choice.AUTO      TE where it can run the recipe, else xla where its block-scaled dot is a native FP4 GEMM
                     (SM100+), else the emulation
    Choice.TE / XLA / EMULATE   that backend, or a BackendError saying why it can't run here
"""

import enum
import functools
import logging

from MaxText.quantization import dots, target
from MaxText.quantization.backends import emulated, te, xla
from MaxText.quantization.backends.base import Backend, OperandBackend
from MaxText.quantization.errors import BackendError
from MaxText.quantization.recipes import Recipe

log = logging.getLogger(__name__)


class Choice(enum.Enum):
  """A backend request (the values are quantization_backend's spellings)."""

  AUTO = "auto"
  TE = "te"
  XLA = "xla"
  EMULATE = "emulate"


class BF16Backend:
  """An unquantized recipe: the plain tensor-core dot (bf16 operands, f32 accumulation, bf16 gradient GEMMs)."""

  name = "bf16"

  def unavailable_reason(self, recipe: Recipe):
    return None

  def matmul(self, x_MxK, w_KxN, recipe: Recipe, *, key, kernels):
    del recipe, key, kernels
    return dots.matmul(x_MxK, w_KxN)

  def quantizers(self, kernels, recipe=None):
    return None

  def __repr__(self):
    return "<bf16 backend>"


BF16 = BF16Backend()
EMULATED, XLA, TE = emulated.BACKEND, xla.BACKEND, te.BACKEND


def resolve(recipe: Recipe, requested: Choice = Choice.AUTO) -> Backend:
  """The Backend that runs `recipe` for `requested` on the device built for (target.py); asking for one that can't
  run there is a BackendError."""
  return _resolve(recipe, requested, target.named())


@functools.lru_cache(maxsize=None)
def _resolve(recipe: Recipe, requested: Choice, named_target) -> Backend:
  del named_target  # a cache key: the answer depends on the target
  if not isinstance(requested, Choice):
    raise BackendError(
      f"a backend request is a backends.Choice ({', '.join(c.name for c in Choice)}), got {requested!r}"
    )
  if not recipe.quantized:
    return BF16
  if requested is Choice.EMULATE:
    return EMULATED
  if requested is Choice.XLA:
    reason = XLA.unavailable_reason(recipe)
    if reason is not None:
      raise BackendError(f"quantization_backend=xla: {reason}; use quantization_backend=auto or emulate")
    return XLA
  reason = TE.unavailable_reason(recipe)
  if reason is None:
    return TE
  if requested is Choice.TE:
    raise BackendError(f"quantization_backend=te: {recipe.name}: {reason}; use quantization_backend=auto or emulate")
  if xla.native(recipe):
    return XLA
  if recipe.te_name is not None:
    log.warning("%s: %s; running emulated %s numerics", recipe.name, reason, recipe.format.label)
  return EMULATED


resolve.cache_clear = _resolve.cache_clear  # what tests that re-pin the GPU call

__all__ = ["BF16", "EMULATED", "TE", "XLA", "Backend", "BackendError", "Choice", "OperandBackend", "resolve"]
