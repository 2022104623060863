"""Pure-JAX emulation of each recipe's operand quantization and GEMM (runs on any backend).

Every operand arrives as [rows, contraction] with blocks along the last axis. A quantized
operand feeds an f32 dot; the result is exactly what a tensor core computes up to the order
of the f32 sum. For per-tensor FP8 the operand is written as convert(f8) * scale before the
dot, the pattern XLA's GPU GEMM rewriter turns into a real FP8 cuBLASLt GEMM on Hopper.
"""

import typing

import jax
import jax.numpy as jnp

from MaxText.quantization import formats
from MaxText.quantization import nvfp4
from MaxText.quantization.recipes import Recipe

MX_BLOCK = 32
_FP8_GRIDS = {"e4m3": formats.E4M3, "e5m2": formats.E5M2}
_BLOCK_SIZES = {"nvfp4": nvfp4.BLOCK, "mxfp8": MX_BLOCK, "mxfp4": MX_BLOCK}


class ScaledOperand(typing.NamedTuple):
  """A quantized operand: `data` on its format's grid (fp8 / fp4 dtype), `scale` to multiply by (f32)."""
  data: jax.Array
  scale: jax.Array  # scalar (per tensor) or [rows, cols] (per block, already broadcast)


def _dot_f32(a, b_t):
  """a [M, K] . b_t [N, K]^T with f32 accumulation."""
  return jax.lax.dot_general(a, b_t, (((1,), (1,)), ((), ())),
                             precision=jax.lax.Precision.HIGHEST,
                             preferred_element_type=jnp.float32)


def per_tensor_fp8_scale(amax, grid):
  """TE's current-scaling rule: scale = fp8_max / amax; 1 when amax is 0 or not finite, capped at FLT_MAX."""
  scale = jnp.minimum(grid.max_value / amax, formats.FLT_MAX)
  return jnp.where((amax > 0) & jnp.isfinite(amax), scale, 1.0).astype(jnp.float32)


def quantize_per_tensor_fp8(x, grid, scale) -> ScaledOperand:
  """x * scale rounded to nearest-even on the FP8 grid (saturating); decode scale = 1/scale."""
  q = formats.round_to_grid(x.astype(jnp.float32) * scale, grid)
  return ScaledOperand(formats.cast_exact(q, grid), (1.0 / scale).astype(jnp.float32))


def quantize_mx(x, grid) -> ScaledOperand:
  """MX block scaling: per 32 along the last axis, scale = 2^ceil(log2(block_amax / grid_max))."""
  m, k = x.shape
  if k % MX_BLOCK:
    raise ValueError(f"MX formats need the contraction axis to be a multiple of {MX_BLOCK}; "
                     f"got an operand of shape {(m, k)}")
  x_blocks = x.astype(jnp.float32).reshape(m, k // MX_BLOCK, MX_BLOCK)
  block_amax = jnp.max(jnp.abs(x_blocks), axis=-1, keepdims=True)
  scale = formats.e8m0_scale_at_least(block_amax / grid.max_value)
  q = formats.round_to_grid(x_blocks / scale, grid).reshape(m, k)
  return ScaledOperand(formats.cast_exact(q, grid),
                       jnp.broadcast_to(scale, x_blocks.shape).reshape(m, k))


def element_grid(recipe: Recipe, role: str) -> formats.FloatGrid:
  """The grid the operand's values land on: E2M1 for the FP4 formats, else E4M3 / E5M2 per role."""
  if recipe.format in ("nvfp4", "mxfp4"):
    return formats.E2M1
  return _FP8_GRIDS[recipe.fp8_dtype_name(role)]


def block_size(recipe: Recipe):
  """Elements per scaling block along the contraction axis; None for per-tensor scaling and BF16."""
  return _BLOCK_SIZES.get(recipe.format)


def quantize_operand(x, recipe: Recipe, role: str, key=None, scale=None):
  """Quantize one GEMM operand [rows, contraction] as `recipe` prescribes for `role`.

  Returns an NVFP4Tensor for NVFP4, a ScaledOperand otherwise, or x itself for BF16.
  `scale` is the per-tensor FP8 scale for delayed scaling (from the amax history).
  """
  fmt = recipe.format
  if fmt == "bf16":
    return x
  if fmt == "nvfp4":
    tile = (nvfp4.BLOCK, nvfp4.BLOCK) if recipe.tile_2d(role) else (1, nvfp4.BLOCK)
    sr = recipe.stochastic_rounding(role)
    return nvfp4.quantize(x, tile=tile, rht=recipe.rht(role), stochastic_rounding=sr,
                          key=key if sr else None)
  if fmt in ("fp8_current", "fp8_delayed"):
    grid = element_grid(recipe, role)
    if scale is None:
      scale = per_tensor_fp8_scale(jnp.max(jnp.abs(x.astype(jnp.float32))), grid)
    return quantize_per_tensor_fp8(x, grid, scale)
  if fmt in ("mxfp8", "mxfp4"):
    return quantize_mx(x, element_grid(recipe, role))
  raise ValueError(f"unknown recipe format {fmt!r}")


def dequantize_operand(q):
  """The operand's f32 values as the GEMM sees them."""
  if isinstance(q, nvfp4.NVFP4Tensor):
    return nvfp4.dequantize(q)
  if isinstance(q, ScaledOperand):
    return q.data.astype(jnp.float32) * q.scale
  return q.astype(jnp.float32)


def gemm(a, b_t):
  """a [M, K] . b_t [N, K]^T for two operands quantized by the same recipe, f32 result."""
  if isinstance(a, nvfp4.NVFP4Tensor):
    return nvfp4.gemm(a, b_t)
  if isinstance(a, ScaledOperand):
    return _dot_f32(dequantize_operand(a), dequantize_operand(b_t))
  return _dot_f32(a, b_t)
