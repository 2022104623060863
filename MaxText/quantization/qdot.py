"""The quantized matmul: y = x . w with the recipe's fprop, dgrad and wgrad GEMMs (custom_vjp).

With a backward_override (NVFP4, TE's option) only fprop is quantized: dgrad and wgrad run in the compute dtype
on the unquantized x, w, dy (high_precision) or on the forward's quantized x and w, dequantized, and the
unquantized dy (dequantized).
"""

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from MaxText.quantization import backends
from MaxText.quantization import dots
from MaxText.quantization import emulated
from MaxText.quantization import stats as stats_lib
from MaxText.quantization import te_backend
from MaxText.quantization import xla_backend
from MaxText.quantization.recipes import Recipe

_FIXED_KEY = 0  # feeds SR-free recipes, which never draw from it
# The name of quantized operands kept for the backward GEMMs (jax.checkpoint_policies.save_only_these_names).
REMAT_NAME = "quantization"


def name_for_remat(operand):
  """Tag a quantized operand kept for the backward with REMAT_NAME."""
  return jax.tree.map(lambda a: checkpoint_name(a, REMAT_NAME), operand)


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


def _quantize(backend, kernels, x, recipe, role, key=None, transpose=False):
  """One operand, x or x.T, quantized for `backend`'s GEMM ('emulated' or 'xla'); `kernels` picks the emulated
  quantizers' implementation (quantizer_impl), whose kernels read x itself for a transposed operand."""
  if backend == "xla":
    return xla_backend.quantize_for_gemm(x.T if transpose else x, recipe, role, key)
  return emulated.quantize_for_gemm(x, recipe, role, key, kernels=kernels, transpose=transpose)


def _gemm(backend, a, b_t, recipe):
  return xla_backend.gemm(a, b_t) if backend == "xla" else emulated.gemm(a, b_t, recipe)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _qmatmul_2d(x_MxK, w_KxN, key, recipe, w_dtype, backend, kernels):
  y, _ = _qmatmul_fwd(x_MxK, w_KxN, key, recipe, w_dtype, backend, kernels)
  return y


def _qmatmul_fwd(x_MxK, w_KxN, key, recipe, w_dtype, backend, kernels):
  del w_dtype
  x_op = _quantize(backend, kernels, x_MxK, recipe, "x")
  w_op = _quantize(backend, kernels, w_KxN, recipe, "w", transpose=True)
  y_MxN = _gemm(backend, x_op, w_op, recipe).astype(x_MxK.dtype)
  if recipe.backward_override == "high_precision":
    return y_MxN, (x_MxK, w_KxN, key)
  if recipe.backward_override == "dequantized":  # the forward's operands, kept (or rematerialized) as they are
    return y_MxN, (name_for_remat(x_op), name_for_remat(w_op), key)
  # What the backward needs: a quantized operand where its transposed role has the same numbers
  # (named, so a remat policy can keep it instead of quantizing again), else the input itself.
  x_res = name_for_remat(x_op.T) if recipe.shares_transpose("x") else x_MxK
  w_res = name_for_remat(w_op.T) if recipe.shares_transpose("w") else w_KxN
  return y_MxN, (x_res, w_res, key)


def _bwd_in_compute_dtype(recipe, w_dtype, backend, residuals, dy_MxN):
  """dgrad and wgrad of a backward_override: GEMMs on dy's dtype (the compute dtype), f32 accumulation."""
  x_res, w_res, _ = residuals
  dtype = dy_MxN.dtype
  if recipe.backward_override == "dequantized":
    dequantize = (lambda op: op.dequantize(dtype)) if backend == "xla" else (
        lambda op: emulated.dequantize_gemm_operand(op, recipe, dtype))
    x_MxK, w_NxK = dequantize(x_res), dequantize(w_res)
  else:
    x_MxK, w_NxK = x_res.astype(dtype), w_res.T.astype(dtype)
  dot = lambda a, b, dims: jax.lax.dot_general(a, b, (dims, ((), ())), preferred_element_type=jnp.float32)
  dx_MxK = dot(dy_MxN, w_NxK, ((1,), (0,))).astype(dtype)
  dw_KxN = dot(x_MxK, dy_MxN, ((0,), (0,))).astype(dtype).astype(w_dtype)
  return dx_MxK, dw_KxN, None


def _qmatmul_bwd(recipe, w_dtype, backend, kernels, residuals, dy_MxN):
  if not recipe.quantized_backward:
    return _bwd_in_compute_dtype(recipe, w_dtype, backend, residuals, dy_MxN)
  x_res, w_res, key = residuals
  k_dgrad, k_wgrad = _split_grad_keys(key)
  dy_op = _quantize(backend, kernels, dy_MxN, recipe, "dy", k_dgrad)
  w_t_op = w_res if recipe.shares_transpose("w") else _quantize(backend, kernels, w_res, recipe, "w_t")
  dx_MxK = _gemm(backend, dy_op, w_t_op, recipe).astype(dy_MxN.dtype)
  x_t_op = x_res if recipe.shares_transpose("x") else _quantize(backend, kernels, x_res, recipe, "x_t", transpose=True)
  dy_t_op = (dy_op.T if recipe.shares_transpose("dy")
             else _quantize(backend, kernels, dy_MxN, recipe, "dy_t", k_wgrad, transpose=True))
  # Rounded to the compute dtype like TE's GEMM output, then to the master weights' dtype.
  dw_KxN = _gemm(backend, x_t_op, dy_t_op, recipe).astype(dy_MxN.dtype).astype(w_dtype)
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


def qmatmul(x, w, recipe: Recipe, *, key=None, backend="auto", stats_sink=None, kernels="auto"):
  """x [M, K] . w [K, N] (flax kernel layout) per `recipe`; differentiable with the recipe's backward.

  The result has x's dtype (bf16 in training), accumulated in f32. `key` feeds stochastic
  rounding of the gradients; it may be None when the recipe has none. BF16 is a plain dot.
  `backend`: auto (TE where it can run the recipe, else xla where its block-scaled dot is native,
  else emulated), te, xla (jax.nn.scaled_matmul on our quantized operands) or emulate.
  `stats_sink`: optional zeros [len(ROLES), len(STATS)] (stats.empty_sink()); its gradient is
  each operand's quantization telemetry (stats.operand_stats); the GEMM itself is unchanged.
  `kernels`: the emulated backend's quantizers: auto (Pallas Triton kernels on NVIDIA GPUs, else XLA), pallas,
  xla, or interpret (the kernels in Pallas interpret mode, for tests); the same bits every way.
  """
  if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
    raise ValueError(f"qmatmul: expects x [M, K] and w [K, N], got {tuple(x.shape)} and {tuple(w.shape)}")
  if not recipe.quantized:
    return dots.matmul(x, w)
  if recipe.stateful:
    raise ValueError(f"{recipe.name} keeps an amax history: call MaxText.quantization.delayed."
                     "qmatmul_delayed with its state")
  key = _as_key(key, recipe)
  resolved = backends.resolve(recipe, backend)
  if resolved == "te":
    y = te_backend.qmatmul(x, w, recipe, key=key, checkpoint_name=REMAT_NAME)
  else:
    y = _qmatmul_jit(x, w, key, recipe, jnp.dtype(w.dtype), resolved, kernels)
  if stats_sink is not None:
    y = y + _stats_probe(x, w, key, stats_sink, recipe)
  return y


# jit at the edge: eager calls compile once per shape; inside a jitted model this just inlines.
_qmatmul_jit = jax.jit(_qmatmul_2d, static_argnums=(3, 4, 5, 6))


def qdense(x, w, recipe: Recipe, *, key=None, backend="auto", stats_sink=None, kernels="auto"):
  """x [..., K] . w [K, N] per `recipe`: flattens leading axes into rows (the Dense-layer hook)."""
  *lead, k = x.shape
  y = qmatmul(x.reshape(-1, k), w, recipe, key=key, backend=backend, stats_sink=stats_sink, kernels=kernels)
  return y.reshape(*lead, w.shape[1])
