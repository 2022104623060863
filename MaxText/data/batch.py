"""The batch every pipeline yields and the iterator interface real data implements."""

import abc
import typing

import numpy as np


class Batch(typing.NamedTuple):
  """Packed next-token batch, each [B, L]: `weights` 1 for real target tokens, 0 for padding."""

  inputs: np.ndarray  # int32 token ids
  targets: np.ndarray  # int32: inputs shifted by one
  positions: np.ndarray  # int32 position within its segment
  segment_ids: np.ndarray  # int32, attention never crosses segments; 0 = padding
  weights: np.ndarray  # float32 loss weights


class DataIterator(abc.ABC):
  """An iterator of Batch with a saveable position (for exact resume)."""

  @abc.abstractmethod
  def __next__(self) -> Batch: ...

  def __iter__(self):
    return self

  @abc.abstractmethod
  def get_state(self) -> dict:
    """JSON-serialisable position."""

  @abc.abstractmethod
  def set_state(self, state: dict) -> None: ...

  def close(self) -> None:
    """Release worker processes and buffers (also done when the iterator is garbage collected)."""


class FirstBatchRepeated(DataIterator):
  """MaxText's reuse_example_batch: the first batch of `inner`, read once and returned at every step (performance
  testing without the input pipeline). Its position is the inner iterator's before that batch, so a resumed run
  reads the same batch again."""

  def __init__(self, inner: DataIterator):
    self._inner, self._start, self._batch = inner, inner.get_state(), None

  def __next__(self) -> Batch:
    if self._batch is None:
      self._batch = next(self._inner)
    return self._batch

  def get_state(self) -> dict:
    return {"reused_batch_at": self._start}

  def set_state(self, state: dict) -> None:
    self._inner.set_state(state["reused_batch_at"])
    self._start, self._batch = state["reused_batch_at"], None

  def close(self) -> None:
    self._inner.close()
