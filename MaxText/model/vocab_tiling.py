"""The lm head's cross-entropy in tiles of the sequence (MaxText's vocabulary tiling), gradients computed tile by tile.

The plain path materialises the f32 logits [B, L, V] (8.4 GB at B 2, L 8192, V 128256), keeps them (or the
softmax) for the backward pass and then writes their gradient, as big again. Here the sequence is cut into
`num_tiles` strided tiles (tile i holds positions i, i + n, ...: every tile spans the batch and context
shards alike, so no tile sits on one device) and one tile's logits [B, L/n, V] exist at a time.

The loss is a sum whose cotangent is a scalar, so its gradients are known once a tile's logits are: the
forward pass (custom_vjp's fwd rule) computes each tile's log-softmax, its loss and its gradient GEMMs
right away, and keeps only dx [B, L, D] and dW [D, V] for the backward pass, which scales them. That is the
plain path's three lm-head GEMMs (logits, dgrad, wgrad) and no recomputed forward GEMM. Without a gradient
(eval) only the loss runs. GEMMs take compute-dtype (bf16) operands with f32 accumulation as
`quantization.dots` does (on a CPU in the dtype quantization.cpu_gemm picks); log-softmax and the loss are f32.
"""

import functools

import jax
import jax.numpy as jnp

from MaxText.model.decoder import ACTIVATION_AXES, LOGITS_AXES
from MaxText.quantization import cpu_gemm
from MaxText.runtime import sharding


def _tiles(a_BxL, n):
  """[B, L, ...] -> [B, L/n, n, ...]: tile i is [:, :, i] (positions i, i + n, ...)."""
  return a_BxL.reshape(a_BxL.shape[0], a_BxL.shape[1] // n, n, *a_BxL.shape[2:])


def _untile(a_NxBxC, length):
  """[n, B, L/n, ...] (one tile per leading index) -> [B, L, ...], inverting `_tiles`."""
  moved = jnp.moveaxis(a_NxBxC, 0, 2)
  return moved.reshape(moved.shape[0], length, *moved.shape[3:])


def _einsum_f32(spec):
  """einsum(spec, a, b) with f32 accumulation and result (cpu_gemm.gemm picks its operands' dtype on a CPU)."""
  return functools.partial(jnp.einsum, spec, preferred_element_type=jnp.float32)


def _tile_loss(x_BxCxD, w_DxV, targets_BxC):
  """(f32 logits [B, C, V], per-token cross-entropy [B, C], log-sum-exp [B, C]) of one tile; operands already
  in the compute dtype."""
  logits = cpu_gemm.gemm(_einsum_f32("bcd,dv->bcv"), x_BxCxD, w_DxV)
  logits = sharding.constrain(logits, LOGITS_AXES)
  lse_BxC = jax.nn.logsumexp(logits, axis=-1)
  label_BxC = jnp.take_along_axis(logits, targets_BxC[..., None], axis=-1)[..., 0]
  return logits, lse_BxC - label_BxC, lse_BxC


def _tile_grads(logits_BxCxV, lse_BxC, x_BxCxD, w_DxV, targets_BxC, weights_BxC):
  """(dx [B, C, D] f32, dW [D, V] f32) of sum(weights * xent) over one tile: d logits = w (softmax - onehot),
  rounded to the compute dtype (as the plain path's bf16 gradient GEMMs read it), f32 accumulation."""
  probs = jnp.exp(logits_BxCxV - lse_BxC[..., None])
  onehot = jax.lax.broadcasted_iota(jnp.int32, logits_BxCxV.shape, 2) == targets_BxC[..., None]
  dlogits = ((probs - onehot) * weights_BxC[..., None]).astype(x_BxCxD.dtype)
  dx = cpu_gemm.gemm(_einsum_f32("bcv,dv->bcd"), dlogits, w_DxV)
  dw = cpu_gemm.gemm(_einsum_f32("bcd,bcv->dv"), x_BxCxD, dlogits)
  return dx, dw


def _scan(x_BxLxD, w_DxV, targets_BxL, weights_BxL, num_tiles, compute_dtype, with_grads):
  """Loop over the tiles: (loss sum, per-token xent [n, B, C], and with_grads: dx [n, B, C, D], dW [D, V])."""
  x_t, targets_t, weights_t = _tiles(x_BxLxD, num_tiles), _tiles(targets_BxL, num_tiles), _tiles(weights_BxL, num_tiles)
  w = w_DxV.astype(compute_dtype)

  def body(carry, i):
    total, dw_acc = carry
    x_i = sharding.constrain(jax.lax.dynamic_index_in_dim(x_t, i, 2, keepdims=False), ACTIVATION_AXES)
    x_i = x_i.astype(compute_dtype)
    targets_i = jax.lax.dynamic_index_in_dim(targets_t, i, 2, keepdims=False)
    weights_i = jax.lax.dynamic_index_in_dim(weights_t, i, 2, keepdims=False).astype(jnp.float32)
    logits, xent, lse = _tile_loss(x_i, w, targets_i)
    total = total + jnp.sum(xent * weights_i)
    if not with_grads:
      return (total, dw_acc), (xent,)
    dx, dw = _tile_grads(logits, lse, x_i, w, targets_i, weights_i)
    return (total, dw_acc + dw), (xent, dx.astype(x_BxLxD.dtype))

  dw0 = jnp.zeros(w_DxV.shape, jnp.float32) if with_grads else jnp.zeros((), jnp.float32)
  (total, dw), per_tile = jax.lax.scan(body, (jnp.zeros((), jnp.float32), dw0), jnp.arange(num_tiles))
  return total, dw, per_tile


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def xent_sum(x_BxLxD, w_DxV, targets_BxL, weights_BxL, num_tiles, compute_dtype):
  """sum over tokens of weights * cross-entropy(x @ w, targets), f32, in `num_tiles` tiles of the sequence
  (num_tiles must divide L)."""
  total, _, _ = _scan(x_BxLxD, w_DxV, targets_BxL, weights_BxL, num_tiles, compute_dtype, with_grads=False)
  return total


def _xent_sum_fwd(x_BxLxD, w_DxV, targets_BxL, weights_BxL, num_tiles, compute_dtype):
  total, dw, (xent, dx) = _scan(x_BxLxD, w_DxV, targets_BxL, weights_BxL, num_tiles, compute_dtype, with_grads=True)
  length = x_BxLxD.shape[1]
  return total, (_untile(dx, length), dw.astype(w_DxV.dtype), _untile(xent, length).astype(weights_BxL.dtype))


def _xent_sum_bwd(num_tiles, compute_dtype, residuals, g):
  """The loss is linear in its cotangent: scale the gradients the forward pass computed."""
  del num_tiles, compute_dtype
  dx, dw, xent = residuals
  return (g * dx).astype(dx.dtype), (g * dw).astype(dw.dtype), None, (g * xent).astype(xent.dtype)


xent_sum.defvjp(_xent_sum_fwd, _xent_sum_bwd)
