"""A Hugging Face Llama config.json <-> our config keys: model shape, norm epsilon, RoPE (both spellings of the llama3
scaling), tied embeddings; and what an export writes back."""

import json
import pathlib

from MaxText.checkpointing.hf import HFError

ARCHITECTURE = "LlamaForCausalLM"
ROPE_SCALING_KEYS = {
  "factor": "rope_scaling_factor",
  "low_freq_factor": "rope_low_freq_factor",
  "high_freq_factor": "rope_high_freq_factor",
  "original_max_position_embeddings": "rope_original_max_position",
}
# What a model directory carries besides the weights, handed through import and export unchanged.
COMPANION_FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "generation_config.json",
  "chat_template.jinja",
  "config.json",
)


def read_json(path, what):
  path = pathlib.Path(path)
  if not path.is_file():
    raise HFError(f"{path}: no {what} there; point at a Hugging Face model directory")
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise HFError(f"{path}: not valid JSON ({e}); the {what} is damaged") from None
  if not isinstance(value, dict):
    raise HFError(f"{path}: expected a JSON object")
  return value


def _rope(hf, where):
  """{rope keys} from transformers 5's rope_parameters or the older rope_theta + rope_scaling."""
  params = hf.get("rope_parameters")
  if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
    params = params["full_attention"]  # the per-attention-type form
  if params is None:
    params = dict(hf.get("rope_scaling") or {})
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
  kind = params.get("rope_type", params.get("type", "default"))
  keys = {"rope_max_timescale": float(params.get("rope_theta", 10000.0))}
  if kind == "default":
    return {**keys, "rope_type": "default"}
  if kind != "llama3":
    raise HFError(f"{where}: RoPE type {kind!r} isn't supported (default and llama3 are)")
  missing = [k for k in ROPE_SCALING_KEYS if k not in params]
  if missing:
    raise HFError(f"{where}: the llama3 RoPE scaling lacks {', '.join(missing)}")
  return {**keys, "rope_type": "llama3.1", **{ours: params[theirs] for theirs, ours in ROPE_SCALING_KEYS.items()}}


def to_keys(hf, where="config.json"):
  """Our config keys for the model a Llama config.json describes; HFError for anything else."""
  architectures = hf.get("architectures") or []
  if (architectures and ARCHITECTURE not in architectures) or hf.get("model_type", "llama") != "llama":
    raise HFError(
      f"{where}: not a Llama architecture (architectures={architectures}, model_type="
      f"{hf.get('model_type')!r}); this converter reads {ARCHITECTURE} checkpoints"
    )
  required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
  missing = [k for k in required if not isinstance(hf.get(k), int)]
  if missing:
    raise HFError(f"{where}: lacks {', '.join(missing)} (integers); not a complete Llama config")
  if hf.get("hidden_act", "silu") != "silu" or hf.get("attention_bias") or hf.get("mlp_bias"):
    raise HFError(
      f"{where}: hidden_act={hf.get('hidden_act')!r}, attention_bias={hf.get('attention_bias')}, "
      f"mlp_bias={hf.get('mlp_bias')}: our Llama is silu with no biases"
    )
  heads = hf["num_attention_heads"]
  head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
  keys = {
    "base_emb_dim": hf["hidden_size"],
    "base_mlp_dim": hf["intermediate_size"],
    "base_num_decoder_layers": hf["num_hidden_layers"],
    "base_num_query_heads": heads,
    "base_num_kv_heads": hf.get("num_key_value_heads") or heads,
    "head_dim": head_dim,
    "vocab_size": hf["vocab_size"],
    "normalization_layer_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
    "logits_via_embedding": bool(hf.get("tie_word_embeddings", False)),
    "mlp_activations": ["silu", "linear"],
  }
  return {**keys, **_rope(hf, where)}


def to_config_json(cfg, base=None, *, dtype="bfloat16", bos_id=None, eos_id=None):
  """config.json for `cfg`'s model: `base` (the config.json the weights came with, if any) with every field our
  model defines set from `cfg`, the RoPE in the rope_theta/rope_scaling spelling every transformers version reads."""
  out = {
    k: v
    for k, v in (base or {}).items()
    if k
    not in (
      "rope_parameters",
      "rope_scaling",
      "rope_theta",
      "dtype",
      "torch_dtype",
      "transformers_version",
      "_name_or_path",
    )
  }
  out.update(
    {
      "architectures": [ARCHITECTURE],
      "model_type": "llama",
      "hidden_size": cfg.base_emb_dim,
      "intermediate_size": cfg.base_mlp_dim,
      "num_hidden_layers": cfg.base_num_decoder_layers,
      "num_attention_heads": cfg.base_num_query_heads,
      "num_key_value_heads": cfg.base_num_kv_heads,
      "head_dim": cfg.head_dim,
      "vocab_size": cfg.vocab_size,
      "rms_norm_eps": cfg.normalization_layer_epsilon,
      "hidden_act": "silu",
      "attention_bias": False,
      "mlp_bias": False,
      "tie_word_embeddings": cfg.logits_via_embedding,
      "rope_theta": cfg.rope_max_timescale,
      "torch_dtype": dtype,
    }
  )
  out["rope_scaling"] = None
  if cfg.rope_type == "llama3.1":
    out["rope_scaling"] = {
      "rope_type": "llama3",
      **{theirs: getattr(cfg, ours) for theirs, ours in ROPE_SCALING_KEYS.items()},
    }
  out.setdefault("max_position_embeddings", cfg.max_target_length)
  for name, value in (("bos_token_id", bos_id), ("eos_token_id", eos_id)):
    if value is not None:
      out.setdefault(name, value)
  return out
