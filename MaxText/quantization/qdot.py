"""The quantized matmul: y = x . w with the recipe's fprop, dgrad and wgrad GEMMs (custom_vjp)."""

import functools

import jax
import jax.numpy as jnp

from MaxText.quantization import backends
from MaxText.quantization import emulated
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


def qmatmul(x, w, recipe: Recipe, *, key=None, backend="auto"):
  """x [M, K] . w [K, N] (flax kernel layout) per `recipe`; differentiable with the recipe's backward.

  The result has x's dtype (bf16 in training), accumulated in f32. `key` feeds stochastic
  rounding of the gradients; it may be None when the recipe has none. BF16 is a plain dot.
  `backend`: auto (TE where it can run the recipe, else emulated), te, or emulate.
  """
  if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
    raise ValueError(f"qmatmul: expects x [M, K] and w [K, N], got {tuple(x.shape)} and {tuple(w.shape)}")
  if not recipe.quantized:
    return jnp.dot(x, w.astype(x.dtype), preferred_element_type=jnp.float32).astype(x.dtype)
  if recipe.stateful:
    raise ValueError(f"{recipe.name} keeps an amax history: call MaxText.quantization.delayed."
                     "qmatmul_delayed with its state")
  if backends.resolve(recipe, backend) == "te":
    return te_backend.qmatmul(x, w, recipe, key=key)
  return _qmatmul_emulated(x, w, _as_key(key, recipe), recipe)


# jit at the edge: eager calls compile once per shape; inside a jitted model this just inlines.
_qmatmul_emulated = jax.jit(_qmatmul_2d, static_argnums=(3,))


def qdense(x, w, recipe: Recipe, *, key=None, backend="auto"):
  """x [..., K] . w [K, N] per `recipe`: flattens leading axes into rows (the Dense-layer hook)."""
  *lead, k = x.shape
  y = qmatmul(x.reshape(-1, k), w, recipe, key=key, backend=backend)
  return y.reshape(*lead, w.shape[1])
