"""FP8 delayed scaling: per-tensor scales from an amax history carried across steps.

The history of one linear layer is an f32 array [3, H] (rows: x, w, dy; index 0 = newest).
`qmatmul_delayed` returns the updated history as the *gradient* of the history argument
(the overwrite-with-gradient convention of Flax's fp8 ops): the trainer stores that gradient
in place of the old history instead of applying the optimizer to it.
"""

import functools

import jax
import jax.numpy as jnp

from MaxText.quantization import emulated
from MaxText.quantization.recipes import Recipe

ROWS = {"x": 0, "w": 1, "dy": 2}


def init_history(recipe: Recipe):
  """Zeros: the first step then uses scale 1 and records real amaxes."""
  return jnp.zeros((3, recipe.amax_history_len), jnp.float32)


def _scale_from_history(history_H, recipe: Recipe, grid):
  amax = history_H[0] if recipe.amax_compute_algo == "most_recent" else jnp.max(history_H)
  return emulated.per_tensor_fp8_scale(amax, grid)


def _push(history_H, amax):
  return jnp.concatenate([amax[None].astype(jnp.float32), history_H[:-1]])


def _quantize(x, recipe, role, history_3xH):
  history_H = history_3xH[ROWS[role.rstrip("_t")]]
  grid = emulated.element_grid(recipe, role)
  return emulated.quantize_operand(x, recipe, role, scale=_scale_from_history(history_H, recipe, grid))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _qmatmul_delayed(x_MxK, w_KxN, history_3xH, recipe):
  return _fwd(x_MxK, w_KxN, history_3xH, recipe)[0]


def _fwd(x_MxK, w_KxN, history_3xH, recipe):
  y = emulated.gemm(_quantize(x_MxK, recipe, "x", history_3xH),
                    _quantize(w_KxN.T, recipe, "w", history_3xH)).astype(x_MxK.dtype)
  return y, (x_MxK, w_KxN, history_3xH)


def _bwd(recipe, residuals, dy_MxN):
  x_MxK, w_KxN, history_3xH = residuals
  dyq = _quantize(dy_MxN, recipe, "dy", history_3xH)
  dx = emulated.gemm(dyq, _quantize(w_KxN, recipe, "w_t", history_3xH)).astype(x_MxK.dtype)
  dw = emulated.gemm(_quantize(x_MxK.T, recipe, "x_t", history_3xH),
                     _quantize(dy_MxN.T, recipe, "dy_t", history_3xH))
  amax = lambda t: jnp.max(jnp.abs(t.astype(jnp.float32)))
  new_history = jnp.stack([_push(history_3xH[0], amax(x_MxK)), _push(history_3xH[1], amax(w_KxN)),
                           _push(history_3xH[2], amax(dy_MxN))])
  return dx, dw.astype(x_MxK.dtype).astype(w_KxN.dtype), new_history


_qmatmul_delayed.defvjp(_fwd, _bwd)


def qmatmul_delayed(x, w, recipe: Recipe, history_3xH):
  """x [M, K] . w [K, N] in per-tensor FP8 with scales from `history_3xH`; grad of history = new history."""
  if recipe.format != "fp8_delayed":
    raise ValueError(f"qmatmul_delayed needs a delayed-scaling recipe, got {recipe.name!r}")
  return _qmatmul_delayed(x, w, history_3xH, recipe)
