"""MX block scaling (MXFP8, MXFP4): an E8M0 power-of-two scale per 32 elements along the contraction axis."""

import jax.numpy as jnp

from MaxText.quantization.formats import grids
from MaxText.quantization.formats.tensor import QuantizedTensor

BLOCK = 32


def quantize(x, grid) -> QuantizedTensor:
  """Per 32 along the last axis, scale = 2^ceil(log2(block_amax / grid_max)) (TE's reference rule: no element
  saturates); values on `grid` in its dtype, scales [rows, cols / 32] as f32 powers of two (exact in E8M0)."""
  m, k = x.shape
  if k % BLOCK:
    raise ValueError(
      f"MX formats need the contraction axis to be a multiple of {BLOCK}; got an operand of shape {(m, k)}"
    )
  x_blocks = x.astype(jnp.float32).reshape(m, k // BLOCK, BLOCK)
  block_amax = grids.abs_max(x_blocks, axis=-1, keepdims=True)
  (exponent,) = grids.materialize(grids.e8m0_exponent_at_least(grids.div_rn(block_amax, grid.max_value)))
  q = grids.round_to_grid(x_blocks * grids.exp2i(-exponent), grid).reshape(m, k)
  return QuantizedTensor(grids.cast_exact(q, grid), grids.exp2i(exponent)[..., 0], jnp.float32(1), tile=(1, BLOCK))


def block_scaled_values(q: QuantizedTensor):
  """values * their block scale in f32 [rows, cols] (exact: a power of two times at most 4 significant bits)."""
  m, k = q.values.shape
  blocks = q.values.astype(jnp.float32).reshape(m, k // BLOCK, BLOCK)
  return (blocks * q.scales[..., None]).reshape(m, k)
