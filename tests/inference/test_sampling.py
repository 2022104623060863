"""Sampling strategies by their definitions: which tokens each may draw, and with what frequencies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from MaxText.inference.sampling import Sampling, sample

PROBS = np.array([0.5, 0.3, 0.15, 0.05], np.float32)


def _draws(sampling, n=4000):
  logits = jnp.broadcast_to(jnp.log(jnp.asarray(PROBS)), (n, 4))  # one row per draw: n independent samples
  return np.asarray(sample(logits, jax.random.key(0), sampling))


def test_greedy_is_the_argmax():
  logits = jnp.asarray([[0.1, 2.0, -1.0], [3.0, 2.9, 0.0]])
  assert sample(logits, jax.random.key(0), Sampling("greedy")).tolist() == [1, 0]


def test_weighted_draws_the_softmax_and_temperature_sharpens_it():
  counts = np.bincount(_draws(Sampling("weighted")), minlength=4) / 4000
  np.testing.assert_allclose(counts, PROBS, atol=0.03)
  cold = np.bincount(_draws(Sampling("weighted", temperature=0.25)), minlength=4) / 4000
  expected = PROBS**4 / np.sum(PROBS**4)
  np.testing.assert_allclose(cold, expected, atol=0.03)


def test_topk_draws_only_the_k_most_probable():
  draws = _draws(Sampling("topk", top_k=2))
  assert set(draws.tolist()) == {0, 1}
  np.testing.assert_allclose(np.mean(draws == 0), 0.5 / 0.8, atol=0.03)


@pytest.mark.parametrize("p, allowed", [(0.5, {0}), (0.51, {0, 1}), (0.85, {0, 1, 2}), (1.0, {0, 1, 2, 3})])
def test_nucleus_keeps_the_smallest_set_reaching_p(p, allowed):
  assert set(_draws(Sampling("nucleus", nucleus_p=p)).tolist()) == allowed


@pytest.mark.parametrize("strategy", ["weighted", "topk", "nucleus"])
@pytest.mark.parametrize("temperature", [1e-40, 1e-30, 1e-7])
def test_a_temperature_too_small_to_sample_is_greedy(strategy, temperature):
  """The limit of sampling as the temperature goes to 0 is the most likely token. Dividing the raw logits by 1e-40
  made every positive logit +inf (or NaN: 0 * inf) and the draw uniform among them; shifted by the row's largest
  first, only the largest is left."""
  logits = jax.random.normal(jax.random.key(1), (256, 384)) * 3  # positive and negative logits, no ties
  sampling = Sampling(strategy, temperature=temperature, top_k=5, nucleus_p=0.9)
  drawn = sample(logits, jax.random.key(2), sampling)
  assert drawn.tolist() == jnp.argmax(logits, axis=-1).tolist()


def test_ties_at_a_tiny_temperature_are_drawn_among_the_tied_only():
  logits = jnp.broadcast_to(jnp.asarray([2.0, 5.0, 5.0, -1.0]), (4000, 4))
  draws = np.asarray(sample(logits, jax.random.key(0), Sampling("weighted", temperature=1e-40)))
  assert set(draws.tolist()) == {1, 2} and abs(np.mean(draws == 1) - 0.5) < 0.03
