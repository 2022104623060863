"""Pure-JAX emulation of each recipe's operand quantization and GEMM (runs on any backend).

Every operand arrives as [rows, contraction] with blocks along the last axis. The GEMM reads a
`GemmOperand` on tensor-core dtypes, as the hardware would: per-tensor FP8 as the f8 values
themselves (an f8 x f8 dot, which XLA turns into a cuBLASLt FP8 GEMM on Hopper), NVFP4 and MX with
their block scales folded into bf16 (exact, see below), and the per-tensor scales applied to the
f32 accumulator in the epilogue. The result is what a tensor core computes up to the order of the
f32 sum.
"""

import functools
import typing

import jax
import jax.numpy as jnp

from MaxText.quantization.formats import grids as formats
from MaxText.quantization.formats import nvfp4
from MaxText.quantization.kernels import quantizer_impl
from MaxText.quantization.recipes import Recipe

MX_BLOCK = 32
_FP8_GRIDS = {"e4m3": formats.E4M3, "e5m2": formats.E5M2}
_BLOCK_SIZES = {"nvfp4": nvfp4.BLOCK, "mxfp8": MX_BLOCK, "mxfp4": MX_BLOCK}


class ScaledOperand(typing.NamedTuple):
  """A quantized operand: `data` on its format's grid (fp8 / fp4 dtype), `scale` to multiply by (f32)."""
  data: jax.Array
  scale: jax.Array  # scalar (per tensor) or [rows, cols] (per block, already broadcast)


class GemmOperand(typing.NamedTuple):
  """A quantized operand as the tensor core reads it, [rows, contraction]."""
  data: jax.Array  # f8 (per-tensor FP8), bf16 (NVFP4 / MX values with block scales folded in; BF16)
  global_scale: jax.Array  # f32 scalar for the epilogue: NVFP4: the tensor's amax; FP8: its decode scale; else 1
  e4m3_max: jax.Array = nvfp4.E4M3_MAX  # NVFP4: its global scale's E4M3 bound (256 under Four Over Six)

  @property
  def T(self):  # pylint: disable=invalid-name
    """The transposed operand: the same numbers, so per-tensor scaled roles share one quantization."""
    return GemmOperand(self.data.T, self.global_scale, self.e4m3_max)


def per_tensor_fp8_scale(amax, grid):
  """TE's current-scaling rule: scale = fp8_max / amax; 1 when amax is 0 or not finite, capped at FLT_MAX."""
  scale = jnp.minimum(formats.div_rn(grid.max_value, amax), formats.FLT_MAX)
  return jnp.where((amax > 0) & jnp.isfinite(amax), scale, 1.0).astype(jnp.float32)


def quantize_per_tensor_fp8(x, grid, scale) -> ScaledOperand:
  """x * scale rounded to nearest-even on the FP8 grid (saturating); decode scale = 1/scale."""
  q = formats.round_to_grid(x.astype(jnp.float32) * scale, grid)
  return ScaledOperand(formats.cast_exact(q, grid), formats.div_rn(1.0, scale))


def quantize_mx(x, grid) -> ScaledOperand:
  """MX block scaling: per 32 along the last axis, scale = 2^ceil(log2(block_amax / grid_max))."""
  m, k = x.shape
  if k % MX_BLOCK:
    raise ValueError(f"MX formats need the contraction axis to be a multiple of {MX_BLOCK}; "
                     f"got an operand of shape {(m, k)}")
  x_blocks = x.astype(jnp.float32).reshape(m, k // MX_BLOCK, MX_BLOCK)
  block_amax = formats.abs_max(x_blocks, axis=-1, keepdims=True)
  exponent, = formats.materialize(formats.e8m0_exponent_at_least(formats.div_rn(block_amax, grid.max_value)))
  scale = formats.exp2i(exponent)
  q = formats.round_to_grid(x_blocks * formats.exp2i(-exponent), grid).reshape(m, k)
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


def nvfp4_options(recipe: Recipe, role: str, key):
  sr = recipe.stochastic_rounding(role)
  return dict(tile=(nvfp4.BLOCK, nvfp4.BLOCK) if recipe.tile_2d(role) else (1, nvfp4.BLOCK),
              rht=recipe.rht(role), stochastic_rounding=sr, key=key if sr else None,
              four_over_six=recipe.four_over_six(role))


def quantize_operand(x, recipe: Recipe, role: str, key=None, scale=None):
  """Quantize one GEMM operand [rows, contraction] as `recipe` prescribes for `role`.

  Returns an NVFP4Tensor for NVFP4, a ScaledOperand otherwise, or x itself for BF16.
  `scale` is the per-tensor FP8 scale for delayed scaling (from the amax history).
  """
  fmt = recipe.format
  if fmt == "bf16":
    return x
  if fmt == "nvfp4":
    return nvfp4.quantize(x, **nvfp4_options(recipe, role, key))
  if fmt in ("fp8_current", "fp8_delayed"):
    grid = element_grid(recipe, role)
    if scale is None:
      scale = per_tensor_fp8_scale(formats.abs_max(x.astype(jnp.float32)), grid)
    return quantize_per_tensor_fp8(x, grid, scale)
  if fmt in ("mxfp8", "mxfp4"):
    return quantize_mx(x, element_grid(recipe, role))
  raise ValueError(f"unknown recipe format {fmt!r}")


def _quantize_with_kernels(x, recipe: Recipe, role: str, key, scale, transpose, interpret):
  """quantize_for_gemm's Pallas path (same bits), or None where the kernels don't cover the operand."""
  # Imported here: Pallas takes ~0.7 s to import, and only the kernel path needs it.
  from MaxText.quantization.kernels import pallas_quantize  # pylint: disable=import-outside-toplevel
  rows, cols = x.shape[::-1] if transpose else x.shape
  where = dict(transpose=transpose, interpret=interpret)
  if recipe.format == "nvfp4":
    options = nvfp4_options(recipe, role, key)
    if options.pop("four_over_six"):
      return None  # the kernels don't implement Four Over Six: the XLA path quantizes these operands
    if not pallas_quantize.nvfp4_supported((rows, cols), tile=options["tile"],
                                           stochastic_rounding=options["stochastic_rounding"], key=key):
      return None
    return GemmOperand(*pallas_quantize.nvfp4_block_scaled(x, **options, **where))
  if x.size == 0:
    return None
  grid = element_grid(recipe, role)
  if recipe.format in ("fp8_current", "fp8_delayed"):
    if scale is None:
      scale = per_tensor_fp8_scale(pallas_quantize.amax(x, interpret=interpret), grid)
    return GemmOperand(pallas_quantize.fp8_per_tensor(x, grid, scale, **where), formats.div_rn(1.0, scale))
  if recipe.format in ("mxfp8", "mxfp4") and cols % MX_BLOCK == 0:
    return GemmOperand(pallas_quantize.mx_block_scaled(x, grid, **where), jnp.float32(1))
  return None


@functools.partial(jax.jit, static_argnums=(1, 2), static_argnames=("kernels", "transpose"))
def quantize_for_gemm(x, recipe: Recipe, role: str, key=None, scale=None, *, kernels="auto",
                      transpose=False) -> GemmOperand:
  """`quantize_operand` of x (x.T if `transpose`), in the form the GEMM reads (see GemmOperand). One call = one
  quantization. `kernels` (quantizer_impl.resolve): the Pallas kernels, which read x and write the transposed
  operand without materialising x.T, or the XLA path; both give the same bits."""
  impl = quantizer_impl.resolve(kernels) if recipe.quantized else "xla"
  if impl != "xla":
    op = _quantize_with_kernels(x, recipe, role, key, scale, transpose, interpret=impl == "interpret")
    if op is not None:
      return op
  if transpose:
    x = x.T
  if recipe.format == "nvfp4":  # straight to bf16, never through the 4-bit dtype
    options = nvfp4_options(recipe, role, key)
    return GemmOperand(*nvfp4.quantize_block_scaled(x, **options),
                       jnp.float32(nvfp4.global_e4m3_max(options["four_over_six"])))
  q = quantize_operand(x, recipe, role, key, scale)
  if not isinstance(q, ScaledOperand):
    return GemmOperand(q.astype(jnp.bfloat16), jnp.float32(1))
  if q.scale.ndim == 0:
    return GemmOperand(q.data, q.scale)
  # MX: E4M3 / E2M1 values (<= 4 significant bits) times a power of two: exact in bf16 (above 2**-126).
  return GemmOperand((q.data.astype(jnp.float32) * q.scale).astype(jnp.bfloat16), jnp.float32(1))


def dequantize_gemm_operand(op: GemmOperand, recipe: Recipe, dtype):
  """An NVFP4 GemmOperand's values in `dtype` (what backward_override=dequantized computes with): as
  nvfp4.dequantize, block-scaled values times 1/S_enc, then rounded to the dtype."""
  if recipe.format != "nvfp4":
    raise ValueError(f"{recipe.name}: only NVFP4 operands are dequantized for the backward")
  decode = formats.div_rn(1.0, nvfp4.global_encode_scale(op.global_scale, op.e4m3_max))
  values = op.data.astype(jnp.float32) * decode
  return formats.round_to_dtype(values, dtype)


def dequantize_operand(q):
  """The operand's f32 values as the GEMM sees them."""
  if isinstance(q, nvfp4.NVFP4Tensor):
    return nvfp4.dequantize(q)
  if isinstance(q, ScaledOperand):
    return q.data.astype(jnp.float32) * q.scale
  return q.astype(jnp.float32)


def gemm(a: GemmOperand, b_t: GemmOperand, recipe: Recipe):
  """a [M, K] . b_t [N, K]^T for two operands quantized by `recipe`: f32 accumulation, then the epilogue."""
  acc = jax.lax.dot_general(a.data, b_t.data, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
  if recipe.format == "nvfp4":
    return acc * nvfp4.gemm_alpha(a.global_scale, b_t.global_scale, a.e4m3_max, b_t.e4m3_max)
  if recipe.format in ("fp8_current", "fp8_delayed"):
    return acc * (a.global_scale * b_t.global_scale)
  return acc
