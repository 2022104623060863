"""Choosing the next token from logits: MaxText's decode_sampling_strategy (greedy, weighted, topk, nucleus)."""

import typing

import jax
import jax.numpy as jnp


class Sampling(typing.NamedTuple):
  """A strategy and its parameters (static: part of the compiled step)."""

  strategy: str = "greedy"
  temperature: float = 1.0
  top_k: int = 0
  nucleus_p: float = -1.0


def from_config(cfg):
  """The config's decode_sampling_* keys."""
  return Sampling(
    cfg.decode_sampling_strategy,
    cfg.decode_sampling_temperature,
    cfg.decode_sampling_top_k,
    cfg.decode_sampling_nucleus_p,
  )


def scaled(logits_BxV, temperature):
  """Logits over `temperature`, shifted so each row's largest is 0 (the softmax is the same). As the temperature
  goes to 0 every other token goes to -inf, so a temperature too small for float32 samples the most likely token
  (greedy, the limit of sampling; ties drawn at random). Unshifted, the positive logits would all tie at +inf (the
  draw uniform among them). The temperature is held at float32's smallest normal number: a subnormal one is 0 to a
  CPU that flushes them."""
  shifted = logits_BxV - jnp.max(logits_BxV, axis=-1, keepdims=True)
  return shifted / max(float(temperature), float(jnp.finfo(jnp.float32).tiny))


def sample(logits_BxV, key, sampling: Sampling):
  """Next token ids [B] (int32). Sampling draws one Gumbel-max sample per row from `key`; masked tokens get -inf."""
  logits = logits_BxV.astype(jnp.float32)
  if sampling.strategy == "greedy":
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = scaled(logits, sampling.temperature)
  if sampling.strategy == "topk":
    kth = jax.lax.top_k(logits, sampling.top_k)[0][:, -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  elif sampling.strategy == "nucleus":
    # Keep the most probable tokens until their mass reaches p (the token that crosses p included).
    sorted_desc = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    kept = jnp.sum(mass_before < sampling.nucleus_p, axis=-1, keepdims=True)  # >= 1
    threshold = jnp.take_along_axis(sorted_desc, kept - 1, axis=-1)
    logits = jnp.where(logits >= threshold, logits, -jnp.inf)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
