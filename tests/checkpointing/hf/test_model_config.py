"""config.json <-> our keys: both spellings of the llama3 RoPE scaling, tied embeddings, refusals, and the round trip
of what an export writes."""

import json

import pytest

from MaxText.checkpointing.hf import HFError, model_config
from MaxText.checkpointing.hf.importer import config_from_keys
from tests.conftest import REPO

TINY = json.loads((REPO / "tests" / "data" / "hf_tiny" / "config.json").read_text())
ROPE_KEYS = {
  "rope_max_timescale": 10000.0,
  "rope_type": "llama3.1",
  "rope_scaling_factor": 8.0,
  "rope_low_freq_factor": 1.0,
  "rope_high_freq_factor": 4.0,
  "rope_original_max_position": 64,
}


def _legacy(hf):
  """The transformers 4 spelling of the same config: rope_theta + rope_scaling."""
  out = {k: v for k, v in hf.items() if k != "rope_parameters"}
  params = dict(hf["rope_parameters"])
  out["rope_theta"] = params.pop("rope_theta")
  out["rope_scaling"] = params
  return out


def test_the_committed_config_and_its_legacy_spelling_give_the_same_keys():
  keys = model_config.to_keys(TINY)
  assert keys == model_config.to_keys(_legacy(TINY))
  assert {k: keys[k] for k in ROPE_KEYS} == ROPE_KEYS
  assert (
    keys["base_emb_dim"],
    keys["base_mlp_dim"],
    keys["base_num_decoder_layers"],
    keys["base_num_query_heads"],
    keys["base_num_kv_heads"],
    keys["head_dim"],
    keys["vocab_size"],
  ) == (64, 160, 3, 4, 2, 16, 384)
  assert keys["normalization_layer_epsilon"] == 1e-6 and keys["logits_via_embedding"] is False
  plain = {k: v for k, v in TINY.items() if k != "rope_parameters"}
  assert model_config.to_keys({**plain, "rope_theta": 5e5, "tie_word_embeddings": True})["rope_type"] == "default"
  assert model_config.to_keys({**plain, "tie_word_embeddings": True})["logits_via_embedding"] is True


def test_an_exported_config_reads_back_to_the_same_keys():
  keys = model_config.to_keys(TINY)
  cfg = config_from_keys(keys, "test")
  written = model_config.to_config_json(cfg, TINY, bos_id=0, eos_id=1)
  assert model_config.to_keys(written) == keys
  assert written["rope_scaling"]["rope_type"] == "llama3" and "rope_parameters" not in written
  assert written["max_position_embeddings"] == 256 and written["torch_dtype"] == "bfloat16"
  fresh = model_config.to_config_json(cfg.replace(rope_type="default"), None, dtype="float32", bos_id=0, eos_id=1)
  assert (
    fresh["rope_scaling"] is None and fresh["bos_token_id"] == 0 and model_config.to_keys(fresh)["vocab_size"] == 384
  )


@pytest.mark.parametrize(
  "change, message",
  [
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "not a Llama architecture"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "RoPE type 'yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}, "lacks low_freq_factor"),
    ({"hidden_act": "gelu"}, "silu with no biases"),
    ({"attention_bias": True}, "silu with no biases"),
    ({"hidden_size": None}, r"hidden_size=null \(the width of the hidden states\) must be an integer >= 1;"),
    ({"intermediate_size": 0}, r"intermediate_size=0 \(the MLP's inner width\) must be an integer >= 1"),
    ({"vocab_size": 384.0}, "vocab_size=384.0"),
    (
      {"rms_norm_eps": None},
      r"rms_norm_eps=null \(the RMSNorm epsilon\) must be a number > 0; LlamaConfig's default is 1e-06",
    ),
    ({"rope_theta": "10k"}, r'rope_theta="10k" \(the RoPE base frequency\) must be a number > 0'),
    ({"rms_norm_eps": -1e-5}, "rms_norm_eps=-1e-05"),
    ({"num_attention_heads": 0}, r"num_attention_heads=0 \(the number of attention \(query\) heads\) must be"),
    ({"num_attention_heads": 3}, "num_attention_heads=3 is not a multiple of num_key_value_heads=2"),
    ({"num_key_value_heads": 0}, "num_key_value_heads=0"),
    ({"head_dim": -16}, "head_dim=-16"),
    (
      {"rope_parameters": "llama3"},
      r'rope_parameters="llama3" \(the RoPE type and its parameters \(transformers 5\)\)',
    ),
    ({"rope_parameters": None, "rope_scaling": [1, 2]}, r"rope_scaling=\[1, 2\] \(the RoPE scaling"),
    ({"max_position_embeddings": None}, r"max_position_embeddings=null \(the longest sequence"),
    ({"max_position_embeddings": 0}, "max_position_embeddings=0"),
    ({"tie_word_embeddings": "false"}, 'tie_word_embeddings="false"'),
    ({"attention_bias": "no"}, 'attention_bias="no"'),
    ({"model_type": None}, "model_type=null"),
    (
      {"rope_parameters": {**TINY["rope_parameters"], "factor": 0}},
      r"rope_parameters.factor=0 \(the context extension factor\) must be a number > 0",
    ),
    (
      {"rope_parameters": {**TINY["rope_parameters"], "original_max_position_embeddings": "64"}},
      'rope_parameters.original_max_position_embeddings="64"',
    ),
  ],
)
def test_what_is_not_our_llama_is_refused_in_one_line(change, message):
  with pytest.raises(HFError, match=message) as e:
    model_config.to_keys({**TINY, **change}, "somewhere/config.json")
  assert str(e.value).startswith("somewhere/config.json") and "\n" not in str(e.value)


def test_null_or_absent_fields_mean_what_llamaconfig_makes_of_them():
  """LlamaConfig reads num_key_value_heads/head_dim null as 'as many as the query heads'/'hidden_size / heads' and
  rope_scaling/rope_parameters null as no scaling; an absent field is its default."""
  nulls = {**TINY, "num_key_value_heads": None, "head_dim": None, "rope_parameters": None, "rope_scaling": None}
  keys = model_config.to_keys(nulls)
  assert (keys["base_num_kv_heads"], keys["head_dim"], keys["rope_type"]) == (4, 16, "default")
  absent = {k: v for k, v in TINY.items() if k not in ("rms_norm_eps", "tie_word_embeddings", "rope_parameters")}
  keys = model_config.to_keys(absent)
  assert keys["normalization_layer_epsilon"] == 1e-6 and keys["logits_via_embedding"] is False
  assert (keys["rope_type"], keys["rope_max_timescale"]) == ("default", 10000.0)
  legacy = model_config.to_keys({**_legacy(TINY), "rope_theta": 500000})  # an integer theta is a number too
  assert legacy["rope_max_timescale"] == 500000.0 and legacy["rope_type"] == "llama3.1"
