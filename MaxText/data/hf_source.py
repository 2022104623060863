"""Documents of a Hugging Face dataset (dataset_type=hf, MaxText's keys), streamed through the `datasets` library as
MaxText streams them, for the same tokenize-split-pack path as ArrayRecord data (grain_pipeline.py).

`load_dataset(hf_path, name=hf_name, data_dir=hf_data_dir, data_files=hf_train_files, split=train_split,
streaming=True)`: a Hub dataset or local/fsspec files through a file builder (parquet, json, arrow, csv, text). Each
process reads its share (`split_dataset_by_node`); training shuffles through a seeded buffer, epoch after epoch
(`set_epoch`). The position saved in checkpoints is (epoch, documents read this epoch): a resumed run opens the same
stream and skips that many documents (read, not tokenized), so it continues exactly.
"""

import logging

import grain

from MaxText.data.records import DataError, reason

DATASETS_VERSION = "5.2.0"  # requirements.txt's pin


def _datasets():
  try:
    import datasets  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise DataError(
      f"dataset_type=hf reads through the datasets library, which is not installed: pip install "
      f"datasets=={DATASETS_VERSION}"
    ) from None
  datasets.utils.logging.set_verbosity(logging.CRITICAL)  # its failures reach the user as one DataError line
  datasets.utils.logging.disable_progress_bar()
  return datasets


class HFSplit:
  """One split of a Hugging Face dataset as this pipeline reads it: the load arguments, its text column, and
  `where(i)` naming a document in errors."""

  def __init__(self, cfg, *, files, split, what):
    self.what = f"{what} (hf_path={cfg.hf_path!r})"
    self.column = cfg.train_data_columns[0]
    self.load_kwargs = dict(
      path=cfg.hf_path,
      name=cfg.hf_name or None,
      data_dir=cfg.hf_data_dir or None,
      data_files=files or None,
      split=split,
      streaming=True,
      token=cfg.hf_access_token or None,
    )

  def where(self, index):
    return f"{self.what}: document {index}"

  def open(self, *, seed, train, epoch, process_index, process_count):
    """The stream of this process's documents (shuffled for training) at `epoch`."""
    datasets = _datasets()

    try:
      ds = datasets.load_dataset(**self.load_kwargs)
    except Exception as e:  # missing files, unknown dataset, no network: datasets raises many types
      raise DataError(
        f"{self.what}: can't open the dataset ({type(e).__name__}: {reason(e)}); check hf_path, hf_name, "
        "hf_data_dir and the hf_*_files globs (a Hub dataset needs the network or its cache)"
      ) from None
    if process_count > 1:
      from datasets.distributed import split_dataset_by_node  # pylint: disable=import-outside-toplevel

      ds = split_dataset_by_node(ds, rank=process_index, world_size=process_count)
    if train:
      ds = ds.shuffle(seed=seed)
      ds.set_epoch(epoch)
    return ds

  def documents(self, tokenize, *, seed, train, process_index, process_count):
    return _Documents(self, tokenize, seed=seed, train=train, process_index=process_index, process_count=process_count)


class _Documents(grain.IterDataset):
  """This process's documents as token ids: for training shuffled and repeated epoch after epoch."""

  def __init__(self, split, tokenize, *, seed, train, process_index, process_count):
    super().__init__()
    self.split, self.tokenize, self.train = split, tokenize, train
    self.open_kwargs = dict(seed=seed, train=train, process_index=process_index, process_count=process_count)

  def check_has_tokens(self):
    """Read documents until one makes a training sequence (2 tokens, BOS/EOS included); DataError if none does."""
    count, unshuffled = 0, {**self.open_kwargs, "train": False}  # the same documents, without a shuffle to wind down
    for count, document in enumerate(_texts(self.split, self.split.open(epoch=0, **unshuffled)), 1):
      if self.tokenize.map((count - 1, document)).size >= 2:
        return
    raise DataError(
      f"{self.split.what}: none of the {count} documents this process reads has 2 or more tokens (BOS/EOS "
      "included), so no sequence can be made from them; check train_data_columns and the tokenizer"
    )

  def __iter__(self):
    return _DocumentIterator(self)


def _texts(split, ds):
  """The documents' text (column train_data_columns[0]) of stream `ds`; DataError naming a missing column."""
  for i, example in enumerate(ds):
    if split.column not in example:
      raise DataError(
        f"{split.where(i)} has no column {split.column!r} (it has {', '.join(example)}); set train_data_columns"
      )
    text = example[split.column]
    if not isinstance(text, str):
      raise DataError(f"{split.where(i)}: column {split.column!r} holds {type(text).__name__}, not text")
    yield text


class _DocumentIterator(grain.DatasetIterator):
  """Token ids of the documents in stream order; state {epoch, documents read in it}."""

  def __init__(self, parent: _Documents):
    super().__init__()
    self._docs = parent
    self._start(epoch=0, skip=0)

  def _start(self, *, epoch, skip):
    docs = self._docs
    stream = docs.split.open(epoch=epoch, **docs.open_kwargs)
    if skip:
      stream = stream.skip(skip)
    self._epoch, self._read, self._texts = epoch, skip, _texts(docs.split, stream)

  def __next__(self):
    try:
      text = next(self._texts)
    except StopIteration:
      if not self._docs.train or not self._read:  # eval ends; an empty training split would repeat forever
        if self._docs.train:
          raise DataError(f"{self._docs.split.what}: this process reads no documents") from None
        raise
      self._start(epoch=self._epoch + 1, skip=0)
      text = next(self._texts)
    index = self._read
    self._read += 1
    return self._docs.tokenize.map((index, text))

  def get_state(self):
    return {"epoch": self._epoch, "documents": self._read}

  def set_state(self, state):
    self._start(epoch=int(state["epoch"]), skip=int(state["documents"]))
