"""Who runs a quantized GEMM: the Backend class (base.py), three backends (emulated, xla, te) and a BF16 one,
chosen per recipe from a request by `resolve`, said once in the log. A request is a `Choice`, a registered backend's
name (`register`) or a Backend itself:

    Choice.AUTO      TE where it can run the recipe, else xla where its block-scaled dot is a native FP4 GEMM
                     (SM100+), else the emulation
    Choice.TE / XLA / EMULATE   that backend, or a BackendError saying why it can't run here
    a registered name or a Backend   that backend, or a BackendError saying why it can't run here
"""

import functools
import logging

from MaxText.quantization import dots, target
from MaxText.quantization.backends import emulated, te, xla
from MaxText.quantization.backends.base import Backend
from MaxText.quantization.errors import BackendError
from MaxText.quantization.registry import REGISTERED, Choice, Names
from MaxText.quantization.recipes import Recipe

log = logging.getLogger(__name__)


class BF16Backend(Backend):
  """An unquantized recipe: the plain tensor-core dot (bf16 operands, f32 accumulation, bf16 gradient GEMMs), one
  global computation that XLA partitions."""

  name = "bf16"

  def dense(self, x, w, recipe: Recipe, *, key, kernels, partition=None, history=None):
    del recipe, key, kernels, partition, history
    *lead, k = x.shape
    # The weight read in the compute dtype (x's); a quantizer reads the master weight itself.
    return dots.matmul(x.reshape(-1, k), w.reshape(k, -1).astype(x.dtype)).reshape(*lead, *w.shape[1:])


BF16 = BF16Backend()
EMULATED, XLA, TE = emulated.BACKEND, xla.BACKEND, te.BACKEND


def register(backend: Backend) -> Backend:
  """Make `backend` a choice of quantization_backend (and a name `resolve` takes) under its `name`: how a backend
  defined outside this package joins. Its `dense` is the recipe's three GEMMs on its quantize and gemm (base.py)."""
  name = backend.name
  if not name or name in (c.value for c in Choice) or REGISTERED.get(name, backend) is not backend:
    raise BackendError(f"a registered backend needs a name of its own, not {name!r} (taken: {', '.join(Names())})")
  REGISTERED[name] = backend
  return backend


def request(name: str):
  """What quantization_backend=`name` asks for: a Choice, or the backend registered under `name`."""
  if name in REGISTERED:
    return REGISTERED[name]
  if name not in (c.value for c in Choice):
    raise BackendError(f"quantization_backend={name!r} is not one of: {', '.join(Names())}")
  return Choice(name)


def resolve(recipe: Recipe, requested=Choice.AUTO) -> Backend:
  """The Backend that runs `recipe` for `requested` (a Choice, a registered name or a Backend) on the device built
  for (target.py): BF16's for an unquantized recipe; asking for one that can't run there is a BackendError."""
  if not recipe.quantized:
    return BF16
  if isinstance(requested, str):
    requested = request(requested)
  if isinstance(requested, Choice):
    return _resolve(recipe, requested, target.named())
  if not callable(getattr(requested, "dense", None)):
    raise BackendError(f"a backend request is a Choice, a registered name or a Backend, not {requested!r}")
  reason = requested.unavailable_reason(recipe)
  if reason is not None:
    raise BackendError(f"quantization_backend={requested.name}: {recipe.name}: {reason}")
  return requested


@functools.lru_cache(maxsize=None)
def _resolve(recipe: Recipe, requested: Choice, named_target) -> Backend:
  del named_target  # a cache key: the answer depends on the target
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

__all__ = ["BF16", "EMULATED", "TE", "XLA", "Backend", "BackendError", "Choice", "register", "request", "resolve"]
