"""Input pipelines behind one interface: an iterator of Batch, chosen by dataset_type."""

from MaxText.data.batch import Batch, DataIterator, FirstBatchRepeated
from MaxText.data import grain_pipeline
from MaxText.data.grain_pipeline import DataError
from MaxText.data.synthetic import SyntheticIterator
from MaxText.data.tokenizers import TokenizerError


def packed_documents(cfg):
  """Whether a row of the batch may hold several documents, so attention must be masked per document: only
  packed grain/tfds data. Synthetic rows are one sequence; packing=false rows are one document piece,
  right-padded, where causal attention alone is exact (real tokens never see the padding after them)."""
  return cfg.packing and cfg.dataset_type != "synthetic"


def make_iterator(cfg, run_shape, process_index=0, process_count=1) -> DataIterator:
  """The training iterator for `cfg.dataset_type`: this process's rows of each global batch.

  The eval split is checked here too (its files, and that it yields tokens), so bad eval data fails
  before training, not at the first eval.
  """
  if cfg.dataset_type != "synthetic" and cfg.eval_interval > 0:
    eval_iter = make_eval_iterator(cfg, run_shape, process_index, process_count)
    if eval_iter is not None:
      eval_iter.close()
  if cfg.dataset_type == "synthetic":
    iterator = SyntheticIterator(
      cfg, run_shape.global_batch_size, seed=cfg.seed, process_index=process_index, process_count=process_count
    )
  else:
    iterator = grain_pipeline.GrainIterator(
      cfg,
      grain_pipeline.train_source(cfg),
      run_shape.global_batch_size // process_count,
      process_index=process_index,
      process_count=process_count,
    )
  return FirstBatchRepeated(iterator) if cfg.reuse_example_batch else iterator


def make_eval_iterator(cfg, run_shape, process_index=0, process_count=1):
  """A fresh pass over the eval split (None when there is none); synthetic data evaluates on held-out seeds.

  An eval split that yields no tokens (for this process) is a DataError here, never an eval loss of 0.
  """
  if cfg.dataset_type == "synthetic":
    return SyntheticIterator(
      cfg,
      run_shape.global_batch_size,
      seed=cfg.seed + 1_000_003,
      process_index=process_index,
      process_count=process_count,
    )
  source = grain_pipeline.eval_source(cfg)
  if source is None:
    return None
  return grain_pipeline.GrainIterator(
    cfg,
    source,
    run_shape.global_batch_size // process_count,
    train=False,
    process_index=process_index,
    process_count=process_count,
  )


__all__ = [
  "Batch",
  "DataError",
  "DataIterator",
  "SyntheticIterator",
  "TokenizerError",
  "make_eval_iterator",
  "make_iterator",
  "packed_documents",
]
