"""The Llama 3 decoder: embedding, stacked decoder layers (scanned or looped, with remat), norm, lm head."""

import jax
import jax.numpy as jnp
from flax import nnx

from MaxText.config import hardware
from MaxText.runtime import sharding
from MaxText.model.attention import Attention
from MaxText.model.layers import Embed, RMSNorm
from MaxText.model.mlp import MLP
from MaxText.precision import uniform
from MaxText.config.models import DENSE_SCOPES
from MaxText.quantization import dots, qdot

ACTIVATION_AXES = ("activation_batch", "activation_length", "activation_embed")
LOGITS_AXES = ("activation_batch", "activation_length", "activation_vocab")

# MaxText's remat policies, by the names Dense (config.models.DENSE_SCOPES), attention and the quantized Dense give
# their outputs.
_PROJECTIONS = tuple(DENSE_SCOPES)
_save = jax.checkpoint_policies.save_only_these_names
# jax's cuDNN attention forward primitive (jax 0.10 and 0.11; its custom-call wrapper is ..._wrapper).
CUDNN_ATTENTION_FORWARD = "dot_product_attention_fwd"


def _and_cudnn_attention_residuals(names_policy):
  """`names_policy`, and also keep what jax's cuDNN attention forward returns (the output and the softmax
  statistics its backward kernel reads): naming the output alone leaves those residuals unnamed, and the
  backward would run the forward kernel again (MaxText names both through its own call of the kernel)."""

  def policy(prim, *args, **params):
    return names_policy(prim, *args, **params) or prim.name.startswith(CUDNN_ATTENTION_FORWARD)

  return policy


REMAT_POLICIES = {
  "full": jax.checkpoint_policies.nothing_saveable,
  "minimal": _save(*_PROJECTIONS),
  "minimal_with_context": _and_cudnn_attention_residuals(_save(*_PROJECTIONS, "context")),
  "minimal_with_quantization": _save(*_PROJECTIONS, qdot.REMAT_NAME),
  "minimal_with_context_and_quantization": _and_cudnn_attention_residuals(
    _save(*_PROJECTIONS, "context", qdot.REMAT_NAME)
  ),
}


class DecoderLayer(nnx.Module):
  """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x))."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    norm = dict(
      epsilon=cfg.normalization_layer_epsilon, dtype=jnp.dtype(cfg.dtype), weight_dtype=jnp.dtype(cfg.weight_dtype)
    )
    self.pre_attention_norm = RMSNorm(cfg.base_emb_dim, **norm)
    self.attention = Attention(cfg, rngs=rngs)
    self.pre_mlp_norm = RMSNorm(cfg.base_emb_dim, **norm)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_BxLxD, positions_BxL, segment_ids_BxL, precision, key, stats_sinks=None, kv_cache=None):
    """(output, this layer's KV cache with these tokens written, or None)."""
    k_attn, k_mlp = jax.random.split(key) if key is not None else (None, None)
    attended, kv_cache = self.attention(
      self.pre_attention_norm(x_BxLxD), positions_BxL, segment_ids_BxL, precision, k_attn, stats_sinks, kv_cache
    )
    x = x_BxLxD + attended
    return x + self.mlp(self.pre_mlp_norm(x), precision, k_mlp, stats_sinks), kv_cache


class Transformer(nnx.Module):
  """tokens [B, L] -> logits [B, L, vocab] (f32): `hidden` (embedding, layers, final norm) then `logits` (the lm
  head); the training loss reads `hidden` and, with num_vocab_tiling > 1, runs the lm head in tiles
  (model/vocab_tiling.py).

  Layers are created stacked (one parameter array per kind with a leading layer axis) whether
  or not they are scanned, so checkpoints don't depend on scan_layers. `layer_precisions` is a
  list of (start, stop, precision-map) ranges that together cover the layers: each range runs
  as one lax.scan (scan_layers) or a Python loop. `stats_sinks` ({gemm: [layers, roles, stats]}
  zeros, see quantization.stats) asks every quantized GEMM for telemetry via the sinks' gradient.
  """

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    dtype, weight_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.weight_dtype)
    # Tied, the embedding is also the lm head: initialised at the lm head's scale (1/sqrt(width)), not 1.
    self.embed = Embed(
      cfg.vocab_size,
      cfg.base_emb_dim,
      dtype=dtype,
      weight_dtype=weight_dtype,
      rngs=rngs,
      stddev=cfg.base_emb_dim**-0.5 if cfg.logits_via_embedding else 1.0,
    )

    @nnx.split_rngs(splits=cfg.base_num_decoder_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make_layers(rngs):
      return DecoderLayer(cfg, rngs=rngs)

    self.layers = make_layers(rngs)
    self.final_norm = RMSNorm(
      cfg.base_emb_dim, epsilon=cfg.normalization_layer_epsilon, dtype=dtype, weight_dtype=weight_dtype
    )
    self.logits_via_embedding = cfg.logits_via_embedding
    if not cfg.logits_via_embedding:
      self.lm_head = nnx.Param(
        nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")(
          rngs.params(), (cfg.base_emb_dim, cfg.vocab_size), weight_dtype
        )
      )
    self.num_layers = cfg.base_num_decoder_layers
    self.scan_layers = cfg.scan_layers
    self.remat_policy = hardware.unresolved_remat(cfg.remat_policy)
    self.dtype = dtype
    self.logits_dtype = jnp.dtype(jnp.float32) if cfg.logits_dot_in_fp32 else dtype  # the lm head GEMM's operands
    self.num_vocab_tiling = cfg.num_vocab_tiling

  def _run_layers(self, x, positions, segment_ids, layer_precisions, key, stats_sinks, kv_cache=None):
    """(x after the layers, the stacked KV cache with these tokens written, or None)."""
    graphdef, layer_params = nnx.split(self.layers)
    stacked = (layer_params, stats_sinks, kv_cache)

    def block(precision):
      def body(x, layer_state_and_index):
        (layer_state, sinks, cache), index = layer_state_and_index
        layer = nnx.merge(graphdef, layer_state)
        layer_key = jax.random.fold_in(key, index) if key is not None else None
        x = sharding.constrain(x, ACTIVATION_AXES)
        return layer(x, positions, segment_ids, precision, layer_key, sinks, cache)

      if self.remat_policy != "none":
        body = jax.checkpoint(body, policy=REMAT_POLICIES[self.remat_policy], prevent_cse=not self.scan_layers)
      return body

    # Named scopes (layers_<i>, or layers_<start>-<stop-1> for a scanned range) name each layer's ops in the HLO
    # and in profiles; tests attribute the lowered GEMMs to layers by them.
    caches = []
    for start, stop, precision in layer_precisions:
      body = block(precision)
      if self.scan_layers:
        part = jax.tree.map(lambda a: a[start:stop], stacked)
        with jax.named_scope(f"layers_{start}-{stop - 1}"):
          x, cache = jax.lax.scan(body, x, (part, jnp.arange(start, stop)))
        caches.append(cache)
      else:
        for i in range(start, stop):
          with jax.named_scope(f"layers_{i}"):
            x, cache = body(x, (jax.tree.map(lambda a, i=i: a[i], stacked), jnp.int32(i)))
          caches.append(jax.tree.map(lambda a: a[None], cache))
    return x, (None if kv_cache is None else jax.tree.map(lambda *parts: jnp.concatenate(parts), *caches))

  def hidden(
    self, tokens_BxL, positions_BxL=None, segment_ids_BxL=None, *, layer_precisions=None, key=None, stats_sinks=None
  ):
    """tokens [B, L] -> the final norm's output [B, L, D]: what the lm head reads. `segment_ids_BxL`: the documents
    of packed rows, which attention never crosses; None where each row is one sequence (causal attention only)."""
    b, l = tokens_BxL.shape
    if positions_BxL is None:
      positions_BxL = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
    if layer_precisions is None:
      layer_precisions = [(0, self.num_layers, uniform())]
    x = self.embed(tokens_BxL)
    x, _ = self._run_layers(x, positions_BxL, segment_ids_BxL, layer_precisions, key, stats_sinks)
    return self.final_norm(sharding.constrain(x, ACTIVATION_AXES))

  def decode_hidden(self, tokens_BxT, positions_BxT, kv_cache, *, layer_precisions=None):
    """(final norm's output [B, T, D] of T new tokens at `positions`, each attending to the cached tokens at
    earlier positions and to itself; the stacked KV cache with them written): prefill (T = the prompt) and
    decode steps (T = 1)."""
    if layer_precisions is None:
      layer_precisions = [(0, self.num_layers, uniform())]
    x, kv_cache = self._run_layers(self.embed(tokens_BxT), positions_BxT, None, layer_precisions, None, None, kv_cache)
    return self.final_norm(x), kv_cache

  def head_kernel(self):
    """The lm head's [D, vocab] kernel: its own parameter, or the embedding's transpose (logits_via_embedding)."""
    return self.embed.embedding[...].T if self.logits_via_embedding else self.lm_head[...]

  def logits(self, x_BxLxD):
    """The lm head: a GEMM on compute-dtype (bf16) operands, f32 with logits_dot_in_fp32; f32 logits [B, L, vocab]."""
    logits = dots.einsum("bld,dv->blv", x_BxLxD, self.head_kernel(), jnp.float32, self.logits_dtype)
    return sharding.constrain(logits, LOGITS_AXES)

  def __call__(
    self, tokens_BxL, positions_BxL=None, segment_ids_BxL=None, *, layer_precisions=None, key=None, stats_sinks=None
  ):
    return self.logits(
      self.hidden(
        tokens_BxL, positions_BxL, segment_ids_BxL, layer_precisions=layer_precisions, key=key, stats_sinks=stats_sinks
      )
    )


def abstract_model(cfg):
  """(graphdef, params, rest) of the model with shapes only (nothing allocated)."""
  return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(cfg.seed))), nnx.Param, ...)
