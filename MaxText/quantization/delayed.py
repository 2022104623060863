"""FP8 delayed scaling: per-tensor scales from an amax history carried across steps.

The history of one linear layer is an f32 array [3, H] (rows: x, w, dy; index 0 = newest).
`qmatmul_delayed` returns the updated history as the *gradient* of the history argument
(the overwrite-with-gradient convention of Flax's fp8 ops): the trainer stores that gradient
in place of the old history instead of applying the optimizer to it. Each operand is quantized
once per step: its transposed role has the same per-tensor scale, hence the same f8 values.
"""

import functools

import jax
import jax.numpy as jnp

from MaxText.quantization.backends import emulated
from MaxText.quantization.backends.base import name_for_remat
from MaxText.quantization.formats import Format, fp8, grids
from MaxText.quantization.kernels.quantizer_impl import Kernels
from MaxText.quantization.recipes import Recipe

ROWS = {"x": 0, "w": 1, "dy": 2}


def init_history(recipe: Recipe):
  """Zeros: the first step then uses scale 1 and records real amaxes."""
  return jnp.zeros((3, recipe.amax_history_len), jnp.float32)


def _scales_from_history(history_3xH, recipe: Recipe):
  """(scales [3], decode scales [3]) of x, w and dy (ROWS' order), each vector from one division: a division
  (grids.div_rn) is ~100 integer ops, and one per role and pass would make most of the FP8 step's program (and its
  compile time). The same numbers as three scalar divisions."""
  amax = history_3xH[:, 0] if recipe.amax_compute_algo == "most_recent" else grids.abs_max(history_3xH, axis=1)
  max_values = jnp.array([emulated.element_grid(recipe, role).max_value for role in ROWS], jnp.float32)
  scales = fp8.scale_for_max(amax, max_values)
  return scales, fp8.decode_scale(scales)


def _push(history_H, amax):
  return jnp.concatenate([amax[None].astype(jnp.float32), history_H[:-1]])


def _quantize(x, recipe, role, scales, kernels, transpose=False):
  scale, decode = (s[ROWS[role]] for s in scales)
  return emulated.quantize_for_gemm(x, recipe, role, scale=scale, decode=decode, kernels=kernels, transpose=transpose)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _qmatmul_delayed(x_MxK, w_KxN, history_3xH, recipe, w_dtype, kernels):
  return _fwd(x_MxK, w_KxN, history_3xH, recipe, w_dtype, kernels)[0]


def _fwd(x_MxK, w_KxN, history_3xH, recipe, w_dtype, kernels):
  del w_dtype
  scales = _scales_from_history(history_3xH, recipe)
  x_op = _quantize(x_MxK, recipe, "x", scales, kernels)
  w_op = _quantize(w_KxN, recipe, "w", scales, kernels, transpose=True)
  y = emulated.gemm(x_op, w_op, recipe).astype(x_MxK.dtype)
  amax = lambda t: grids.abs_max(t.astype(jnp.float32))
  residuals = (name_for_remat(x_op.T), name_for_remat(w_op.T), history_3xH, scales, amax(x_MxK), amax(w_KxN))
  return y, residuals


def _bwd(recipe, w_dtype, kernels, residuals, dy_MxN):
  x_t_op, w_t_op, history_3xH, scales, amax_x, amax_w = residuals
  dy_op = _quantize(dy_MxN, recipe, "dy", scales, kernels)
  dx = emulated.gemm(dy_op, w_t_op, recipe).astype(dy_MxN.dtype)
  dw = emulated.gemm(x_t_op, dy_op.T, recipe)
  amax_dy = grids.abs_max(dy_MxN.astype(jnp.float32))
  new_history = jnp.stack(
    [_push(history_3xH[0], amax_x), _push(history_3xH[1], amax_w), _push(history_3xH[2], amax_dy)]
  )
  return dx, dw.astype(dy_MxN.dtype).astype(w_dtype), new_history


_qmatmul_delayed.defvjp(_fwd, _bwd)


def qmatmul_delayed(x, w, recipe: Recipe, history_3xH, kernels=Kernels.AUTO):
  """x [M, K] . w [K, N] in per-tensor FP8 with scales from `history_3xH`; grad of history = new history.
  `kernels`: the quantizers' implementation, as for qmatmul."""
  if recipe.format is not Format.FP8_DELAYED:
    raise ValueError(f"qmatmul_delayed needs a delayed-scaling recipe, got {recipe.name!r}")
  return _qmatmul_delayed(x, w, history_3xH, recipe, jnp.dtype(w.dtype), kernels)
