"""Autoregressive generation for a batch of prompts: the prompts prefilled at once into a KV cache preallocated to
max_target_length (GQA: K key/value heads cached, not H), then one token per compiled step; or, as the reference,
the whole sequence recomputed every step. Both draw token t with the key fold_in(key(seed), t), so the two agree
token for token wherever their logits do.

Row b holds its prompt at positions 0..n_b-1 (right-padded to max_prefill_predict_length) and its t-th generated
token at n_b + t; a row stops at EOS (kept in its completion) or when position max_target_length - 1 is filled.
Under an NVFP4 plan a GEMM scales its activations by their amax over the tokens it multiplies, so a one-token step
and a recompute of every token round a token differently: the two agree exactly under BF16/FP32 plans only.
"""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from MaxText.inference import sampling as sampling_lib
from MaxText.model.attention import KVCache


@dataclasses.dataclass
class Generation:
  """A batch's completions (ids, EOS included when reached) and timings (compilation excluded)."""

  completions: list
  prefill_seconds: float
  decode_seconds: float
  prefill_tokens: int  # prompt tokens of the batch
  decode_tokens: int  # tokens the decode steps produced for rows still generating


class Generator:
  """Compiled prefill/step (use_cache) or full-recompute functions for `batch` rows of at most `prefill_length`
  prompt tokens in sequences of `length`, under the precision plan's layer ranges."""

  def __init__(
    self, cfg, graphdef, rest, layer_ranges, batch, *, sampling=sampling_lib.Sampling(), eos_id=None, use_cache=True
  ):
    self.cfg, self.batch, self.eos_id, self.use_cache = cfg, batch, eos_id, use_cache
    self.length, self.prefill_length = cfg.max_target_length, cfg.max_prefill_predict_length
    rows = jnp.arange(batch)

    def next_token(model, hidden_BxTxD, last_B, key):
      logits = model.logits(hidden_BxTxD[rows, last_B][:, None])[:, 0]
      return sampling_lib.sample(logits, key, sampling)

    def prefill(params, tokens_BxP, lengths_B, key):
      model = nnx.merge(graphdef, params, rest)
      positions = jnp.broadcast_to(jnp.arange(tokens_BxP.shape[1], dtype=jnp.int32), tokens_BxP.shape)
      cache = KVCache.zeros(cfg, batch, self.length)
      hidden, cache = model.decode_hidden(tokens_BxP, positions, cache, layer_precisions=layer_ranges)
      return next_token(model, hidden, lengths_B - 1, key), cache

    def step(params, cache, tokens_B, positions_B, key):
      model = nnx.merge(graphdef, params, rest)
      hidden, cache = model.decode_hidden(tokens_B[:, None], positions_B[:, None], cache, layer_precisions=layer_ranges)
      return next_token(model, hidden, jnp.zeros_like(positions_B), key), cache

    def recompute(params, tokens_BxS, last_B, key):
      model = nnx.merge(graphdef, params, rest)
      return next_token(model, model.hidden(tokens_BxS, layer_precisions=layer_ranges), last_B, key)

    self._prefill, self._step = jax.jit(prefill), jax.jit(step, donate_argnums=(1,))
    self._recompute = jax.jit(recompute)
    self._compiled = {}

  def _fn(self, name, *args):
    """The function compiled ahead for these arguments' shapes (so timings hold no compilation)."""
    if name not in self._compiled:
      self._compiled[name] = getattr(self, f"_{name}").lower(*args).compile()
    return self._compiled[name]

  def __call__(self, params, prompts, seed=0):
    """Completions of `prompts` (lists of ids, exactly `batch` of them, each 1..prefill_length long)."""
    lengths = np.array([len(p) for p in prompts], np.int32)
    if len(prompts) != self.batch or lengths.min() < 1 or lengths.max() > self.prefill_length:
      raise ValueError(
        f"{len(prompts)} prompts of {lengths.min()}..{lengths.max()} tokens for a batch of "
        f"{self.batch} and prefill length {self.prefill_length}"
      )
    tokens = np.zeros((self.batch, self.length), np.int32)
    for b, p in enumerate(prompts):
      tokens[b, : len(p)] = p
    base_key = jax.random.key(seed)
    key = lambda t: jax.random.fold_in(base_key, t)
    if self.use_cache:
      args = (params, jnp.asarray(tokens[:, : self.prefill_length]), jnp.asarray(lengths), key(0))
      prefill = self._fn("prefill", *args)
      start = time.perf_counter()
      token, cache = jax.block_until_ready(prefill(*args))
      prefill_seconds = time.perf_counter() - start
      self._fn("step", params, cache, jnp.asarray(lengths), jnp.asarray(lengths), key(1))  # compiled before timing
    else:
      args = (params, jnp.asarray(tokens), jnp.asarray(lengths - 1), key(0))
      prefill = self._fn("recompute", *args)
      start = time.perf_counter()
      token = jax.block_until_ready(prefill(*args))
      prefill_seconds = time.perf_counter() - start
    token = np.asarray(token)
    done, decoded, t = np.zeros(self.batch, bool), 0, 0
    start = time.perf_counter()
    while True:
      position = np.minimum(lengths + t, self.length - 1)  # where token t goes
      active = ~done
      tokens[active, position[active]] = token[active]
      done |= (position >= self.length - 1) | ((token == self.eos_id) if self.eos_id is not None else False)
      if done.all():
        break
      t += 1
      if self.use_cache:
        args = (params, cache, jnp.asarray(token), jnp.asarray(position), key(t))
        token, cache = self._fn("step", *args)(*args)
      else:
        args = (params, jnp.asarray(tokens), jnp.asarray(position), key(t))
        token = self._fn("recompute", *args)(*args)
      token = np.asarray(token)
      decoded += int((~done).sum())
    decode_seconds = time.perf_counter() - start
    ends = [self._end(tokens[b], lengths[b]) for b in range(self.batch)]
    completions = [tokens[b, lengths[b] : ends[b]].tolist() for b in range(self.batch)]
    return Generation(completions, prefill_seconds, decode_seconds, int(lengths.sum()), decoded)

  def _end(self, row, start):
    """One past the row's last generated token: its EOS, or the end of the sequence."""
    if self.eos_id is not None:
      hits = np.nonzero(row[start:] == self.eos_id)[0]
      if hits.size:
        return start + hits[0] + 1
    return self.length
