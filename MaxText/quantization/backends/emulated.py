"""Emulated backend: each recipe's operand quantization and GEMM in pure JAX (runs on any backend).

Every operand arrives as [rows, contraction] with blocks along the last axis. The GEMM reads a folded
QuantizedTensor on tensor-core dtypes, as the hardware would: per-tensor FP8 as the f8 values
themselves (an f8 x f8 dot, which XLA turns into a cuBLASLt FP8 GEMM on Hopper), NVFP4 and MX with their
block scales folded into bf16 (exact, see below), and the per-tensor scales applied to the f32 accumulator in
the epilogue. On a CPU the GEMM reads the same values in the dtype XLA:CPU multiplies fastest there (cpu_gemm.py:
bf16 or f32). The result is what a tensor core computes up to the order of the f32 sum.
"""

import functools

import jax
import jax.numpy as jnp

from MaxText.quantization import cpu_gemm
from MaxText.quantization.backends.base import OperandBackend
from MaxText.quantization.formats import Format, fp8, grids, mx, nvfp4
from MaxText.quantization.formats.tensor import QuantizedTensor
from MaxText.quantization.kernels import quantizer_impl
from MaxText.quantization.kernels.quantizer_impl import Kernels
from MaxText.quantization.recipes import Recipe

_FP8_GRIDS = {"e4m3": grids.E4M3, "e5m2": grids.E5M2}


def element_grid(recipe: Recipe, role: str) -> grids.FloatGrid:
  """The grid the operand's values land on: E2M1 for the FP4 formats, else E4M3 / E5M2 per role."""
  if recipe.format.fp4:
    return grids.E2M1
  return _FP8_GRIDS[recipe.fp8_dtype_name(role)]


def nvfp4_options(recipe: Recipe, role: str, key):
  """nvfp4.quantize's arguments for `role` under `recipe`."""
  sr = recipe.stochastic_rounding(role)
  return dict(
    tile=(nvfp4.BLOCK, nvfp4.BLOCK) if recipe.tile_2d(role) else (1, nvfp4.BLOCK),
    rht=recipe.rht(role),
    stochastic_rounding=sr,
    key=key if sr else None,
    four_over_six=recipe.four_over_six(role),
  )


def quantize_operand(x, recipe: Recipe, role: str, key=None, scale=None, decode=None, amax_axes=(), draws=None):
  """Quantize one GEMM operand [rows, contraction] as `recipe` prescribes for `role`.

  Returns a narrow QuantizedTensor (values in the format's own dtype), or x itself for BF16.
  `scale` is the per-tensor FP8 scale for delayed scaling (from the amax history), `decode` its inverse if known.
  `amax_axes`, `draws`: x is a shard of the operand inside a partitioned GEMM (nvfp4.quantize says how).
  """
  fmt = recipe.format
  if fmt is Format.BF16:
    return x
  if fmt is Format.NVFP4:
    return nvfp4.quantize(x, **nvfp4_options(recipe, role, key), amax_axes=amax_axes, draws=draws)
  if fmt.per_tensor_fp8:
    grid = element_grid(recipe, role)
    if scale is None:
      scale = fp8.per_tensor_scale(grids.max_across(grids.abs_max(x.astype(jnp.float32)), amax_axes), grid)
    return fp8.quantize(x, grid, scale, decode)
  return mx.quantize(x, element_grid(recipe, role))


def _quantize_with_kernels(x, recipe: Recipe, role: str, key, scale, decode, transpose, interpret, amax_axes, draws):
  """quantize_for_gemm's Pallas path (same bits), or None where the kernels don't cover the operand."""
  # Imported here: Pallas takes ~0.7 s to import, and only the kernel path needs it.
  from MaxText.quantization.kernels import pallas_quantize  # pylint: disable=import-outside-toplevel

  rows, cols = x.shape[::-1] if transpose else x.shape
  where = dict(transpose=transpose, interpret=interpret)
  if recipe.format is Format.NVFP4:
    options = nvfp4_options(recipe, role, key)
    if draws is not None:  # a shard's draws in the whole operand: the kernels draw for the array they are given
      return None
    if not pallas_quantize.nvfp4_supported(
      (rows, cols), tile=options["tile"], stochastic_rounding=options["stochastic_rounding"], key=key
    ):
      return None
    values, amax = pallas_quantize.nvfp4_block_scaled(x, **options, **where, amax_axes=amax_axes)
    e4m3_max = jnp.float32(nvfp4.global_e4m3_max(options["four_over_six"]))
    return QuantizedTensor(values, None, amax, e4m3_max, tile=options["tile"])
  if x.size == 0:
    return None
  grid = element_grid(recipe, role)
  if recipe.format.per_tensor_fp8:
    if scale is None:
      scale = fp8.per_tensor_scale(grids.max_across(pallas_quantize.amax(x, interpret=interpret), amax_axes), grid)
    decode = fp8.decode_scale(scale) if decode is None else decode
    return QuantizedTensor(pallas_quantize.fp8_per_tensor(x, grid, scale, **where), None, decode)
  if recipe.format.block_size == mx.BLOCK and cols % mx.BLOCK == 0:
    return QuantizedTensor(pallas_quantize.mx_block_scaled(x, grid, **where), None, jnp.float32(1), tile=(1, mx.BLOCK))
  return None


@functools.partial(jax.jit, static_argnums=(1, 2), static_argnames=("kernels", "transpose", "amax_axes"))
def quantize_for_gemm(
  x,
  recipe: Recipe,
  role: str,
  key=None,
  scale=None,
  decode=None,
  *,
  kernels=Kernels.AUTO,
  transpose=False,
  amax_axes=(),
  draws=None,
) -> QuantizedTensor:
  """`quantize_operand` of x (x.T if `transpose`), folded as the GEMM reads it (see the module doc). One call = one
  quantization. `kernels` (quantizer_impl.resolve): the Pallas kernels, which read x and write the transposed
  operand without materialising x.T, or the XLA path; both give the same bits. `scale` and `decode`: a given
  per-tensor FP8 scale and its inverse (delayed scaling). `amax_axes`, `draws`: x is a shard of the operand inside a
  partitioned GEMM (nvfp4.quantize; `draws` are the operand's, transposed or not)."""
  impl = quantizer_impl.resolve(kernels) if recipe.quantized else Kernels.XLA
  if impl is not Kernels.XLA:
    interpret = impl is Kernels.INTERPRET
    op = _quantize_with_kernels(x, recipe, role, key, scale, decode, transpose, interpret, amax_axes, draws)
    if op is not None:
      return op
  if transpose:
    x = x.T
  if recipe.format is Format.NVFP4:  # straight to bf16, never through the 4-bit dtype
    return nvfp4.quantize_block_scaled(x, **nvfp4_options(recipe, role, key), amax_axes=amax_axes, draws=draws)
  q = quantize_operand(x, recipe, role, key, scale, decode, amax_axes=amax_axes)
  if not isinstance(q, QuantizedTensor):
    return QuantizedTensor(q.astype(jnp.bfloat16), None, jnp.float32(1))
  if q.scales is None:
    return q
  # MX: E4M3 / E2M1 values (<= 4 significant bits) times a power of two: exact in bf16 (above 2**-126).
  return QuantizedTensor(mx.block_scaled_values(q).astype(jnp.bfloat16), None, jnp.float32(1), tile=q.tile)


def dequantize(q: QuantizedTensor, recipe: Recipe, dtype):
  """An NVFP4 operand's values in `dtype` (what backward_override=dequantized computes with): nvfp4.dequantize,
  block-scaled values times 1/S_enc, then rounded to the dtype."""
  if recipe.format is not Format.NVFP4:
    raise ValueError(f"{recipe.name}: only NVFP4 operands are dequantized for the backward")
  return grids.round_to_dtype(nvfp4.dequantize(q), dtype)


def dequantize_operand(q):
  """The operand's f32 values as the GEMM sees them (`quantize_operand`'s result)."""
  if not isinstance(q, QuantizedTensor):
    return q.astype(jnp.float32)
  if q.tile is None:  # per tensor
    return q.values.astype(jnp.float32) * q.global_scale
  if q.tile[1] == mx.BLOCK:
    return mx.block_scaled_values(q)
  return nvfp4.dequantize(q)


def _dot_f32(a_MxK, b_NxK):
  return jax.lax.dot_general(a_MxK, b_NxK, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def gemm(a: QuantizedTensor, b_t: QuantizedTensor, recipe: Recipe):
  """a [M, K] . b_t [N, K]^T for two operands quantized by `recipe`: f32 accumulation, then the epilogue. Per-tensor
  FP8 is an f8 x f8 dot (cuBLASLt on a GPU); on a CPU every one reads cpu_gemm's dtype (E4M3 and E5M2 values are
  exact in bf16, their products in f32; XLA:CPU would widen f8 to f32 anyway)."""
  acc = cpu_gemm.gemm(_dot_f32, a.values, b_t.values)
  if recipe.format is Format.NVFP4:
    return acc * nvfp4.gemm_alpha(a.global_scale, b_t.global_scale, a.e4m3_max, b_t.e4m3_max)
  if recipe.format.per_tensor_fp8:
    return acc * (a.global_scale * b_t.global_scale)
  return acc


class EmulatedBackend(OperandBackend):
  """Our quantizers (XLA path or Pallas kernels) and a tensor-core-dtype GEMM: runs everywhere."""

  name = "emulated"

  def unavailable_reason(self, recipe: Recipe):
    return None

  def quantize(self, x, recipe: Recipe, role: str, key=None, *, kernels, transpose=False, amax_axes=(), draws=None):
    return quantize_for_gemm(
      x, recipe, role, key, kernels=kernels, transpose=transpose, amax_axes=tuple(amax_axes), draws=draws
    )

  def gemm(self, a, b_t, recipe: Recipe, out_dtype=jnp.float32):
    del out_dtype  # f32, the caller rounds it (the tensor core's single rounding of acc * scales)
    return gemm(a, b_t, recipe)

  def dequantize(self, q, recipe: Recipe, dtype):
    return dequantize(q, recipe, dtype)

  def quantizers(self, kernels):
    return quantizer_impl.resolve(kernels).value


BACKEND = EmulatedBackend()
