"""Gated (SwiGLU) MLP: gate, up and down projections, each a Dense GEMM through the precision hook; with fused_mlp
gate and up are one kernel and one GEMM."""

import jax
import jax.numpy as jnp
from flax import nnx

from MaxText.runtime import sharding
from MaxText.model.layers import Dense
from MaxText.precision import LayerPrecision, amax_history_len

ACTIVATIONS = {"silu": jax.nn.silu, "gelu": jax.nn.gelu, "relu": jax.nn.relu, "linear": lambda x: x}


class MLP(nnx.Module):
  """down(act0(gate(x)) * act1(up(x))).

  fused_mlp (MaxText's key and layout): gate and up are one kernel [emb, 2, mlp] (`gate_up`, [..., 0, :] the gate),
  multiplied as one GEMM [emb, 2 * mlp] under the gate's precision: one quantization of the pair, so an NVFP4 run
  has one global scale for both, as the fused gate_up_proj of serving engines reads them.
  """

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    d, f = cfg.base_emb_dim, cfg.base_mlp_dim
    kw = dict(
      dtype=jnp.dtype(cfg.dtype), weight_dtype=jnp.dtype(cfg.weight_dtype), rngs=rngs, history_len=amax_history_len(cfg)
    )
    self.fused = cfg.fused_mlp
    up = dict(kernel_axes=("embed", "mlp"), out_axes=("activation_mlp",))
    if self.fused:
      fused_axes = dict(kernel_axes=("embed", "num_activations", "mlp"), out_axes=("num_activations", "activation_mlp"))
      self.gate_up = Dense(d, (2, f), gemm=("gate", "up"), **fused_axes, **kw)
    else:
      self.gate = Dense(d, f, gemm="gate", **up, **kw)
      self.up = Dense(d, f, gemm="up", **up, **kw)
    down = dict(kernel_axes=("mlp", "embed"), in_axis="activation_mlp", out_axes=("activation_embed",))
    self.down = Dense(f, d, gemm="down", **down, **kw)
    self.activations = tuple(cfg.mlp_activations)

  def __call__(self, x_BxLxD, precision: LayerPrecision, key, stats_sinks=None):
    """`precision`, `stats_sinks`: the layer's ({gemm: GemmPrecision}, {gemm: sink}), as every Dense takes them."""
    keys = jax.random.split(key, 3) if key is not None else [None] * 3
    act_gate, act_up = (ACTIVATIONS[a] for a in self.activations)
    if self.fused:
      # One GEMM, under the gate's precision, reporting its telemetry to both kinds' sinks.
      gate_up = self.gate_up(x_BxLxD, precision, keys[0], stats_sinks)
      gate, up = act_gate(gate_up[..., 0, :]), act_up(gate_up[..., 1, :])
    else:
      gate = act_gate(self.gate(x_BxLxD, precision, keys[0], stats_sinks))
      up = act_up(self.up(x_BxLxD, precision, keys[1], stats_sinks))
    hidden = sharding.constrain(gate * up, ("activation_batch", "activation_length", "activation_mlp"))
    return self.down(hidden, precision, keys[2], stats_sinks)
