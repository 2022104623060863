"""The committed tiny Llama (tests/data/hf_tiny) as our model: config, graph, parameters; transformers' reference."""

import json

import jax
import numpy as np

from MaxText import config
from MaxText.checkpointing import parameters
from MaxText.model.decoder import abstract_model
from tests.conftest import HF_TINY


def reference():
  """(records of reference.json: prompt, prompt_ids, greedy_ids; [transformers' f32 logits per prompt])."""
  records = json.loads((HF_TINY / "reference.json").read_text())["prompts"]
  logits = np.load(HF_TINY / "reference.npz")
  return records, [logits[f"logits_{i}"] for i in range(len(records))]


def load(config_path, *overrides, path=None):
  """(cfg, graphdef, params, rest): the config's model (float32 unless overridden) with the parameters of
  load_parameters_path (or `path`) on the first device."""
  cfg = config.load(config_path, ["dtype=float32", *overrides])
  graphdef, abstract, rest = abstract_model(cfg)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  template = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), abstract)
  return cfg, graphdef, parameters.load(cfg, path or cfg.load_parameters_path, template), rest
