"""How the quantization kernels tile an operand: padding, the [pair, rows, cols] view, block sizes and BlockSpecs.

An operand is [rows, cols] with scaling blocks along cols, stored either as is or transposed (x_t,
dy_t, w: the kernel reads x [cols, rows] and writes the operand, so x.T is never materialised). The
kernel sees a [pair, block_rows, block_cols] tile: pair = 2 puts row r and row r + rows/2 in one
program (the kernels use pair = 1: stochastic rounding's draws depend on an element's row and column only).
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# Elements per program. A starting point, not tuned on a GPU (none was available): ~32 f32 values per
# thread at 4 warps, and at least 64 contiguous elements per row of a transposed read.
BLOCK_ELEMS = 4096
MAX_BLOCK_COLS = 128
MAX_TRANSPOSED_BLOCK = 64


def pow2_divisor(n, cap):
  """The largest power of two dividing n, at most cap."""
  p = 1
  while n % (2 * p) == 0 and 2 * p <= cap:
    p *= 2
  return p


@dataclasses.dataclass(frozen=True)
class Layout:
  """Operand [rows, cols] (padded) read from x = operand or operand.T, in [pair, block_rows, block_cols] tiles."""

  rows: int
  cols: int
  transpose: bool
  pair: int
  block_rows: int  # rows of one half per tile
  block_cols: int

  @property
  def grid(self):
    return (self.rows // self.pair // self.block_rows, self.cols // self.block_cols)

  @property
  def tile(self):
    return (self.pair, self.block_rows, self.block_cols)

  def view(self, x_padded):
    """The stored array as the in_spec reads it: [pair, rows/pair, cols], or [cols, pair, rows/pair] if transposed."""
    if self.transpose:
      return x_padded.reshape(self.cols, self.pair, self.rows // self.pair)
    return x_padded.reshape(self.pair, self.rows // self.pair, self.cols)

  def in_spec(self):
    if self.transpose:
      return pl.BlockSpec((self.block_cols, self.pair, self.block_rows), lambda i, j: (j, 0, i))
    return pl.BlockSpec(self.tile, lambda i, j: (0, i, j))

  def load(self, x_ref):
    """The tile as f32 [pair, block_rows, block_cols] (transposed in registers when the operand is x.T)."""
    x = x_ref[...].astype(jnp.float32)
    return jnp.transpose(x, (1, 2, 0)) if self.transpose else x

  def out_shape(self, dtype):
    return jax.ShapeDtypeStruct((self.pair, self.rows // self.pair, self.cols), dtype)

  def out_spec(self):
    return pl.BlockSpec(self.tile, lambda i, j: (0, i, j))

  def rows_cols_origin(self):
    """(first row within the half, first col) of this program's tile, uint32."""
    return (
      (pl.program_id(0) * self.block_rows).astype(jnp.uint32),
      (pl.program_id(1) * self.block_cols).astype(jnp.uint32),
    )


def make_layout(rows, cols, *, transpose, pair=1):
  """Tiles for a padded operand [rows, cols]; rows divisible by `pair`."""
  col_cap = MAX_TRANSPOSED_BLOCK if transpose else MAX_BLOCK_COLS
  block_cols = pow2_divisor(cols, col_cap)
  row_cap = max(1, BLOCK_ELEMS // (pair * block_cols))
  if transpose:
    row_cap = min(row_cap, MAX_TRANSPOSED_BLOCK)
  return Layout(rows, cols, transpose, pair, pow2_divisor(rows // pair, row_cap), block_cols)


def pad_operand(x, *, transpose, row_multiple, col_multiple):
  """x (stored orientation) zero-padded so the operand's rows and cols are multiples (scale math pads the same)."""
  rows, cols = x.shape[::-1] if transpose else x.shape
  pad_rows, pad_cols = (-rows) % row_multiple, (-cols) % col_multiple
  if not (pad_rows or pad_cols):
    return x
  widths = ((0, pad_cols), (0, pad_rows)) if transpose else ((0, pad_rows), (0, pad_cols))
  return jnp.pad(x, widths)
