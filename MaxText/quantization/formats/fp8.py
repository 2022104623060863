"""Per-tensor FP8 (TE's current and delayed scaling): one f32 scale for the whole tensor, E4M3 or E5M2 values; delayed
scaling's amax history (rows x, w, dy; newest first) and the scales it gives.

Both scalars (the encode scale and its inverse, the decode scale) go through grids.materialize: each is a few dozen
integer ops (grids.div_rn), which XLA would otherwise fuse into every elementwise consumer and recompute for every
element of the tensor (measured on the 2-core CPU box: most of an FP8 training step's time).
"""

import jax.numpy as jnp

from MaxText.quantization.formats import grids
from MaxText.quantization.formats.tensor import QuantizedTensor

HISTORY_ROWS = ("x", "w", "dy")  # the operands of a linear layer a history [3, H] keeps amaxes of, in row order


def per_tensor_scale(amax, grid):
  """TE's current-scaling rule: scale = fp8_max / amax; 1 when amax is 0 or not finite, capped at FLT_MAX."""
  return scale_for_max(amax, grid.max_value)


def scale_for_max(amax, max_value):
  """per_tensor_scale with the grid's largest value given: arrays of amaxes and maxima give every scale in one
  division (delayed scaling's x, w and dy scales)."""
  scale = jnp.minimum(grids.div_rn(max_value, amax), grids.FLT_MAX)
  (scale,) = grids.materialize(jnp.where((amax > 0) & jnp.isfinite(amax), scale, 1.0).astype(jnp.float32))
  return scale


def decode_scale(scale):
  """1 / scale, correctly rounded: what the GEMM's epilogue multiplies by."""
  (decode,) = grids.materialize(grids.div_rn(1.0, scale))
  return decode


def quantize(x, grid, scale, decode=None) -> QuantizedTensor:
  """x * scale rounded to nearest-even on the FP8 grid (saturating), in its f8 dtype; decode scale = 1/scale
  (`decode`, where the caller has it already)."""
  q = grids.round_to_grid(x.astype(jnp.float32) * scale, grid)
  return QuantizedTensor(grids.cast_exact(q, grid), None, decode_scale(scale) if decode is None else decode)


def scales_from_history(history_3xH, max_values_3, amax_compute_algo):
  """(scales [3], decode scales [3]) of x, w and dy (HISTORY_ROWS' order) from an amax history [3, H]: the newest
  amax ("most_recent") or the history's max ("max"), each grid's largest value in `max_values_3`. Each vector from
  one division: a division (grids.div_rn) is ~100 integer ops, and one per role and pass would make most of the FP8
  step's program (and its compile time). The same numbers as three scalar divisions."""
  amax = history_3xH[:, 0] if amax_compute_algo == "most_recent" else grids.abs_max(history_3xH, axis=1)
  scales = scale_for_max(amax, jnp.asarray(max_values_3, jnp.float32))
  return scales, decode_scale(scales)


def push_history(history_3xH, amaxes_3):
  """The history with this step's amaxes [3] (HISTORY_ROWS' order) in front and the oldest column dropped."""
  newest = jnp.asarray(amaxes_3, jnp.float32)[:, None]
  return jnp.concatenate([newest, history_3xH[:, :-1]], axis=1)
