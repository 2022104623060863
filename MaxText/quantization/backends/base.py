"""What a backend is: the Backend class every backend is, whose `dense` is the one quantized Dense.

A backend supplies a recipe's operand quantizers and its GEMM (`quantize`, `gemm`, `dequantize`); its `dense` is then
the recipe's three GEMMs as gemms.py writes them, on one device or partitioned over a mesh (partition.py) when the
call says how the mesh splits its operands. A backend that brings a whole quantized Dense of its own (Transformer
Engine's dense, BF16's plain dot, per-tensor FP8's fused linear layer) overrides `dense` and keeps its signature.
"""

import typing

import jax.numpy as jnp

from MaxText.quantization import gemms
from MaxText.quantization import partition as partition_lib
from MaxText.quantization.errors import BackendError
from MaxText.quantization.formats.tensor import QuantizedTensor
from MaxText.quantization.recipes import Recipe

REMAT_NAME = gemms.REMAT_NAME
F32 = jnp.float32


class Backend:
  """Who runs a recipe's GEMMs. `name` is how the precision plan and the logs call it (bf16, emulated, xla, te)."""

  name = ""

  def unavailable_reason(self, recipe: Recipe) -> typing.Optional[str]:
    """None when this backend can run `recipe` here, else why not (one line)."""
    del recipe
    return None

  def quantizers(self, kernels, recipe=None) -> typing.Optional[str]:
    """What quantizes `recipe`'s operands under `kernels` ('pallas', 'xla', 'interpret'), for the precision plan;
    None where the backend's own GEMM call quantizes them."""
    del kernels, recipe
    return None

  def quantize(
    self, x, recipe: Recipe, role: str, key=None, *, kernels, transpose=False, amax_axes=(), draws=None
  ) -> QuantizedTensor:
    """One operand, x or x.T, quantized as the GEMM reads it; `kernels` picks the quantizers' implementation.
    `amax_axes`, `draws`: x is one device's shard of the operand, inside a partitioned GEMM (partition.py): its
    per-tensor amax is the largest over these mesh axes, `draws` its elements' stochastic-rounding draws."""
    raise NotImplementedError(f"the {self.name} backend quantizes no operand of its own")

  def gemm(self, a: QuantizedTensor, b_t: QuantizedTensor, recipe: Recipe, out_dtype=F32):
    """a [M, K] . b_t [N, K]^T, the global scales applied, in f32 or in `out_dtype` (the dtype the caller rounds
    it to: a backend whose GEMM can write that directly does)."""
    raise NotImplementedError(f"the {self.name} backend has no GEMM on quantized operands")

  def dequantize(self, q: QuantizedTensor, recipe: Recipe, dtype):
    """An operand's values in `dtype`, for backward_override=dequantized."""
    raise NotImplementedError(f"the {self.name} backend dequantizes no operand")

  def dense(self, x, w, recipe: Recipe, *, key, kernels, partition=None, history=None):
    """y [..., *out] = x [..., K] . w [K, *out] in x's dtype with `recipe`'s forward and backward GEMMs; dw in w's
    dtype. `key`: the stochastic-rounding key; `kernels`: the quantizers' implementation; `partition`: the mesh axes
    splitting each dimension (partition.GemmAxes), None for one global computation; `history`: a stateful recipe's
    amax history (delayed scaling), None for the others."""
    if history is not None:
      raise BackendError(
        f"the {self.name} backend keeps no amax history ({recipe.name}): use quantization_backend=emulate"
      )
    return dense(self, x, w, recipe, key=key, kernels=kernels, partition=partition)

  def __repr__(self):
    return f"<{self.name} backend>"


def dense(backend: Backend, x, w, recipe: Recipe, *, key, kernels, partition=None):
  """`backend`'s quantizers and GEMM in the recipe's three GEMMs (gemms.py): partitioned where `partition` splits an
  operand on the current mesh, else on one device."""
  if partition_lib.active(partition):
    return partition_lib.dense(x, w, recipe, backend, key=key, kernels=kernels, axes=partition)
  *lead, k = x.shape
  static = gemms.Static(recipe, backend, kernels, jnp.dtype(w.dtype))
  return gemms.dense_2d(x.reshape(-1, k), w.reshape(k, -1), key, static).reshape(*lead, *w.shape[1:])
