"""The quantized Dense: y = x . w per a recipe, on the backend the request resolves to (once), differentiable with
the recipe's forward and backward GEMMs, over N-D operands on any mesh (one device being the trivial one); the
options are the call's: partitioning (the mesh axes of each dimension), delayed scaling's amax history, telemetry."""

import functools

import jax
import jax.numpy as jnp

from MaxText.quantization import backends, gemms
from MaxText.quantization import stats as stats_lib
from MaxText.quantization.backends import emulated
from MaxText.quantization.gemms import REMAT_NAME
from MaxText.quantization.kernels.quantizer_impl import Kernels
from MaxText.quantization.recipes import Recipe

_FIXED_KEY = 0  # feeds SR-free recipes, which never draw from it
__all__ = ["REMAT_NAME", "qdense", "qmatmul"]


def _as_key(key, recipe):
  if key is None:
    if recipe.needs_rng:
      raise ValueError(
        f"{recipe.name}: stochastic rounding needs a PRNG key (pass key=..., or set disable_stochastic_rounding=True)"
      )
    return jax.random.key(_FIXED_KEY)
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key)
  return key


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _stats_probe(x_MxK, w_KxN, key, sink, recipe):
  """Zeros [M, N] added to the GEMM's output: its backward sees dy and returns the telemetry as the
  sink's gradient, whichever backend ran the GEMM. Operands are quantized as the GEMM's are (same keys)."""
  return jnp.zeros((x_MxK.shape[0], w_KxN.shape[1]), x_MxK.dtype)


def _stats_probe_fwd(x_MxK, w_KxN, key, sink, recipe):
  return _stats_probe(x_MxK, w_KxN, key, sink, recipe), (x_MxK, w_KxN, key)


def _stats_probe_bwd(recipe, residuals, dy_MxN):
  x_MxK, w_KxN, key = residuals
  inputs, keys = {"x": x_MxK, "w": w_KxN, "dy": dy_MxN}, gemms.grad_keys(key)

  def stats(role):
    source, transpose = gemms.OPERANDS[role]
    operand = inputs[source].T if transpose else inputs[source]  # as the role's quantizer reads it
    return stats_lib.operand_stats(
      operand, recipe, role, emulated.quantize_operand(operand, recipe, role, keys.get(role))
    )

  sink_grad = jnp.stack([stats(role) for role in stats_lib.ROLES])
  return jnp.zeros_like(x_MxK), jnp.zeros_like(w_KxN), None, sink_grad


_stats_probe.defvjp(_stats_probe_fwd, _stats_probe_bwd)


def qdense(
  x,
  w,
  recipe: Recipe,
  *,
  key=None,
  backend=backends.Choice.AUTO,
  kernels=Kernels.AUTO,
  partition=None,
  history=None,
  stats_sink=None,
):
  """x [..., K] . w [K, *out] (flax kernel layout) per `recipe` -> [..., *out] in x's dtype, accumulated in f32;
  differentiable with the recipe's backward, dw in w's dtype (the Dense layer's one call).

  `key` feeds stochastic rounding of the gradients; it may be None when the recipe has none. `backend`: a
  backends.Choice (AUTO: TE where it can run the recipe, else xla where its block-scaled dot is native, else
  emulated; TE, XLA, EMULATE), a registered backend's name or a Backend; resolved once here (an unquantized recipe:
  BF16's plain dot). `kernels`: the quantizers' implementation (quantizer_impl.Kernels: AUTO, PALLAS, XLA,
  INTERPRET; the same bits). `partition`: the mesh axes splitting each dimension (partition.GemmAxes): under a mesh
  that splits them, a backend of quantizers and a GEMM runs the GEMMs partitioned (each device quantizes its own
  shard, the collectives the BF16 GEMM's); TE partitions by its own rules, BF16 and per-tensor FP8's linear layer are
  one global computation XLA partitions. `history`: a stateful recipe's amax history (delayed.init_history); its
  gradient is the new history. `stats_sink`: zeros [len(ROLES), len(STATS)] (stats.empty_sink()) whose gradient is
  each operand's quantization telemetry (stats.operand_stats) for the stateless recipes; the GEMM is unchanged."""
  if recipe.stateful and history is None:
    raise ValueError(f"{recipe.name} keeps an amax history: pass history= (delayed.init_history)")
  chosen = backends.resolve(recipe, backend)
  key = _as_key(key, recipe) if recipe.quantized and not recipe.stateful else None
  y = chosen.dense(x, w, recipe, key=key, kernels=kernels, partition=partition, history=history)
  if stats_sink is not None and key is not None:
    k = x.shape[-1]
    y = y + _stats_probe(x.reshape(-1, k), w.reshape(k, -1), key, stats_sink, recipe).reshape(y.shape)
  return y


def qmatmul(x, w, recipe: Recipe, *, key=None, backend=backends.Choice.AUTO, stats_sink=None, kernels=Kernels.AUTO):
  """qdense of x [M, K] and w [K, N] on one device (a stateless recipe): y [M, N]."""
  if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
    raise ValueError(f"qmatmul: expects x [M, K] and w [K, N], got {tuple(x.shape)} and {tuple(w.shape)}")
  if recipe.stateful:
    raise ValueError(f"{recipe.name} keeps an amax history: call qdense with history= (or delayed.qmatmul_delayed)")
  return qdense(x, w, recipe, key=key, backend=backend, stats_sink=stats_sink, kernels=kernels)
