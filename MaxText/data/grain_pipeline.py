"""Real data through grain: ArrayRecord (or TFDS ArrayRecord) records -> tokens -> packed Batch, checkpointable.

Per document: [BOS] tokens [EOS], cut into pieces of at most L+1 tokens that overlap by one (every
token is a target once), each piece an (inputs, targets) pair; pieces are packed first-fit into
rows of L with segment ids and positions, so attention never crosses documents and padding has
weight 0. Every process reads its own 1/process_count of the documents.
"""

import glob
import json
import os
import pathlib

import grain
import grain.experimental as grain_exp
import numpy as np

from MaxText.data import tokenizers
from MaxText.data.batch import Batch, DataIterator

PACKING_BINS = 32


class DataError(ValueError):
  """Missing, empty or invalid data: a user error."""


def _array_record_source(pattern, what, record_format):
  paths = sorted(glob.glob(pattern))
  if not pattern or not paths:
    raise DataError(f"{what}={pattern!r} matches no files; run scripts/prepare_data.py or fix the glob")
  for directory in sorted({os.path.dirname(p) for p in paths}):
    _check_record_format(directory, what, record_format)
  for path in paths:
    try:
      records = len(grain.sources.ArrayRecordDataSource([path]))
    except Exception as e:  # array_record raises RuntimeError/ValueError/OSError for damaged files
      reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
      raise DataError(f"{what}: {path} is not a readable ArrayRecord shard ({reason}); regenerate the shards "
                      "with scripts/prepare_data.py") from None
    if not records:
      raise DataError(f"{what}: {path} holds no records; remove it or regenerate the shards")
  return grain.sources.ArrayRecordDataSource(paths)


def _check_record_format(directory, what, record_format):
  """prepare_data.py's metadata.json beside the shards says how they were written: it must match the config."""
  path = os.path.join(directory or ".", "metadata.json")
  try:
    with open(path, encoding="utf-8") as f:
      written = json.load(f).get("record_format")
  except FileNotFoundError:
    return  # shards from elsewhere: nothing to check against
  except (OSError, ValueError, AttributeError) as e:
    raise DataError(f"{what}: can't read {path} ({e}); fix or remove it") from None
  if written and written != record_format:
    raise DataError(f"{what}: the shards in {directory} hold {written} records ({path}) but "
                    f"grain_record_format={record_format}; set grain_record_format={written}")


def _tfds_source(cfg, split):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  root = pathlib.Path(cfg.dataset_path) / cfg.dataset_name
  versions = sorted(p for p in root.glob("*") if (p / "dataset_info.json").is_file()) if root.is_dir() else []
  if not versions:
    raise DataError(f"dataset_path={cfg.dataset_path!r}, dataset_name={cfg.dataset_name!r}: no TFDS dataset "
                    f"(no {root}/<version>/dataset_info.json); run scripts/prepare_data.py --tfds")
  builder = tfds.builder_from_directory(str(versions[-1]))
  if split not in builder.info.splits:
    raise DataError(f"{cfg.dataset_name}: no split {split!r}; it has {', '.join(builder.info.splits)}")
  source = builder.as_data_source(split)
  if not len(source):
    raise DataError(f"{cfg.dataset_name} split {split!r} holds no records")
  return source


class _Tokenize(grain.transforms.Map):
  """Record -> int32 token ids of one document (with BOS/EOS where the tokenizer has them)."""

  def __init__(self, cfg, tokenizer):
    self.tokenizer, self.record_format, self.vocab_size = tokenizer, cfg.grain_record_format, cfg.vocab_size

  def map(self, record):
    if isinstance(record, dict):  # TFDS: {"text": bytes}
      record = record["text"]
    if self.record_format == "token_ids":
      if len(record) % 4:
        raise DataError(f"a record of {len(record)} bytes is not int32 token ids: are the shards text? set "
                        "grain_record_format=text")
      ids = np.frombuffer(record, np.int32)
    else:
      tok = self.tokenizer
      text = record.decode("utf-8") if isinstance(record, bytes) else str(record)
      ids = np.asarray(([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(text)
                       + ([tok.eos_id] if tok.eos_id is not None else []), np.int32)
    if ids.size and (ids.max() >= self.vocab_size or ids.min() < 0):
      raise DataError(f"token id {int(ids.max()) if ids.max() >= self.vocab_size else int(ids.min())} is outside "
                      f"[0, vocab_size={self.vocab_size}); set vocab_size or re-tokenize the data")
    return ids


class _Split(grain_exp.FlatMapTransform):
  """One document's ids -> {inputs, targets} pieces of at most `length` tokens."""

  def __init__(self, length, max_fan_out):
    self.length, self.max_fan_out = length, max_fan_out

  def flat_map(self, ids):
    ends = [min(s + self.length, len(ids) - 1) for s in range(0, len(ids) - 1, self.length)]
    return [{"inputs": ids[e - min(self.length, e):e], "targets": ids[e - min(self.length, e) + 1:e + 1]}
            for e in ends]


def _to_batch(packed):
  return Batch(inputs=packed["inputs"].astype(np.int32), targets=packed["targets"].astype(np.int32),
               positions=packed["inputs_positions"].astype(np.int32),
               segment_ids=packed["inputs_segment_ids"].astype(np.int32),
               weights=(packed["targets_segment_ids"] != 0).astype(np.float32))


class GrainIterator(DataIterator):
  """Packed batches of this process's slice of the global batch; `get_state` is grain's iterator state."""

  def __init__(self, cfg, source, batch_size, *, train=True, process_index=0, process_count=1):
    tokenizer = None  # token_ids records are already tokenized; their ids are checked per record
    if cfg.grain_record_format == "text":
      tokenizer = tokenizers.load(cfg.tokenizer_type, cfg.tokenizer_path, cfg.vocab_size)
    length = cfg.max_target_length
    ds = grain.MapDataset.source(source)[process_index::process_count]
    if train:
      ds = ds.shuffle(seed=cfg.seed).repeat()  # each epoch in a new order
    ds = ds.map(_Tokenize(cfg, tokenizer)).to_iter_dataset()
    ds = grain_exp.FlatMapIterDataset(ds, _Split(length, max_fan_out=cfg.grain_max_pieces_per_document))
    ds = grain_exp.FirstFitPackIterDataset(ds, length_struct={"inputs": length, "targets": length},
                                           num_packing_bins=PACKING_BINS, seed=cfg.seed, shuffle_bins=train)
    ds = ds.batch(batch_size, drop_remainder=train).map(_to_batch)
    if cfg.grain_worker_count > 0:
      ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.grain_worker_count))
    self._iter = iter(ds)

  def __next__(self) -> Batch:
    try:
      return next(self._iter)
    except (DataError, StopIteration):
      raise
    except Exception as e:  # grain re-raises a worker's error wrapped; keep ours readable
      cause = e
      while cause is not None and not isinstance(cause, DataError):
        cause = cause.__cause__ or cause.__context__
      if cause is not None:
        raise DataError(str(cause)) from e
      raise

  def get_state(self):
    return json.loads(json.dumps(self._iter.get_state(), default=_jsonable))

  def set_state(self, state):
    self._iter.set_state(state)


def _jsonable(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, bytes):
    return value.decode("latin-1")
  raise TypeError(f"data iterator state holds a {type(value).__name__}")


def train_source(cfg):
  if cfg.dataset_type == "tfds":
    return _tfds_source(cfg, cfg.train_split)
  return _array_record_source(cfg.grain_train_files, "grain_train_files", cfg.grain_record_format)


def eval_source(cfg):
  """The eval split's source, or None when the config names none."""
  if cfg.dataset_type == "tfds":
    return _tfds_source(cfg, cfg.eval_split) if cfg.eval_split else None
  return (_array_record_source(cfg.grain_eval_files, "grain_eval_files", cfg.grain_record_format)
          if cfg.grain_eval_files else None)
