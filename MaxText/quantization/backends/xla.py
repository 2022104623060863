"""XLA backend: each quantized GEMM as JAX's block-scaled dot (`jax.nn.scaled_matmul`, custom call
`__op$block_scaled_dot`) on operands from our own NVFP4 / MX quantizers.

The operands are exactly the emulated backend's (16x16 weight tiles, RHT on the wgrad operands, SR
on the gradients, the per-tensor amax as the global scale); only the GEMM differs: XLA turns the
custom call into a cuDNN block-scaled FP4 GEMM on Blackwell (SM100+, cuDNN >= 9.7) and expands it
into dequantize + dot elsewhere on NVIDIA GPUs. E2M1 x E4M3 products are exact in f32 and TF32, so
the result equals the emulated backend's up to the order of the f32 accumulation. JAX has no CPU
lowering of the custom call: on CPU this backend can be lowered for CUDA (jax.export), not run.
"""

import functools

import jax
import jax.numpy as jnp

from MaxText.quantization import target
from MaxText.quantization.backends import emulated
from MaxText.quantization.backends.base import OperandBackend
from MaxText.quantization.formats import Format, mx, nvfp4
from MaxText.quantization.formats.tensor import QuantizedTensor
from MaxText.quantization.recipes import RECIPES, Recipe

NATIVE_MIN_SM = 100  # cuDNN's block-scaled FP4 GEMM: Blackwell


def unavailable_reason(recipe: Recipe, platform=None):
  """None when this backend can run `recipe` here, else why not (one line)."""
  if recipe.block_size is None:
    names = ", ".join(n for n, r in RECIPES.items() if r.block_size)
    return f"{recipe.name}: the xla backend runs the block-scaled recipes ({names}) only"
  platform = platform or target.platform()
  if platform not in ("gpu", "cuda"):
    return f"jax.nn.scaled_matmul (__op$block_scaled_dot) runs on NVIDIA GPUs only, not on {platform}"
  return None


def native(recipe: Recipe):
  """Whether the block-scaled dot becomes a real FP4 GEMM here (what `auto` needs to prefer it)."""
  from MaxText.quantization.backends import te  # pylint: disable=import-outside-toplevel

  sm = te.gpu_compute_capability()
  return unavailable_reason(recipe) is None and sm is not None and sm >= NATIVE_MIN_SM


@functools.partial(jax.jit, static_argnums=(1, 2), static_argnames=("amax_axes",))
def quantize_for_gemm(x, recipe: Recipe, role: str, key=None, amax_axes=(), draws=None) -> QuantizedTensor:
  """Our quantization of one operand [rows, contraction], narrow: NVFP4 (E2M1, E4M3 per 16, amax) or MX (E4M3 /
  E2M1, E8M0 per 32: the power of two itself, exact in float8_e8m0fnu). `amax_axes`, `draws`: x is a shard of the
  operand inside a partitioned GEMM (nvfp4.quantize)."""
  if recipe.format is Format.NVFP4:
    return nvfp4.quantize(x, **emulated.nvfp4_options(recipe, role, key), amax_axes=amax_axes, draws=draws)
  q = mx.quantize(x, emulated.element_grid(recipe, role))
  return QuantizedTensor(q.values, q.scales.astype(jnp.float8_e8m0fnu), q.global_scale, tile=q.tile)


def gemm(a: QuantizedTensor, b_t: QuantizedTensor, recipe: Recipe):
  """a [M, K] . b_t [N, K]^T through the block-scaled dot; NVFP4's global scales in the epilogue (f32)."""
  acc = jax.nn.scaled_matmul(
    a.values[None], b_t.values[None], a.scales[None], b_t.scales[None], preferred_element_type=jnp.float32
  )[0]
  if recipe.format is not Format.NVFP4:
    return acc
  return acc * nvfp4.gemm_alpha(a.global_scale, b_t.global_scale, a.e4m3_max, b_t.e4m3_max)


class XlaBackend(OperandBackend):
  """Our operands through XLA's block-scaled dot (a native FP4 GEMM on SM100+); NVIDIA GPUs, block-scaled recipes."""

  name = "xla"

  def unavailable_reason(self, recipe: Recipe):
    return unavailable_reason(recipe)

  def quantize(self, x, recipe: Recipe, role: str, key=None, *, kernels, transpose=False, amax_axes=(), draws=None):
    del kernels  # always our XLA-path quantizers: the kernels write the emulated GEMM's folded operands
    return quantize_for_gemm(x.T if transpose else x, recipe, role, key, amax_axes=tuple(amax_axes), draws=draws)

  def gemm(self, a, b_t, recipe: Recipe):
    return gemm(a, b_t, recipe)

  def dequantize(self, q, recipe: Recipe, dtype):
    """NVFP4: values * block scale * 1/S_enc rounded to `dtype`, as the emulated backend's."""
    return emulated.dequantize(q, recipe, dtype)

  def quantizers(self, kernels, recipe=None):
    return "xla"


BACKEND = XlaBackend()
