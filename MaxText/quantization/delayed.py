"""FP8 delayed scaling: per-tensor scales from an amax history carried across steps.

The history of one linear layer is an f32 array [3, H] (rows: fp8.HISTORY_ROWS, x, w, dy; index 0 = newest).
`qmatmul_delayed` returns the updated history as the *gradient* of the history argument
(the overwrite-with-gradient convention of Flax's fp8 ops): the trainer stores that gradient
in place of the old history instead of applying the optimizer to it. The Dense layer passes the history to qdense
(`history=`), like any other call's option; the GEMMs and the quantizers are the emulated backend's per-tensor FP8
linear layer (emulated.fp8_linear), the scales from the history instead of the operands' own amaxes; the amaxes
the history records are read where each operand is quantized.
"""

import jax.numpy as jnp

from MaxText.quantization import backends, qdot
from MaxText.quantization.formats import Format
from MaxText.quantization.kernels.quantizer_impl import Kernels
from MaxText.quantization.recipes import Recipe


def init_history(recipe: Recipe):
  """Zeros: the first step then uses scale 1 and records real amaxes."""
  return jnp.zeros((3, recipe.amax_history_len), jnp.float32)


def qmatmul_delayed(x, w, recipe: Recipe, history_3xH, kernels=Kernels.AUTO):
  """x [M, K] . w [K, N] in per-tensor FP8 with scales from `history_3xH`; grad of history = new history.
  `kernels`: the quantizers' implementation, as for qmatmul."""
  if recipe.format is not Format.FP8_DELAYED:
    raise ValueError(f"qmatmul_delayed needs a delayed-scaling recipe, got {recipe.name!r}")
  return qdot.qdense(x, w, recipe, backend=backends.Choice.EMULATE, kernels=kernels, history=history_3xH)
