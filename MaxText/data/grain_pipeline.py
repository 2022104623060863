"""Real data through grain: checked records (MaxText/data/records.py) -> tokens -> packed Batch, checkpointable.

Per document: [BOS] tokens [EOS] (BOS as add_bos says), cut into pieces of at most L+1 tokens that overlap by
one (every token is a target once), each piece an (inputs, targets) pair; pieces are packed first-fit into
rows of L with segment ids and positions, so attention never crosses documents and padding has
weight 0. Every process reads its own 1/process_count of the documents (and each grain worker its
own share of those). A split from which no training sequence can come (every document shorter than
2 tokens) is a DataError before the first batch, never an endless read.
"""

import json
import threading
import weakref

import grain
import grain.experimental as grain_exp
import numpy as np

from MaxText.data import tokenizers
from MaxText.data.hf_source import HFSplit
from MaxText.data.batch import Batch, DataIterator
from MaxText.data.records import DataError, array_record_source, reason, tfds_source

PACKING_BINS = 32


class _Tokenize(grain.transforms.Map):
  """(record index, document) -> int32 token ids (text gets BOS as add_bos says, EOS where the tokenizer has one)."""

  def __init__(self, records, tokenizer, length, max_pieces):
    self.records, self.tokenizer, self.length, self.max_pieces = records, tokenizer, length, max_pieces

  def map(self, element):
    index, document = element
    tok = self.tokenizer
    ids = document if tok is None else np.asarray(tok.encode_document(document), np.int32)
    pieces = -(-(ids.size - 1) // self.length)
    if pieces > self.max_pieces:
      raise DataError(
        f"{self.records.where(index)} is a document of {ids.size} tokens: {pieces} sequences of "
        f"max_target_length={self.length}, more than grain_max_pieces_per_document={self.max_pieces}; "
        "raise it or split such documents"
      )
    return ids


class _Split(grain_exp.FlatMapTransform):
  """One document's ids -> {inputs, targets} pieces of at most `length` tokens (none below 2 tokens)."""

  def __init__(self, length, max_fan_out):
    self.length, self.max_fan_out = length, max_fan_out

  def flat_map(self, ids):
    ends = [min(s + self.length, len(ids) - 1) for s in range(0, len(ids) - 1, self.length)]
    return [
      {"inputs": ids[e - min(self.length, e) : e], "targets": ids[e - min(self.length, e) + 1 : e + 1]} for e in ends
    ]


class _Documents(grain.IterDataset):
  """This process's documents as token ids; for training shuffled each epoch and repeated.

  Under mp_prefetch each worker reads its own share of them (set_slice) and shuffles it on its own,
  so a worker's pass over its documents is well defined: one without a training token is a
  DataError, not an endless read.
  """

  def __init__(self, records, tokenize, *, seed, train, process_index, process_count):
    super().__init__()
    self._docs = grain.MapDataset.source(records)[process_index::process_count]
    self._tokenize, self._seed, self._train, self._what = tokenize, seed, train, records.what
    self._reader = f"process {process_index} of {process_count}" if process_count > 1 else "this process"

  def set_slice(self, sl, sequential_slice=False):
    """grain's mp_prefetch: this copy of the dataset is worker sl.start of sl.step."""
    del sequential_slice
    self._docs = self._docs[sl]
    self._reader += f", grain worker {sl.start} of {sl.step}"

  def check_has_tokens(self):
    """Read documents until one makes a training sequence: the first one, unless the data can't make any."""
    for i in range(len(self._docs)):
      if self._tokenize.map(self._docs[i]).size >= 2:
        return
    raise DataError(self._no_tokens(len(self._docs)))

  def _no_tokens(self, count):
    return (
      f"{self._what}: none of the {count} documents {self._reader} reads has 2 or more tokens (BOS/EOS "
      "included), so no sequence can be made from them; check grain_record_format and the tokenizer, or "
      "regenerate the data with scripts/prepare_data.py"
      + ("; or lower grain_worker_count" if "worker" in self._reader else "")
    )

  def __iter__(self):
    docs, count = self._docs, len(self._docs)
    if not self._train:
      return docs.map(self._tokenize).to_iter_dataset().__iter__()
    if not count:
      raise DataError(f"{self._what}: {self._reader} gets none of the documents; lower grain_worker_count")
    parent = docs.shuffle(seed=self._seed).repeat().map(self._tokenize).to_iter_dataset().__iter__()
    # 2n - 1 documents in a row always hold a whole epoch of the n, whatever the shuffles.
    return _NotEndless(parent, limit=2 * count - 1, message=self._no_tokens(count))


class _NotEndless(grain.DatasetIterator):
  """The documents as they come, but `limit` of them in a row without a training sequence is a DataError."""

  def __init__(self, parent, *, limit, message):
    super().__init__(parent)
    self._limit, self._message, self._empty = limit, message, 0

  def __next__(self):
    ids = next(self._parent)
    self._empty = 0 if ids.size >= 2 else self._empty + 1
    if self._empty >= self._limit:
      raise DataError(self._message)
    return ids

  def get_state(self):
    return self._parent.get_state()

  def set_state(self, state):
    self._parent.set_state(state)


class _PadPiece(grain.transforms.Map):
  """packing=false: one piece per row, right-padded to `length` (segment id 0, weight 0), laid out as packed rows."""

  def __init__(self, length):
    self.length = length

  def map(self, piece):
    n = len(piece["inputs"])
    pad = lambda a: np.pad(np.asarray(a, np.int32), (0, self.length - n))
    segments = pad(np.ones(n))
    return {
      "inputs": pad(piece["inputs"]),
      "targets": pad(piece["targets"]),
      "inputs_positions": pad(np.arange(n)),
      "inputs_segment_ids": segments,
      "targets_segment_ids": segments,
    }


def _to_batch(packed):
  return Batch(
    inputs=packed["inputs"].astype(np.int32),
    targets=packed["targets"].astype(np.int32),
    positions=packed["inputs_positions"].astype(np.int32),
    segment_ids=packed["inputs_segment_ids"].astype(np.int32),
    weights=(packed["targets_segment_ids"] != 0).astype(np.float32),
  )


def _absl_flags_parsed():
  """grain's worker processes read absl flags: a program that never parsed any must say so (defaults)."""
  from absl import flags  # pylint: disable=import-outside-toplevel

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


class GrainIterator(DataIterator):
  """Packed batches of this process's slice of the global batch; `get_state` is grain's iterator state.

  Training reads through `grain_worker_count` worker processes (0: in this process); eval, a fresh
  short pass each time, always in this process.
  """

  def __init__(self, cfg, records, batch_size, *, train=True, process_index=0, process_count=1):
    tokenizer = None  # token_ids records are already tokenized; their ids are checked per record
    if cfg.grain_record_format == "text":
      tokenizer = tokenizers.load(cfg.tokenizer_type, cfg.tokenizer_path, cfg.vocab_size, cfg.add_bos)
    length = cfg.max_target_length
    tokenize = _Tokenize(records, tokenizer, length, cfg.grain_max_pieces_per_document)
    reading = dict(seed=cfg.seed, train=train, process_index=process_index, process_count=process_count)
    # Random-access records (ArrayRecord, TFDS) are sliced and shuffled here; a streamed source brings its own.
    documents = (
      records.documents(tokenize, **reading)
      if hasattr(records, "documents")
      else _Documents(records, tokenize, **reading)
    )
    documents.check_has_tokens()
    ds = grain_exp.FlatMapIterDataset(documents, _Split(length, max_fan_out=cfg.grain_max_pieces_per_document))
    if cfg.packing:
      ds = grain_exp.FirstFitPackIterDataset(
        ds,
        length_struct={"inputs": length, "targets": length},
        num_packing_bins=PACKING_BINS,
        seed=cfg.seed,
        shuffle_bins=train,
        max_sequences_per_bin=cfg.max_segments_per_seq if cfg.max_segments_per_seq > 0 else None,
      )
    else:  # one piece per row: the model then attends causally with no per-document mask
      ds = ds.map(_PadPiece(length))
    ds = ds.batch(batch_size, drop_remainder=train).map(_to_batch)
    if train and cfg.grain_worker_count > 0:
      _absl_flags_parsed()
      ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.grain_worker_count))
    self._iter = iter(ds)
    self._what, self._batches = records.what, 0
    self._from_workers = train and cfg.grain_worker_count > 0
    # Worker processes, threads and shared memory are released by close(), when this iterator goes, or at
    # exit; never under a next() running in another thread (a prefetch thread): closing grain's iterator
    # there aborted the process at exit (2 runs in 27).
    self._guard = {"lock": threading.Lock(), "closed": False}
    self._closer = weakref.finalize(self, _close, self._iter, self._guard)

  def __next__(self) -> Batch:
    with self._guard["lock"]:
      if self._guard["closed"]:
        raise StopIteration
      return self._next()

  def _next(self):
    try:
      batch = next(self._iter)
    except StopIteration:
      if not self._batches:  # eval: check_has_tokens passed, so this is a bug, never a loss of 0
        raise DataError(f"{self._what}: the split yields no batch") from None
      raise
    except DataError:
      raise
    except Exception as e:  # grain re-raises a thread's or worker's error wrapped; keep ours readable
      cause = _data_error_in(e)
      if cause is None:
        raise
      raise DataError(str(cause)) from None
    self._batches += 1
    if self._from_workers:  # copies out of the workers' shared memory, which the iterator may then reuse
      batch = Batch(*(np.array(a) for a in batch))
    return batch

  def close(self):
    self._closer()

  def get_state(self):
    return json.loads(json.dumps(self._iter.get_state(), default=_jsonable))

  def set_state(self, state):
    try:
      self._iter.set_state(state)
    except DataError:
      raise
    except Exception as e:  # grain's KeyError/IndexError/ValueError for a state of another pipeline
      if _data_error_in(e) is not None:
        raise DataError(str(_data_error_in(e))) from None
      raise DataError(
        f"the checkpoint's data position doesn't fit this data pipeline ({type(e).__name__} "
        f"{reason(e)}); resume with the data, grain_worker_count and process count it was saved "
        "with, or start from its parameters with load_parameters_path"
      ) from None


def _close(iterator, guard):
  """Closes grain's iterator once no next() is running (waiting at most 10 s for one, then grain's own exit
  hooks are left to stop its workers)."""
  if guard["lock"].acquire(timeout=10):
    try:
      if not guard["closed"]:
        guard["closed"] = True
        getattr(iterator, "close", lambda: None)()
    finally:
      guard["lock"].release()


def _data_error_in(e):
  """The DataError an exception wraps (as __cause__ / __context__), or None."""
  while e is not None and not isinstance(e, DataError):
    e = e.__cause__ or e.__context__
  return e


def _jsonable(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, bytes):
    return value.decode("latin-1")
  raise TypeError(f"data iterator state holds a {type(value).__name__}")


def train_source(cfg):
  if cfg.dataset_type == "hf":
    return HFSplit(cfg, files=cfg.hf_train_files, split=cfg.train_split, what="train_split")
  if cfg.dataset_type == "tfds":
    return tfds_source(cfg, cfg.train_split, "train_split")
  return array_record_source(cfg.grain_train_files, "grain_train_files", cfg.grain_record_format, cfg.vocab_size)


def eval_source(cfg):
  """The eval split's records, or None when the config names none."""
  if cfg.dataset_type == "hf":
    split = "train" if cfg.hf_eval_files else cfg.hf_eval_split  # data_files land in the "train" split (MaxText)
    return HFSplit(cfg, files=cfg.hf_eval_files, split=split, what="hf_eval_split") if split else None
  if cfg.dataset_type == "tfds":
    return tfds_source(cfg, cfg.eval_split, "eval_split") if cfg.eval_split else None
  return (
    array_record_source(cfg.grain_eval_files, "grain_eval_files", cfg.grain_record_format, cfg.vocab_size)
    if cfg.grain_eval_files
    else None
  )
