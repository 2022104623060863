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
import typing

import jax
import jax.numpy as jnp

from MaxText.quantization.backends import emulated
from MaxText.quantization.formats import grids as formats
from MaxText.quantization.formats import nvfp4
from MaxText.quantization.recipes import Recipe

NATIVE_MIN_SM = 100  # cuDNN's block-scaled FP4 GEMM: Blackwell


class XlaOperand(typing.NamedTuple):
  """A block-scaled operand [rows, contraction] as the block-scaled dot reads it."""
  values: jax.Array  # float4_e2m1fn (NVFP4, MXFP4) or float8_e4m3fn (MXFP8) [rows, contraction]
  scales: jax.Array  # float8_e4m3fn [rows, contraction / 16] (NVFP4) or float8_e8m0fnu [rows, contraction / 32]
  amax: jax.Array  # f32 scalar: NVFP4's global scale is amax / (6 * e4m3_max); unused for MX
  e4m3_max: jax.Array = nvfp4.E4M3_MAX  # NVFP4: 448, or 256 for a Four Over Six operand

  @property
  def T(self):  # pylint: disable=invalid-name
    """The transposed operand of a 16x16-tiled quantization (every row of a tile has the tile's scale)."""
    rows, cols = self.values.shape
    tile_scales = self.scales[::nvfp4.BLOCK]  # [rows / 16, cols / 16]
    return XlaOperand(self.values.T, jnp.repeat(tile_scales.T, nvfp4.BLOCK, axis=0)[:cols], self.amax,
                      self.e4m3_max)

  def dequantize(self, dtype):
    """NVFP4: values * block scale * 1/S_enc rounded to `dtype`, as emulated.dequantize_gemm_operand."""
    q = nvfp4.NVFP4Tensor(self.values, self.scales, self.amax, self.e4m3_max)
    return formats.round_to_dtype(nvfp4.dequantize(q), dtype)


BLOCK_SCALED_FORMATS = ("nvfp4", "mxfp8", "mxfp4")


def unavailable_reason(recipe: Recipe, platform=None):
  """None when this backend can run `recipe` here, else why not (one line)."""
  if recipe.format not in BLOCK_SCALED_FORMATS:
    return (f"{recipe.name}: the xla backend runs the block-scaled recipes (te_nvfp4, te_nvfp4_no_rht, te_mxfp8, "
            "mxfp4) only")
  platform = platform or jax.default_backend()
  if platform not in ("gpu", "cuda"):
    return f"jax.nn.scaled_matmul (__op$block_scaled_dot) runs on NVIDIA GPUs only, not on {platform}"
  return None


def native(recipe: Recipe):
  """Whether the block-scaled dot becomes a real FP4 GEMM here (what `auto` needs to prefer it)."""
  from MaxText.quantization.backends import te as te_backend  # pylint: disable=import-outside-toplevel
  sm = te_backend.gpu_compute_capability()
  return unavailable_reason(recipe) is None and sm is not None and sm >= NATIVE_MIN_SM


@functools.partial(jax.jit, static_argnums=(1, 2))
def quantize_for_gemm(x, recipe: Recipe, role: str, key=None) -> XlaOperand:
  """Our quantization of one operand [rows, contraction], with its narrow dtypes: NVFP4 (E2M1, E4M3 per
  16, amax) or MX (E4M3 / E2M1, E8M0 per 32: the power of two itself, exact in float8_e8m0fnu)."""
  if recipe.format == "nvfp4":
    q = nvfp4.quantize(x, **emulated.nvfp4_options(recipe, role, key))
    return XlaOperand(q.values, q.scales, q.amax, q.e4m3_max)
  q = emulated.quantize_mx(x, emulated.element_grid(recipe, role))
  rows, cols = x.shape
  scales = q.scale.reshape(rows, cols // emulated.MX_BLOCK, emulated.MX_BLOCK)[..., 0]
  return XlaOperand(q.data, scales.astype(jnp.float8_e8m0fnu), jnp.float32(0))


def gemm(a: XlaOperand, b_t: XlaOperand):
  """a [M, K] . b_t [N, K]^T through the block-scaled dot; NVFP4's global scales in the epilogue (f32)."""
  acc = jax.nn.scaled_matmul(a.values[None], b_t.values[None], a.scales[None], b_t.scales[None],
                             preferred_element_type=jnp.float32)[0]
  if a.scales.dtype == jnp.float8_e8m0fnu:
    return acc
  return acc * nvfp4.gemm_alpha(a.amax, b_t.amax, a.e4m3_max, b_t.e4m3_max)
