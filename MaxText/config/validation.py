"""What no single key's range can say: checks across keys of a Config, and its mesh against a job's size."""

import math

from MaxText.config.schema import MESH_AXES, RANGES, SCHEMA, ConfigError, check_number
from MaxText.quantization.formats import Format
from MaxText.quantization.recipes import get_recipe, recipe_names


def validate(c):
  """ConfigError for the first cross-key mistake in Config `c`."""
  for name in RANGES:  # what loading checked value by value, again for a Config made any other way
    check_number(name, getattr(c, name), "config")
  if c.load_parameters_path and c.load_full_state_path:
    raise ConfigError("set load_parameters_path or load_full_state_path, not both")
  if c.dataset_type == "grain" and not c.grain_train_files:
    raise ConfigError(
      "dataset_type=grain needs grain_train_files (a glob of ArrayRecord shards); "
      "python scripts/prepare_data.py --corpus shakespeare writes some"
    )
  if c.dataset_type == "tfds" and not (c.dataset_path and c.dataset_name):
    raise ConfigError("dataset_type=tfds needs dataset_path and dataset_name")
  _validate_hf(c)
  if c.amax_history_len < 1:
    raise ConfigError(f"amax_history_len={c.amax_history_len} must be >= 1")
  _validate_keys_in_effect(c)
  _validate_nvfp4_options(c)
  if c.quantization_stats_period < 0:
    raise ConfigError(f"quantization_stats_period={c.quantization_stats_period} must be >= 0 (0 = off)")
  if c.learning_rate < 0:
    raise ConfigError(f"learning_rate={c.learning_rate} must be >= 0")
  if not 0 <= c.warmup_steps_fraction <= 1:
    raise ConfigError(f"warmup_steps_fraction={c.warmup_steps_fraction} must be in [0, 1]")
  if c.base_num_query_heads % c.base_num_kv_heads:
    raise ConfigError(
      f"base_num_query_heads={c.base_num_query_heads} must be a multiple of base_num_kv_heads={c.base_num_kv_heads}"
    )
  if len(c.mlp_activations) != 2 or any(a not in ("silu", "gelu", "relu", "linear") for a in c.mlp_activations):
    raise ConfigError(
      f"mlp_activations={c.mlp_activations} must be two of silu, gelu, relu, linear (gate, up), e.g. [silu, linear]"
    )
  edge = c.quantization_bf16_first_layers + c.quantization_bf16_last_layers
  if min(c.quantization_bf16_first_layers, c.quantization_bf16_last_layers) < 0 or edge > c.base_num_decoder_layers:
    raise ConfigError(
      f"quantization_bf16_first_layers + quantization_bf16_last_layers = {edge} must be between 0 "
      f"and base_num_decoder_layers={c.base_num_decoder_layers}"
    )
  if c.run_name in (".", "..") or any(sep in c.run_name for sep in ("/", "\\", "\0")):
    raise ConfigError(
      f"run_name={c.run_name!r} must be a plain directory name (no '/', '..'): outputs go to "
      "base_output_directory/run_name"
    )
  if c.head_dim % 2:
    raise ConfigError(f"head_dim={c.head_dim} must be even (RoPE rotates pairs)")
  if c.num_vocab_tiling != -1 and (c.num_vocab_tiling < 1 or c.max_target_length % c.num_vocab_tiling):
    raise ConfigError(
      f"num_vocab_tiling={c.num_vocab_tiling} must be -1 (auto), or >= 1 and divide max_target_length="
      f"{c.max_target_length} (the lm head runs in tiles of the sequence)"
    )
  _validate_ranges_across_keys(c)


# disable_stochastic_rounding is not among them: it also says "no randomness" for any recipe (decode and calibration
# set it whatever the recipe).
NVFP4_OPTION_KEYS = (
  "disable_rht",
  "disable_2d_quantization",
  "nvfp4_4over6",
  "nvfp4_4over6_err_mode",
  "nvfp4_backward_override",
)
DELAYED_SCALING_KEYS = ("amax_history_len", "amax_compute_algo")


def _recipes_in_force(c):
  """The recipe names the GEMMs run: the MLP's, and the attention projections' (the MLP's under all_dense)."""
  return [c.quantization, c.quantization if c.quantization_scope == "all_dense" else c.attention_quantization]


def _changed(c, keys):
  """'key=value' of each of `keys` the config sets to other than its default (booleans as the user writes them)."""
  value = lambda k: str(getattr(c, k)).lower() if SCHEMA[k].type is bool else getattr(c, k)
  return [f"{k}={value(k)}" for k in keys if getattr(c, k) != SCHEMA[k].default]


def _recipes_text(c):
  if c.quantization_scope == "all_dense":
    return f"quantization={c.quantization!r} with quantization_scope=all_dense"
  return f"quantization={c.quantization!r} and attention_quantization={c.attention_quantization!r}"


def _validate_nvfp4_options(c):
  """The NVFP4 options need an NVFP4 recipe, and 4/6 on gradients needs a backward that quantizes them."""
  changed = _changed(c, NVFP4_OPTION_KEYS)
  if changed and not any(get_recipe(r).format is Format.NVFP4 for r in _recipes_in_force(c)):
    first, *others = [n for n in recipe_names() if get_recipe(n).format is Format.NVFP4]
    raise ConfigError(
      f"{', '.join(changed)} applies to the NVFP4 recipes only, but {_recipes_text(c)}; set quantization="
      f"{first} (or {', '.join(others)}), or drop the option"
    )
  if c.nvfp4_4over6 == "gradients" and c.nvfp4_backward_override != "none":
    raise ConfigError(
      f"nvfp4_4over6=gradients does nothing with nvfp4_backward_override="
      f"{c.nvfp4_backward_override}: the backward doesn't quantize gradients; use nvfp4_4over6=all, "
      "weights or activations, or nvfp4_backward_override=none"
    )


def _validate_keys_in_effect(c):
  """A key that does nothing under the config's recipes is refused, naming it and why (the user meant something)."""
  if c.attention_quantization and c.quantization_scope == "all_dense":
    raise ConfigError(
      f"attention_quantization={c.attention_quantization} does nothing with quantization_scope=all_dense: the "
      f"attention projections run quantization={c.quantization!r} there; set quantization_scope=mlp to give them "
      "their own recipe, or drop attention_quantization"
    )
  attention = _recipes_in_force(c)[1]
  if c.attention_quantization_backend and not get_recipe(attention).quantized:
    raise ConfigError(
      f"attention_quantization_backend={c.attention_quantization_backend} does nothing: the attention projections "
      f"run in BF16 ({_recipes_text(c)}); set attention_quantization to a recipe, or drop "
      "attention_quantization_backend"
    )
  changed = _changed(c, DELAYED_SCALING_KEYS)
  if changed and not any(get_recipe(r).stateful for r in _recipes_in_force(c)):
    delayed = [n for n in recipe_names() if get_recipe(n).stateful]
    raise ConfigError(
      f"{', '.join(changed)} applies to FP8 delayed scaling only ({', '.join(delayed)}: scales from an amax "
      f"history), but {_recipes_text(c)}; set quantization or attention_quantization to one of those, or drop "
      "the option"
    )


def _validate_hf(c):
  """dataset_type=hf as MaxText checks it, and what this pipeline reads (text, in the training process)."""
  if c.dataset_type != "hf":
    return
  if not c.hf_path:
    raise ConfigError(
      "dataset_type=hf needs hf_path: a Hub dataset (allenai/c4) or a file builder (parquet, json, arrow, csv, text) "
      "with hf_train_files"
    )
  if c.grain_worker_count > 0:
    raise ConfigError(
      f"dataset_type=hf streams its documents in the training process: grain_worker_count={c.grain_worker_count} "
      "must be 0 (MaxText allows at most 1 reader too)"
    )
  if c.grain_record_format != "text":
    raise ConfigError("dataset_type=hf reads text and tokenizes it: grain_record_format must be text")
  if c.eval_interval > 0 and not (c.hf_eval_split or c.hf_eval_files):
    raise ConfigError(
      f"eval_interval={c.eval_interval} with dataset_type=hf needs hf_eval_split or hf_eval_files (MaxText's rule); "
      "or set eval_interval=-1"
    )
  if len(c.train_data_columns) != 1:
    raise ConfigError(f"train_data_columns={c.train_data_columns} must name one column (the documents' text)")


def _validate_ranges_across_keys(c):
  """What a single key's range (RANGES) can't say: mesh sizes of 0, RoPE's interpolation band."""
  for name in (f"{k}_{a}_parallelism" for k in ("ici", "dcn") for a in MESH_AXES):
    if getattr(c, name) == 0:
      raise ConfigError(f"{name}=0 must be -1 (the remaining devices) or >= 1")
  if c.rope_type == "llama3.1" and c.rope_high_freq_factor <= c.rope_low_freq_factor:
    raise ConfigError(
      f"rope_high_freq_factor={c.rope_high_freq_factor} must be > rope_low_freq_factor="
      f"{c.rope_low_freq_factor} (llama3.1 RoPE interpolates between them; Llama 3.1 uses 4 and 1)"
    )


def check_job(cfg, nodes, devices_per_node):
  """The mesh keys against a job of `nodes` processes of `devices_per_node` devices each (submit.sh runs this
  before sbatch, where there may be no jax: the trainer's mesh forms from the same keys)."""
  for kind, count, unit, flag in (
    ("dcn", nodes, "node(s)", "--nodes"),
    ("ici", devices_per_node, "GPU(s) per node", "--gpus-per-node"),
  ):
    values = [getattr(cfg, f"{kind}_{a}_parallelism") for a in MESH_AXES]
    named = ", ".join(f"{kind}_{a}_parallelism={v}" for a, v in zip(MESH_AXES, values) if v != 1) or f"{kind}_* = 1"
    if values.count(-1) > 1:
      raise ConfigError(f"only one {kind}_*_parallelism may be -1 ({named})")
    fixed = math.prod(v for v in values if v != -1)
    if (count % fixed) if -1 in values else (count != fixed):
      need = f"a multiple of {fixed}" if -1 in values else f"exactly {fixed}"
      raise ConfigError(f"{flag} {count}: the config's {named} needs {need} {unit}; change {flag} or the {kind}_* keys")
