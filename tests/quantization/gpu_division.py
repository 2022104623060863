"""A CPU stand-in for XLA's f32 division on NVIDIA GPUs: quotients up to one ulp off (test helper).

XLA lowers f32 division on NVIDIA GPUs to `div.full.f32`, which is not correctly rounded (measured
on an H100: 29% of random quotients, 29% of 2688/amax and 14% of 1/x one ulp off IEEE). Inside
`gpu_like_division()`, every f32 `lax.div` jitted on CPU (`x / y`, `1 / x`, `jnp.reciprocal`)
computes the IEEE quotient and then moves a deterministic ~30% of the finite nonzero results one
ulp up or down (chosen by a hash of the quotient's bits), so code whose bits depend on division
rounding gives different bits here than outside, as it does on a GPU.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.interpreters import mlir
from jax._src.lax import lax as lax_internal
from jax._src.lib.mlir.dialects import hlo

SHARE_PERCENT = 30


def _one_ulp_off(q):
  bits = jax.lax.bitcast_convert_type(q, jnp.uint32)
  h = bits * np.uint32(0x9E3779B1)
  h = (h ^ (h >> 15)) * np.uint32(0x85EBCA77)
  h = h ^ (h >> 13)
  magnitude = bits & np.uint32(0x7FFFFFFF)
  moved = ((h % 100) < SHARE_PERCENT) & (magnitude > 0) & (magnitude < np.uint32(0x7F7FFFFF))
  up = ((h >> 24) & 1) == 1
  bits = jnp.where(moved, jnp.where(up, bits + np.uint32(1), bits - np.uint32(1)), bits)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _div_lowering(ctx, x, y, **params):
  (q,) = lax_internal._nary_lower_hlo(hlo.divide, ctx, x, y, **params)  # pylint: disable=protected-access
  aval_out = ctx.avals_out[0]
  if aval_out.dtype != np.float32:
    return [q]  # integer (and other float) division stays exact
  return mlir.lower_fun(_one_ulp_off, multiple_results=False)(ctx.replace(avals_in=[aval_out]), q)


@contextlib.contextmanager
def gpu_like_division():
  """Within the block, f32 division jitted on CPU rounds like an NVIDIA GPU's (caches cleared on entry and exit)."""
  rules = mlir._platform_specific_lowerings["cpu"]  # pylint: disable=protected-access
  previous = rules.get(lax_internal.div_p)
  jax.clear_caches()
  mlir.register_lowering(lax_internal.div_p, _div_lowering, platform="cpu")
  try:
    yield
  finally:
    if previous is None:
      rules.pop(lax_internal.div_p, None)
    else:
      rules[lax_internal.div_p] = previous
    jax.clear_caches()
