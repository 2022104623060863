"""Quantized GEMMs partitioned over a device mesh, as the BF16 ones are: each device quantizes its own shard of every
operand, and the collectives are the BF16 step's, on the quantized operands.

y [*rows, *out] = x [*rows, K] . w [K, *out], with `GemmAxes` saying which mesh axes split each dimension (the caller's
logical axis rules, passed in: this library knows no trainer). The GEMMs are gemms.py's, the one-device GEMMs' own
code: under `shard_map` each device runs gemms.forward and gemms.backward on its blocks through a `MeshShards`:
  forward   x and w quantized where they lie (block scales from the shard's own blocks: shard boundaries fall on block
            boundaries, `_check_blocks`; a per-tensor amax is one scalar all-reduce); the quantized w all-gathered over
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

from MaxText.quantization import gemms
from MaxText.quantization.gemms import name_for_remat
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

  gemm: gemms.Static
  axes: GemmAxes
  mesh: typing.Any
  rows_shape: tuple  # global leading dimensions of x
  k: int  # the global contraction
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


class MeshShards(gemms.Shards):
  """One device's blocks of x [*rows, K], w [K, *out] and dy [*rows, *out] inside shard_map (flattened to x [M, K],
  w [K, N], dy [M, N] for the GEMMs): each operand quantized where it lies, as a shard of the whole (its amax the
  largest over the axes that split it, its stochastic-rounding draws its elements' in the whole operand), w gathered
  quantized over the axes that split it but not x, partial sums reduced as the BF16 step reduces them."""

  def __init__(self, static: _Static):
    mesh, axes = static.mesh, static.axes
    self.mesh, self.axes, self.static = mesh, axes, static
    self.rows = tuple(n // _sizes(mesh, a) for n, a in zip(static.rows_shape, axes.rows))
    self.k_x, self.k_w = static.k // _sizes(mesh, axes.x_k), static.k // _sizes(mesh, axes.w_k)
    self.out_w = tuple(n // _sizes(mesh, a) for n, a in zip(static.out_shape, axes.w_out))
    self.out_y = tuple(n // _sizes(mesh, a) for n, a in zip(static.out_shape, axes.y_out))
    self.gather_out = tuple(_minor_suffix(y, w, "y's output") for y, w in zip(axes.y_out, axes.w_out))
    self.gather_k = _minor_suffix(axes.x_k, axes.w_k, "x's contraction")
    self.splits_k = bool(axes.x_k) and _sizes(mesh, axes.x_k) > 1

  def _dims(self, source):
    """((local sizes, mesh axes) of the row dims, the same of the column dims) of an operand's block."""
    axes = self.axes
    return {
      "x": ((self.rows, axes.rows), ((self.k_x,), (axes.x_k,))),
      "w": (((self.k_w,), (axes.w_k,)), (self.out_w, axes.w_out)),
      "dy": ((self.rows, axes.rows), (self.out_y, axes.y_out)),
    }[source]

  def quantize(self, static: gemms.Static, a, role, key=None):
    source, transpose = gemms.OPERANDS[role]
    extra = {}
    if key is not None and static.recipe.stochastic_rounding(role):
      row_dims, col_dims = self._dims(source)[::-1] if transpose else self._dims(source)
      extra["draws"] = _block_index(self.mesh, row_dims, col_dims)
    amax_axes = self.axes.operand_axes(source)
    return static.backend.quantize(
      a, static.recipe, role, key, kernels=static.kernels, transpose=transpose, amax_axes=amax_axes, **extra
    )

  def gather(self, w_op, role):
    if role == "w":  # w^T [N, K]
      return _gather_operand(w_op, self.gather_out, self.out_w, self.gather_k, self.mesh)
    return _gather_t(w_op, self.gather_k, self.gather_out, self.out_w, self.mesh)

  def gather_input(self, w_KxN):
    w_full = _gather(w_KxN.reshape(w_KxN.shape[0], *self.out_w), (self.gather_k, *self.gather_out), self.mesh)
    return w_full.reshape(w_full.shape[0], -1)

  def sum_k(self, y_MxN):
    return jax.lax.psum(y_MxN, self.axes.x_k) if self.splits_k else y_MxN  # a row GEMM's partial sums, in f32

  def sum_dx(self, dx_MxK):
    if any(_sizes(self.mesh, a) > 1 for a in self.axes.y_out):
      return jax.lax.psum(dx_MxK, tuple(a for ax in self.axes.y_out for a in ax))  # a column GEMM's dgrad sums
    return dx_MxK

  def reduce_dw(self, dw_KxN):
    return _scatter_to_kernel(dw_KxN, self.static, self.k_x, self.out_y)


def _block_index(mesh, row_dims, col_dims):
  """Where a block lies in the whole operand (sr_bits.ShardIndex: the global row and column of each of its rows and
  columns), given its row and column dimensions (local sizes, mesh axes per dimension): the XLA path and the kernels
  draw its elements' stochastic-rounding bits from it where it lies."""
  (row_sizes, row_axes), (col_sizes, col_axes) = row_dims, col_dims
  return sr_bits.ShardIndex(global_indices(mesh, row_sizes, row_axes), global_indices(mesh, col_sizes, col_axes))


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


def _forward_local(static: _Static, x_l, w_l):
  """Per device: (y's block, the kept quantized operands, stacked)."""
  shards = MeshShards(static)
  y_MxN, kept = gemms.forward(shards, static.gemm, x_l.reshape(-1, x_l.shape[-1]), w_l.reshape(w_l.shape[0], -1))
  return y_MxN.reshape(*shards.rows, *shards.out_y), _stack(kept)


def _backward_local(static: _Static, inputs_l, kept_l, key_data, dy_l):
  """Per device: (dx's block, dw's shard)."""
  shards = MeshShards(static)
  x_l, w_l = inputs_l
  inputs = (
    None if x_l is None else x_l.reshape(-1, x_l.shape[-1]),
    None if w_l is None else w_l.reshape(w_l.shape[0], -1),
  )
  dy_MxN = dy_l.reshape(math.prod(shards.rows), -1)
  dx, dw = gemms.backward(shards, static.gemm, inputs, _unstack(kept_l), _wrap(key_data), dy_MxN)
  return dx.reshape(*shards.rows, shards.k_x), dw.reshape(shards.k_w, *shards.out_w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _pdense(x, w, key_data, static: _Static):
  return _forward_program(static, x, w)[0]


def _forward_program(static: _Static, x, w):
  """The forward's shard_map: (y, the kept quantized shards, stacked per device)."""
  axes, mesh = static.axes, static.mesh
  return jax.shard_map(
    functools.partial(_forward_local, static),
    mesh=mesh,
    in_specs=(axes.x_spec, axes.w_spec),
    out_specs=(axes.y_spec, _every_axis(mesh)),
    check_vma=False,
  )(x, w)


def _pdense_fwd(x, w, key_data, static: _Static):
  recipe = static.gemm.recipe
  _check_blocks(recipe, static.axes, static.mesh, x.shape, w.shape, backward=True)  # traced when differentiated
  y, kept = _forward_program(static, x, w)
  # The inputs the backward reads, and the kept quantized operands named (a remat policy can keep them). The kept w
  # is the forward's gathered weight, as the BF16 step keeps its gathered weight: a remat policy that doesn't save
  # it gathers it once more, not twice.
  return y, (gemms.kept_inputs(static.gemm, x, w), name_for_remat(kept), key_data)


def _pdense_bwd(static: _Static, residuals, dy):
  inputs, kept, key_data = residuals
  axes, mesh = static.axes, static.mesh
  dx, dw = jax.shard_map(
    functools.partial(_backward_local, static),
    mesh=mesh,
    in_specs=((axes.x_spec, axes.w_spec), _every_axis(mesh), P(), axes.y_spec),
    out_specs=(axes.x_spec, axes.w_spec),
    check_vma=False,
  )(inputs, kept, key_data, dy)
  return dx, dw, None


_pdense.defvjp(_pdense_fwd, _pdense_bwd)


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


def dense(x, w, recipe: Recipe, backend, *, key, kernels, axes: GemmAxes, mesh=None):
  """y [*rows, *out] = x [*rows, K] . w [K, *out] with `recipe`'s three GEMMs (gemms.py) on `backend`'s quantizers and
  GEMM, partitioned over `mesh` (default: the current one, jax.set_mesh) by `axes`; differentiable, the same quantized
  bits as one device computing the whole GEMM."""
  mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
  if len(axes.rows) != x.ndim - 1 or len(axes.w_out) != w.ndim - 1 or len(axes.y_out) != w.ndim - 1:
    raise PartitionError(f"partitioned quantized GEMM: axes {axes} don't match x {x.shape} and w {w.shape}")
  _check_divisible("x", x.shape, (*axes.rows, axes.x_k), mesh)
  _check_divisible("w", w.shape, (axes.w_k, *axes.w_out), mesh)
  _check_divisible("y", (*x.shape[:-1], *w.shape[1:]), (*axes.rows, *axes.y_out), mesh)
  _check_blocks(recipe, axes, mesh, x.shape, w.shape)
  if recipe.needs_rng:
    check_key(key)
  gemm = gemms.Static(recipe, backend, per_shard_kernels(kernels), jnp.dtype(w.dtype))
  static = _Static(gemm, axes, mesh, tuple(x.shape[:-1]), w.shape[0], tuple(w.shape[1:]))
  return _pdense(x, w, _key_data(key), static)
