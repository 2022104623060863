"""Input pipelines behind one interface: an iterator of Batch, chosen by dataset_type."""

from MaxText.data.batch import Batch, DataIterator
from MaxText.data.synthetic import SyntheticIterator


def make_iterator(cfg, run_shape, process_index=0) -> DataIterator:
  """The training iterator for `cfg.dataset_type`."""
  if cfg.dataset_type == "synthetic":
    return SyntheticIterator(cfg, run_shape.global_batch_size, seed=cfg.seed, process_index=process_index)
  raise ValueError(f"dataset_type={cfg.dataset_type!r} is not supported")


__all__ = ["Batch", "DataIterator", "SyntheticIterator", "make_iterator"]
