"""Models by name (`model_name`, MaxText's way to pick a model): every named model's definition, the one table of
their shapes, vocabulary, norm epsilon, RoPE and embedding tying, from the published Hugging Face config.json files
(MaxText's configs/models/<name>.yml for the shapes MaxText also defines)."""

# The keys a model definition sets (MaxText's "model keys"): the shape, vocabulary, norm, RoPE and tying. A named model
# sets all of them, so switching names never keeps another model's values; the command line or a YAML may set one to
# another value only with override_model_config=true (MaxText's rule). Training keys (max_target_length, dtype, ...)
# are not model keys.
MODEL_KEYS = (
  "base_emb_dim",
  "base_num_query_heads",
  "base_num_kv_heads",
  "head_dim",
  "base_mlp_dim",
  "base_num_decoder_layers",
  "vocab_size",
  "mlp_activations",
  "normalization_layer_epsilon",
  "rope_max_timescale",
  "rope_type",
  "rope_scaling_factor",
  "rope_low_freq_factor",
  "rope_high_freq_factor",
  "rope_original_max_position",
  "logits_via_embedding",
)
# The GEMMs of a decoder layer by the precision plan's names, each with the named scope its Dense layer runs in:
# MaxText's remat names, which the remat policies save and a compiled program's op paths show.
ATTENTION_GEMMS = {"q": "query_proj", "k": "key_proj", "v": "value_proj", "o": "out_proj"}
MLP_GEMMS = {"gate": "mlpwi_0", "up": "mlpwi_1", "down": "mlpwo"}
FUSED_GEMMS = {("gate", "up"): "mlpwi"}  # fused_mlp: gate and up as one GEMM
# Named scope -> the GEMM it names ("gate_up" for the fused pair).
DENSE_SCOPES = {
  **{scope: gemm for gemm, scope in {**ATTENTION_GEMMS, **MLP_GEMMS}.items()},
  **{scope: "_".join(gemms) for gemms, scope in FUSED_GEMMS.items()},
}
DEFAULT = "default"  # MaxText's name for "no named model": the model keys as the config sets them

_LLAMA3 = dict(
  base_num_kv_heads=8,
  head_dim=128,
  vocab_size=128256,
  mlp_activations=["silu", "linear"],
  normalization_layer_epsilon=1e-5,
  rope_max_timescale=500000.0,
  rope_type="default",
  rope_scaling_factor=8.0,
  rope_low_freq_factor=1.0,
  rope_high_freq_factor=4.0,
  rope_original_max_position=8192,
  logits_via_embedding=False,
)
_8B = dict(base_emb_dim=4096, base_num_query_heads=32, base_mlp_dim=14336, base_num_decoder_layers=32)
_70B = dict(base_emb_dim=8192, base_num_query_heads=64, base_mlp_dim=28672, base_num_decoder_layers=80)
_405B = dict(base_emb_dim=16384, base_num_query_heads=128, base_mlp_dim=53248, base_num_decoder_layers=126)
_LLAMA31_ROPE = dict(rope_type="llama3.1", rope_scaling_factor=8.0)  # config.json: rope_scaling llama3, factor 8
_LLAMA32_ROPE = dict(rope_type="llama3.1", rope_scaling_factor=32.0)  # factor 32 (MaxText has no Llama 3.2)

MODELS = {
  "llama3-8b": {**_LLAMA3, **_8B},
  "llama3-70b": {**_LLAMA3, **_70B},
  "llama3.1-8b": {**_LLAMA3, **_8B, **_LLAMA31_ROPE},
  "llama3.1-70b": {**_LLAMA3, **_70B, **_LLAMA31_ROPE},
  "llama3.1-405b": {**_LLAMA3, **_405B, **_LLAMA31_ROPE},
  # MaxText gives llama3.3-70b no RoPE scaling (its scaling keys off the name prefix "llama3.1"); Meta's config.json
  # has the llama3 x8 scaling, which is what the published weights were trained with.
  "llama3.3-70b": {**_LLAMA3, **_70B, **_LLAMA31_ROPE},
  # Llama 3.2 1B/3B tie the lm head to the embedding (no sqrt(width) logit normalisation, as Hugging Face).
  "llama3.2-1b": {
    **_LLAMA3,
    **dict(base_emb_dim=2048, base_num_query_heads=32, head_dim=64, base_mlp_dim=8192, base_num_decoder_layers=16),
    **_LLAMA32_ROPE,
    "logits_via_embedding": True,
  },
  "llama3.2-3b": {
    **_LLAMA3,
    **dict(base_emb_dim=3072, base_num_query_heads=24, base_mlp_dim=8192, base_num_decoder_layers=28),
    **_LLAMA32_ROPE,
    "logits_via_embedding": True,
  },
  # Ours: the few-million-parameter demo that trains on a 2-core CPU (configs/llama3_tiny.yml).
  "llama3-tiny": {
    **_LLAMA3,
    **dict(base_emb_dim=256, base_num_query_heads=4, base_num_kv_heads=2, head_dim=64, base_mlp_dim=768),
    **dict(base_num_decoder_layers=4, vocab_size=512),
  },
}
# The context length each published model was trained to (config.json max_position_embeddings); not a model key.
MAX_POSITION = {
  **{n: 8192 for n in ("llama3-8b", "llama3-70b")},
  **{n: 131072 for n in MODELS if n.startswith(("llama3.1", "llama3.2", "llama3.3"))},
}
# Parameters of the published checkpoints (safetensors totals on Hugging Face); tests check the model against them.
PUBLISHED_PARAMETERS = {
  "llama3-8b": 8_030_261_248,
  "llama3.1-8b": 8_030_261_248,
  "llama3-70b": 70_553_706_496,
  "llama3.1-70b": 70_553_706_496,
  "llama3.3-70b": 70_553_706_496,
  "llama3.1-405b": 405_853_388_800,
  "llama3.2-1b": 1_235_814_400,
  "llama3.2-3b": 3_212_749_824,
}
assert all(set(m) == set(MODEL_KEYS) for m in MODELS.values()), "every model sets every model key"


def canonical_name(name):
  """MaxText's spelling -> the table's: its '-Instruct' suffix names the same shapes (MaxText strips it too)."""
  return name[: -len("-Instruct")] if name.endswith("-Instruct") else name


def definition(name):
  """{model key: value} of model `name`, None for 'default'; KeyError for a name the table lacks."""
  name = canonical_name(name)
  if name == DEFAULT:
    return None
  return dict(MODELS[name])


def known_names():
  return [DEFAULT, *MODELS]


def matching(values):
  """The name of the model whose definition `values` (a {key: value} with every model key) equals, else None."""
  for name, model in MODELS.items():
    if all(values.get(k) == v for k, v in model.items()):
      return name
  return None
