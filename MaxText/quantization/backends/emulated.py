"""Emulated backend: each recipe's operand quantization and GEMM in pure JAX (runs on any backend).

Every operand arrives as [rows, contraction] with blocks along the last axis. The GEMM reads a folded
QuantizedTensor on tensor-core dtypes, as the hardware would: per-tensor FP8 as the f8 values
themselves (an f8 x f8 dot, which XLA turns into a cuBLASLt FP8 GEMM on Hopper and Blackwell), NVFP4 and MX with
their block scales folded into bf16 (exact, see below), and the per-tensor scales applied to the f32 accumulator in
the epilogue. On a CPU the GEMM reads the same values in the dtype XLA:CPU multiplies fastest there (cpu_gemm.py:
bf16 or f32). The result is what a tensor core computes up to the order of the f32 sum.

Per-tensor FP8 (current and delayed scaling) has its own linear layer here (`fp8_linear`), written for what XLA:GPU
makes of it: each operand quantized once, in the layouts its GEMMs read (made in the quantizing kernel on Hopper,
whose FP8 GEMMs read both operands K-major; none on Blackwell, whose FP8 GEMMs read any layout), and every GEMM one
`__cublas$lt$matmul$f8` call with the decode scales as its scale operand and the output in the compute dtype
(`fp8_gemm`): no f32 output and no scale or convert pass after it.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import layout

from MaxText.quantization import cpu_gemm, target
from MaxText.quantization import partition as partition_lib
from MaxText.quantization.backends.base import Backend
from MaxText.quantization.gemms import name_for_remat
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


def quantizers_for(recipe: Recipe, kernels=Kernels.AUTO) -> Kernels:
  """Who quantizes `recipe`'s operands under `kernels` (quantizer_impl.resolve's answer), except that `auto` keeps
  per-tensor FP8 on the XLA path: there XLA fuses the quantizer with the transposed copy the GEMM reads and with
  its neighbours, and on one H100 it ran faster than the Pallas kernel (fp8 current on [8192, 16384]: 0.313 vs
  0.409 ms, benchmarks/results/h100-2026-11-27/). `pallas` still runs the kernel (the same bits)."""
  if not recipe.quantized or (recipe.format.per_tensor_fp8 and kernels is Kernels.AUTO):
    return Kernels.XLA
  return quantizer_impl.resolve(kernels)


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
  impl = quantizers_for(recipe, kernels)
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


# -- per-tensor FP8: the linear layer (current and delayed scaling) -------------------------------------------------


def fp8_gemm(a: QuantizedTensor, b: QuantizedTensor, contracting, out_dtype):
  """a . b for per-tensor FP8 operands, contracted on `contracting` ((a's axis,), (b's axis,)), times both decode
  scales, in `out_dtype`: the f32 sum times the scale, rounded once.

  For CUDA it is written as XLA's GEMM rewriter folds it: a dot in `out_dtype` of the two f8 operands converted,
  the first times the scale (the product of the two decode scales: the rewriter takes the f32 scalar under its
  conversion to `out_dtype`), becomes one `__cublas$lt$matmul$f8` on the f8 operands with that scale as its
  a_scale, computing scale x the f32 sum and rounding it to `out_dtype` in the GEMM's epilogue: the same number as
  below, with no f32 output, scale or convert pass (aot.hlo.fp8_gemm_scales checks a compiled program's scales are
  f32; tests/te/test_aot_step.py). Unfolded, it would dequantize in bf16, so elsewhere, and on a CPU (cpu_gemm's
  operand dtype), it is the f32 sum, the scale, one rounding."""
  dims = (contracting, ((), ()))
  scale = a.global_scale * b.global_scale

  def exact(a_values, b_values, scale):
    contract = functools.partial(jax.lax.dot_general, dimension_numbers=dims, preferred_element_type=jnp.float32)
    return (cpu_gemm.gemm(contract, a_values, b_values) * scale).astype(out_dtype)

  def folded(a_values, b_values, scale):
    # The scale a scalar of its own (a barrier): XLA's simplifier otherwise moves the reshape that made it a scalar
    # between its two converts, and the rewriter then reads the scale rounded to `out_dtype` (bf16), not in f32.
    (scale,) = jax.lax.optimization_barrier((scale,))
    # On an operand (dequantized a), not on the output: where the contraction is sharded (wgrad under fsdp), the
    # partitioner would apply an output scale after the reduction, in bf16, outside the GEMM.
    a_dequantized = a_values.astype(out_dtype) * scale.astype(out_dtype)
    return jax.lax.dot_general(a_dequantized, b_values.astype(out_dtype), dims, preferred_element_type=out_dtype)

  return jax.lax.platform_dependent(a.values, b.values, scale, cuda=folded, default=exact)


def fp8_gemm_reads_any_layout():
  """Whether the FP8 GEMMs of the device built for read their operands in any layout (cuBLASLt on Blackwell,
  SM100+): then no operand is transposed in memory. Hopper's FP8 GEMMs read both operands with the contraction axis
  minor (XLA's rewriter transposes any other into a copy), and a CPU's GEMMs read them row by row (cpu_gemm): there
  the transposed operands are written where the operand is quantized, from the same read."""
  named = target.named()
  sm = named.sm if named is not None else target.local_gpu_sm()
  return target.platform() in ("gpu", "cuda") and sm is not None and sm >= 100


def fp8_linear(x_MxK, w_KxN, recipe: Recipe, kernels=Kernels.AUTO, history_3xH=None):
  """x [M, K] . w [K, N] in per-tensor FP8 with the recipe's fprop, dgrad and wgrad; differentiable. Current scaling
  (`history_3xH` None): each operand's scale from its own amax. Delayed scaling: the x, w and dy scales from the amax
  history [3, H] (fp8.HISTORY_ROWS), whose gradient is then the updated history (the overwrite-with-gradient
  convention of Flax's fp8 ops: the trainer stores it in place of the old one). Each operand is quantized once per
  step: its transposed role has the same per-tensor scale, hence the same f8 values."""
  return _fp8_linear_jit(x_MxK, w_KxN, history_3xH, recipe, jnp.dtype(w_KxN.dtype), kernels)


def _history_scales(history_3xH, recipe):
  """(scales [3], decode scales [3]) from the history, or None for current scaling."""
  if history_3xH is None:
    return None
  max_values = [element_grid(recipe, role).max_value for role in fp8.HISTORY_ROWS]
  return fp8.scales_from_history(history_3xH, max_values, recipe.amax_compute_algo)


def _quantize_fp8(x, recipe, role, scales, kernels):
  """One operand as stored, with its history's scale (delayed) or its own amax's (current), row-major (_row_major)."""
  if scales is None:
    op = quantize_for_gemm(x, recipe, role, kernels=kernels)
  else:
    row = fp8.HISTORY_ROWS.index(role)
    # Each scalar through grids.materialize (a fusion boundary): sliced out of the [3] vectors in a scanned layer, XLA
    # otherwise fuses the slice into a kernel of its own that writes x * scale in f32 for the quantizer to read.
    scale, decode = grids.materialize(scales[0][row], scales[1][row])
    op = quantize_for_gemm(x, recipe, role, scale=scale, decode=decode, kernels=kernels)
  return dataclasses.replace(op, values=_row_major(op.values))


def _row_major(values):
  """`values` [rows, cols] stored row by row, where XLA:GPU compiles it. Where one GEMM reads an f8 operand
  transposed, XLA's layout assignment otherwise stores the operand column-major, which moves the transpose into the
  quantizer, and XLA then splits the quantizer (~20 elementwise ops) into ~6 transposing kernels with f32
  intermediates in memory (2.8 GB instead of 0.7 GB for one [4096, 4096] layer's fprop + backward on h100).
  Pinned, each quantizer is one kernel that writes the operand and, where a GEMM reads it transposed, its transpose
  from the same read."""
  return jax.lax.platform_dependent(values, cuda=_pin_row_major, default=lambda v: v)


def _pin_row_major(values):
  return layout.with_layout_constraint(values, layout.Layout(major_to_minor=tuple(range(values.ndim))))


def _amax(x):
  return grids.abs_max(x.astype(jnp.float32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _fp8_linear(x_MxK, w_KxN, history_3xH, recipe, w_dtype, kernels):
  return _fp8_linear_fwd(x_MxK, w_KxN, history_3xH, recipe, w_dtype, kernels)[0]


def _fp8_linear_fwd(x_MxK, w_KxN, history_3xH, recipe, w_dtype, kernels):
  del w_dtype
  scales = _history_scales(history_3xH, recipe)
  x_op = _quantize_fp8(x_MxK, recipe, "x", scales, kernels)
  w_op = _quantize_fp8(w_KxN, recipe, "w", scales, kernels)  # [K, N]: dgrad's operand as it is
  if fp8_gemm_reads_any_layout():
    y_MxN = fp8_gemm(x_op, w_op, ((1,), (0,)), x_MxK.dtype)
    x_res = x_op  # wgrad contracts it on M as it is
  else:
    y_MxN = fp8_gemm(x_op, w_op.T, ((1,), (1,)), x_MxK.dtype)
    # x^T [K, M] for wgrad, from the quantizing kernel's read; row-major too, so that the scan's stack of the saved
    # operands has the layout the backward reads (else XLA transposes the whole stack between the two loops).
    x_t = x_op.T
    x_res = dataclasses.replace(x_t, values=_row_major(x_t.values))
  # The amaxes the history records, named like the operands: kept (two scalars) rather than recomputed in the
  # backward, where a remat policy keeps the operands (each a read of x or w).
  amaxes = None if history_3xH is None else name_for_remat((_amax(x_MxK), _amax(w_KxN)))
  # The quantized operands, named: a remat policy can keep them rather than quantize again in the backward.
  return y_MxN, (name_for_remat(x_res), name_for_remat(w_op), history_3xH, scales, amaxes)


def _fp8_linear_bwd(recipe, w_dtype, kernels, residuals, dy_MxN):
  x_res, w_op, history_3xH, scales, amaxes = residuals
  dy_op = _quantize_fp8(dy_MxN, recipe, "dy", scales, kernels)
  dx_MxK = fp8_gemm(dy_op, w_op, ((1,), (1,)), dy_MxN.dtype)
  if fp8_gemm_reads_any_layout():
    dw_KxN = fp8_gemm(x_res, dy_op, ((0,), (0,)), dy_MxN.dtype)
  else:
    dw_KxN = fp8_gemm(x_res, dy_op.T, ((1,), (1,)), dy_MxN.dtype)
  # dw in the compute dtype like TE's GEMM output, then in the master weights' dtype.
  new_history = None if history_3xH is None else fp8.push_history(history_3xH, jnp.stack([*amaxes, _amax(dy_MxN)]))
  return dx_MxK, dw_KxN.astype(w_dtype), new_history


_fp8_linear.defvjp(_fp8_linear_fwd, _fp8_linear_bwd)
# jit at the edge, as the other backends' matmul: eager calls compile once per shape; inside a jitted model it inlines.
_fp8_linear_jit = jax.jit(_fp8_linear, static_argnums=(3, 4, 5))


class EmulatedBackend(Backend):
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

  def dense(self, x, w, recipe: Recipe, *, key, kernels, partition=None, history=None):
    """Per-tensor FP8 as its own linear layer (fp8_linear: each operand quantized once), one global computation that
    XLA partitions, for delayed scaling (`history`) always and for current scaling where no partition splits it;
    every other GEMM the recipe's three GEMMs on this backend's quantizers (Backend.dense)."""
    if recipe.format.per_tensor_fp8 and (history is not None or not partition_lib.active(partition)):
      *lead, k = x.shape
      y = fp8_linear(x.reshape(-1, k), w.reshape(k, -1), recipe, kernels, history)
      return y.reshape(*lead, *w.shape[1:])
    return super().dense(x, w, recipe, key=key, kernels=kernels, partition=partition, history=history)

  def dequantize(self, q, recipe: Recipe, dtype):
    return dequantize(q, recipe, dtype)

  def quantizers(self, kernels, recipe=None):
    return (quantizer_impl.resolve(kernels) if recipe is None else quantizers_for(recipe, kernels)).value


BACKEND = EmulatedBackend()
