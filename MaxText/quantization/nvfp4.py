"""NVFP4: two-level (FP32 per-tensor, E4M3 per-16) scaled E2M1 quantization, bit-faithful to TE's NVFP4BlockScaling.

Behaviour at the edges (as TE's reference quantizer):
  * all-zero tensor: amax 0, S_enc = FLT_MAX, every scale and value 0.
  * a last axis (or, with 16x16 tiles, a first axis) not divisible by 16 is zero-padded for
    scale computation; `values` keep the input's shape, `scales` have ceil(N / 16) columns.
    The RHT needs whole 16-blocks and raises ValueError otherwise.
  * +-inf: amax is inf, S_enc = 6*448/inf = 0 -> 1.0; the block holding the inf gets scale 448
    and saturates to +-6, other blocks quantize against S_enc = 1 (mostly underflowing to 0).
  * NaN: amax and every scale become NaN, so `dequantize` returns NaN everywhere: a poisoned
    tensor stays visibly poisoned instead of being silently clipped.
"""

import functools
import typing

import jax
import jax.numpy as jnp
import numpy as np

from MaxText.quantization import formats

BLOCK = 16
E2M1_MAX = formats.E2M1.max_value
E4M3_MAX = formats.E4M3.max_value
# TE's fixed random signs for the wgrad RHT.
RHT_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float32)


class NVFP4Tensor(typing.NamedTuple):
  """A quantized 2-D tensor: E2M1 `values` [M, N], E4M3 `scales` [M, ceil(N/16)], global `amax` (f32 scalar)."""
  values: jax.Array
  scales: jax.Array
  amax: jax.Array


def _sylvester_hadamard(n):
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h


def rht_matrix():
  """diag(signs) @ H16 / 4: orthonormal, applied on the right of 16-blocks (exact in bfloat16)."""
  return (RHT_SIGNS[:, None] * _sylvester_hadamard(BLOCK)) / 4.0


def hadamard16(x):
  """Random Hadamard Transform along the last axis in blocks of 16, f32 accumulation, rounded to bf16."""
  *lead, n = x.shape
  if n % BLOCK:
    raise ValueError(f"hadamard16: last axis of shape {tuple(x.shape)} must be a multiple of {BLOCK}")
  blocks = x.astype(jnp.bfloat16).astype(jnp.float32).reshape(*lead, n // BLOCK, BLOCK)
  out = jnp.einsum("...k,kj->...j", blocks, jnp.asarray(rht_matrix()),
                   precision=jax.lax.Precision.HIGHEST)
  return out.reshape(*lead, n).astype(jnp.bfloat16)


def global_encode_scale(amax):
  """S_enc = 6*448/amax capped at FLT_MAX, and 1.0 where that comes out 0 (amax = inf).

  amax = 0 gives FLT_MAX, as in TE's reference; the all-zero tensor then has block scales 0.
  """
  amax = amax.astype(jnp.float32)
  s_enc = jnp.minimum(jnp.float32(E2M1_MAX * E4M3_MAX) / amax, formats.FLT_MAX)
  return jnp.where(s_enc == 0, 1.0, s_enc)


def _pad_to_block(x, rows_multiple):
  m, n = x.shape
  pad_m, pad_n = (-m) % rows_multiple, (-n) % BLOCK
  if pad_m or pad_n:
    x = jnp.pad(x, ((0, pad_m), (0, pad_n)))
  return x


def _block_amax(x_f32, tile):
  """Per-block amax [M, N/16]; with 16x16 tiles each of a tile's 16 rows repeats the tile's amax."""
  m, n = x_f32.shape
  if tile == (1, BLOCK):
    return jnp.max(jnp.abs(x_f32).reshape(m, n // BLOCK, BLOCK), axis=-1)
  tiles = jnp.abs(x_f32).reshape(m // BLOCK, BLOCK, n // BLOCK, BLOCK)
  return jnp.repeat(jnp.max(tiles, axis=(1, 3)), BLOCK, axis=0)


def quantize(x, *, tile=(1, 16), rht=False, stochastic_rounding=False, key=None) -> NVFP4Tensor:
  """Quantize a 2-D x [M, N] to NVFP4 with blocks along the last axis (16x16 tiles if tile=(16, 16))."""
  return _quantize_jit(x, tile=tuple(tile), rht=rht, stochastic_rounding=stochastic_rounding, key=key)


@functools.partial(jax.jit, static_argnames=("tile", "rht", "stochastic_rounding"))
def _quantize_jit(x, *, tile, rht, stochastic_rounding, key):
  if tile not in ((1, BLOCK), (BLOCK, BLOCK)):
    raise ValueError(f"nvfp4.quantize: tile must be (1, 16) or (16, 16), got {tile}")
  if x.ndim != 2:
    raise ValueError(f"nvfp4.quantize: expects a 2-D array, got shape {tuple(x.shape)}")
  if stochastic_rounding and key is None:
    raise ValueError("nvfp4.quantize: stochastic_rounding=True needs a PRNG key")
  if rht:
    x = hadamard16(x)
  m, n = x.shape
  x_f32 = x.astype(jnp.float32)
  amax = jnp.max(jnp.abs(x_f32)) if x.size else jnp.float32(0)
  s_enc = global_encode_scale(amax)
  s_dec = 1.0 / s_enc

  padded = _pad_to_block(x_f32, tile[0])
  block_amax = _block_amax(padded, tile)[:m]  # [M, ceil(N/16)]
  decode = jnp.minimum(block_amax * (s_enc * (1.0 / E2M1_MAX)), formats.FLT_MAX)
  decode = formats.round_to_grid(jnp.clip(decode, -E4M3_MAX, E4M3_MAX), formats.E4M3)
  encode = jnp.minimum(1.0 / (decode * s_dec), formats.FLT_MAX)

  scaled = padded[:m].reshape(m, -1, BLOCK) * encode[..., None]
  scaled = jnp.clip(scaled, -E2M1_MAX, E2M1_MAX).reshape(m, -1)[:, :n]
  if stochastic_rounding:
    values = formats.stochastic_round_to_grid(scaled, formats.E2M1, key)
  else:
    values = formats.round_to_grid(scaled, formats.E2M1)
  return NVFP4Tensor(formats.cast_exact(values, formats.E2M1),
                     formats.cast_exact(decode, formats.E4M3), amax)


def block_scaled_values(q: NVFP4Tensor):
  """values * block decode scale in f32 [M, N]: exact (at most 2 + 4 significant bits)."""
  m, n = q.values.shape
  scales = jnp.repeat(q.scales.astype(jnp.float32), BLOCK, axis=1)[:, :n]
  return q.values.astype(jnp.float32) * scales


def decode_scale(q: NVFP4Tensor):
  """The global decode scale 1/S_enc (f32 scalar)."""
  return 1.0 / global_encode_scale(q.amax)


def dequantize(q: NVFP4Tensor):
  """values * block scale * (1/S_enc), f32 [M, N]."""
  return block_scaled_values(q) * decode_scale(q)


def gemm_alpha(a: NVFP4Tensor, b: NVFP4Tensor):
  """The epilogue scale of an NVFP4 GEMM: amax_a * amax_b / (6*6*448*448), as the tensor core applies it."""
  return (a.amax * b.amax) / jnp.float32(E2M1_MAX * E2M1_MAX * E4M3_MAX * E4M3_MAX)


def gemm(a: NVFP4Tensor, b: NVFP4Tensor):
  """a [M, K] . b [N, K]^T (both blocked along K) in f32, global scales applied in the epilogue.

  Each block's partial product is exact in f32, so this equals the tensor core's per-16 f32
  accumulation up to the order of the f32 sum.
  """
  k = a.values.shape[1]
  out = jnp.dot(block_scaled_values(a), block_scaled_values(b).T,
                precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  alpha = jnp.where(k > 0, gemm_alpha(a, b), 1.0)
  return out * alpha
