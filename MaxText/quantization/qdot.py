"""The quantized matmul: y = x . w per a recipe, on the backend the recipe resolves to, differentiable with the
recipe's backward (fprop, dgrad and wgrad GEMMs: backends/base.py), plus optional quantization telemetry."""

import functools

import jax
import jax.numpy as jnp

from MaxText.quantization import backends
from MaxText.quantization import partition as partition_lib
from MaxText.quantization import stats as stats_lib
from MaxText.quantization.backends import emulated, te
from MaxText.quantization.backends.base import REMAT_NAME, OperandBackend, split_grad_keys
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
  keys = dict(zip(("dy", "dy_t"), split_grad_keys(key)))
  operands = {"x": x_MxK, "w": w_KxN.T, "dy": dy_MxN, "w_t": w_KxN, "x_t": x_MxK.T, "dy_t": dy_MxN.T}
  sink_grad = jnp.stack(
    [
      stats_lib.operand_stats(operands[r], recipe, r, emulated.quantize_operand(operands[r], recipe, r, keys.get(r)))
      for r in stats_lib.ROLES
    ]
  )
  return jnp.zeros_like(x_MxK), jnp.zeros_like(w_KxN), None, sink_grad


_stats_probe.defvjp(_stats_probe_fwd, _stats_probe_bwd)


def qmatmul(x, w, recipe: Recipe, *, key=None, backend=backends.Choice.AUTO, stats_sink=None, kernels=Kernels.AUTO):
  """x [M, K] . w [K, N] (flax kernel layout) per `recipe`; differentiable with the recipe's backward.

  The result has x's dtype (bf16 in training), accumulated in f32. `key` feeds stochastic
  rounding of the gradients; it may be None when the recipe has none. BF16 is a plain dot.
  `backend`: a backends.Choice (AUTO: TE where it can run the recipe, else xla where its block-scaled dot is
  native, else emulated; TE, XLA, EMULATE) or a Backend object itself.
  `stats_sink`: optional zeros [len(ROLES), len(STATS)] (stats.empty_sink()); its gradient is
  each operand's quantization telemetry (stats.operand_stats); the GEMM itself is unchanged.
  `kernels`: the emulated backend's quantizers (quantizer_impl.Kernels): AUTO (Pallas Triton kernels on NVIDIA
  GPUs, else XLA), PALLAS, XLA, or INTERPRET (the kernels in Pallas interpret mode, for tests); the same bits.
  """
  if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
    raise ValueError(f"qmatmul: expects x [M, K] and w [K, N], got {tuple(x.shape)} and {tuple(w.shape)}")
  if not recipe.quantized:
    return backends.BF16.matmul(x, w, recipe, key=None, kernels=kernels)
  if recipe.stateful:
    raise ValueError(
      f"{recipe.name} keeps an amax history: call MaxText.quantization.delayed.qmatmul_delayed with its state"
    )
  key = _as_key(key, recipe)
  chosen = backend if hasattr(backend, "matmul") else backends.resolve(recipe, backend)
  y = chosen.matmul(x, w, recipe, key=key, kernels=kernels)
  if stats_sink is not None:
    y = y + _stats_probe(x, w, key, stats_sink, recipe)
  return y


def qdense(
  x,
  w,
  recipe: Recipe,
  *,
  key=None,
  backend=backends.Choice.AUTO,
  stats_sink=None,
  kernels=Kernels.AUTO,
  partition: partition_lib.GemmAxes = None,
):
  """x [..., K] . w [K, *out] per `recipe` -> [..., *out] (the Dense-layer hook).

  `partition`: the mesh axes splitting each dimension (partition.GemmAxes). Under a mesh that splits them, an operand
  backend's GEMM (emulated, xla) runs partitioned: each device quantizes its own shard and the collectives are the
  BF16 GEMM's (partition.py), the quantized bits one device's. TE's GEMMs take x and w with their own dimensions and
  are partitioned by TE's rules (te.mesh_resource); BF16 and delayed scaling are one global computation that XLA
  partitions."""
  *lead, k = x.shape
  out = w.shape[1:]
  if not recipe.quantized or recipe.stateful:
    return qmatmul(x.reshape(-1, k), w.reshape(k, -1), recipe, key=key, backend=backend, kernels=kernels).reshape(
      *lead, *out
    )
  key = _as_key(key, recipe)
  chosen = backend if hasattr(backend, "matmul") else backends.resolve(recipe, backend)
  if partition_lib.active(partition) and isinstance(chosen, OperandBackend):
    y = partition_lib.qdense(x, w, recipe, chosen, key=key, kernels=kernels, axes=partition)
  elif chosen is backends.TE:
    y = te.qmatmul(x, w, recipe, key=key, checkpoint_name=REMAT_NAME)
  else:
    y = chosen.matmul(x.reshape(-1, k), w.reshape(k, -1), recipe, key=key, kernels=kernels).reshape(*lead, *out)
  if stats_sink is not None:
    probe = _stats_probe(x.reshape(-1, k), w.reshape(k, -1), key, stats_sink, recipe)
    y = y + probe.reshape(y.shape)
  return y
