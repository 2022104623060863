"""Quantized GEMMs partitioned over a device mesh, as the BF16 ones are: each device quantizes its own shard of every
operand, and the collectives are the BF16 step's, on the quantized operands.

y [*rows, *out] = x [*rows, K] . w [K, *out], with `GemmAxes` saying which mesh axes split each dimension (the caller's
logical axis rules, passed in: this library knows no trainer). Under `shard_map`, per device:
  forward   x and w quantized where they lie (block scales from the shard's own blocks: shard boundaries fall on block
            boundaries, `check_blocks`; a per-tensor amax is one scalar all-reduce); the quantized w all-gathered over
            the axes that split it but not x (FSDP: what the BF16 step gathers, in bf16 or narrower); the local GEMM,
            summed over the axes that split K (tensor-parallel row GEMMs).
  backward  dy quantized where it lies, with the stochastic-rounding draws of its elements in the whole dy (`draws`);
            dgrad against the gathered quantized w^T, summed over the axes that split y's columns; wgrad on the
            shard's own tokens, reduce-scattered onto w's sharding (FSDP), all-reduced over the other token axes.
Every operand's quantized values are the bits one device computes for the whole tensor; the GEMMs' sums are split as
the BF16 step splits them (partial sums rounded to the compute dtype before they are reduced, as BF16's are).
"""

import dataclasses
import functools
import math
import typing

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from MaxText.quantization.backends.base import backward_in_compute_dtype, name_for_remat, split_grad_keys
from MaxText.quantization.errors import QuantizationError
from MaxText.quantization.formats import sr_bits
from MaxText.quantization.kernels import quantizer_impl, threefry
from MaxText.quantization.recipes import Recipe


class PartitionError(QuantizationError, ValueError):
  """A mesh or operand shape the partitioned quantized GEMM can't split: what, and what to change (one line)."""


@dataclasses.dataclass(frozen=True)
class GemmAxes:
  """The mesh axes splitting each dimension of y [*rows, *out] = x [*rows, K] . w [K, *out]: a tuple of mesh-axis
  names per dimension (major first, as in a PartitionSpec entry). Axes of size 1 may be named: they split nothing."""

  rows: tuple  # per leading (token) dimension of x, dy and y
  x_k: tuple  # x's contraction dimension (tensor parallelism of a row GEMM)
  w_k: tuple  # the kernel's contraction dimension
  w_out: tuple  # per output dimension of the kernel
  y_out: tuple  # per output dimension of y

  @property
  def x_spec(self):
    return P(*self.rows, self.x_k)

  @property
  def w_spec(self):
    return P(self.w_k, *self.w_out)

  @property
  def y_spec(self):
    return P(*self.rows, *self.y_out)

  @property
  def row_axes(self):
    return tuple(a for axes in self.rows for a in axes)

  def operand_axes(self, operand):
    """Every mesh axis splitting x, w or dy (what its per-tensor amax is reduced over)."""
    dims = {"x": (*self.rows, self.x_k), "w": (self.w_k, *self.w_out), "dy": (*self.rows, *self.y_out)}[operand]
    return tuple(a for axes in dims for a in axes)


def _minor_suffix(kept, split, what):
  """The axes of `split` after its prefix `kept`: what an all-gather over them (or a reduce-scatter onto them) moves,
  with the shards staying contiguous. PartitionError where `kept` is not a prefix of `split`."""
  kept, split = tuple(kept), tuple(split)
  if split[: len(kept)] != kept:
    raise PartitionError(
      f"partitioned quantized GEMM: {what} is split over mesh axes {kept or '()'} but the kernel's over {split}; "
      "the operand's axes must lead the kernel's (use the logical axis rules' order)"
    )
  return split[len(kept) :]


def _sizes(mesh, axes):
  return math.prod(mesh.shape[a] for a in axes)


def _shard_index(mesh, axes):
  """This device's shard along a dimension split over `axes` (inside shard_map), major axis first."""
  index = jnp.uint32(0)
  for a in axes:
    index = index * np.uint32(mesh.shape[a]) + jax.lax.axis_index(a).astype(jnp.uint32)
  return index


def global_indices(mesh, local_shape, dim_axes):
  """[prod(local_shape)] uint32: the row-major index, in the whole array, of each element of this device's block
  (inside shard_map), for dimensions of `local_shape` split over `dim_axes` (one tuple per dimension)."""
  global_shape = [n * _sizes(mesh, axes) for n, axes in zip(local_shape, dim_axes)]
  if math.prod(global_shape) >= 2**32:
    raise PartitionError(f"partitioned quantized GEMM: {global_shape} has 2**32 or more rows or columns")
  flat = jnp.zeros((), jnp.uint32)
  for n, axes, size in zip(local_shape, dim_axes, global_shape):
    start = _shard_index(mesh, axes) * np.uint32(n)
    flat = flat[..., None] * np.uint32(size) + (start + jnp.arange(n, dtype=jnp.uint32))
  return flat.reshape(-1)


def draws(key, global_shape, rows_u32, cols_u32):
  """grids.draws16(key, global_shape)[rows][:, cols]: the 16-bit stochastic-rounding draws of a shard's elements
  (global row and column indices), computed where they lie: each is a hash of (key, row, column), so nothing is
  drawn for other shards (sr_bits.py)."""
  del global_shape  # the draws depend on the element's row and column only
  return sr_bits.draws(key, rows_u32, cols_u32)


def check_key(key):
  """The SR key's draws can be recomputed per shard: jax's partitionable threefry (jax 0.5+'s default)."""
  if not threefry.reproducible(key, 1):
    raise PartitionError(
      "partitioned quantized GEMM with stochastic rounding needs jax's threefry PRNG with "
      "jax_threefry_partitionable=True (jax's default): each device draws its own elements' bits"
    )


class _Static(typing.NamedTuple):
  """What the partitioned GEMM's custom_vjp keeps static (hashable)."""

  recipe: Recipe
  w_dtype: typing.Any
  backend: typing.Any
  kernels: typing.Any
  axes: GemmAxes
  mesh: typing.Any
  rows_shape: tuple  # global leading dimensions of x
  out_shape: tuple  # global output dimensions of w


def _stack(tree):
  """Per-device arrays as one global array each ([1, ...] per device, the leading axis split over every mesh axis):
  how a residual that has no global meaning (a device's quantized shard) leaves shard_map."""
  return jax.tree.map(lambda a: jnp.asarray(a)[None], tree)


def _unstack(tree):
  return jax.tree.map(lambda a: a[0], tree)


def _gather(a, dims_axes, mesh):
  """a all-gathered along each dimension over its axes (a tuple of mesh axes per dimension, () for none)."""
  for dim, axes in enumerate(dims_axes):
    if axes and _sizes(mesh, axes) > 1:
      a = jax.lax.all_gather(a, axes, axis=dim, tiled=True)
  return a


def _gather_operand(q, lead_axes, lead_shape, col_axes, mesh):
  """A quantized operand [rows, cols] (rows flattened from dimensions `lead_shape`) all-gathered along its leading
  dimensions and its columns: values and block scales (blocks lie within shards), the per-tensor scale as it is."""

  def gather(a):
    if a is None:
      return None
    g = _gather(a.reshape(*lead_shape, a.shape[1]), (*lead_axes, col_axes), mesh)
    return g.reshape(-1, g.shape[-1])

  return dataclasses.replace(q, values=gather(q.values), scales=gather(q.scales))


def _local_shapes(static: _Static):
  """(local rows dims, local K of x, local K of w, local out dims of w, local out dims of y)."""
  mesh, axes = static.mesh, static.axes
  rows = tuple(n // _sizes(mesh, a) for n, a in zip(static.rows_shape, axes.rows))
  out_w = tuple(n // _sizes(mesh, a) for n, a in zip(static.out_shape, axes.w_out))
  out_y = tuple(n // _sizes(mesh, a) for n, a in zip(static.out_shape, axes.y_out))
  return rows, out_w, out_y


def _quantize(static: _Static, a, role, operand, key=None, transpose=False, draw_dims=None):
  """One operand of this device quantized as the whole operand's shard: amax over the operand's axes, SR draws of its
  elements in the whole operand (`draw_dims`: (row dims' axes and local sizes, column dims' axes and sizes))."""
  recipe = static.recipe
  extra = {}
  if key is not None and recipe.stochastic_rounding(role):
    (row_dims, row_axes), (col_dims, col_axes) = draw_dims
    rows = global_indices(static.mesh, row_dims, row_axes)
    cols = global_indices(static.mesh, col_dims, col_axes)
    extra["draws"] = sr_bits.ShardIndex(rows, cols)  # the XLA path and the kernels draw from it where it lies
  return static.backend.quantize(
    a,
    recipe,
    role,
    key,
    kernels=static.kernels,
    transpose=transpose,
    amax_axes=static.axes.operand_axes(operand),
    **extra,
  )


def _forward_local(static: _Static, x_l, w_l, key):
  """Per device: (y's block, residuals): x and w quantized where they lie, w gathered quantized, the local GEMM."""
  recipe, backend, mesh, axes = static.recipe, static.backend, static.mesh, static.axes
  rows_l, out_w, out_y = _local_shapes(static)
  x_MxK = x_l.reshape(-1, x_l.shape[-1])
  w_KxN = w_l.reshape(w_l.shape[0], -1)
  x_op = _quantize(static, x_MxK, "x", "x")
  w_op = _quantize(static, w_KxN, "w", "w", transpose=True)  # w^T [N, K]
  gather_out = tuple(_minor_suffix(y, w, "y's output") for y, w in zip(axes.y_out, axes.w_out))
  gather_k = _minor_suffix(axes.x_k, axes.w_k, "x's contraction")
  w_full = _gather_operand(w_op, gather_out, out_w, gather_k, mesh)
  split_k = bool(axes.x_k) and _sizes(mesh, axes.x_k) > 1
  # Emitted in the compute dtype where nothing sums it first (the xla backend's dot writes bf16, as on one device).
  y_MxN = backend.gemm(x_op, w_full, recipe, jnp.float32 if split_k else x_l.dtype)
  if split_k:
    y_MxN = jax.lax.psum(y_MxN, axes.x_k)  # a row GEMM's partial sums (f32, as the BF16 step reduces them)
  y = y_MxN.astype(x_l.dtype).reshape(*rows_l, *out_y)
  # Kept for the backward: the gathered weight (its dgrad operand where the transpose has the same numbers, as the
  # BF16 step keeps its gathered weight: a remat policy that doesn't save it gathers it once more, not twice).
  if recipe.backward_override == "dequantized":
    return y, (x_op, w_full)
  kept = (
    x_op.T if recipe.quantized_backward and recipe.shares_transpose("x") else None,
    w_full.T if recipe.quantized_backward and recipe.shares_transpose("w") else None,
  )
  return y, kept


def _scatter_to_kernel(dw_KxN, static: _Static, k_l, out_y):
  """The wgrad's partial sums (over this device's tokens) reduced over the token axes onto w's sharding: a
  reduce-scatter over the axes that split w but not x (FSDP), an all-reduce over the other token axes (data)."""
  mesh, axes = static.mesh, static.axes
  scatter_k = _minor_suffix(axes.x_k, axes.w_k, "x's contraction")
  scatter_out = tuple(_minor_suffix(y, w, "y's output") for y, w in zip(axes.y_out, axes.w_out))
  dw = dw_KxN.reshape(k_l, *out_y)
  scattered = set()
  for dim, split in enumerate((scatter_k, *scatter_out)):
    split = tuple(a for a in split if mesh.shape[a] > 1)
    if not split:
      continue
    outside = [a for a in split if a not in axes.row_axes]
    if outside:
      raise PartitionError(
        f"partitioned quantized GEMM: the kernel is split over {outside}, which split no token dimension; "
        "its gradient can't be reduce-scattered there"
      )
    dw = jax.lax.psum_scatter(dw, split, scatter_dimension=dim, tiled=True)
    scattered.update(split)
  rest = tuple(a for a in axes.row_axes if a not in scattered and mesh.shape[a] > 1)
  if rest:
    dw = jax.lax.psum(dw, rest)
  return dw


def _backward_local(static: _Static, x_l, w_l, key, kept, dy_l):
  """Per device: (dx's block, dw's shard)."""
  recipe, backend, mesh, axes = static.recipe, static.backend, static.mesh, static.axes
  rows_l, out_w, out_y = _local_shapes(static)
  x_MxK = x_l.reshape(-1, x_l.shape[-1])
  dy_MxN = dy_l.reshape(x_MxK.shape[0], -1)
  dtype = dy_l.dtype
  gather_out = tuple(_minor_suffix(y, w, "y's output") for y, w in zip(axes.y_out, axes.w_out))
  gather_k = _minor_suffix(axes.x_k, axes.w_k, "x's contraction")
  k_dgrad, k_wgrad = split_grad_keys(key)
  dy_dims = ((rows_l, axes.rows), (out_y, axes.y_out))
  if recipe.backward_override != "none":  # dgrad and wgrad in the compute dtype, as one device's (base.py)
    if recipe.backward_override == "dequantized":
      residuals = (*kept, None)  # the forward's quantized x and gathered w^T
    else:
      w_full = _gather(w_l.reshape(w_l.shape[0], *out_w), (gather_k, *gather_out), mesh)
      residuals = (x_MxK, w_full.reshape(w_full.shape[0], -1), None)
    dx, dw, _ = backward_in_compute_dtype(recipe, dtype, backend, residuals, dy_MxN)
  else:
    x_t_kept, w_t_kept = kept
    dy_op = _quantize(static, dy_MxN, "dy", "dy", key=k_dgrad, draw_dims=dy_dims)
    w_KxN = w_l.reshape(w_l.shape[0], -1)
    if w_t_kept is not None:  # the forward's gathered weight, transposed
      w_t_full = w_t_kept
    else:
      w_t_full = _gather_t(_quantize(static, w_KxN, "w_t", "w"), gather_k, gather_out, out_w, mesh)  # [K, N]
    dx = backend.gemm(dy_op, w_t_full, recipe, dtype).astype(dtype)
    x_t_op = x_t_kept if x_t_kept is not None else _quantize(static, x_MxK, "x_t", "x", transpose=True)
    if recipe.shares_transpose("dy"):
      dy_t_op = dy_op.T
    else:
      dy_t_dims = (dy_dims[1], dy_dims[0])
      dy_t_op = _quantize(static, dy_MxN, "dy_t", "dy", key=k_wgrad, transpose=True, draw_dims=dy_t_dims)
    dw = backend.gemm(x_t_op, dy_t_op, recipe, dtype).astype(dtype)  # rounded like TE's GEMM output (and BF16's)
  if any(_sizes(mesh, a) > 1 for a in axes.y_out):
    dx = jax.lax.psum(dx, tuple(a for ax in axes.y_out for a in ax))  # a column GEMM's dgrad partial sums
  dw = _scatter_to_kernel(dw, static, x_MxK.shape[1], out_y)
  return dx.reshape(x_l.shape), dw.astype(static.w_dtype).reshape(w_l.shape)


def _gather_t(w_t_op, gather_k, gather_out, out_w, mesh):
  """The dgrad's w^T operand ([K, N] quantized, N flattened from the kernel's output dims) gathered as the forward's."""
  k = w_t_op.values.shape[0]

  def gather(a):
    if a is None:
      return None
    # [K, N...]: K, then the output dims (scales: the last output dim in blocks)
    tail = a.shape[1] // math.prod(out_w[:-1]) if out_w else a.shape[1]
    g = _gather(a.reshape(k, *out_w[:-1], tail), (gather_k, *gather_out), mesh)
    return g.reshape(g.shape[0], -1)

  return dataclasses.replace(w_t_op, values=gather(w_t_op.values), scales=gather(w_t_op.scales))


def _key_data(key):
  return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


def _wrap(key_data):
  return jax.random.wrap_key_data(key_data)


def _every_axis(mesh):
  """The spec of per-device residuals (`_stack`): their leading axis split over the whole mesh."""
  return P(tuple(mesh.axis_names))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _pmatmul(x, w, key_data, static: _Static):
  return _forward_program(static, x, w, key_data)[0]


def _forward_program(static: _Static, x, w, key_data):
  """The forward's shard_map: (y, the residual quantized shards, stacked per device)."""
  axes, mesh = static.axes, static.mesh

  def local(x_l, w_l, k):
    y, kept = _forward_local(static, x_l, w_l, _wrap(k))
    return y, _stack(kept)

  return jax.shard_map(
    local,
    mesh=mesh,
    in_specs=(axes.x_spec, axes.w_spec, P()),
    out_specs=(axes.y_spec, _every_axis(mesh)),
    check_vma=False,
  )(x, w, key_data)


def _pmatmul_fwd(x, w, key_data, static: _Static):
  _check_blocks(static.recipe, static.axes, static.mesh, x.shape, w.shape, backward=True)  # traced when differentiated
  y, kept = _forward_program(static, x, w, key_data)
  return y, (x, w, key_data, name_for_remat(kept))


def _pmatmul_bwd(static: _Static, residuals, dy):
  x, w, key_data, kept = residuals
  axes, mesh = static.axes, static.mesh

  def local(x_l, w_l, k, kept_l, dy_l):
    return _backward_local(static, x_l, w_l, _wrap(k), _unstack(kept_l), dy_l)

  dx, dw = jax.shard_map(
    local,
    mesh=mesh,
    in_specs=(axes.x_spec, axes.w_spec, P(), _every_axis(mesh), axes.y_spec),
    out_specs=(axes.x_spec, axes.w_spec),
    check_vma=False,
  )(x, w, key_data, kept, dy)
  return dx, dw, None


_pmatmul.defvjp(_pmatmul_fwd, _pmatmul_bwd)


def _check_divisible(what, shape, dim_axes, mesh):
  for n, axes in zip(shape, dim_axes):
    shards = _sizes(mesh, axes)
    if n % shards:
      raise PartitionError(
        f"partitioned quantized GEMM: {what} {tuple(shape)} has a dimension of {n} that mesh axes {axes} "
        f"({shards} shards) don't divide; change the parallelism or the model size"
      )


def _check_blocks(recipe: Recipe, axes: GemmAxes, mesh, x_shape, w_shape, backward=False):
  """Every scaling block of every operand lies within one device's shard: its contraction shards (K for x and w, the
  output columns for dy and w^T, the tokens for x^T and dy^T: `backward`, checked where the GEMM is differentiated, so
  a decode step's few tokens per device are no error) are whole blocks, and 16x16 weight tiles whole tiles.
  A PartitionError saying which dimension and by how much otherwise (sharding.check_quantization_blocks says it
  in the config's terms before anything is built)."""
  block = recipe.block_size
  if not block:
    return
  local = lambda n, ax: n // _sizes(mesh, ax)
  rows = [local(n, ax) for n, ax in zip(x_shape[:-1], axes.rows)]
  split_rows = [i for i, ax in enumerate(axes.rows) if _sizes(mesh, ax) > 1]
  # The tokens of a wgrad block are consecutive in the flattened rows: whole blocks of the innermost split row dim,
  # or of all the local rows when only the outermost is split.
  tokens = rows[-1] if split_rows and split_rows[-1] == len(rows) - 1 else math.prod(rows)
  checks = [
    ("x's contraction (K)", local(x_shape[-1], axes.x_k)),
    ("the kernel's contraction (K)", local(w_shape[0], axes.w_k)),
    ("the kernel's last output dim", local(w_shape[-1], axes.w_out[-1])),
  ]
  if backward and recipe.quantized_backward:  # dy and w^T block along the output dims, x^T and dy^T along tokens
    checks += [("y's last output dim", local(w_shape[-1], axes.y_out[-1])), ("the tokens of a wgrad operand", tokens)]
  for what, n in checks:
    if n % block:
      raise PartitionError(
        f"partitioned {recipe.name} GEMM: a shard holds {n} of {what}, not a multiple of the {block}-element "
        f"scaling blocks (x {tuple(x_shape)}, w {tuple(w_shape)} on mesh {dict(mesh.shape)}); every block must lie "
        "within one shard: use fewer shards on that axis or keep that GEMM in bf16"
      )


def per_shard_kernels(kernels):
  """The quantizers each device runs on its shard: `auto` picks the Pallas kernels wherever they run (they quantize
  the shard they are given, so the device count no longer matters)."""
  if kernels is quantizer_impl.Kernels.AUTO and quantizer_impl.unavailable_reason() is None:
    return quantizer_impl.Kernels.PALLAS
  return kernels


def active(axes, mesh=None):
  """Whether a GEMM with these axes is split at all on the current mesh (jax.set_mesh): some named axis of size > 1."""
  mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
  if axes is None or mesh.empty:
    return False
  named = {a for dims in (axes.rows, (axes.x_k, axes.w_k), axes.w_out, axes.y_out) for ax in dims for a in ax}
  return any(mesh.shape.get(a, 1) > 1 for a in named)


def qdense(x, w, recipe: Recipe, backend, *, key, kernels, axes: GemmAxes, mesh=None):
  """y [*rows, *out] = x [*rows, K] . w [K, *out] per `recipe` on an operand backend (emulated, xla), partitioned
  over `mesh` (default: the current one, jax.set_mesh) by `axes`; differentiable with the recipe's backward, the
  same quantized bits as one device computing the whole GEMM."""
  mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
  if len(axes.rows) != x.ndim - 1 or len(axes.w_out) != w.ndim - 1 or len(axes.y_out) != w.ndim - 1:
    raise PartitionError(f"partitioned quantized GEMM: axes {axes} don't match x {x.shape} and w {w.shape}")
  _check_divisible("x", x.shape, (*axes.rows, axes.x_k), mesh)
  _check_divisible("w", w.shape, (axes.w_k, *axes.w_out), mesh)
  _check_divisible("y", (*x.shape[:-1], *w.shape[1:]), (*axes.rows, *axes.y_out), mesh)
  _check_blocks(recipe, axes, mesh, x.shape, w.shape)
  if recipe.needs_rng:
    check_key(key)
  static = _Static(
    recipe, jnp.dtype(w.dtype), backend, per_shard_kernels(kernels), axes, mesh, x.shape[:-1], w.shape[1:]
  )
  return _pmatmul(x, w, _key_data(key), static)
