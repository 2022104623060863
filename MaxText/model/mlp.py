"""Gated (SwiGLU) MLP: gate, up and down projections, each a Dense GEMM through the precision hook."""

import jax
import jax.numpy as jnp
from flax import nnx

from MaxText.runtime import sharding
from MaxText.model.layers import Dense
from MaxText.precision import amax_history_len

ACTIVATIONS = {"silu": jax.nn.silu, "gelu": jax.nn.gelu, "relu": jax.nn.relu, "linear": lambda x: x}


class MLP(nnx.Module):
  """down(act0(gate(x)) * act1(up(x)))."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    d, f = cfg.base_emb_dim, cfg.base_mlp_dim
    kw = dict(
      dtype=jnp.dtype(cfg.dtype), weight_dtype=jnp.dtype(cfg.weight_dtype), rngs=rngs, history_len=amax_history_len(cfg)
    )
    self.gate = Dense(d, f, remat_name="mlpwi_0", **kw)
    self.up = Dense(d, f, remat_name="mlpwi_1", **kw)
    self.down = Dense(f, d, remat_name="mlpwo", **kw)
    self.activations = tuple(cfg.mlp_activations)

  def __call__(self, x_BxLxD, precision, key, stats_sinks=None):
    keys = jax.random.split(key, 3) if key is not None else [None] * 3
    sinks = stats_sinks or {}
    gate = ACTIVATIONS[self.activations[0]](self.gate(x_BxLxD, precision["gate"], keys[0], sinks.get("gate")))
    up = ACTIVATIONS[self.activations[1]](self.up(x_BxLxD, precision["up"], keys[1], sinks.get("up")))
    hidden = sharding.constrain(gate * up, ("activation_batch", "activation_length", "activation_mlp"))
    return self.down(hidden, precision["down"], keys[2], sinks.get("down"))
