"""Synthetic data with learnable structure: noisy repeats of a fixed random bigram chain, seeded per step."""

import numpy as np

from MaxText.data.batch import Batch, DataIterator


class SyntheticIterator(DataIterator):
  """Sequences from a random sparse Markov chain (each token has 4 likely successors), so the loss
  falls well below log(vocab) when the model learns. Batch k depends only on (seed, k)."""

  SUCCESSORS = 4

  def __init__(self, cfg, global_batch_size, *, seed, process_index=0, process_count=1):
    self.vocab, self.length, self.batch = cfg.vocab_size, cfg.max_target_length, global_batch_size
    self.seed, self.step = seed, 0
    table_rng = np.random.default_rng(seed)
    self.successors = table_rng.integers(0, self.vocab, (self.vocab, self.SUCCESSORS))
    # Every process draws the same global batch and keeps its rows: the same data on any process count.
    rows = global_batch_size // process_count
    self.rows = slice(process_index * rows, (process_index + 1) * rows)

  def __next__(self) -> Batch:
    rng = np.random.default_rng((self.seed, self.step))
    self.step += 1
    b, l = self.batch, self.length + 1
    tokens = np.empty((b, l), np.int64)
    tokens[:, 0] = rng.integers(0, self.vocab, b)
    choice = rng.integers(0, self.SUCCESSORS, (b, l))
    noise = rng.random((b, l)) < 0.1
    random_tokens = rng.integers(0, self.vocab, (b, l))
    for t in range(1, l):
      nxt = self.successors[tokens[:, t - 1], choice[:, t]]
      tokens[:, t] = np.where(noise[:, t], random_tokens[:, t], nxt)
    tokens = tokens.astype(np.int32)
    tokens = tokens[self.rows]
    shape = (tokens.shape[0], self.length)
    return Batch(
      inputs=tokens[:, :-1],
      targets=tokens[:, 1:],
      positions=np.broadcast_to(np.arange(self.length, dtype=np.int32), shape).copy(),
      segment_ids=np.ones(shape, np.int32),
      weights=np.ones(shape, np.float32),
    )

  def get_state(self):
    return {"step": self.step}

  def set_state(self, state):
    self.step = int(state["step"])
