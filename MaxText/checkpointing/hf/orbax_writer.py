"""A parameter checkpoint written one array region at a time, in a layout Orbax restores like its own.

Orbax saves a pytree in one call from arrays held whole in memory; an import must not hold the model. This writes
what Orbax's PyTreeCheckpointHandler writes with use_ocdbt=False, use_zarr3=False (its long-standing format, which
every Orbax restores): one zarr v2 array per leaf, named by the leaf's keys joined with '.', created empty by
tensorstore and filled block by block, and the `_METADATA` tree record. tests/hf/test_orbax_writer.py compares
both files with what the installed Orbax writes for the same tree and restores the result through Orbax.
"""

import collections
import json
import math

import numpy as np
import tensorstore as ts

from MaxText.runtime import preemption

CHUNK_BYTES = 64 << 20  # the zarr chunks (and the blocks an import writes) hold at most this much
MAX_PENDING = 1  # a write in flight while the next block is read
_ZARR_DTYPES = {"bfloat16": "bfloat16"}


def leaf_keys(path):
  """Orbax's keys of an nnx parameter: ('params', 'layers', 'mlp', 'gate', 'kernel', 'value') for the Param's value
  at "layers/mlp/gate/kernel"."""
  return ("params", *path.split("/"), "value")


def chunk_shape(shape, itemsize, block_axis, unit_axes=()):
  """Chunks of 1 along `unit_axes` (a stacked parameter's layer axis: whole layers; a fused one's part axis), the
  `block_axis` cut so one chunk is <= CHUNK_BYTES."""
  chunks = list(shape)
  for axis in unit_axes:
    chunks[axis] = 1
  other = math.prod(c for i, c in enumerate(chunks) if i != block_axis) * itemsize
  chunks[block_axis] = max(1, min(shape[block_axis], CHUNK_BYTES // max(other, 1)))
  return chunks


class ParamCheckpointWriter:
  """`arrays`: {our parameter path: (shape, numpy dtype, block axis, unit axes)}; `write(path, index, block)`
  stores a region (regions written one after another never share a chunk when they differ only along the unit axes
  and whole chunks of the block axis); `finish()` writes the tree record that makes the directory a checkpoint
  item."""

  def __init__(self, state_dir, arrays):
    self.state_dir = state_dir
    self.state_dir.mkdir(parents=True)
    self._stores, self._chunks, self._pending = {}, {}, collections.deque()
    # No fsync per chunk (tensorstore's default): the import is written in a temporary directory that becomes the
    # output only once complete, and fsyncing each 64 MB chunk made writing 3x slower.
    context = ts.Context({"file_io_sync": False})
    for path, (shape, dtype, block_axis, unit_axes) in arrays.items():
      dtype = np.dtype(dtype)
      chunks = chunk_shape(shape, dtype.itemsize, block_axis, unit_axes)
      spec = {
        "driver": "zarr",
        "kvstore": {"driver": "file", "path": str(state_dir / ".".join(leaf_keys(path)))},
        "metadata": {
          "shape": list(shape),
          "chunks": chunks,
          "dtype": _ZARR_DTYPES.get(dtype.name, dtype.str),
          "compressor": None,
          "fill_value": None,
          "order": "C",
          "dimension_separator": ".",
        },
      }
      with preemption.deferred():  # an open started is an open finished: nothing creates files after a cleanup
        self._stores[path] = ts.open(spec, create=True, context=context).result()
      self._chunks[path] = chunks

  def block_rows(self, path, axis):
    """Rows per block along `axis` that fill whole chunks."""
    return self._chunks[path][axis]

  def write(self, path, index, block):
    """Starts writing `block` at `index`; at most MAX_PENDING writes are in flight (each holds its block). A write in
    flight stays in `_pending` until it has finished, whatever interrupts this (abort() waits for it)."""
    with preemption.deferred():
      self._pending.append(self._stores[path][index].write(block))
    preemption.point("write")  # tests: a stop signal mid-write
    while len(self._pending) > MAX_PENDING:
      self._pending[0].result()
      self._pending.popleft()

  def abort(self):
    """Waits out the writes in flight, their errors ignored (after a failure or a stop signal: nothing may write
    into the directory once it is being removed)."""
    with preemption.ignored():
      while self._pending:
        try:
          self._pending[0].result()
        except Exception:  # pylint: disable=broad-except  (the failure being handled is the news)
          pass
        self._pending.popleft()

  def finish(self):
    while self._pending:
      self._pending[0].result()
      self._pending.popleft()
    tree = {}
    for path, store in self._stores.items():
      keys = leaf_keys(path)
      tree[str(keys)] = {
        "key_metadata": [{"key": k, "key_type": 2} for k in keys],
        "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False, "write_shape": list(store.shape)},
      }
    record = {
      "tree_metadata": tree,
      "use_ocdbt": False,
      "use_zarr3": False,
      "store_array_data_equal_to_fill_value": True,
      "custom_metadata": None,
    }
    (self.state_dir / "_METADATA").write_text(json.dumps(record))
