"""A Hugging Face Llama config.json <-> our config keys: model shape, norm epsilon, RoPE (both spellings of the llama3
scaling), tied embeddings; and what an export writes back."""

import json
import math
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


# The config.json fields read here: (what transformers' LlamaConfig means by it, its kind, LlamaConfig's default where
# the field may be left out; REQUIRED where it may not). Kinds: "count" an integer >= 1, "positive" a finite number
# > 0, "bool" true or false, "text" a string, "object" a JSON object; "or null" where LlamaConfig reads null as
# its default (num_key_value_heads, head_dim) or as none at all (rope_scaling, rope_parameters).
REQUIRED = object()
FIELDS = {
  "vocab_size": ("the vocabulary size", "count", REQUIRED),
  "hidden_size": ("the width of the hidden states", "count", REQUIRED),
  "intermediate_size": ("the MLP's inner width", "count", REQUIRED),
  "num_hidden_layers": ("the number of decoder layers", "count", REQUIRED),
  "num_attention_heads": ("the number of attention (query) heads", "count", REQUIRED),
  "num_key_value_heads": ("the number of key/value heads (GQA)", "count or null", None),
  "head_dim": ("each attention head's width", "count or null", None),
  "rms_norm_eps": ("the RMSNorm epsilon", "positive", 1e-6),
  "rope_theta": ("the RoPE base frequency", "positive", 10000.0),
  "max_position_embeddings": ("the longest sequence the model was trained for", "count", 2048),
  "tie_word_embeddings": ("whether lm_head shares the embedding's weights", "bool", False),
  "hidden_act": ("the MLP's activation", "text", "silu"),
  "attention_bias": ("whether the attention projections have biases", "bool", False),
  "mlp_bias": ("whether the MLP projections have biases", "bool", False),
  "model_type": ("the architecture's name", "text", "llama"),
  "rope_scaling": ("the RoPE scaling (transformers 4)", "object or null", None),
  "rope_parameters": ("the RoPE type and its parameters (transformers 5)", "object or null", None),
}
# The llama3 RoPE scaling's fields (in rope_scaling or rope_parameters).
ROPE_FIELDS = {
  "factor": ("the context extension factor", "positive"),
  "low_freq_factor": ("the low-frequency wavelength factor", "positive"),
  "high_freq_factor": ("the high-frequency wavelength factor", "positive"),
  "original_max_position_embeddings": ("the context length before scaling", "count"),
}
_KINDS = {
  "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
  "positive": (
    lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
    "a number > 0",
  ),
  "bool": (lambda v: isinstance(v, bool), "true or false"),
  "text": (lambda v: isinstance(v, str), "a string"),
  "object": (lambda v: isinstance(v, dict), "a JSON object"),
}


def _field(hf, name, where, fields=None, prefix=""):
  """config.json's `name`, checked to be what LlamaConfig means by it (LlamaConfig's default where it is absent, or
  null where null means that); HFError naming the field, its meaning and what it must be."""
  meaning, kind, default = (fields or FIELDS)[name] + ((REQUIRED,) if fields else ())
  if name not in hf:
    if default is REQUIRED:
      raise HFError(f"{where}: lacks {prefix}{name} ({meaning}); not a complete Llama config")
    return default
  value = hf[name]
  base, _, nullable = kind.partition(" or ")
  if value is None and nullable:
    return default
  check, wanted = _KINDS[base]
  if not check(value):
    default_note = f"; LlamaConfig's default is {json.dumps(default)}" if default not in (REQUIRED, None) else ""
    raise HFError(
      f"{where}: {prefix}{name}={json.dumps(value)} ({meaning}) must be {wanted}{' or null' if nullable else ''}"
      f"{default_note}; fix config.json"
    )
  return value


def _rope(hf, where):
  """{rope keys} from transformers 5's rope_parameters or the older rope_theta + rope_scaling."""
  params = _field(hf, "rope_parameters", where)
  prefix = "rope_parameters."
  if params is not None and isinstance(params.get("full_attention"), dict):
    params, prefix = params["full_attention"], "rope_parameters.full_attention."  # the per-attention-type form
  if params is None:
    params, prefix = dict(_field(hf, "rope_scaling", where) or {}), "rope_scaling."
  theta = (
    _field(params, "rope_theta", where, prefix=prefix) if "rope_theta" in params else _field(hf, "rope_theta", where)
  )
  kind = params.get("rope_type", params.get("type", "default"))
  keys = {"rope_max_timescale": float(theta)}
  if kind == "default":
    return {**keys, "rope_type": "default"}
  if kind != "llama3":
    raise HFError(f"{where}: RoPE type {kind!r} isn't supported (default and llama3 are)")
  missing = [k for k in ROPE_SCALING_KEYS if k not in params]
  if missing:
    raise HFError(f"{where}: the llama3 RoPE scaling lacks {', '.join(missing)}")
  scaling = {ours: _field(params, theirs, where, ROPE_FIELDS, prefix) for theirs, ours in ROPE_SCALING_KEYS.items()}
  return {**keys, "rope_type": "llama3.1", **scaling}


def to_keys(hf, where="config.json"):
  """Our config keys for the model a Llama config.json describes; HFError for anything else, and for a field that
  isn't what LlamaConfig means by it (null, another type, zero), one line naming it."""
  architectures = hf.get("architectures") or []
  if not isinstance(architectures, list):
    architectures = [architectures]
  model_type = _field(hf, "model_type", where)
  if (architectures and ARCHITECTURE not in architectures) or model_type != "llama":
    raise HFError(
      f"{where}: not a Llama architecture (architectures={architectures}, model_type="
      f"{hf.get('model_type')!r}); this converter reads {ARCHITECTURE} checkpoints"
    )
  value = {name: _field(hf, name, where) for name in FIELDS if name not in ("rope_scaling", "rope_parameters")}
  if value["hidden_act"] != "silu" or value["attention_bias"] or value["mlp_bias"]:
    raise HFError(
      f"{where}: hidden_act={hf.get('hidden_act')!r}, attention_bias={hf.get('attention_bias')}, "
      f"mlp_bias={hf.get('mlp_bias')}: our Llama is silu with no biases"
    )
  heads = value["num_attention_heads"]
  kv_heads = value["num_key_value_heads"] or heads
  if heads % kv_heads:
    raise HFError(
      f"{where}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads} (each key/value "
      "head serves a whole group of query heads); fix config.json"
    )
  head_dim = value["head_dim"] or value["hidden_size"] // heads
  if head_dim < 1:
    raise HFError(
      f"{where}: hidden_size={value['hidden_size']} / num_attention_heads={heads} leaves heads of width 0 and "
      "config.json gives no head_dim; fix config.json"
    )
  keys = {
    "base_emb_dim": value["hidden_size"],
    "base_mlp_dim": value["intermediate_size"],
    "base_num_decoder_layers": value["num_hidden_layers"],
    "base_num_query_heads": heads,
    "base_num_kv_heads": kv_heads,
    "head_dim": head_dim,
    "vocab_size": value["vocab_size"],
    "normalization_layer_epsilon": float(value["rms_norm_eps"]),
    "logits_via_embedding": value["tie_word_embeddings"],
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
