"""Building blocks: the Dense layer (one quantized-Dense call per GEMM), RMSNorm, token embedding."""

import functools
import operator

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from MaxText.config.models import ATTENTION_GEMMS, FUSED_GEMMS, MLP_GEMMS
from MaxText.precision import LayerPrecision, uniform
from MaxText.quantization import qdense
from MaxText.quantization.partition import GemmAxes
from MaxText.runtime import sharding


class AmaxHistory(nnx.Variable):
  """FP8 delayed scaling's amax history [3, H] (rows x, w, dy; newest first). The train step overwrites it
  with its gradient (the new history) instead of handing it to the optimizer."""


def dense_init(ndim=2):
  """Fan-in scaled truncated normal for a kernel [in, *out] of `ndim` axes: the fan-in is the first axis alone."""
  return nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=0, out_axis=tuple(range(1, ndim)))


class Dense(nnx.Module):
  """y = x . kernel with kernel [in, out] in weight_dtype, through one call of the quantized Dense
  (quantization.qdense). An `out_features` tuple makes a kernel [in, *out] (MaxText's fused MLP [embed, 2, mlp]): one
  GEMM on the kernel viewed as [in, prod(out)], its output [..., *out].

  `gemm` is the precision plan's name of the GEMM (config.models: "q", ..., "down"; a tuple for GEMMs fused into
  one, which runs under the first one's precision and reports telemetry to each one's sink). A call takes the layer's
  precision ({gemm: GemmPrecision}, the plan's, so one possibly scanned layer can run different recipes per GEMM kind
  and per layer), the GEMM's PRNG key and the layer's telemetry sinks ({gemm: quantization.stats.empty_sink()},
  returned as their gradients). The output is tagged with MaxText's remat name of the GEMM (query_proj, mlpwo, ...)
  for the remat policies that save GEMM outputs, and the GEMM's ops run in a named scope of that name.
  """

  def __init__(
    self,
    in_features,
    out_features,
    *,
    gemm,
    dtype,
    weight_dtype,
    rngs: nnx.Rngs,
    history_len=0,
    kernel_axes=None,
    in_axis="activation_embed",
    out_axes=None,
  ):
    out_features = tuple(out_features) if isinstance(out_features, (tuple, list)) else (out_features,)
    self.gemms = (gemm,) if isinstance(gemm, str) else tuple(gemm)
    self.remat_name = FUSED_GEMMS[self.gemms] if len(self.gemms) > 1 else {**ATTENTION_GEMMS, **MLP_GEMMS}[gemm]
    # Logical axes (runtime/sharding.py's rules) of the kernel's dims, of x's last dim and of y's output dims: how a
    # quantized GEMM is partitioned over the mesh (quantization/partition.py). None: never partitioned by hand.
    self.kernel_axes = tuple(kernel_axes) if kernel_axes else None
    self.in_axis, self.out_axes = in_axis, tuple(out_axes or ())
    self.kernel = nnx.Param(
      dense_init(1 + len(out_features))(rngs.params(), (in_features, *out_features), weight_dtype)
    )
    self.dtype = dtype
    if history_len:
      self.amax_history = AmaxHistory(jnp.zeros((3, history_len), jnp.float32))

  def __call__(self, x, precision: LayerPrecision = None, key=None, stats_sinks=None):
    gemm = (precision or uniform())[self.gemms[0]]
    kernel = self.kernel[...]
    with jax.named_scope(self.remat_name):  # the GEMM's ops, forward and backward, named in the HLO and profiles
      y = qdense(
        x.astype(self.dtype),
        kernel,
        gemm.recipe,
        key=key,
        backend=gemm.backend,
        kernels=gemm.kernels,
        partition=self._partition(x.shape, kernel.shape),
        history=self._history(gemm.recipe),
        stats_sink=self._sink(stats_sinks),
      )
      return checkpoint_name(y, self.remat_name)

  def _history(self, recipe):
    """Delayed scaling's amax history, for a stateful recipe."""
    if not recipe.stateful:
      return None
    if not hasattr(self, "amax_history"):
      raise ValueError(f"{recipe.name} needs an amax history: build the model with amax_history_len")
    return self.amax_history[...]

  def _sink(self, stats_sinks):
    """The telemetry sink of this GEMM (of a fused pair: the sum of both, whose gradient reaches each), or None."""
    sinks = [stats_sinks[g] for g in self.gemms if g in (stats_sinks or {})]
    return functools.reduce(operator.add, sinks) if sinks and len(sinks) == len(self.gemms) else None

  def _partition(self, x_shape, kernel_shape):
    """The mesh axes of x [batch, length, K], the kernel and y under the current mesh (runtime/sharding.py's
    logical rules), or None: no mesh, no logical axes, or another input rank."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or self.kernel_axes is None or len(x_shape) != 3:
      return None
    sizes = dict(mesh.shape)
    rows = ("activation_batch", "activation_length")
    x_axes = sharding.mesh_axes((*rows, self.in_axis), x_shape, sizes, strict=False)
    w_axes = sharding.mesh_axes(self.kernel_axes, kernel_shape, sizes, strict=False)
    y_shape = (*x_shape[:-1], *kernel_shape[1:])
    y_axes = sharding.mesh_axes((*rows, *self.out_axes), y_shape, sizes, strict=False)
    return GemmAxes(rows=x_axes[:-1], x_k=x_axes[-1], w_k=w_axes[0], w_out=w_axes[1:], y_out=y_axes[2:])


class RMSNorm(nnx.Module):
  """x / rms(x) * scale, computed in f32."""

  def __init__(self, features, *, epsilon, dtype, weight_dtype):
    self.scale = nnx.Param(jnp.ones((features,), weight_dtype))
    self.epsilon = epsilon
    self.dtype = dtype

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.epsilon)
    return (y * self.scale[...].astype(jnp.float32)).astype(self.dtype)


class Embed(nnx.Module):
  """Token embedding lookup [vocab, emb] (outside the precision hook)."""

  def __init__(self, vocab_size, features, *, dtype, weight_dtype, rngs: nnx.Rngs, stddev=1.0):
    self.embedding = nnx.Param(nnx.initializers.normal(stddev)(rngs.params(), (vocab_size, features), weight_dtype))
    self.dtype = dtype

  def __call__(self, tokens_BxL):
    return jnp.take(self.embedding[...], tokens_BxL, axis=0).astype(self.dtype)
