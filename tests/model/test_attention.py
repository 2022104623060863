"""Attention's mask: causal only where the model is given no segment ids (the train step gives none where rows hold
one document: synthetic data, packing=false), per document where given; the XLA kernel's numbers unchanged by leaving
out a mask that masks nothing."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from MaxText import config, data
from MaxText.model import attention
from MaxText.model.decoder import Transformer
from tests.conftest import REPO

TINY = [
  "base_emb_dim=32",
  "base_num_query_heads=4",
  "base_num_kv_heads=2",
  "head_dim=8",
  "base_mlp_dim=48",
  "base_num_decoder_layers=2",
  "vocab_size=64",
  "max_target_length=12",
  "dtype=float32",
  "remat_policy=none",
]
GRAIN = ["dataset_type=grain", "grain_train_files=unused-*.array_record"]


def _cfg(*extra):
  return config.load(REPO / "configs" / "base.yml", TINY + list(extra))


def test_only_packed_grain_or_tfds_rows_hold_several_documents():
  """The data's answer (the model reads no data config): what the train step's segment ids follow."""
  assert not data.packed_documents(_cfg())  # synthetic
  assert not data.packed_documents(_cfg("packing=true"))  # packing applies to grain/tfds only
  assert data.packed_documents(_cfg(*GRAIN))
  assert not data.packed_documents(_cfg(*GRAIN, "packing=false"))
  assert data.packed_documents(_cfg("dataset_type=tfds", "dataset_path=d", "dataset_name=n"))


def test_xla_kernel_without_segments_is_the_one_segment_kernel_bit_for_bit():
  k = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(k[0], (2, 16, 4, 8), jnp.bfloat16)
  kk, v = (jax.random.normal(key, (2, 16, 2, 8), jnp.bfloat16) for key in k[1:])
  ones = jnp.ones((2, 16), jnp.int32)
  causal, one_segment = (jax.jit(attention.dot_product_attention)(q, kk, v, s) for s in (None, ones))
  assert np.array_equal(np.asarray(causal, np.float32), np.asarray(one_segment, np.float32))
  grads = [
    jax.jit(jax.grad(lambda q, s=s: attention.dot_product_attention(q, kk, v, s).astype(jnp.float32).sum()))(q)
    for s in (None, ones)
  ]
  assert np.array_equal(np.asarray(grads[0], np.float32), np.asarray(grads[1], np.float32))


def test_the_model_masks_per_document_only_where_given_segment_ids():
  """No segment ids (rows of one document): causal attention over the whole row; with ids, the second document's
  tokens don't see the first's."""
  tokens = jax.random.randint(jax.random.key(1), (1, 12), 0, 64)
  segments = jnp.array([[1] * 5 + [2] * 7])
  positions = jnp.array([list(range(5)) + list(range(7))])
  run = nnx.jit(lambda model, t, p, s: model(t, p, s))
  model = Transformer(_cfg(*GRAIN), rngs=nnx.Rngs(0))
  alone = run(model, tokens[:, 5:], positions[:, 5:], segments[:, 5:])
  np.testing.assert_allclose(run(model, tokens, positions, segments)[:, 5:], alone, rtol=1e-5, atol=1e-5)
  assert not np.allclose(run(model, tokens, positions, None)[:, 5:], alone, atol=1e-3)
