"""The quantized matmul: y = x . w with the recipe's fprop, dgrad and wgrad GEMMs (custom_vjp)."""

import functools

import jax
import jax.numpy as jnp

from MaxText.quantization import backends
from MaxText.quantization import emulated
from MaxText.quantization import stats as stats_lib
from MaxText.quantization import te_backend
from MaxText.quantization.recipes import Recipe

_FIXED_KEY = 0  # feeds SR-free recipes, which never draw from it


def _split_grad_keys(key):
  k_dgrad, k_wgrad = jax.random.split(key)
  return k_dgrad, k_wgrad


def _as_key(key, recipe):
  if key is None:
    if recipe.needs_rng:
      raise ValueError(f"{recipe.name}: stochastic rounding needs a PRNG key (pass key=..., or set "
                       "disable_stochastic_rounding=True)")
    return jax.random.key(_FIXED_KEY)
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key)
  return key


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _qmatmul_2d(x_MxK, w_KxN, key, recipe):
  y, _ = _qmatmul_fwd(x_MxK, w_KxN, key, recipe)
  return y


def _qmatmul_fwd(x_MxK, w_KxN, key, recipe):
  xq = emulated.quantize_operand(x_MxK, recipe, "x")
  wq = emulated.quantize_operand(w_KxN.T, recipe, "w")
  y_MxN = emulated.gemm(xq, wq).astype(x_MxK.dtype)
  return y_MxN, (x_MxK, w_KxN, key)


def _qmatmul_bwd(recipe, residuals, dy_MxN):
  x_MxK, w_KxN, key = residuals
  k_dgrad, k_wgrad = _split_grad_keys(key)
  dyq = emulated.quantize_operand(dy_MxN, recipe, "dy", k_dgrad)
  wq_t = emulated.quantize_operand(w_KxN, recipe, "w_t")
  dx_MxK = emulated.gemm(dyq, wq_t).astype(x_MxK.dtype)
  xq_t = emulated.quantize_operand(x_MxK.T, recipe, "x_t")
  dyq_t = emulated.quantize_operand(dy_MxN.T, recipe, "dy_t", k_wgrad)
  # Rounded to the compute dtype like TE's GEMM output, then to the master weights' dtype.
  dw_KxN = emulated.gemm(xq_t, dyq_t).astype(x_MxK.dtype).astype(w_KxN.dtype)
  return dx_MxK, dw_KxN, None


_qmatmul_2d.defvjp(_qmatmul_fwd, _qmatmul_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _stats_probe(x_MxK, w_KxN, key, sink, recipe):
  """Zeros [M, N] added to the GEMM's output: its backward sees dy and returns the telemetry as the
  sink's gradient, whichever backend ran the GEMM. Operands are quantized as the GEMM's are (same keys)."""
  return jnp.zeros((x_MxK.shape[0], w_KxN.shape[1]), x_MxK.dtype)


def _stats_probe_fwd(x_MxK, w_KxN, key, sink, recipe):
  return _stats_probe(x_MxK, w_KxN, key, sink, recipe), (x_MxK, w_KxN, key)


def _stats_probe_bwd(recipe, residuals, dy_MxN):
  x_MxK, w_KxN, key = residuals
  keys = dict(zip(("dy", "dy_t"), _split_grad_keys(key)))
  operands = {"x": x_MxK, "w": w_KxN.T, "dy": dy_MxN, "w_t": w_KxN, "x_t": x_MxK.T, "dy_t": dy_MxN.T}
  sink_grad = jnp.stack([
      stats_lib.operand_stats(operands[r], recipe, r,
                              emulated.quantize_operand(operands[r], recipe, r, keys.get(r)))
      for r in stats_lib.ROLES])
  return jnp.zeros_like(x_MxK), jnp.zeros_like(w_KxN), None, sink_grad


_stats_probe.defvjp(_stats_probe_fwd, _stats_probe_bwd)


def qmatmul(x, w, recipe: Recipe, *, key=None, backend="auto", stats_sink=None):
  """x [M, K] . w [K, N] (flax kernel layout) per `recipe`; differentiable with the recipe's backward.

  The result has x's dtype (bf16 in training), accumulated in f32. `key` feeds stochastic
  rounding of the gradients; it may be None when the recipe has none. BF16 is a plain dot.
  `backend`: auto (TE where it can run the recipe, else emulated), te, or emulate.
  `stats_sink`: optional zeros [len(ROLES), len(STATS)] (stats.empty_sink()); its gradient is
  each operand's quantization telemetry (stats.operand_stats); the GEMM itself is unchanged.
  """
  if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
    raise ValueError(f"qmatmul: expects x [M, K] and w [K, N], got {tuple(x.shape)} and {tuple(w.shape)}")
  if not recipe.quantized:
    return jnp.dot(x, w.astype(x.dtype), preferred_element_type=jnp.float32).astype(x.dtype)
  if recipe.stateful:
    raise ValueError(f"{recipe.name} keeps an amax history: call MaxText.quantization.delayed."
                     "qmatmul_delayed with its state")
  key = _as_key(key, recipe)
  if backends.resolve(recipe, backend) == "te":
    y = te_backend.qmatmul(x, w, recipe, key=key)
  else:
    y = _qmatmul_emulated(x, w, key, recipe)
  if stats_sink is not None:
    y = y + _stats_probe(x, w, key, stats_sink, recipe)
  return y


# jit at the edge: eager calls compile once per shape; inside a jitted model this just inlines.
_qmatmul_emulated = jax.jit(_qmatmul_2d, static_argnums=(3,))


def qdense(x, w, recipe: Recipe, *, key=None, backend="auto", stats_sink=None):
  """x [..., K] . w [K, N] per `recipe`: flattens leading axes into rows (the Dense-layer hook)."""
  *lead, k = x.shape
  y = qmatmul(x.reshape(-1, k), w, recipe, key=key, backend=backend, stats_sink=stats_sink)
  return y.reshape(*lead, w.shape[1])
