"""The three GEMMs of a quantized Dense, written once: y = x . w (fprop), dx = dy . w^T (dgrad), dw = x^T . dy (wgrad).

`derive(recipe)` is the one place that says which quantized operand (role) each GEMM reads, what the forward keeps for
the backward and which stochastic-rounding key each gradient operand draws from. `forward` and `backward` compute one
device's block of the three GEMMs with a backend's quantizers and GEMM, through a `Shards`: how that block lies in
the whole operands (`ONE_DEVICE`: it is the whole operand; partition.py's: a shard of an operand split over a mesh,
with the collectives the BF16 step has). `dense_2d` is their custom_vjp on one device; partition.py runs the same two
functions per device under shard_map.

With a backward_override (NVFP4, TE's option) only fprop is quantized: dgrad and wgrad run in the compute dtype on the
unquantized x, w, dy (high_precision) or on the forward's quantized x and w, dequantized, and the unquantized dy
(dequantized).
"""

import dataclasses
import functools
import typing

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from MaxText.quantization import cpu_gemm
from MaxText.quantization.recipes import Recipe

# The name of quantized operands kept for the backward GEMMs (jax.checkpoint_policies.save_only_these_names).
REMAT_NAME = "quantization"
F32 = jnp.float32


class Operand(typing.NamedTuple):
  """A GEMM operand role: the input it is quantized from and whether from its transpose (each operand is quantized as
  [rows, contraction], its blocks along the contraction)."""

  source: str  # "x" [M, K], "w" [K, N] or "dy" [M, N]
  transpose: bool


# Operand roles (recipes.ROLES) of the three GEMMs, each the pair (a, b) of a [M, K] . b [N, K]^T.
OPERANDS = {
  "x": Operand("x", False),
  "w": Operand("w", True),  # w^T [N, K]
  "dy": Operand("dy", False),
  "w_t": Operand("w", False),  # w [K, N]: dgrad contracts N
  "x_t": Operand("x", True),  # x^T [K, M]: wgrad contracts the tokens
  "dy_t": Operand("dy", True),  # dy^T [N, M]
}
GEMMS = {"fprop": ("x", "w"), "dgrad": ("dy", "w_t"), "wgrad": ("x_t", "dy_t")}


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a recipe's three GEMMs read and keep (`derive`)."""

  # "quantized": dgrad and wgrad on quantized operands; "high_precision" / "dequantized": in the compute dtype.
  backward: str
  # What the forward keeps of x and of w for the backward: "input" (the input itself), "transposed" (its quantized
  # operand transposed: the backward role has the same numbers), "operand" (its quantized operand, to dequantize).
  kept: tuple  # ((x's), (w's))
  # Backward roles that are the transpose of another quantized operand (the same numbers, quantized once).
  transposes: tuple  # ((role, the role it transposes), ...)

  def keeps(self, source, what):
    return dict(self.kept)[source] == what

  def transpose_of(self, role):
    return dict(self.transposes).get(role)


@functools.lru_cache(maxsize=None)
def derive(recipe: Recipe) -> Plan:
  """The Plan of `recipe`'s three GEMMs, on one device and partitioned alike."""
  if not recipe.quantized:
    raise ValueError(f"{recipe.name or 'bf16'} quantizes no operand: its GEMMs are the compute dtype's")
  if recipe.backward_override == "high_precision":
    return Plan("high_precision", (("x", "input"), ("w", "input")), ())
  if recipe.backward_override == "dequantized":
    return Plan("dequantized", (("x", "operand"), ("w", "operand")), ())
  shared = {source: recipe.shares_transpose(source) for source in ("x", "w", "dy")}
  kept = tuple((source, "transposed" if shared[source] else "input") for source in ("x", "w"))
  transposes = tuple((role, source) for role, source in (("w_t", "w"), ("x_t", "x"), ("dy_t", "dy")) if shared[source])
  return Plan("quantized", kept, transposes)


def grad_keys(key):
  """{gradient role: its stochastic-rounding key}: dgrad's dy and wgrad's dy^T, one stream each."""
  k_dgrad, k_wgrad = jax.random.split(key)
  return {"dy": k_dgrad, "dy_t": k_wgrad}


def name_for_remat(operand):
  """Tag a quantized operand kept for the backward with REMAT_NAME."""
  return jax.tree.map(lambda a: checkpoint_name(a, REMAT_NAME), operand)


class Static(typing.NamedTuple):
  """What the GEMMs keep static (hashable): the recipe, the backend (its quantize, gemm, dequantize), the quantizers'
  implementation and the weights' dtype (dw's)."""

  recipe: Recipe
  backend: typing.Any
  kernels: typing.Any
  w_dtype: typing.Any


class Shards:
  """How one device's blocks x [M, K], w [K, N], dy [M, N] lie in the whole operands; this one: they are the whole
  operands (one device). partition.py's splits them over a mesh: amax and SR draws of the whole operand, w gathered,
  partial sums reduced."""

  splits_k = False  # whether fprop's contraction is split (its partial sums then add in f32)

  def quantize(self, static: Static, a, role, key=None):
    """`a` quantized for `role` (its source's block: a, or a^T for a transposed role)."""
    transpose = OPERANDS[role].transpose
    return static.backend.quantize(a, static.recipe, role, key, kernels=static.kernels, transpose=transpose)

  def gather(self, w_op, role):
    """A quantized w operand ("w": w^T [N, K], "w_t": w [K, N]) gathered where the GEMM needs more of it."""
    del role
    return w_op

  def gather_input(self, w_KxN):
    return w_KxN

  def sum_k(self, y_MxN):
    return y_MxN

  def sum_dx(self, dx_MxK):
    return dx_MxK

  def reduce_dw(self, dw_KxN):
    """dw's partial sums over this device's tokens, reduced onto w's block."""
    return dw_KxN


ONE_DEVICE = Shards()


def forward(shards: Shards, static: Static, x_MxK, w_KxN):
  """(y [M, N] in x's dtype, the quantized operands the forward keeps: (x's, w's), None where it keeps none)."""
  recipe, plan = static.recipe, derive(static.recipe)
  x_op = shards.quantize(static, x_MxK, "x")
  w_op = shards.gather(shards.quantize(static, w_KxN, "w"), "w")  # w^T [N, K]
  # In the compute dtype where nothing sums it first (a backend whose dot writes it directly does).
  y_MxN = static.backend.gemm(x_op, w_op, recipe, F32 if shards.splits_k else x_MxK.dtype)
  y_MxN = shards.sum_k(y_MxN).astype(x_MxK.dtype)
  return y_MxN, (_kept_operand(plan, "x", x_op), _kept_operand(plan, "w", w_op))


def _kept_operand(plan: Plan, source, op):
  """What the forward keeps of `source`'s quantized operand: it, its transpose, or nothing (the input is kept)."""
  if plan.keeps(source, "operand"):
    return op
  return op.T if plan.keeps(source, "transposed") else None


def kept_inputs(static: Static, x, w):
  """(x, w) where the backward reads the input itself, else None."""
  plan = derive(static.recipe)
  return tuple(a if plan.keeps(s, "input") else None for s, a in (("x", x), ("w", w)))


def backward(shards: Shards, static: Static, inputs, kept, key, dy_MxN):
  """(dx [M, K] in dy's dtype, dw in the weights' dtype) from the kept inputs (x [M, K], w [K, N]) and operands."""
  if derive(static.recipe).backward == "quantized":
    dx_MxK, dw_KxN = _quantized_backward(shards, static, inputs, kept, key, dy_MxN)
  else:
    dx_MxK, dw_KxN = _compute_dtype_backward(shards, static, inputs, kept, dy_MxN)
  return shards.sum_dx(dx_MxK), shards.reduce_dw(dw_KxN).astype(static.w_dtype)


def _quantized_backward(shards: Shards, static: Static, inputs, kept, key, dy_MxN):
  """dgrad and wgrad on quantized operands, each rounded to the compute dtype like TE's GEMM output (and BF16's)."""
  recipe, backend, plan = static.recipe, static.backend, derive(static.recipe)
  (x_MxK, w_KxN), (x_t_kept, w_t_kept), keys, dtype = inputs, kept, grad_keys(key), dy_MxN.dtype
  dy_op = shards.quantize(static, dy_MxN, "dy", keys["dy"])
  w_t_op = w_t_kept if plan.transpose_of("w_t") else shards.gather(shards.quantize(static, w_KxN, "w_t"), "w_t")
  dx_MxK = backend.gemm(dy_op, w_t_op, recipe, dtype).astype(dtype)
  x_t_op = x_t_kept if plan.transpose_of("x_t") else shards.quantize(static, x_MxK, "x_t")
  dy_t_op = dy_op.T if plan.transpose_of("dy_t") else shards.quantize(static, dy_MxN, "dy_t", keys["dy_t"])
  return dx_MxK, backend.gemm(x_t_op, dy_t_op, recipe, dtype).astype(dtype)


def _compute_dtype_backward(shards: Shards, static: Static, inputs, kept, dy_MxN):
  """dgrad and wgrad of a backward_override: GEMMs on dy's dtype (the compute dtype), f32 accumulation, on the inputs
  (high_precision) or the forward's quantized x and w^T [N, K], dequantized (dequantized)."""
  dtype = dy_MxN.dtype
  if derive(static.recipe).backward == "dequantized":
    x_MxK, w_NxK = (static.backend.dequantize(op, static.recipe, dtype) for op in kept)
  else:
    x_MxK, w_NxK = inputs[0].astype(dtype), shards.gather_input(inputs[1]).T.astype(dtype)

  def dot(a, b, dims):
    contract = functools.partial(jax.lax.dot_general, dimension_numbers=(dims, ((), ())), preferred_element_type=F32)
    return cpu_gemm.gemm(contract, a, b)

  return dot(dy_MxN, w_NxK, ((1,), (0,))).astype(dtype), dot(x_MxK, dy_MxN, ((0,), (0,))).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _dense_2d(x_MxK, w_KxN, key, static: Static):
  return forward(ONE_DEVICE, static, x_MxK, w_KxN)[0]


def _dense_2d_fwd(x_MxK, w_KxN, key, static: Static):
  y_MxN, kept = forward(ONE_DEVICE, static, x_MxK, w_KxN)
  # The kept quantized operands named: a remat policy can keep them instead of quantizing again.
  return y_MxN, (kept_inputs(static, x_MxK, w_KxN), name_for_remat(kept), key)


def _dense_2d_bwd(static: Static, residuals, dy_MxN):
  inputs, kept, key = residuals
  return (*backward(ONE_DEVICE, static, inputs, kept, key, dy_MxN), None)


_dense_2d.defvjp(_dense_2d_fwd, _dense_2d_bwd)
# jit at the edge: eager calls compile once per shape; inside a jitted model this just inlines.
_dense_2d_jit = jax.jit(_dense_2d, static_argnums=(3,))


def dense_2d(x_MxK, w_KxN, key, static: Static):
  """x [M, K] . w [K, N] on one device with the recipe's three GEMMs; differentiable (dw in the weights' dtype)."""
  return _dense_2d_jit(x_MxK, w_KxN, key, static)
