"""Where documents come from: ArrayRecord shards or a TFDS split, checked up front and record by record.

Every record is checked as it is read, so data that is not what it claims stops the run with a
DataError naming the file and the record: a chunk that fails its checksum, text that is not UTF-8,
int32 token ids read as text (shards copied without their metadata.json), text read as token ids,
token ids outside the vocabulary.
"""

import bisect
import glob
import json
import os
import pathlib

import grain
import numpy as np

from MaxText import storage
from MaxText.errors import UserError

# int32 ids below 2^24 have a NUL high byte: a quarter of their bytes or more. Text has none.
NUL_SHARE_OF_TOKEN_IDS = 0.25


class DataError(UserError, ValueError):
  """Missing, empty or invalid data: a user error."""


def reason(e):
  """The first line of an exception's message (or its type), short enough for a one-line error."""
  text = str(e).strip()
  return text.splitlines()[0][:160] if text else type(e).__name__


def decode(record, record_format, vocab_size):
  """A record's document: str (text) or int32 ids (token_ids); DataError saying what it is instead."""
  if isinstance(record, dict):  # TFDS: {"text": bytes}
    record = record["text"]
  if isinstance(record, str):
    record = record.encode("utf-8")
  record = bytes(record)
  return _token_ids(record, vocab_size) if record_format == "token_ids" else _text(record)


def _text(record):
  nul = record.count(0)
  if record and nul >= NUL_SHARE_OF_TOKEN_IDS * len(record):
    raise DataError(
      f"is not text: {nul} of its {len(record)} bytes are NUL, as in int32 token ids; if the shards "
      "hold token ids set grain_record_format=token_ids (prepare_data.py --pretokenize writes them "
      "with a metadata.json saying so)"
    )
  try:
    return record.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(
      f"is not UTF-8 text (byte {e.start} is {record[e.start : e.start + 1]!r}); convert the text to "
      "UTF-8 and rerun scripts/prepare_data.py"
    ) from None


def _reads_as_text(record):
  try:
    return b"\0" not in record and bool(record.decode("utf-8").strip())
  except UnicodeDecodeError:
    return False


def _token_ids(record, vocab_size):
  hint = "; it reads as UTF-8 text: set grain_record_format=text" if _reads_as_text(record) else ""
  if len(record) % 4:
    raise DataError(f"of {len(record)} bytes is not int32 token ids{hint or '; regenerate the shards'}")
  ids = np.frombuffer(record, "<i4")
  if ids.size and (ids.max() >= vocab_size or ids.min() < 0):
    bad = int(ids.max()) if ids.max() >= vocab_size else int(ids.min())
    raise DataError(
      f"token id {bad} is outside [0, vocab_size={vocab_size}){hint or '; set vocab_size or re-tokenize the data'}"
    )
  return ids


class Records:
  """A random-access source of (record index, document): every record decoded and checked as it is read,
  each failure a DataError naming the file (or split) and the record."""

  def __init__(self, source, files, what, record_format, vocab_size):
    """`files`: [(name, record count)] in the source's order."""
    self._source, self.what = source, what
    self.record_format, self.vocab_size = record_format, vocab_size
    self._names = [name for name, _ in files]
    self._ends = np.cumsum([count for _, count in files]).tolist()

  def __len__(self):
    return len(self._source)

  def __getitem__(self, index):
    try:
      record = self._source[index]
    except Exception as e:  # array_record: RuntimeError "Corrupted Riegeli/records file: ... hash mismatch"
      raise DataError(
        f"{self.where(index)} can't be read ({reason(e)}): the shard is damaged; regenerate it "
        "with scripts/prepare_data.py, or leave it out of the glob"
      ) from None
    try:
      return index, decode(record, self.record_format, self.vocab_size)
    except DataError as e:
      raise DataError(f"{self.where(index)} {e}") from None

  def where(self, index):
    """'grain_train_files: record 17 of /data/train-00003.array_record' for a source index."""
    k = bisect.bisect_right(self._ends, index)
    first = self._ends[k - 1] if k else 0
    return f"{self.what}: record {index - first} of {self._names[min(k, len(self._names) - 1)]}"

  def check_shards(self):
    """Decode the first record of every file: shards of another format fail here, before training."""
    for first in [0] + self._ends[:-1]:
      if first < len(self):
        self[first]  # pylint: disable=pointless-statement


def array_record_source(pattern, what, record_format, vocab_size):
  """Records of every shard `pattern` matches; DataError for no match, a damaged or empty shard, a format
  other than the one metadata.json (or the first record) says."""
  storage.check_local_shards(pattern, what)
  paths = sorted(glob.glob(pattern)) if pattern else []
  if not paths:
    raise DataError(f"{what}={pattern!r} matches no files; run scripts/prepare_data.py or fix the glob")
  for directory in sorted({os.path.dirname(p) for p in paths}):
    _check_record_format(directory, what, record_format)
  counts = []
  for path in paths:
    try:
      counts.append(len(grain.sources.ArrayRecordDataSource([path])))
    except Exception as e:  # array_record raises RuntimeError/ValueError/OSError for damaged files
      raise DataError(
        f"{what}: {path} is not a readable ArrayRecord shard ({reason(e)}); regenerate the shards "
        "with scripts/prepare_data.py"
      ) from None
    if not counts[-1]:
      raise DataError(f"{what}: {path} holds no records; remove it or regenerate the shards")
  records = Records(
    grain.sources.ArrayRecordDataSource(paths), list(zip(paths, counts)), what, record_format, vocab_size
  )
  records.check_shards()
  return records


def _check_record_format(directory, what, record_format):
  """prepare_data.py's metadata.json beside the shards says how they were written: it must match the config."""
  path = os.path.join(directory or ".", "metadata.json")
  try:
    with open(path, encoding="utf-8") as f:
      written = json.load(f).get("record_format")
  except FileNotFoundError:
    return  # shards from elsewhere: their first records are checked instead
  except (OSError, ValueError, AttributeError) as e:
    raise DataError(f"{what}: can't read {path} ({e}); fix or remove it") from None
  if written and written != record_format:
    raise DataError(
      f"{what}: the shards in {directory} hold {written} records ({path}) but "
      f"grain_record_format={record_format}; set grain_record_format={written}"
    )


def tfds_source(cfg, split, what):
  """Records of a TFDS split read through its ArrayRecord data source (no TensorFlow at run time)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  root = pathlib.Path(cfg.dataset_path) / cfg.dataset_name
  versions = sorted(p for p in root.glob("*") if (p / "dataset_info.json").is_file()) if root.is_dir() else []
  if not versions:
    raise DataError(
      f"dataset_path={cfg.dataset_path!r}, dataset_name={cfg.dataset_name!r}: no TFDS dataset "
      f"(no {root}/<version>/dataset_info.json); run scripts/prepare_data.py --tfds"
    )
  builder = tfds.builder_from_directory(str(versions[-1]))
  if split not in builder.info.splits:
    raise DataError(f"{cfg.dataset_name}: no split {split!r}; it has {', '.join(builder.info.splits)}")
  source = builder.as_data_source(split)
  if not len(source):
    raise DataError(f"{cfg.dataset_name} split {split!r} holds no records")
  records = Records(
    source,
    [(f"{cfg.dataset_name} split {split!r} ({versions[-1]})", len(source))],
    what,
    cfg.grain_record_format,
    cfg.vocab_size,
  )
  records.check_shards()
  return records
