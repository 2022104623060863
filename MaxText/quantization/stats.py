"""Quantization telemetry: how much of one operand a quantizer loses, saturates or flushes to zero.

For one operand x [rows, contraction] and its quantized form q (as the GEMM sees it):
  rel_err    ||dequant(q) - ref||_F / ||ref||_F, where ref is x after the recipe's transform
             (the RHT for NVFP4 wgrad operands), so only the rounding and clipping is measured.
  saturated  fraction of blocks with an element clipped: |ref| beyond what rounding alone would
             move to the format's max (max + half its top spacing, x the element's scale). NVFP4's
             block scale rounds to E4M3 and can land just below amax/6, which clips the block max
             by less than that: rounding, not saturation, and not counted.
  underflow  fraction of blocks that held a nonzero value but quantized to all zeros (a block
             scale that rounded to 0, or a block far below the tensor's scale).
Blocks are the format's scaling blocks along the contraction axis (16 for NVFP4, 32 for MX);
per-tensor FP8 is reported over 16-element groups so its numbers compare with NVFP4's.
"""

import jax.numpy as jnp

from MaxText.quantization.backends import emulated
from MaxText.quantization.formats import grids
from MaxText.quantization.formats import nvfp4
from MaxText.quantization.formats.tensor import QuantizedTensor
from MaxText.quantization.recipes import ROLES, Recipe

STATS = ("rel_err", "saturated", "underflow")


def _blocks(a_MxK, block):
  m, k = a_MxK.shape
  return jnp.pad(a_MxK, ((0, 0), (0, (-k) % block))).reshape(m, -1, block)


def _element_scale(q: QuantizedTensor):
  """The decode scale each element of q was quantized with, [M, K] (or a scalar for per-tensor scaling)."""
  if q.tile is None:
    return q.global_scale
  n = q.values.shape[1]
  scales = jnp.repeat(q.scales.astype(jnp.float32), q.tile[1], axis=1)[:, :n]
  return scales * nvfp4.decode_scale(q) if q.tile[1] == nvfp4.BLOCK else scales


def operand_stats(x_MxK, recipe: Recipe, role: str, q=None):
  """f32 [3]: (rel_err, saturated, underflow) of x quantized as `recipe` does for `role` (see module doc)."""
  if q is None:
    q = emulated.quantize_operand(x_MxK, recipe, role)
  ref = x_MxK.astype(jnp.float32)
  if recipe.rht(role):
    ref = nvfp4.hadamard16(x_MxK).astype(jnp.float32)
  deq = emulated.dequantize_operand(q)
  ref_norm = jnp.sqrt(jnp.sum(ref * ref))
  rel_err = jnp.where(ref_norm > 0, jnp.sqrt(jnp.sum((deq - ref) ** 2)) / jnp.maximum(ref_norm, 1e-38), 0.0)
  block = recipe.block_size or nvfp4.BLOCK
  scale = jnp.broadcast_to(_element_scale(q), ref.shape)
  # A zero scale is an underflow (counted below), not a saturation.
  clipped = (jnp.abs(ref) > grids.saturation_threshold(emulated.element_grid(recipe, role)) * scale) & (scale > 0)
  clipped = _blocks(clipped.astype(jnp.float32), block)
  ref_blocks, deq_blocks = _blocks(ref, block), _blocks(deq, block)
  flushed = jnp.any(ref_blocks != 0, axis=-1) & jnp.all(deq_blocks == 0, axis=-1)
  return jnp.stack([rel_err, jnp.mean(jnp.max(clipped, axis=-1)), jnp.mean(flushed.astype(jnp.float32))])


def empty_sink():
  """The stats sink of one GEMM: zeros [len(ROLES), len(STATS)]; its gradient carries the stats."""
  return jnp.zeros((len(ROLES), len(STATS)), jnp.float32)
