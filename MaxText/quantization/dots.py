"""Tensor-core contractions: operands in the compute dtype (bf16) with f32 accumulation, forward and backward.

`jnp.dot(a_bf16, b_bf16, preferred_element_type=f32).astype(bf16)` computes the right forward, but
JAX's transpose rule then contracts the f32 cotangent with the bf16 operand, so both gradient GEMMs
run on f32 operands (TF32 or FP32 SIMT on a GPU, at a fraction of the bf16 rate). Here the
cotangent is rounded to the compute dtype first (what it would be had the output been bf16, as
MaxText's is) and the gradient GEMMs are bf16 x bf16 with bf16 results, accumulated in f32. On a CPU all three
read the same values in the dtype XLA:CPU multiplies fastest there (cpu_gemm.py: bf16 or f32).
"""

import functools

import jax
import jax.numpy as jnp

from MaxText.quantization import cpu_gemm


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4))
def einsum(spec, a, b, out_dtype, compute_dtype):
  """jnp.einsum(spec, a, b) on operands cast to `compute_dtype`, f32 accumulation, result in `out_dtype`;
  its two gradient contractions also run on `compute_dtype` operands."""
  contract = functools.partial(jnp.einsum, spec, preferred_element_type=jnp.float32)
  return cpu_gemm.gemm(contract, a.astype(compute_dtype), b.astype(compute_dtype)).astype(out_dtype)


def _einsum_fwd(spec, a, b, out_dtype, compute_dtype):
  return einsum(spec, a, b, out_dtype, compute_dtype), (a, b)


def _einsum_bwd(spec, out_dtype, compute_dtype, residuals, ct):
  del out_dtype
  a, b = residuals

  def grads(a, b, ct):  # in the compute dtype; on a CPU perhaps in f32, rounded to it
    _, vjp = jax.vjp(functools.partial(jnp.einsum, spec, preferred_element_type=ct.dtype), a, b)
    return tuple(g.astype(compute_dtype) for g in vjp(ct))

  da, db = cpu_gemm.gemm(grads, a.astype(compute_dtype), b.astype(compute_dtype), ct.astype(compute_dtype))
  return da.astype(a.dtype), db.astype(b.dtype)


einsum.defvjp(_einsum_fwd, _einsum_bwd)


def matmul(x_MxK, w_KxN, out_dtype=None):
  """x [M, K] . w [K, N] in x's dtype (w cast to it), per `einsum`; the result in out_dtype (default x's)."""
  dtype = jnp.dtype(x_MxK.dtype)
  return einsum("mk,kn->mn", x_MxK, w_KxN, jnp.dtype(out_dtype or dtype), dtype)
