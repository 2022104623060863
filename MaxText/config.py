"""The config schema (every key: type, default, doc), YAML + key=value loading, validation and derived values."""

import dataclasses
import difflib
import math
import os
import pathlib
import re
import sys
import typing

import yaml


def _recipe_names_without_jax():
  """recipes.py is plain Python but its package imports jax: load the file alone, so that
  `python -m MaxText.config --check` (submit.sh on a login node) needs only pyyaml."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("_maxtext_recipes_only",
                                                pathlib.Path(__file__).parent / "quantization" / "recipes.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up
  spec.loader.exec_module(module)
  return module.recipe_names


try:
  from MaxText.quantization import recipe_names
except ImportError:  # no jax on this machine
  recipe_names = _recipe_names_without_jax()


class ConfigError(ValueError):
  """A user mistake in a config file or override: printed as one line, exit code 2."""


@dataclasses.dataclass(frozen=True)
class Key:
  type: type
  default: typing.Any
  doc: str
  choices: tuple = ()


# One source of truth: configs/base.yml is generated from this table (see write_base_yml).
SCHEMA = {
    # -- run
    "run_name": Key(str, "", "name of the run; outputs go to base_output_directory/run_name ('' = timestamp)"),
    "base_output_directory": Key(str, "outputs", "root directory for metrics, TensorBoard events and checkpoints"),
    "steps": Key(int, 100, "number of optimizer steps to train"),
    "log_period": Key(int, 10, "flush metrics files (JSONL, TensorBoard) every this many steps"),
    "seed": Key(int, 0, "seed for parameter init, data and stochastic rounding"),
    "dry_run": Key(bool, False, "build the model abstractly, print the summary and memory estimate, exit"),
    "enable_tensorboard": Key(bool, True, "write TensorBoard event files next to the JSONL metrics"),
    "hardware_memory_gib": Key(float, 0.0, "memory per device for the preflight check (0 = ask the device)"),
    "jax_cache_dir": Key(str, "~/.cache/maxtext_nvfp4/jax", "persistent compilation cache shared by every run on "
                         "the machine: a restart loads what an earlier start compiled ('' = off)"),
    "data_prefetch_depth": Key(int, 2, "batches read and placed on the devices ahead of the step, by a background "
                               "thread (0 = read each batch in the loop)"),
    "profiler": Key(str, "", "'' (off), xplane (XProf trace of the profiled steps under run_dir/tensorboard, for "
                    "TensorBoard or Perfetto, plus a printed device-time breakdown) or nsys (cudaProfilerStart/Stop "
                    "around them, for nsys profile --capture-range=cudaProfilerApi)", ("", "xplane", "nsys")),
    "skip_first_n_steps_for_profiler": Key(int, 1, "profile from this step on (skips compilation)"),
    "profiler_steps": Key(int, 5, "number of steps to profile"),
    # -- batch
    "per_device_batch_size": Key(float, 1.0, "sequences per device per step (global batch = this x devices)"),
    "max_target_length": Key(int, 2048, "sequence length in tokens"),
    "gradient_accumulation_steps": Key(int, 1, "micro-batches accumulated into one optimizer step"),
    # -- optimizer
    "learning_rate": Key(float, 3e-4, "peak learning rate (AdamW)"),
    "warmup_steps_fraction": Key(float, 0.1, "linear warmup length as a fraction of the schedule"),
    "warmup_steps": Key(int, -1, "linear warmup length in steps (-1 = use warmup_steps_fraction)"),
    "learning_rate_schedule_steps": Key(int, -1, "length of the warmup+cosine schedule (-1 = steps)"),
    "cosine_learning_rate_final_fraction": Key(float, 0.1, "final learning rate as a fraction of the peak"),
    "adam_b1": Key(float, 0.9, "AdamW beta1"),
    "adam_b2": Key(float, 0.95, "AdamW beta2"),
    "adam_eps": Key(float, 1e-8, "AdamW epsilon"),
    "adam_weight_decay": Key(float, 0.1, "AdamW decoupled weight decay"),
    "gradient_clipping_threshold": Key(float, 1.0, "clip gradients to this global norm (0 = off)"),
    # -- precision
    "dtype": Key(str, "bfloat16", "activation / compute dtype", ("bfloat16", "float32", "float16")),
    "weight_dtype": Key(str, "float32", "parameter (master weight) dtype", ("float32", "bfloat16")),
    "quantization": Key(str, "", "precision recipe of the MLP GEMMs ('' = BF16)", tuple([""] + recipe_names())),
    "quantization_scope": Key(str, "mlp", "GEMMs that run `quantization`: mlp (the published recipe) or "
                              "all_dense (attention q/k/v/o projections too, MaxText's behaviour)", ("mlp", "all_dense")),
    "attention_quantization": Key(str, "", "recipe of the attention q/k/v/o projections when "
                                  "quantization_scope=mlp ('' = BF16)", tuple([""] + recipe_names())),
    "quantization_bf16_first_layers": Key(int, 0, "keep this many first decoder layers unquantized (BF16)"),
    "quantization_bf16_last_layers": Key(int, 0, "keep this many last decoder layers unquantized (BF16)"),
    "high_precision_from_step": Key(int, -1, "run every GEMM in BF16 from this step on (-1 = never)"),
    "quantization_backend": Key(str, "auto", "auto: Transformer Engine where it can run the recipe, else xla where "
                                "its block-scaled dot is a native FP4 GEMM (SM100+), else emulate; te; xla "
                                "(jax.nn.scaled_matmul on our NVFP4 operands, NVIDIA GPUs); emulate (pure JAX)",
                                ("auto", "te", "xla", "emulate")),
    "quantization_kernels": Key(str, "auto", "operand quantizers of the emulated backend: auto (Pallas Triton "
                                "kernels on a single NVIDIA GPU, else xla), pallas, xla (the portable XLA path, "
                                "same bits)",
                                ("auto", "pallas", "xla")),
    "disable_rht": Key(bool, False, "NVFP4: no Random Hadamard Transform on the wgrad operands"),
    "disable_stochastic_rounding": Key(bool, False, "NVFP4: round gradients to nearest instead of stochastically"),
    "disable_2d_quantization": Key(bool, False, "NVFP4: 1x16 blocks for weights instead of 16x16 tiles"),
    "nvfp4_4over6": Key(str, "none", "NVFP4: Four Over Six block scaling (each block quantized with its max mapped "
                        "to 6 and to 4, the one with the smaller error kept; global scale 6*256/amax) on the weights "
                        "(w), activations (x), gradients (dy) or all of them (TE's name; TE's 'all' leaves gradients "
                        "out)", ("none", "weights", "activations", "gradients", "all")),
    "nvfp4_4over6_err_mode": Key(str, "mse", "NVFP4 Four Over Six: the block error that picks 4 or 6: mse (sum of "
                                 "squares, the paper's) or mae (sum of magnitudes, TE's default)", ("mse", "mae")),
    "nvfp4_backward_override": Key(str, "none", "NVFP4: quantize fprop only; dgrad and wgrad in the compute dtype "
                                   "on the unquantized x, w, dy (high_precision) or on the forward's quantized x and "
                                   "w, dequantized, with unquantized dy (dequantized); TE's backward_override",
                                   ("none", "high_precision", "dequantized")),
    "amax_history_len": Key(int, 1024, "te_fp8_delayedscaling: steps of amax history per GEMM operand"),
    "amax_compute_algo": Key(str, "max", "te_fp8_delayedscaling: scale from the history's max or its most "
                             "recent amax", ("max", "most_recent")),
    "quantization_stats_period": Key(int, 0, "every N steps log, per GEMM kind and operand, the relative "
                                     "quantization error and the fractions of saturated and all-zero (underflowed) "
                                     "blocks to metrics.jsonl/TensorBoard as quant/<gemm>/<operand>/<stat> (0 = off)"),
    # -- model
    "model_name": Key(str, "llama3", "model family label (informational)"),
    "base_emb_dim": Key(int, 2048, "model (embedding) width"),
    "base_num_query_heads": Key(int, 16, "attention query heads"),
    "base_num_kv_heads": Key(int, 8, "attention key/value heads (grouped-query attention)"),
    "head_dim": Key(int, 128, "width of one attention head"),
    "base_mlp_dim": Key(int, 7168, "SwiGLU hidden width"),
    "base_num_decoder_layers": Key(int, 16, "decoder layers"),
    "vocab_size": Key(int, 32000, "vocabulary size (embedding rows and lm head columns)"),
    "logits_via_embedding": Key(bool, False, "the lm head is the embedding's transpose (tied embeddings, as Llama "
                                "3.2 1B/3B; no lm_head parameter); MaxText's key, without its Gemma-style "
                                "normalize_embedding_logits"),
    "mlp_activations": Key(list, ["silu", "linear"], "gated MLP activations: [gate, up]"),
    "normalization_layer_epsilon": Key(float, 1e-5, "RMSNorm epsilon"),
    "rope_max_timescale": Key(float, 500000.0, "RoPE base (theta)"),
    "rope_type": Key(str, "default", "RoPE frequencies: default, or llama3.1 scaling", ("default", "llama3.1")),
    "rope_scaling_factor": Key(float, 8.0, "llama3.1 RoPE: scale factor"),
    "rope_low_freq_factor": Key(float, 1.0, "llama3.1 RoPE: low-frequency factor"),
    "rope_high_freq_factor": Key(float, 4.0, "llama3.1 RoPE: high-frequency factor"),
    "rope_original_max_position": Key(int, 8192, "llama3.1 RoPE: original context length"),
    "scan_layers": Key(bool, True, "run the decoder layers with lax.scan (one compiled layer)"),
    "remat_policy": Key(str, "full", "activation rematerialization per layer: none, full (recompute the layer), "
                        "minimal (keep the q/k/v/o and MLP GEMM outputs), +_with_context (and the attention "
                        "output, with cuDNN its softmax statistics too), +_with_quantization (and the quantized operands the backward GEMMs reuse)",
                        ("none", "minimal", "minimal_with_context", "minimal_with_quantization",
                         "minimal_with_context_and_quantization", "full")),
    "attention": Key(str, "dot_product", "attention kernel: XLA dot_product, or cuDNN flash on GPU",
                     ("dot_product", "cudnn_flash")),
    "num_vocab_tiling": Key(int, 1, "compute the lm head and its cross-entropy in this many tiles of the sequence, "
                            "gradients included, so the [tokens, vocab] f32 logits are never whole in memory "
                            "(1 = off; must divide max_target_length)"),
    # -- distribution
    "hardware": Key(str, "cpu", "cpu (one process; NNODES>1 with JAX_COORDINATOR_IP for CPU multi-process), gpu (one "
                    "process per node from JAX_COORDINATOR_IP/PORT, NNODES, NODE_RANK) or gpu_multiprocess (one "
                    "process per GPU, Slurm detected)", ("cpu", "gpu", "gpu_multiprocess")),
    "jax_distributed_initialization_timeout": Key(int, 300, "seconds to wait for all processes to join"),
    **{f"ici_{axis}_parallelism": Key(int, -1 if axis == "fsdp" else 1,
                                      f"{axis} parallelism within a node (-1 = the remaining devices)")
       for axis in ("data", "fsdp", "context", "tensor")},
    **{f"dcn_{axis}_parallelism": Key(int, -1 if axis == "data" else 1,
                                      f"{axis} parallelism across nodes/processes (-1 = the remaining processes)")
       for axis in ("data", "fsdp", "context", "tensor")},
    "gpu_type": Key(str, "", "target GPU for the memory check (dry_run and preflight): its published HBM less "
                    "10% headroom for XLA workspace, NCCL buffers and fragmentation ('' = the local device)",
                    ("", "h100", "h200", "b200", "gb200", "b300", "gb300")),
    "num_devices": Key(int, 0, "dry_run: the device count to plan for (0 = the ici/dcn product, else local)"),
    # -- data
    "dataset_type": Key(str, "synthetic", "input pipeline: synthetic (a seeded Markov chain), grain (ArrayRecord "
                        "files) or tfds (a TFDS dataset directory read through its ArrayRecord data source)",
                        ("synthetic", "grain", "tfds")),
    "grain_train_files": Key(str, "", "grain: glob of the training ArrayRecord shards"),
    "grain_eval_files": Key(str, "", "grain: glob of the eval ArrayRecord shards ('' = no eval data)"),
    "grain_record_format": Key(str, "text", "grain/tfds: records are UTF-8 text (tokenized on the fly) or "
                               "token_ids (int32 little-endian)", ("text", "token_ids")),
    "grain_worker_count": Key(int, 0, "grain/tfds: worker processes reading the training data, each its own share "
                              "of the documents (0 = read in the training process; eval always reads there)"),
    "packing": Key(bool, True, "grain/tfds: pack several documents into each row (attention masked per document); "
                   "false: one document piece per row, right-padded, attention causal only. Synthetic data is "
                   "never packed"),
    "grain_max_pieces_per_document": Key(int, 4096, "grain/tfds: a document longer than this many sequences of "
                                         "max_target_length is an error naming it"),
    "dataset_path": Key(str, "", "tfds: the data_dir holding <dataset_name>/<version>/"),
    "dataset_name": Key(str, "", "tfds: dataset name"),
    "train_split": Key(str, "train", "tfds: training split"),
    "eval_split": Key(str, "", "tfds: eval split ('' = no eval data)"),
    "tokenizer_type": Key(str, "byte", "byte (UTF-8 bytes, no file), huggingface (tokenizer.json), tiktoken "
                          "(a Llama 3 tokenizer.model) or sentencepiece", ("byte", "huggingface", "tiktoken",
                                                                          "sentencepiece")),
    "tokenizer_path": Key(str, "", "the tokenizer file (not needed for byte)"),
    "eval_interval": Key(int, 0, "evaluate every this many steps and at the end (0 = never)"),
    "eval_steps": Key(int, 10, "batches per evaluation (fewer if the eval split runs out)"),
    # -- checkpoints
    "enable_checkpointing": Key(bool, False, "save Orbax checkpoints under base_output_directory/run_name/"
                                "checkpoints and resume from the latest one when rerun"),
    "async_checkpointing": Key(bool, True, "write checkpoints in the background while training goes on"),
    "checkpoint_period": Key(int, 100, "save every this many steps (and when training ends or is preempted)"),
    "max_num_checkpoints_to_keep": Key(int, 3, "keep the newest this many checkpoints (0 = all)"),
    "load_parameters_path": Key(str, "", "start from these parameters (fresh optimizer, step 0): a checkpoint step "
                                "directory (<run dir>/checkpoints/<step>, an import's checkpoints/0) or a Hugging Face "
                                "Llama directory, read directly (each process reads its devices' slices)"),
    "load_full_state_path": Key(str, "", "start from this checkpoint step directory: parameters, optimizer "
                                "state, step and data position"),
    # -- decode (python -m MaxText.decode; MaxText's keys)
    "prompt": Key(str, "I love to", "decode: the prompt, encoded as the tokenizer encodes it (a tokenizer.json's own "
                  "post-processor decides BOS)"),
    "prompts_file": Key(str, "", "decode: a UTF-8 file of prompts, one per line, decoded in batches of "
                        "per_device_batch_size x devices (instead of prompt)"),
    "decode_output_file": Key(str, "", "decode: write one JSON line per prompt here (prompt, prompt_ids, "
                              "completion_ids, completion, prefill and decode tokens/s)"),
    "max_prefill_predict_length": Key(int, 64, "decode: the longest prompt in tokens; prompts are prefilled at once, "
                                      "padded to this length"),
    "decode_sampling_strategy": Key(str, "greedy", "decode: greedy (argmax), weighted (sample the softmax), topk "
                                    "(sample the top decode_sampling_top_k) or nucleus (sample the smallest set "
                                    "holding decode_sampling_nucleus_p of the probability)",
                                    ("greedy", "weighted", "topk", "nucleus")),
    "decode_sampling_temperature": Key(float, 1.0, "decode: logits are divided by this before sampling"),
    "decode_sampling_top_k": Key(int, 0, "decode: k of decode_sampling_strategy=topk"),
    "decode_sampling_nucleus_p": Key(float, -1.0, "decode: p of decode_sampling_strategy=nucleus, in (0, 1]"),
}


INT32_MAX = 2 ** 31 - 1  # steps, positions and sizes reach int32 arrays and XLA shapes
MESH_AXES = ("data", "fsdp", "context", "tensor")


@dataclasses.dataclass(frozen=True)
class Span:
  """A numeric key's valid values: low..high, each end closed unless marked open."""
  low: float
  high: float
  low_open: bool = False
  high_open: bool = False

  def __contains__(self, v):
    return (v > self.low if self.low_open else v >= self.low) and (v < self.high if self.high_open else v <= self.high)

  def describe(self, v):
    """'> 0', '>= 0', 'at most 2147483647' or 'in [0, 1)': what `v` violates."""
    if self.high in (INT32_MAX, 2 ** 32 - 1, math.inf) and v > self.low:
      return f"at most {self.high}"
    low, high = _number(self.low), _number(self.high)
    if self.high in (INT32_MAX, math.inf):
      return "> 0" if self.low == 1 and not self.low_open else f"{'>' if self.low_open else '>='} {low}"
    return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _number(x):
  return str(int(x)) if float(x).is_integer() else f"{x:g}"


_COUNT, _NONNEGATIVE, _OR_MINUS_1 = Span(1, INT32_MAX), Span(0, INT32_MAX), Span(-1, INT32_MAX)
_POSITIVE, _NONNEGATIVE_REAL, _FRACTION = Span(0, math.inf, low_open=True), Span(0, math.inf), Span(0, 1)
# Every numeric key's range; unlisted int keys take [-INT32_MAX, INT32_MAX], unlisted floats any finite value.
RANGES = {
    **{n: _COUNT for n in ("steps", "log_period", "profiler_steps", "max_target_length", "gradient_accumulation_steps",
                           "amax_history_len", "base_emb_dim", "base_num_query_heads", "base_num_kv_heads",
                           "head_dim", "base_mlp_dim", "base_num_decoder_layers", "vocab_size",
                           "rope_original_max_position", "jax_distributed_initialization_timeout",
                           "grain_max_pieces_per_document", "eval_steps", "checkpoint_period", "num_vocab_tiling",
                           "max_prefill_predict_length")},
    **{n: _NONNEGATIVE for n in ("skip_first_n_steps_for_profiler", "quantization_bf16_first_layers",
                                 "quantization_bf16_last_layers", "quantization_stats_period", "num_devices",
                                 "eval_interval", "max_num_checkpoints_to_keep", "data_prefetch_depth",
                                 "decode_sampling_top_k")},
    **{n: _OR_MINUS_1 for n in ("warmup_steps", "learning_rate_schedule_steps", "high_precision_from_step")},
    **{f"{k}_{a}_parallelism": _OR_MINUS_1 for k in ("ici", "dcn") for a in MESH_AXES},
    "seed": Span(0, 2 ** 32 - 1),  # grain's shuffle and numpy's generators take unsigned 32-bit seeds
    "grain_worker_count": Span(0, 1024),  # processes
    **{n: _NONNEGATIVE_REAL for n in ("hardware_memory_gib", "learning_rate", "adam_weight_decay",
                                      "gradient_clipping_threshold")},
    **{n: _FRACTION for n in ("warmup_steps_fraction", "cosine_learning_rate_final_fraction")},
    **{n: Span(0, 1, high_open=True) for n in ("adam_b1", "adam_b2")},
    **{n: _POSITIVE for n in ("adam_eps", "normalization_layer_epsilon", "rope_max_timescale", "rope_scaling_factor",
                              "rope_low_freq_factor", "rope_high_freq_factor", "decode_sampling_temperature")},
    "per_device_batch_size": Span(0, INT32_MAX, low_open=True),
}
# Paths get ~ and $VARIABLES expanded as a shell would, when the config is loaded.
PATH_KEYS = ("base_output_directory", "grain_train_files", "grain_eval_files", "dataset_path", "tokenizer_path",
             "load_parameters_path", "load_full_state_path", "jax_cache_dir", "prompts_file", "decode_output_file")
_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def _check_number(name, value, where):
  if isinstance(value, float) and not math.isfinite(value):
    raise ConfigError(f"{where}: {name}={value} must be a finite number")
  span = RANGES.get(name, Span(-INT32_MAX, INT32_MAX) if isinstance(value, int) else Span(-math.inf, math.inf))
  if value not in span:
    raise ConfigError(f"{where}: {name}={value} must be {span.describe(value)}")


def _expand_path(name, value, where):
  """~ and $VAR / ${VAR} expanded as a shell would; a variable that is not set is an error (a shell makes it '')."""
  expanded = os.path.expanduser(os.path.expandvars(value))
  unset = _VARIABLE.search(expanded)
  if unset:
    raise ConfigError(f"{where}: {name}={value!r}: the environment variable {unset.group(1).strip('{}')} is not "
                      "set; set it or write the path out")
  return expanded


def _parse_bool(value):
  if isinstance(value, bool):
    return value
  if isinstance(value, str) and value.lower() in ("true", "1", "yes"):
    return True
  if isinstance(value, str) and value.lower() in ("false", "0", "no"):
    return False
  raise ValueError


def _coerce(name, value, where):
  key = SCHEMA[name]
  try:
    if key.type is bool:
      out = _parse_bool(value)
    elif key.type is list:
      if isinstance(value, str):
        value = yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
      if not isinstance(value, list):
        raise ValueError
      out = [str(v).strip() for v in value]
    elif key.type is int:
      if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError
      out = int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
      if not -2**63 <= out < 2**63:
        raise ConfigError(f"{where}: {name}={value!r} is out of range (a 64-bit integer)")
    elif key.type is float:
      if isinstance(value, bool):
        raise ValueError
      out = float(value)
    else:
      out = "" if value is None else str(value)
  except ConfigError:
    raise
  except (TypeError, ValueError, OverflowError):
    raise ConfigError(f"{where}: {name}={value!r} is not a valid {key.type.__name__}") from None
  if key.type in (int, float):
    _check_number(name, out, where)
  if name in PATH_KEYS:
    out = _expand_path(name, out, where)
  if key.choices and out not in key.choices:
    shown = ", ".join(repr(c) if c == "" else c for c in key.choices)
    raise ConfigError(f"{where}: {name}={out!r} is not one of: {shown}")
  return out


def _unknown(name, where):
  close = difflib.get_close_matches(name, SCHEMA, n=1)
  hint = f" (did you mean '{close[0]}'?)" if close else ""
  return ConfigError(f"{where}: unknown key '{name}'{hint}")


class _UniqueKeyLoader(yaml.SafeLoader):
  """safe_load that refuses a key given twice in one mapping (YAML would silently keep the last)."""

  def construct_mapping(self, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
      key = self.construct_object(key_node, deep=deep)
      if key in seen:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
      seen.add(key)
    return super().construct_mapping(node, deep)


def _load_yaml(path: pathlib.Path, seen=()):
  if not path.is_file():
    raise ConfigError(f"config file not found: {path}")
  if path.resolve() in seen:
    raise ConfigError(f"{path}: base_config cycle through {path.name}")
  try:
    raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
  except OSError as e:
    raise ConfigError(f"{path}: can't read the config file ({e.strerror or e})") from None
  except UnicodeDecodeError as e:
    raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); save the config as UTF-8") from None
  except yaml.YAMLError as e:
    line = getattr(getattr(e, "problem_mark", None), "line", None)
    at = f" line {line + 1}" if line is not None else ""
    raise ConfigError(f"{path}{at}: not valid YAML ({getattr(e, 'problem', e)})") from None
  if not isinstance(raw, dict):
    raise ConfigError(f"{path}: expected a mapping of key: value")
  values = {}
  base = raw.pop("base_config", None)
  if base:
    values.update(_load_yaml(path.parent / base, seen + (path.resolve(),)))
  for name, value in raw.items():
    if name not in SCHEMA:
      raise _unknown(name, str(path))
    values[name] = _coerce(name, value, str(path))
  return values


def parse_overrides(args):
  """['key=value', ...] -> {key: raw value}; errors name the argument."""
  out = {}
  for arg in args:
    name, sep, value = arg.partition("=")
    if not sep or not name:
      raise ConfigError(f"command line: expected key=value, got '{arg}'")
    if name not in SCHEMA:
      raise _unknown(name, "command line")
    out[name] = value
  return out


def load(config_path, overrides=()):
  """The validated Config from a YAML file (with base_config inheritance) and key=value overrides."""
  values = {n: os.path.expanduser(k.default) if n in PATH_KEYS else k.default for n, k in SCHEMA.items()}
  values.update(_load_yaml(pathlib.Path(os.path.expanduser(str(config_path)))))
  for name, raw in parse_overrides(overrides).items():
    values[name] = _coerce(name, raw, "command line")
  return Config(**values)


def _validate(c):
  positive = ("steps", "max_target_length", "gradient_accumulation_steps", "base_emb_dim", "base_num_query_heads",
              "base_num_kv_heads", "head_dim", "base_mlp_dim", "base_num_decoder_layers", "vocab_size", "log_period")
  for name in positive:
    if getattr(c, name) <= 0:
      raise ConfigError(f"{name}={getattr(c, name)} must be > 0")
  if c.per_device_batch_size <= 0:
    raise ConfigError(f"per_device_batch_size={c.per_device_batch_size} must be > 0")
  for name in ("eval_interval", "grain_worker_count", "skip_first_n_steps_for_profiler", "data_prefetch_depth"):
    if getattr(c, name) < 0:
      raise ConfigError(f"{name}={getattr(c, name)} must be >= 0")
  for name in ("eval_steps", "checkpoint_period", "grain_max_pieces_per_document", "profiler_steps"):
    if getattr(c, name) <= 0:
      raise ConfigError(f"{name}={getattr(c, name)} must be > 0")
  if c.max_num_checkpoints_to_keep < 0:
    raise ConfigError(f"max_num_checkpoints_to_keep={c.max_num_checkpoints_to_keep} must be >= 0 (0 = keep all)")
  if c.load_parameters_path and c.load_full_state_path:
    raise ConfigError("set load_parameters_path or load_full_state_path, not both")
  if c.dataset_type == "grain" and not c.grain_train_files:
    raise ConfigError("dataset_type=grain needs grain_train_files (a glob of ArrayRecord shards); "
                      "python scripts/prepare_data.py --corpus shakespeare writes some")
  if c.dataset_type == "tfds" and not (c.dataset_path and c.dataset_name):
    raise ConfigError("dataset_type=tfds needs dataset_path and dataset_name")
  if c.amax_history_len < 1:
    raise ConfigError(f"amax_history_len={c.amax_history_len} must be >= 1")
  _validate_nvfp4_options(c)
  if c.quantization_stats_period < 0:
    raise ConfigError(f"quantization_stats_period={c.quantization_stats_period} must be >= 0 (0 = off)")
  if c.learning_rate < 0:
    raise ConfigError(f"learning_rate={c.learning_rate} must be >= 0")
  if not 0 <= c.warmup_steps_fraction <= 1:
    raise ConfigError(f"warmup_steps_fraction={c.warmup_steps_fraction} must be in [0, 1]")
  if c.base_num_query_heads % c.base_num_kv_heads:
    raise ConfigError(f"base_num_query_heads={c.base_num_query_heads} must be a multiple of "
                      f"base_num_kv_heads={c.base_num_kv_heads}")
  if len(c.mlp_activations) != 2 or any(a not in ("silu", "gelu", "relu", "linear") for a in c.mlp_activations):
    raise ConfigError(f"mlp_activations={c.mlp_activations} must be two of silu, gelu, relu, linear "
                      "(gate, up), e.g. [silu, linear]")
  edge = c.quantization_bf16_first_layers + c.quantization_bf16_last_layers
  if min(c.quantization_bf16_first_layers, c.quantization_bf16_last_layers) < 0 or edge > c.base_num_decoder_layers:
    raise ConfigError(f"quantization_bf16_first_layers + quantization_bf16_last_layers = {edge} must be between 0 "
                      f"and base_num_decoder_layers={c.base_num_decoder_layers}")
  if c.run_name in (".", "..") or any(sep in c.run_name for sep in ("/", "\\", "\0")):
    raise ConfigError(f"run_name={c.run_name!r} must be a plain directory name (no '/', '..'): outputs go to "
                      "base_output_directory/run_name")
  if c.head_dim % 2:
    raise ConfigError(f"head_dim={c.head_dim} must be even (RoPE rotates pairs)")
  if c.num_vocab_tiling < 1 or c.max_target_length % c.num_vocab_tiling:
    raise ConfigError(f"num_vocab_tiling={c.num_vocab_tiling} must be >= 1 and divide max_target_length="
                      f"{c.max_target_length} (the lm head runs in tiles of the sequence)")
  _validate_ranges_across_keys(c)


NVFP4_OPTION_KEYS = ("nvfp4_4over6", "nvfp4_4over6_err_mode", "nvfp4_backward_override")


def _validate_nvfp4_options(c):
  """The NVFP4 options need an NVFP4 recipe, and 4/6 on gradients needs a backward that quantizes them."""
  changed = [f"{k}={getattr(c, k)}" for k in NVFP4_OPTION_KEYS if getattr(c, k) != SCHEMA[k].default]
  recipes = [c.quantization] + ([c.attention_quantization] if c.quantization_scope == "mlp" else [])
  if changed and not any(r.startswith("te_nvfp4") for r in recipes):
    raise ConfigError(f"{', '.join(changed)} applies to the NVFP4 recipes only, but quantization="
                      f"{c.quantization!r} and attention_quantization={c.attention_quantization!r}; set quantization="
                      "te_nvfp4 (or te_nvfp4_no_rht), or drop the option")
  if c.nvfp4_4over6 == "gradients" and c.nvfp4_backward_override != "none":
    raise ConfigError(f"nvfp4_4over6=gradients does nothing with nvfp4_backward_override="
                      f"{c.nvfp4_backward_override}: the backward doesn't quantize gradients; use nvfp4_4over6=all, "
                      "weights or activations, or nvfp4_backward_override=none")


def _validate_ranges_across_keys(c):
  """What a single key's range (RANGES) can't say: mesh sizes of 0, RoPE's interpolation band."""
  for name in (f"{k}_{a}_parallelism" for k in ("ici", "dcn") for a in MESH_AXES):
    if getattr(c, name) == 0:
      raise ConfigError(f"{name}=0 must be -1 (the remaining devices) or >= 1")
  if c.rope_type == "llama3.1" and c.rope_high_freq_factor <= c.rope_low_freq_factor:
    raise ConfigError(f"rope_high_freq_factor={c.rope_high_freq_factor} must be > rope_low_freq_factor="
                      f"{c.rope_low_freq_factor} (llama3.1 RoPE interpolates between them; Llama 3.1 uses 4 and 1)")


def _replace(self, **changes):
  """A copy with keys changed (values coerced and validated like overrides)."""
  for name in changes:
    if name not in SCHEMA:
      raise _unknown(name, "replace")
  return dataclasses.replace(self, **{n: _coerce(n, v, "replace") for n, v in changes.items()})


def _field(key: Key):
  if isinstance(key.default, list):
    return dataclasses.field(default_factory=lambda d=key.default: list(d))
  return dataclasses.field(default=key.default)


# A validated run configuration: every SCHEMA key as a frozen attribute.
Config = dataclasses.make_dataclass(
    "Config", [(n, k.type, _field(k)) for n, k in SCHEMA.items()], frozen=True,
    namespace={"__post_init__": lambda self: _validate(self), "replace": _replace,
               "to_dict": lambda self: {n: getattr(self, n) for n in SCHEMA}})


@dataclasses.dataclass(frozen=True)
class RunShape:
  """Values derived from a Config and the device count: the only place they are computed."""
  num_devices: int
  global_batch_size: int  # sequences per optimizer step
  micro_batch_size: int  # sequences per accumulation micro-step
  tokens_per_step: int

  @classmethod
  def of(cls, config, num_devices: int):
    global_batch = config.per_device_batch_size * num_devices
    if not float(global_batch).is_integer() or global_batch < 1:
      raise ConfigError(f"per_device_batch_size={config.per_device_batch_size} x {num_devices} devices "
                        "must be a whole number of sequences >= 1")
    global_batch = int(global_batch)
    if global_batch % config.gradient_accumulation_steps:
      raise ConfigError(f"global batch {global_batch} is not divisible by gradient_accumulation_steps="
                        f"{config.gradient_accumulation_steps}")
    return cls(num_devices, global_batch, global_batch // config.gradient_accumulation_steps,
               global_batch * config.max_target_length)


def write_base_yml(path):
  """configs/base.yml: every key with its default and doc, generated from SCHEMA."""
  lines = ["# All keys with their defaults. Generated from MaxText/config.py SCHEMA:",
           "#   python -m MaxText.config > configs/base.yml", ""]
  for name, key in SCHEMA.items():
    choices = f" [{', '.join(repr(c) if c == '' else str(c) for c in key.choices)}]" if key.choices else ""
    lines.append(f"# {key.doc}{choices}")
    lines.append(yaml.safe_dump({name: key.default}, default_flow_style=True).strip().strip("{}"))
  text = "\n".join(lines) + "\n"
  if path is None:
    return text
  pathlib.Path(path).write_text(text)
  return text


def check_job(cfg, nodes, devices_per_node):
  """The mesh keys against a job of `nodes` processes of `devices_per_node` devices each (submit.sh runs this
  before sbatch, where there may be no jax: the trainer's mesh forms from the same keys)."""
  for kind, count, unit, flag in (("dcn", nodes, "node(s)", "--nodes"),
                                  ("ici", devices_per_node, "GPU(s) per node", "--gpus-per-node")):
    values = [getattr(cfg, f"{kind}_{a}_parallelism") for a in MESH_AXES]
    named = ", ".join(f"{kind}_{a}_parallelism={v}" for a, v in zip(MESH_AXES, values) if v != 1) or f"{kind}_* = 1"
    if values.count(-1) > 1:
      raise ConfigError(f"only one {kind}_*_parallelism may be -1 ({named})")
    fixed = math.prod(v for v in values if v != -1)
    if (count % fixed) if -1 in values else (count != fixed):
      need = f"a multiple of {fixed}" if -1 in values else f"exactly {fixed}"
      raise ConfigError(f"{flag} {count}: the config's {named} needs {need} {unit}; change {flag} or the "
                        f"{kind}_* keys")


USAGE = """usage: python -m MaxText.config                  print configs/base.yml (every key, its default and doc)
       python -m MaxText.config --check [--nodes N --gpus-per-node G] CONFIG [key=value ...]
           validate a config (and that its mesh fits a job of N nodes x G GPUs); needs pyyaml, not jax"""


def _check_cli(args):
  """--check's arguments -> (config path, overrides, nodes or None, GPUs per node or None)."""
  job = {"--nodes": None, "--gpus-per-node": None}
  while args and args[0] in job:
    if len(args) < 2 or not args[1].isdigit() or int(args[1]) < 1:
      raise ConfigError(f"{args[0]} needs a positive integer")
    job[args[0]], args = int(args[1]), args[2:]
  if not args or args[0].startswith("-"):
    raise ConfigError("--check needs a config file: python -m MaxText.config --check [--nodes N "
                      "--gpus-per-node G] CONFIG [key=value ...]")
  return args[0], args[1:], job["--nodes"], job["--gpus-per-node"]


def main(argv):
  if argv[:1] in (["-h"], ["--help"]):
    print(USAGE)
    return 0
  if argv[:1] != ["--check"]:
    if argv:
      print(f"error: unknown argument {argv[0]!r}\n{USAGE}", file=sys.stderr)
      return 2
    print(write_base_yml(None), end="")
    return 0
  try:
    path, overrides, nodes, gpus = _check_cli(argv[1:])
    cfg = load(path, overrides)
    if nodes or gpus:
      check_job(cfg, nodes or 1, gpus or 1)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print("config ok")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
