"""Generation: decoding from the KV cache equals recomputing the whole sequence every step, token for token, for
greedy decoding and for sampling with a fixed seed; EOS stops a row and stays in its completion; under te_nvfp4 the
prefill is the training forward pass bit for bit.

NVFP4 quantizes a GEMM's activations with a per-tensor global scale (their amax over the tokens in that GEMM): a
decode step (one token per row) and a full recompute (every token) quantize the same token differently, so under
te_nvfp4 the two decodes are not expected to agree token for token; the forward pass over the same tokens is.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from MaxText import precision
from MaxText.inference import sampling
from MaxText.inference.generate import Generator
from MaxText.model.attention import KVCache
from tests.checkpointing.hf import tiny

PROMPTS = [[0, 51, 48, 46, 38, 48, 15], [0, 53, 80], [0, 45, 81, 60, 285, 310, 13, 222, 60, 81, 14], [0, 40]]


def _generate(cfg, graphdef, params, rest, use_cache, strategy, seed=3, eos_id=None):
  plan = precision.plan_from_config(cfg.replace(disable_stochastic_rounding=True))
  generate = Generator(
    cfg,
    graphdef,
    rest,
    plan.layer_ranges,
    len(PROMPTS),
    use_cache=use_cache,
    eos_id=eos_id,
    sampling=sampling.Sampling(strategy, 0.8, 5, 0.9),
  )
  return generate(params, PROMPTS, seed=seed).completions


@pytest.mark.parametrize(
  "strategy, extra",
  [
    ("greedy", ()),
    ("nucleus", ()),
    pytest.param("weighted", (), marks=pytest.mark.slow),
    pytest.param("topk", (), marks=pytest.mark.slow),
    pytest.param("greedy", ("scan_layers=false", "dtype=bfloat16"), id="greedy-loop-bf16", marks=pytest.mark.slow),
  ],
)
@jax.default_matmul_precision("highest")
def test_kv_cache_decode_equals_full_recompute(hf_tiny_import, strategy, extra):
  model = tiny.load(hf_tiny_import / "config.yml", "max_prefill_predict_length=12", "max_target_length=40", *extra)
  cached = _generate(*model, True, strategy)
  assert cached == _generate(*model, False, strategy)
  assert [len(c) for c in cached] == [40 - len(p) for p in PROMPTS]
  if strategy != "greedy":
    assert cached != _generate(*model, True, strategy, seed=4)  # the seed matters


def test_eos_stops_a_row_and_is_kept(hf_tiny_import):
  model = tiny.load(hf_tiny_import / "config.yml", "max_prefill_predict_length=12", "max_target_length=40")
  free = _generate(*model, True, "greedy")
  eos = free[0][5]  # pretend the 6th token of row 0 is the end of text
  stopped = _generate(*model, True, "greedy", eos_id=eos)
  for row, full in zip(stopped, free):
    end = full.index(eos) + 1 if eos in full else len(full)
    assert row == full[:end]
  assert len(stopped[0]) <= 6


@jax.default_matmul_precision("highest")
def test_te_nvfp4_prefill_is_the_training_forward_pass(hf_tiny_import):
  records, reference_logits = tiny.reference()
  tokens = jnp.asarray([records[2]["prompt_ids"]])
  cfg, graphdef, params, rest = tiny.load(hf_tiny_import / "config.yml", "quantization=te_nvfp4")
  layers = precision.plan_from_config(cfg.replace(disable_stochastic_rounding=True)).layer_ranges
  model = nnx.merge(graphdef, params, rest)
  hidden, _ = model.decode_hidden(
    tokens, jnp.arange(tokens.shape[1])[None], KVCache.zeros(cfg, 1, 32), layer_precisions=layers
  )
  logits = np.asarray(model.logits(hidden))
  np.testing.assert_array_equal(logits, model(tokens, layer_precisions=layers))
  exact = reference_logits[2][None]  # transformers, float32
  error = np.sqrt(np.mean((logits - exact) ** 2) / np.mean(exact**2))
  assert 0.03 < error < 0.5  # E2M1 MLPs: the NVFP4 forward runs
