"""What a backend is (the Backend protocol), and what the backends that quantize operands themselves (emulated, xla)
share: the quantized matmul's custom_vjp, y = x . w with the recipe's fprop, dgrad and wgrad GEMMs.

With a backward_override (NVFP4, TE's option) only fprop is quantized: dgrad and wgrad run in the compute dtype
on the unquantized x, w, dy (high_precision) or on the forward's quantized x and w, dequantized, and the
unquantized dy (dequantized).
"""

import functools
import typing

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from MaxText.quantization import cpu_gemm
from MaxText.quantization.formats.tensor import QuantizedTensor
from MaxText.quantization.recipes import Recipe

# The name of quantized operands kept for the backward GEMMs (jax.checkpoint_policies.save_only_these_names).
REMAT_NAME = "quantization"
F32 = jnp.float32


class Backend(typing.Protocol):
  """Who runs a recipe's GEMMs: `matmul` is y = x [M, K] . w [K, N] with the recipe's backward (differentiable)."""

  name: str  # how the precision plan and the logs call it: bf16, emulated, xla, te

  def unavailable_reason(self, recipe: Recipe) -> typing.Optional[str]:
    """None when this backend can run `recipe` here, else why not (one line)."""

  def matmul(self, x_MxK, w_KxN, recipe: Recipe, *, key, kernels) -> jax.Array:
    """x . w in x's dtype, f32 accumulation; `key` feeds stochastic rounding, `kernels` the operand quantizers."""


def name_for_remat(operand):
  """Tag a quantized operand kept for the backward with REMAT_NAME."""
  return jax.tree.map(lambda a: checkpoint_name(a, REMAT_NAME), operand)


def split_grad_keys(key):
  """(dgrad key, wgrad key): the gradients' stochastic-rounding draws, one stream each."""
  k_dgrad, k_wgrad = jax.random.split(key)
  return k_dgrad, k_wgrad


class OperandBackend:
  """A backend that quantizes each operand (`quantize`) and multiplies two quantized operands (`gemm`): its matmul is
  the custom_vjp below, the same for every such backend."""

  name = ""

  def unavailable_reason(self, recipe: Recipe) -> typing.Optional[str]:
    raise NotImplementedError

  def quantize(
    self, x, recipe: Recipe, role: str, key=None, *, kernels, transpose=False, amax_axes=(), draws=None
  ) -> QuantizedTensor:
    """One operand, x or x.T, quantized as the GEMM reads it; `kernels` picks the quantizers' implementation.
    `amax_axes`, `draws`: x is one device's shard of the operand, inside a partitioned GEMM (partition.py): its
    per-tensor amax is the largest over these mesh axes, `draws` its elements' stochastic-rounding draws."""
    raise NotImplementedError

  def gemm(self, a: QuantizedTensor, b_t: QuantizedTensor, recipe: Recipe, out_dtype=F32):
    """a [M, K] . b_t [N, K]^T, the global scales applied, in f32 or in `out_dtype` (the dtype the caller rounds
    it to: a backend whose GEMM can write that directly does)."""
    raise NotImplementedError

  def dequantize(self, q: QuantizedTensor, recipe: Recipe, dtype):
    """An operand's values in `dtype`, for backward_override=dequantized."""
    raise NotImplementedError

  def quantizers(self, kernels, recipe=None):
    """What quantizes `recipe`'s operands under `kernels` ('pallas', 'xla', 'interpret'), for the precision plan."""
    raise NotImplementedError

  def matmul(self, x_MxK, w_KxN, recipe: Recipe, *, key, kernels):
    return _qmatmul_jit(x_MxK, w_KxN, key, recipe, jnp.dtype(w_KxN.dtype), self, kernels)

  def __repr__(self):
    return f"<{self.name} backend>"


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _qmatmul_2d(x_MxK, w_KxN, key, recipe, w_dtype, backend, kernels):
  y, _ = _qmatmul_fwd(x_MxK, w_KxN, key, recipe, w_dtype, backend, kernels)
  return y


def _qmatmul_fwd(x_MxK, w_KxN, key, recipe, w_dtype, backend, kernels):
  del w_dtype
  x_op = backend.quantize(x_MxK, recipe, "x", kernels=kernels)
  w_op = backend.quantize(w_KxN, recipe, "w", kernels=kernels, transpose=True)
  y_MxN = backend.gemm(x_op, w_op, recipe, x_MxK.dtype).astype(x_MxK.dtype)
  if recipe.backward_override == "high_precision":
    return y_MxN, (x_MxK, w_KxN, key)
  if recipe.backward_override == "dequantized":  # the forward's operands, kept (or rematerialized) as they are
    return y_MxN, (name_for_remat(x_op), name_for_remat(w_op), key)
  # What the backward needs: a quantized operand where its transposed role has the same numbers
  # (named, so a remat policy can keep it instead of quantizing again), else the input itself.
  x_res = name_for_remat(x_op.T) if recipe.shares_transpose("x") else x_MxK
  w_res = name_for_remat(w_op.T) if recipe.shares_transpose("w") else w_KxN
  return y_MxN, (x_res, w_res, key)


def backward_in_compute_dtype(recipe, w_dtype, backend, residuals, dy_MxN):
  """dgrad and wgrad of a backward_override: GEMMs on dy's dtype (the compute dtype), f32 accumulation. `residuals`:
  (x [M, K] and w [K, N], or the forward's quantized x and w^T [N, K] for backward_override=dequantized, key)."""
  x_res, w_res, _ = residuals
  dtype = dy_MxN.dtype
  if recipe.backward_override == "dequantized":
    x_MxK, w_NxK = backend.dequantize(x_res, recipe, dtype), backend.dequantize(w_res, recipe, dtype)
  else:
    x_MxK, w_NxK = x_res.astype(dtype), w_res.T.astype(dtype)

  def dot(a, b, dims):
    contract = functools.partial(jax.lax.dot_general, dimension_numbers=(dims, ((), ())), preferred_element_type=F32)
    return cpu_gemm.gemm(contract, a, b)

  dx_MxK = dot(dy_MxN, w_NxK, ((1,), (0,))).astype(dtype)
  dw_KxN = dot(x_MxK, dy_MxN, ((0,), (0,))).astype(dtype).astype(w_dtype)
  return dx_MxK, dw_KxN, None


def _qmatmul_bwd(recipe, w_dtype, backend, kernels, residuals, dy_MxN):
  if not recipe.quantized_backward:
    return backward_in_compute_dtype(recipe, w_dtype, backend, residuals, dy_MxN)
  x_res, w_res, key = residuals
  k_dgrad, k_wgrad = split_grad_keys(key)
  quantize = functools.partial(backend.quantize, recipe=recipe, kernels=kernels)
  dy_op = quantize(dy_MxN, role="dy", key=k_dgrad)
  w_t_op = w_res if recipe.shares_transpose("w") else quantize(w_res, role="w_t")
  dx_MxK = backend.gemm(dy_op, w_t_op, recipe, dy_MxN.dtype).astype(dy_MxN.dtype)
  x_t_op = x_res if recipe.shares_transpose("x") else quantize(x_res, role="x_t", transpose=True)
  dy_t_op = dy_op.T if recipe.shares_transpose("dy") else quantize(dy_MxN, role="dy_t", key=k_wgrad, transpose=True)
  # Rounded to the compute dtype like TE's GEMM output, then to the master weights' dtype.
  dw_KxN = backend.gemm(x_t_op, dy_t_op, recipe, dy_MxN.dtype).astype(dy_MxN.dtype).astype(w_dtype)
  return dx_MxK, dw_KxN, None


_qmatmul_2d.defvjp(_qmatmul_fwd, _qmatmul_bwd)

# jit at the edge: eager calls compile once per shape; inside a jitted model this just inlines.
_qmatmul_jit = jax.jit(_qmatmul_2d, static_argnums=(3, 4, 5, 6))
