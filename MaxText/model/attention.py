"""Grouped-query self-attention with RoPE: q/k/v/o projections through Dense, core in XLA or cuDNN."""

import math
import typing

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from MaxText.config import hardware
from MaxText.model.layers import Dense
from MaxText.precision import GemmPrecision, LayerPrecision, amax_history_len
from MaxText.quantization import dots

NEG_INF = -0.7 * float(jnp.finfo(jnp.float32).max)


def rope_frequencies(
  head_dim,
  max_timescale,
  rope_type="default",
  scaling_factor=8.0,
  low_freq_factor=1.0,
  high_freq_factor=4.0,
  original_max_position=8192,
):
  """Inverse frequencies [head_dim/2]; 'llama3.1' applies Llama 3.1's piecewise wavelength scaling."""
  inv_freq = 1.0 / (max_timescale ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  if rope_type != "llama3.1":
    return inv_freq
  wavelen = 2 * math.pi / inv_freq
  low_freq_wavelen = original_max_position / low_freq_factor
  high_freq_wavelen = original_max_position / high_freq_factor
  smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
  smoothed = (1 - smooth) * inv_freq / scaling_factor + smooth * inv_freq
  return jnp.where(
    wavelen > low_freq_wavelen, inv_freq / scaling_factor, jnp.where(wavelen < high_freq_wavelen, inv_freq, smoothed)
  )


def apply_rope(x_BxLxHxD, positions_BxL, inv_freq):
  """Rotate the two halves of each head by position * frequency (Llama's rotate-half convention)."""
  angles = positions_BxL[..., None].astype(jnp.float32) * inv_freq  # [B, L, D/2]
  sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
  x1, x2 = jnp.split(x_BxLxHxD.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxLxHxD.dtype)


def _gqa_attention(q_BxLxHxD, k_BxSxKxD, v_BxSxKxD, mask_BxLxS):
  """GQA attention in XLA where `mask` allows: GEMMs on the compute dtype, scores and softmax in f32."""
  b, l, h, d = q_BxLxHxD.shape
  kv = k_BxSxKxD.shape[2]
  q = q_BxLxHxD.reshape(b, l, kv, h // kv, d)
  dtype = q_BxLxHxD.dtype
  scores = dots.einsum("blkgd,bskd->bkgls", q, k_BxSxKxD, jnp.float32, dtype) / math.sqrt(d)
  probs = jax.nn.softmax(jnp.where(mask_BxLxS[:, None, None], scores, NEG_INF), axis=-1)
  out = dots.einsum("bkgls,bskd->blkgd", probs, v_BxSxKxD, dtype, dtype)
  return out.reshape(b, l, h, d)


def dot_product_attention(q_BxLxHxD, k_BxSxKxD, v_BxSxKxD, segment_ids_BxL=None):
  """Causal GQA attention in XLA; with segment ids, attention never crosses segments."""
  l = q_BxLxHxD.shape[1]
  mask_LxS = jnp.tril(jnp.ones((l, l), bool))[None]
  if segment_ids_BxL is not None:
    mask_LxS = mask_LxS & (segment_ids_BxL[:, :, None] == segment_ids_BxL[:, None, :])
  return _gqa_attention(q_BxLxHxD, k_BxSxKxD, v_BxSxKxD, mask_LxS)


class KVCache(typing.NamedTuple):
  """Keys and values [B, S, K, D] (K key/value heads: GQA's cache is K/H of the queries'), in slots by position.
  Stacked over the decoder layers ([L, B, S, K, D]) when the model holds it."""

  k: jax.Array
  v: jax.Array

  @classmethod
  def zeros(cls, cfg, batch, length):
    shape = (cfg.base_num_decoder_layers, batch, length, cfg.base_num_kv_heads, cfg.head_dim)
    return cls(jnp.zeros(shape, cfg.dtype), jnp.zeros(shape, cfg.dtype))

  def written(self, k_BxTxKxD, v_BxTxKxD, positions_BxT):
    """The cache with the new tokens' keys and values in their positions' slots."""
    rows = jnp.arange(k_BxTxKxD.shape[0])[:, None]
    return KVCache(
      self.k.at[rows, positions_BxT].set(k_BxTxKxD.astype(self.k.dtype)),
      self.v.at[rows, positions_BxT].set(v_BxTxKxD.astype(self.v.dtype)),
    )


def cached_attention(q_BxTxHxD, cache: KVCache, positions_BxT):
  """T new queries over the cache: the query at position p sees slots 0..p (earlier tokens and itself)."""
  slots_S = jnp.arange(cache.k.shape[1])
  mask_BxTxS = slots_S[None, None, :] <= positions_BxT[:, :, None]
  return _gqa_attention(q_BxTxHxD, cache.k.astype(q_BxTxHxD.dtype), cache.v.astype(q_BxTxHxD.dtype), mask_BxTxS)


def cudnn_flash_attention(q_BxLxHxD, k_BxSxKxD, v_BxSxKxD, segment_ids_BxL=None):
  """cuDNN fused flash attention (GPU only), causal; with segment ids, masked per segment.

  Without segments the causal mask is generated inside the kernel (masked tiles are skipped, no mask in
  memory). jax's public API takes a segment mask only as a dense bool [B, 1, L, L], which it turns into an
  additive bf16 bias that the forward and the backward kernel both read (jax 0.10 also writes its
  gradient, another [B, 1, L, L], in the backward): the cost packed data pays on this path.
  """
  if segment_ids_BxL is None:
    return jax.nn.dot_product_attention(q_BxLxHxD, k_BxSxKxD, v_BxSxKxD, is_causal=True, implementation="cudnn")
  same_segment = segment_ids_BxL[:, :, None] == segment_ids_BxL[:, None, :]
  return jax.nn.dot_product_attention(
    q_BxLxHxD, k_BxSxKxD, v_BxSxKxD, mask=same_segment[:, None], is_causal=True, implementation="cudnn"
  )


ATTENTION_KERNELS = {"dot_product": dot_product_attention, "cudnn_flash": cudnn_flash_attention}


def attention_kernel(name):
  """The attention function `name` names. auto, in a config not made concrete for a target (runs and compiles do:
  config.hardware), is the kernel for the platform jax computes on here."""
  if name == "auto":
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)
    name, _ = hardware.attention_kernel(hardware.Hardware(device.platform, float(capability) if capability else None))
  return ATTENTION_KERNELS[name]


class Attention(nnx.Module):
  """Self-attention: q/k/v/o are Dense GEMMs (precision hook); QK^T, softmax and PV stay high precision."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    d, h, kv, dh = cfg.base_emb_dim, cfg.base_num_query_heads, cfg.base_num_kv_heads, cfg.head_dim
    kw = dict(
      dtype=jnp.dtype(cfg.dtype), weight_dtype=jnp.dtype(cfg.weight_dtype), rngs=rngs, history_len=amax_history_len(cfg)
    )
    heads = dict(kernel_axes=("embed", "heads"), out_axes=("activation_heads",))
    kv_heads = dict(kernel_axes=("embed", "kv_heads"), out_axes=("activation_heads",))
    out = dict(kernel_axes=("heads", "embed"), in_axis="activation_heads", out_axes=("activation_embed",))
    self.query = Dense(d, h * dh, gemm="q", **heads, **kw)
    self.key = Dense(d, kv * dh, gemm="k", **kv_heads, **kw)
    self.value = Dense(d, kv * dh, gemm="v", **kv_heads, **kw)
    self.out = Dense(h * dh, d, gemm="o", **out, **kw)
    self.heads, self.kv_heads, self.head_dim = h, kv, dh
    self.rope = (
      dh,
      cfg.rope_max_timescale,
      cfg.rope_type,
      cfg.rope_scaling_factor,
      cfg.rope_low_freq_factor,
      cfg.rope_high_freq_factor,
      cfg.rope_original_max_position,
    )
    self.kernel = attention_kernel(cfg.attention)

  def __call__(
    self, x_BxLxD, positions_BxL, segment_ids_BxL, precision: LayerPrecision, key, stats_sinks=None, kv_cache=None
  ):
    """(output [B, L, D], the KV cache with these tokens written, or None without one). `segment_ids_BxL`: the
    documents of packed rows (attention never crosses them), None for rows of one sequence (causal only: no mask
    tensor)."""
    b, l, _ = x_BxLxD.shape
    keys = jax.random.split(key, 4) if key is not None else [None] * 4
    inv_freq = rope_frequencies(*self.rope)
    q = self.query(x_BxLxD, precision, keys[0], stats_sinks).reshape(b, l, self.heads, self.head_dim)
    k = self.key(x_BxLxD, precision, keys[1], stats_sinks).reshape(b, l, self.kv_heads, self.head_dim)
    v = self.value(x_BxLxD, precision, keys[2], stats_sinks).reshape(b, l, self.kv_heads, self.head_dim)
    q, k = apply_rope(q, positions_BxL, inv_freq), apply_rope(k, positions_BxL, inv_freq)
    if kv_cache is not None:  # decoding: attend to the cached tokens and these
      kv_cache = kv_cache.written(k, v, positions_BxL)
      ctx = cached_attention(q, kv_cache, positions_BxL)
    else:
      ctx = self.kernel(q, k, v, segment_ids_BxL)
    ctx = checkpoint_name(ctx, "context").reshape(b, l, self.heads * self.head_dim)
    return self.out(ctx, precision, keys[3], stats_sinks), kv_cache


__all__ = [
  "Attention",
  "GemmPrecision",
  "KVCache",
  "apply_rope",
  "cached_attention",
  "cudnn_flash_attention",
  "dot_product_attention",
  "rope_frequencies",
]
