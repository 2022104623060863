"""Building blocks: the Dense layer with its precision hook, RMSNorm, token embedding."""

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from MaxText.precision import GemmPrecision
from MaxText.quantization import delayed, qdense
from MaxText.quantization.partition import GemmAxes
from MaxText.runtime import sharding


class AmaxHistory(nnx.Variable):
  """FP8 delayed scaling's amax history [3, H] (rows x, w, dy; newest first). The train step overwrites it
  with its gradient (the new history) instead of handing it to the optimizer."""


def dense_init(ndim=2):
  """Fan-in scaled truncated normal for a kernel [in, *out] of `ndim` axes: the fan-in is the first axis alone."""
  return nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=0, out_axis=tuple(range(1, ndim)))


class Dense(nnx.Module):
  """y = x . kernel with kernel [in, out] in weight_dtype; every call goes through one dot_general hook. An
  `out_features` tuple makes a kernel [in, *out] (MaxText's fused MLP [embed, 2, mlp]): one GEMM on the kernel viewed
  as [in, prod(out)], its output [..., *out].

  The output is tagged with `remat_name` (MaxText's names: query_proj, mlpwo, ...) for the remat
  policies that save GEMM outputs. The hook is `dot_general(x, kernel, precision, key, stats_sink)`: the quantized
  matmul of the recipe that the caller passes per call, so one (possibly scanned) layer can run under different
  recipes per GEMM kind and per layer. A `stats_sink` (quantization.stats.empty_sink()) asks for
  quantization telemetry, returned as the sink's gradient.
  """

  def __init__(
    self,
    in_features,
    out_features,
    *,
    dtype,
    weight_dtype,
    rngs: nnx.Rngs,
    remat_name,
    history_len=0,
    kernel_axes=None,
    in_axis="activation_embed",
    out_axes=None,
  ):
    out_features = tuple(out_features) if isinstance(out_features, (tuple, list)) else (out_features,)
    # Logical axes (runtime/sharding.py's rules) of the kernel's dims, of x's last dim and of y's output dims: how a
    # quantized GEMM is partitioned over the mesh (quantization/partition.py). None: never partitioned by hand.
    self.kernel_axes = tuple(kernel_axes) if kernel_axes else None
    self.in_axis, self.out_axes = in_axis, tuple(out_axes or ())
    self.kernel = nnx.Param(
      dense_init(1 + len(out_features))(rngs.params(), (in_features, *out_features), weight_dtype)
    )
    self.dtype = dtype
    self.remat_name = remat_name
    if history_len:
      self.amax_history = AmaxHistory(jnp.zeros((3, history_len), jnp.float32))

  @staticmethod
  def dot_general(x, kernel, precision: GemmPrecision, key, stats_sink=None, partition=None):
    return qdense(
      x,
      kernel,
      precision.recipe,
      key=key,
      backend=precision.backend,
      stats_sink=stats_sink,
      kernels=precision.kernels,
      partition=partition,
    )

  def __call__(self, x, precision: GemmPrecision = GemmPrecision(), key=None, stats_sink=None):
    with jax.named_scope(self.remat_name):  # the GEMM's ops, forward and backward, named in the HLO and profiles
      return checkpoint_name(self._gemm(x, precision, key, stats_sink), self.remat_name)

  def _gemm(self, x, precision, key, stats_sink):
    kernel = self.kernel[...]
    out_shape = kernel.shape[1:]
    if precision.recipe.quantized and not precision.recipe.stateful:
      # The kernel with its own dims: a partitioned GEMM splits them as the parameter is split
      partition = self._partition(x.shape, kernel.shape)
      return self.dot_general(x.astype(self.dtype), kernel, precision, key, stats_sink, partition)
    kernel = kernel.reshape(kernel.shape[0], -1)
    return self._gemm_2d(x, kernel, precision, key).reshape(*x.shape[:-1], *out_shape)

  def _gemm_2d(self, x, kernel, precision, key):
    if precision.recipe.stateful:
      if not hasattr(self, "amax_history"):
        raise ValueError(f"{precision.recipe.name} needs an amax history: build the model with amax_history_len")
      x2d = x.astype(self.dtype).reshape(-1, x.shape[-1])
      y = delayed.qmatmul_delayed(x2d, kernel, precision.recipe, self.amax_history[...], precision.kernels)
      return y.reshape(*x.shape[:-1], kernel.shape[1])
    # BF16 GEMM (quantizers read the f32 master weight; this reads it in the compute dtype)
    return self.dot_general(x.astype(self.dtype), kernel.astype(self.dtype), precision, key)

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
