"""The safetensors format, read and written here: an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw little-endian data.

Reading takes a tensor, or a slice of it, with positioned reads of only the rows that slice touches (in bounded
chunks), so a process loading its shard of a 405B checkpoint never holds more than that shard. Writing lays the header
out first from the names, dtypes and shapes, then each tensor (or a range of its rows) goes to its offset.
"""

import json
import math
import os
import pathlib
import struct

import ml_dtypes
import numpy as np

from MaxText.checkpointing.hf import HFError
from MaxText.runtime import preemption

# The format's dtype names (safetensors' Dtype enum) and their little-endian numpy types.
DTYPES = {
  "BOOL": np.bool_,
  "U8": np.uint8,
  "I8": np.int8,
  "U16": np.uint16,
  "I16": np.int16,
  "F16": np.float16,
  "BF16": ml_dtypes.bfloat16,
  "U32": np.uint32,
  "I32": np.int32,
  "F32": np.float32,
  "U64": np.uint64,
  "I64": np.int64,
  "F64": np.float64,
  "F8_E4M3": ml_dtypes.float8_e4m3fn,
  "F8_E5M2": ml_dtypes.float8_e5m2,
}
NAMES = {np.dtype(t): name for name, t in DTYPES.items()}
MAX_HEADER_BYTES = 100 << 20  # the reference implementation's limit
READ_CHUNK_BYTES = 64 << 20  # a sliced read holds at most this many bytes of rows beyond its output


def dtype_name(dtype):
  """'BF16' for bfloat16, ...; HFError for a dtype the format has no name for."""
  name = NAMES.get(np.dtype(dtype))
  if name is None:
    raise HFError(f"dtype {np.dtype(dtype)} has no safetensors name (the format has {', '.join(DTYPES)})")
  return name


class TensorInfo:
  """One header entry: numpy dtype, shape and absolute byte range in the file."""

  __slots__ = ("name", "dtype", "shape", "begin", "end")

  def __init__(self, name, dtype, shape, begin, end):
    self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, tuple(shape), begin, end

  @property
  def nbytes(self):
    return self.end - self.begin


def _header_entry(path, name, entry, data_bytes):
  where = f"{path}: tensor {name}"
  if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
    raise HFError(f"{where}: header entry lacks dtype/shape/data_offsets; not a safetensors file")
  if not isinstance(entry["dtype"], str) or entry["dtype"] not in DTYPES:
    raise HFError(
      f"{where} has dtype {entry['dtype']!r}, which this reader doesn't know (it reads "
      f"{', '.join(DTYPES)}); convert the checkpoint to bf16 or f32"
    )
  shape, offsets = entry["shape"], entry["data_offsets"]
  if (
    not isinstance(shape, list)
    or not all(isinstance(d, int) and d >= 0 for d in shape)
    or not isinstance(offsets, list)
    or len(offsets) != 2
    or not all(isinstance(o, int) for o in offsets)
  ):
    raise HFError(f"{where}: malformed shape {shape!r} or data_offsets {offsets!r}")
  dtype = np.dtype(DTYPES[entry["dtype"]]).newbyteorder("<")
  begin, end = offsets
  if end - begin != math.prod(shape) * dtype.itemsize or begin < 0:
    raise HFError(
      f"{where}: data_offsets {offsets} hold {end - begin} bytes but shape {shape} of "
      f"{entry['dtype']} needs {math.prod(shape) * dtype.itemsize}; the file is damaged"
    )
  if end > data_bytes:
    raise HFError(
      f"{where} ends at data byte {end} but the file holds {data_bytes}: the file is truncated "
      "(an interrupted download or copy?); fetch it again"
    )
  return dtype, shape, begin, end


class SafetensorsFile:
  """A safetensors file opened for positioned reads: `names`, `info(name)`, `read(name, index)`."""

  def __init__(self, path):
    self.path = pathlib.Path(path)
    try:
      self._fd = os.open(self.path, os.O_RDONLY)
    except OSError as e:
      raise HFError(f"{self.path}: can't open it ({e.strerror})") from None
    try:
      self._parse()
    except BaseException:
      os.close(self._fd)
      raise

  def _parse(self):
    size = os.fstat(self._fd).st_size
    if size < 8:
      raise HFError(f"{self.path}: {size} bytes, truncated (a safetensors file starts with an 8-byte header length)")
    (header_bytes,) = struct.unpack("<Q", os.pread(self._fd, 8, 0))
    if header_bytes > min(size - 8, MAX_HEADER_BYTES):
      raise HFError(
        f"{self.path}: its header claims {header_bytes} bytes but the file has {size}: truncated, or "
        "not a safetensors file"
      )
    try:
      header = json.loads(os.pread(self._fd, header_bytes, 8).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
      raise HFError(f"{self.path}: the header is not JSON; not a safetensors file (or a damaged one)") from None
    if not isinstance(header, dict):
      raise HFError(f"{self.path}: the header is not a JSON object; not a safetensors file")
    self.metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + header_bytes
    self._infos = {}
    for name, entry in header.items():
      dtype, shape, begin, end = _header_entry(self.path, name, entry, size - data_start)
      self._infos[name] = TensorInfo(name, dtype, shape, data_start + begin, data_start + end)

  @property
  def names(self):
    return list(self._infos)

  def info(self, name) -> TensorInfo:
    return self._infos[name]

  def _read_into(self, out, offset):
    view = memoryview(out.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
      n = os.preadv(self._fd, [view[done:]], offset + done)
      if n <= 0:
        raise HFError(f"{self.path}: unexpected end of file at byte {offset + done}; the file is truncated")
      done += n

  def read(self, name, index=None) -> np.ndarray:
    """The tensor, or `index` of it (a tuple of step-1 slices, one per leading dimension it restricts), as a new
    array. Only the rows in the first dimension's range are read, at most READ_CHUNK_BYTES of them at a time."""
    info = self._infos[name]
    shape = info.shape
    index = tuple(index or ()) + (slice(None),) * (len(shape) - len(index or ()))
    ranges = [range(*s.indices(d)) for s, d in zip(index, shape)]
    if any(r.step != 1 for r in ranges):
      raise ValueError(f"read({name}): only step-1 slices, got {index}")
    out = np.empty([len(r) for r in ranges], info.dtype)
    if not shape or out.size == 0:
      if out.size:
        self._read_into(out, info.begin)
      return out
    row_elems = math.prod(shape[1:])
    row_bytes = row_elems * info.dtype.itemsize
    rest = tuple(slice(r.start, r.stop) for r in ranges[1:])
    whole_rows = all(len(r) == d for r, d in zip(ranges[1:], shape[1:]))
    rows = ranges[0]
    if whole_rows:  # contiguous bytes: straight into the output
      self._read_into(out, info.begin + rows.start * row_bytes)
      return out
    chunk_rows = max(1, READ_CHUNK_BYTES // max(row_bytes, 1))
    buffer = np.empty((min(chunk_rows, len(rows)),) + shape[1:], info.dtype)
    for start in range(0, len(rows), chunk_rows):
      n = min(chunk_rows, len(rows) - start)
      self._read_into(buffer[:n], info.begin + (rows.start + start) * row_bytes)
      out[start : start + n] = buffer[(slice(0, n),) + rest]
    return out

  def close(self):
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class SafetensorsWriter:
  """Writes one file whose tensors (name -> (dtype, shape), in file order) are known up front: the header goes
  first, then `write(name, array, row=0)` puts a tensor, or rows of it from `row` on, at its offset. `close()`
  checks every byte was written."""

  def __init__(self, path, tensors, metadata=None):
    self.path = pathlib.Path(path)
    header, offset, self._layout = {}, 0, {}
    if metadata:
      header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, (dtype, shape) in tensors.items():
      dtype = np.dtype(dtype)
      nbytes = math.prod(shape) * dtype.itemsize
      header[name] = {
        "dtype": dtype_name(dtype),
        "shape": [int(d) for d in shape],
        "data_offsets": [offset, offset + nbytes],
      }
      self._layout[name] = (dtype, tuple(shape), offset)
      offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # data 8-byte aligned, as the reference writer pads
    self._data_start = 8 + len(text)
    self._written = {name: 0 for name in tensors}
    self.size = self._data_start + offset
    self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
      self._pwrite(struct.pack("<Q", len(text)) + text, 0)
    except BaseException:
      self.abort()
      raise

  def _pwrite(self, data, position):
    """All of `data` at `position`; an OSError names the file (os.pwrite's doesn't)."""
    done = 0
    try:
      while done < len(data):
        done += os.pwrite(self._fd, data[done:], position + done)
    except OSError as e:
      raise OSError(e.errno, e.strerror, str(self.path)) from None

  def write(self, name, array, row=0):
    dtype, shape, offset = self._layout[name]
    array = np.ascontiguousarray(array)
    if (
      array.dtype != dtype
      or array.shape[1:] != shape[1:]
      or row + (array.shape[0] if shape else 1) > (shape[0] if shape else 1)
    ):
      raise ValueError(f"{name}: writing {array.dtype}{list(array.shape)} at row {row} into {dtype}{list(shape)}")
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    data = memoryview(array.reshape(-1).view(np.uint8))
    self._pwrite(data, self._data_start + offset + row * row_bytes)
    self._written[name] += len(data)
    preemption.point("write")  # tests: a stop signal mid-write

  def close(self):
    """Flushes and closes; ValueError if a tensor was not (or not wholly) written."""
    if self._fd is None:
      return
    try:
      missing = [
        n for n, (dtype, shape, _) in self._layout.items() if self._written[n] != math.prod(shape) * dtype.itemsize
      ]
      if missing:
        raise ValueError(f"{self.path}: tensors not written in full: {missing[:3]}")
      try:
        os.fsync(self._fd)
      except OSError as e:  # a full disk can show only now
        raise OSError(e.errno, e.strerror, str(self.path)) from None
    finally:
      self.abort()

  def abort(self):
    """Closes without checking (after a failure: what the file lacks is not news, the failure is)."""
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None
