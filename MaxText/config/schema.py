"""The config schema: every key (type, default, doc, choices) and its range, and how one value of a key is read
(type coercion, range and choice checks, ~ and $VARIABLE expansion of paths). One source of truth for every key:
configs/base.yml is generated from SCHEMA (base_yml.py)."""

import dataclasses
import math
import os
import re
import typing

import yaml

from MaxText.errors import UserError
from MaxText.quantization import registry as backend_names
from MaxText.quantization.recipes import recipe_names


class ConfigError(UserError, ValueError):
  """A user mistake in a config file or override: printed as one line, exit code 2."""


INT32_MAX = 2**31 - 1  # steps, positions and sizes reach int32 arrays and XLA shapes
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
    if self.high in (INT32_MAX, 2**32 - 1, math.inf) and v > self.low:
      return f"at most {self.high}"
    low, high = _number(self.low), _number(self.high)
    if self.high in (INT32_MAX, math.inf):
      return "> 0" if self.low == 1 and not self.low_open else f"{'>' if self.low_open else '>='} {low}"
    return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _number(x):
  return str(int(x)) if float(x).is_integer() else f"{x:g}"


COUNT, NONNEGATIVE, OR_MINUS_1 = Span(1, INT32_MAX), Span(0, INT32_MAX), Span(-1, INT32_MAX)
POSITIVE, NONNEGATIVE_REAL, FRACTION = Span(0, math.inf, low_open=True), Span(0, math.inf), Span(0, 1)


@dataclasses.dataclass(frozen=True)
class Key:
  """A config key: its type, default, one-line doc and allowed values. `aliases` are other spellings of a value
  (MaxText's, e.g. attention=cudnn_flash_te), read as the value they name. `no_effect` says why a key that MaxText
  has does nothing here: a value other than the default is accepted with one warning line saying so."""

  type: type
  default: typing.Any
  doc: str
  choices: tuple = ()
  aliases: tuple = ()  # ((their value, ours), ...)
  no_effect: str = ""
  # A numeric key's valid values; None: an int key takes [-INT32_MAX, INT32_MAX], a float any finite value.
  range: typing.Optional[Span] = None


SCHEMA = {
  # -- run
  "run_name": Key(str, "", "name of the run; outputs go to base_output_directory/run_name ('' = timestamp)"),
  "base_output_directory": Key(str, "outputs", "root directory for metrics, TensorBoard events and checkpoints"),
  "steps": Key(int, 100, "number of optimizer steps to train", range=COUNT),
  "log_period": Key(int, 10, "flush metrics files (JSONL, TensorBoard) every this many steps", range=COUNT),
  "seed": Key(int, 0, "seed for parameter init, data and stochastic rounding", range=Span(0, 2**32 - 1)),
  "dry_run": Key(bool, False, "build the model abstractly, print the summary and memory estimate, exit"),
  "enable_tensorboard": Key(bool, True, "write TensorBoard event files next to the JSONL metrics"),
  "hardware_memory_gib": Key(
    float, 0.0, "memory per device for the preflight check (0 = ask the device)", range=NONNEGATIVE_REAL
  ),
  "jax_cache_dir": Key(
    str,
    "~/.cache/maxtext_nvfp4/jax",
    "persistent compilation cache shared by every run on "
    "the machine: a restart loads what an earlier start compiled ('' = off)",
  ),
  "data_prefetch_depth": Key(
    int,
    2,
    "batches read and placed on the devices ahead of the step, by a background "
    "thread (0 = read each batch in the loop)",
    range=NONNEGATIVE,
  ),
  "profiler": Key(
    str,
    "",
    "'' (off), xplane (XProf trace of the profiled steps under run_dir/tensorboard, for "
    "TensorBoard or Perfetto, plus a printed device-time breakdown) or nsys (cudaProfilerStart/Stop "
    "around them, for nsys profile --capture-range=cudaProfilerApi)",
    ("", "xplane", "nsys"),
  ),
  "skip_first_n_steps_for_profiler": Key(int, 1, "profile from this step on (skips compilation)", range=NONNEGATIVE),
  "profiler_steps": Key(int, 5, "number of steps to profile", range=COUNT),
  # -- batch
  "per_device_batch_size": Key(
    float, 1.0, "sequences per device per step (global batch = this x devices)", range=Span(0, INT32_MAX, low_open=True)
  ),
  "max_target_length": Key(int, 2048, "sequence length in tokens", range=COUNT),
  "gradient_accumulation_steps": Key(int, 1, "micro-batches accumulated into one optimizer step", range=COUNT),
  # -- optimizer
  "learning_rate": Key(float, 3e-4, "peak learning rate (AdamW)", range=NONNEGATIVE_REAL),
  "warmup_steps_fraction": Key(float, 0.1, "linear warmup length as a fraction of the schedule", range=FRACTION),
  "warmup_steps": Key(int, -1, "linear warmup length in steps (-1 = use warmup_steps_fraction)", range=OR_MINUS_1),
  "learning_rate_schedule_steps": Key(int, -1, "length of the warmup+cosine schedule (-1 = steps)", range=OR_MINUS_1),
  "cosine_learning_rate_final_fraction": Key(
    float, 0.1, "final learning rate as a fraction of the peak", range=FRACTION
  ),
  "adam_b1": Key(float, 0.9, "AdamW beta1", range=Span(0, 1, high_open=True)),
  "adam_b2": Key(float, 0.95, "AdamW beta2", range=Span(0, 1, high_open=True)),
  "adam_eps": Key(float, 1e-8, "AdamW epsilon", range=POSITIVE),
  "adam_weight_decay": Key(float, 0.1, "AdamW decoupled weight decay", range=NONNEGATIVE_REAL),
  "gradient_clipping_threshold": Key(
    float, 1.0, "clip gradients to this global norm (0 = off)", range=NONNEGATIVE_REAL
  ),
  "opt_type": Key(
    str,
    "adamw",
    "optimizer (MaxText's): adamw (optax.adamw), adam_pax (Praxis' Adam: the same update, bias correction folded "
    "into the decay rates, decoupled weight decay) or sgd (optax.sgd: no momentum, no weight decay)",
    ("adamw", "adam_pax", "sgd"),
  ),
  "adam_eps_root": Key(float, 0.0, "Adam epsilon inside the square root (MaxText's)", range=NONNEGATIVE_REAL),
  # -- precision
  "dtype": Key(str, "bfloat16", "activation / compute dtype", ("bfloat16", "float32", "float16")),
  "weight_dtype": Key(str, "float32", "parameter (master weight) dtype", ("float32", "bfloat16")),
  "quantization": Key(
    str,
    "",
    "precision recipe of the MLP GEMMs ('' = BF16); fp8 is MaxText's: FP8 delayed scaling of every Dense layer "
    "(te_fp8_delayedscaling with quantization_scope=all_dense)",
    tuple([""] + recipe_names()),
  ),
  "quantization_scope": Key(
    str,
    "mlp",
    "GEMMs that run `quantization`: mlp (the published recipe) or "
    "all_dense (attention q/k/v/o projections too, MaxText's behaviour)",
    ("mlp", "all_dense"),
  ),
  "attention_quantization": Key(
    str,
    "",
    "recipe of the attention q/k/v/o projections when quantization_scope=mlp ('' = BF16)",
    tuple([""] + recipe_names()),
  ),
  "quantization_bf16_first_layers": Key(
    int, 0, "keep this many first decoder layers unquantized (BF16)", range=NONNEGATIVE
  ),
  "quantization_bf16_last_layers": Key(
    int, 0, "keep this many last decoder layers unquantized (BF16)", range=NONNEGATIVE
  ),
  "high_precision_from_step": Key(int, -1, "run every GEMM in BF16 from this step on (-1 = never)", range=OR_MINUS_1),
  "quantization_backend": Key(
    str,
    "auto",
    "auto: Transformer Engine where it can run the recipe, else xla where "
    "its block-scaled dot is a native FP4 GEMM (SM100+), else emulate; te; xla "
    "(jax.nn.scaled_matmul on our NVFP4 operands, NVIDIA GPUs); emulate (pure JAX); or the name of a backend a "
    "program registered (quantization.backends.register)",
    backend_names.Names(),
  ),
  "attention_quantization_backend": Key(
    str,
    "",
    "quantization_backend of the attention projections ('' = quantization_backend), e.g. xla NVFP4 MLP GEMMs "
    "beside Transformer Engine FP8 attention projections (auto)",
    backend_names.Names(""),
  ),
  "quantization_kernels": Key(
    str,
    "auto",
    "operand quantizers of the emulated backend: auto (Pallas Triton "
    "kernels on a single NVIDIA GPU, else xla), pallas, xla (the portable XLA path, "
    "same bits)",
    ("auto", "pallas", "xla"),
  ),
  "disable_rht": Key(bool, False, "NVFP4: no Random Hadamard Transform on the wgrad operands"),
  "disable_stochastic_rounding": Key(bool, False, "NVFP4: round gradients to nearest instead of stochastically"),
  "disable_2d_quantization": Key(bool, False, "NVFP4: 1x16 blocks for weights instead of 16x16 tiles"),
  "nvfp4_4over6": Key(
    str,
    "none",
    "NVFP4: Four Over Six block scaling (each block quantized with its max mapped "
    "to 6 and to 4, the one with the smaller error kept; global scale 6*256/amax) on the weights "
    "(w), activations (x), gradients (dy) or all of them (TE's name; TE's 'all' leaves gradients "
    "out)",
    ("none", "weights", "activations", "gradients", "all"),
  ),
  "nvfp4_4over6_err_mode": Key(
    str,
    "mse",
    "NVFP4 Four Over Six: the block error that picks 4 or 6: mse (sum of "
    "squares, the paper's) or mae (sum of magnitudes, TE's default)",
    ("mse", "mae"),
  ),
  "nvfp4_backward_override": Key(
    str,
    "none",
    "NVFP4: quantize fprop only; dgrad and wgrad in the compute dtype "
    "on the unquantized x, w, dy (high_precision) or on the forward's quantized x and "
    "w, dequantized, with unquantized dy (dequantized); TE's backward_override",
    ("none", "high_precision", "dequantized"),
  ),
  "amax_history_len": Key(
    int,
    1024,
    "FP8 delayed scaling (te_fp8_delayedscaling): steps of amax history per GEMM operand",
    range=COUNT,
  ),
  "amax_compute_algo": Key(
    str, "max", "FP8 delayed scaling: scale from the history's max or its most recent amax", ("max", "most_recent")
  ),
  "quantization_stats_period": Key(
    int,
    0,
    "every N steps log, per GEMM kind and operand, the relative "
    "quantization error and the fractions of saturated and all-zero (underflowed) "
    "blocks to metrics.jsonl/TensorBoard as quant/<gemm>/<operand>/<stat> (0 = off)",
    range=NONNEGATIVE,
  ),
  "matmul_precision": Key(
    str,
    "default",
    "precision of every matmul of f32 operands (MaxText's; jax.default_matmul_precision): default, high, highest, "
    "bfloat16 (= default), float32 (= highest); bf16 and quantized GEMMs are unaffected",
    ("default", "high", "highest", "bfloat16", "float32"),
  ),
  "cpu_gemm_dtype": Key(
    str,
    "auto",
    "operand dtype of the GEMMs on a CPU (the same values and numbers either way, at the CPU's speed for it): auto "
    "(bfloat16 where the CPU has bf16 matrix instructions, amx_bf16 or ARM bf16; else float32), float32, bfloat16",
    ("auto", "float32", "bfloat16"),
  ),
  "logits_dot_in_fp32": Key(bool, False, "run the lm head GEMM on f32 operands instead of the compute dtype"),
  # -- model
  "model_name": Key(
    str,
    "default",
    "the model, as MaxText names them (MaxText/config/models.py: llama3-8b, llama3.1-405b, llama3.2-1b, "
    "llama3-tiny, ...); default: the model keys (base_*, vocab_size, rope_*, ...) as the config sets them",
  ),
  "override_model_config": Key(
    bool,
    False,
    "allow the command line or a YAML to set a named model's model keys to other values (MaxText's rule: refused "
    "otherwise)",
  ),
  "base_emb_dim": Key(int, 2048, "model (embedding) width", range=COUNT),
  "base_num_query_heads": Key(int, 16, "attention query heads", range=COUNT),
  "base_num_kv_heads": Key(int, 8, "attention key/value heads (grouped-query attention)", range=COUNT),
  "head_dim": Key(int, 128, "width of one attention head", range=COUNT),
  "base_mlp_dim": Key(int, 7168, "SwiGLU hidden width", range=COUNT),
  "base_num_decoder_layers": Key(int, 16, "decoder layers", range=COUNT),
  "vocab_size": Key(int, 32000, "vocabulary size (embedding rows and lm head columns)", range=COUNT),
  "logits_via_embedding": Key(
    bool,
    False,
    "the lm head is the embedding's transpose (tied embeddings, as Llama "
    "3.2 1B/3B; no lm_head parameter); MaxText's key, without its Gemma-style "
    "normalize_embedding_logits",
  ),
  "mlp_activations": Key(list, ["silu", "linear"], "gated MLP activations: [gate, up]"),
  "fused_mlp": Key(
    bool,
    False,
    "gate and up as one [emb, 2, mlp] kernel and one GEMM (MaxText's key and layout; parameter "
    "layers/mlp/gate_up): NVFP4 quantizes them with one global scale, as serving engines' fused gate_up_proj reads "
    "them (to-hf --nvfp4 then writes the training forward's codes exactly)",
  ),
  "normalization_layer_epsilon": Key(float, 1e-5, "RMSNorm epsilon", range=POSITIVE),
  "rope_max_timescale": Key(float, 500000.0, "RoPE base (theta)", range=POSITIVE),
  "rope_type": Key(str, "default", "RoPE frequencies: default, or llama3.1 scaling", ("default", "llama3.1")),
  "rope_scaling_factor": Key(float, 8.0, "llama3.1 RoPE: scale factor", range=POSITIVE),
  "rope_low_freq_factor": Key(float, 1.0, "llama3.1 RoPE: low-frequency factor", range=POSITIVE),
  "rope_high_freq_factor": Key(float, 4.0, "llama3.1 RoPE: high-frequency factor", range=POSITIVE),
  "rope_original_max_position": Key(int, 8192, "llama3.1 RoPE: original context length", range=COUNT),
  "scan_layers": Key(bool, True, "run the decoder layers with lax.scan (one compiled layer)"),
  "remat_policy": Key(
    str,
    "auto",
    "activation rematerialization per layer: auto (full on a CPU, MaxText's default; on a GPU the first of "
    "minimal_with_context, minimal, full whose estimated memory fits in 90% of the GPU's; the log says which), "
    "none, full (recompute the layer), "
    "minimal (keep the q/k/v/o and MLP GEMM outputs), +_with_context (and the attention "
    "output, with cuDNN its softmax statistics too), +_with_quantization (and the quantized "
    "operands the backward GEMMs reuse)",
    (
      "auto",
      "none",
      "minimal",
      "minimal_with_context",
      "minimal_with_quantization",
      "minimal_with_context_and_quantization",
      "full",
    ),
  ),
  "attention": Key(
    str,
    "auto",
    "attention kernel: auto (cudnn_flash on an NVIDIA GPU of compute capability 8.0 or newer, dot_product "
    "elsewhere; the log says which), XLA dot_product, or cuDNN flash on GPU (MaxText's names: autoselected is "
    "auto, cudnn_flash_te is cudnn_flash)",
    ("auto", "dot_product", "cudnn_flash"),
    aliases=(("autoselected", "auto"), ("cudnn_flash_te", "cudnn_flash")),
  ),
  "num_vocab_tiling": Key(
    int,
    -1,
    "compute the lm head and its cross-entropy in this many tiles of the sequence, "
    "gradients included, so the [tokens, vocab] f32 logits are never whole in memory "
    "(1 = off; must divide max_target_length; -1 = auto: on a GPU tiled only where one device's f32 logits and "
    "their gradient would take over 1/16 of its memory, in the fewest tiles that bring them under, the log says how "
    "many; 1 on a CPU)",
    range=OR_MINUS_1,
  ),
  # -- distribution
  "hardware": Key(
    str,
    "cpu",
    "cpu (one process; NNODES>1 with JAX_COORDINATOR_IP for CPU multi-process), gpu (one "
    "process per node from JAX_COORDINATOR_IP/PORT, NNODES, NODE_RANK) or gpu_multiprocess (one "
    "process per GPU, Slurm detected)",
    ("cpu", "gpu", "gpu_multiprocess"),
  ),
  "jax_distributed_initialization_timeout": Key(int, 300, "seconds to wait for all processes to join", range=COUNT),
  "jax_distributed_heartbeat_timeout_seconds": Key(
    int,
    30,
    "multi-process: seconds without a heartbeat after which every other process names the lost process in one "
    "line and exits 75 (rerun to resume)",
    range=COUNT,
  ),
  **{
    f"ici_{axis}_parallelism": Key(
      int,
      -1 if axis == "fsdp" else 1,
      f"{axis} parallelism within a node (-1 = the remaining devices)",
      range=OR_MINUS_1,
    )
    for axis in ("data", "fsdp", "context", "tensor")
  },
  **{
    f"dcn_{axis}_parallelism": Key(
      int,
      -1 if axis == "data" else 1,
      f"{axis} parallelism across nodes/processes (-1 = the remaining processes)",
      range=OR_MINUS_1,
    )
    for axis in ("data", "fsdp", "context", "tensor")
  },
  "gpu_type": Key(
    str,
    "",
    "target GPU for the memory check (dry_run and preflight): the memory jax's allocator takes of it, its HBM x "
    "XLA_PYTHON_CLIENT_MEM_FRACTION (jax's default 0.75), as train_compile counts it ('' = the local device)",
    ("", "h100", "h200", "b200", "gb200", "b300", "gb300"),
  ),
  "num_devices": Key(
    int, 0, "dry_run: the device count to plan for (0 = the ici/dcn product, else local)", range=NONNEGATIVE
  ),
  # -- ahead-of-time compilation for a GPU target (python -m MaxText.train_compile; dry_run)
  "compile_topology": Key(
    str,
    "",
    "GPU target to compile the train step for, on any machine: h100-N, h200-N, b200-N, gb200-N, b300-N, gb300-N "
    "(N GPUs in one NVLink domain) or a3 (= h100-8); dry_run and train_compile report its compiled memory ('' = "
    "none; dry_run then compiles for the local GPUs, if any)",
  ),
  "compile_topology_num_slices": Key(int, 1, "NVLink domains (hosts, for HGX) of compile_topology", range=COUNT),
  "compile_report": Key(str, "", "train_compile: write the JSON report here ('' = none)"),
  "compile_hlo": Key(str, "", "train_compile: write the compiled step's optimized HLO text here ('' = none)"),
  # -- data
  "dataset_type": Key(
    str,
    "synthetic",
    "input pipeline: synthetic (a seeded Markov chain), grain (ArrayRecord "
    "files), tfds (a TFDS dataset directory read through its ArrayRecord data source) or hf (a Hugging Face "
    "dataset, streamed through the datasets library)",
    ("synthetic", "grain", "tfds", "hf"),
  ),
  "grain_train_files": Key(str, "", "grain: glob of the training ArrayRecord shards"),
  "grain_eval_files": Key(str, "", "grain: glob of the eval ArrayRecord shards ('' = no eval data)"),
  "grain_record_format": Key(
    str,
    "text",
    "grain/tfds: records are UTF-8 text (tokenized on the fly) or token_ids (int32 little-endian)",
    ("text", "token_ids"),
  ),
  "grain_worker_count": Key(
    int,
    0,
    "grain/tfds: worker processes reading the training data, each its own share "
    "of the documents (0 = read in the training process; eval always reads there)",
    range=Span(0, 1024),
  ),
  "packing": Key(
    bool,
    True,
    "grain/tfds: pack several documents into each row (attention masked per document); "
    "false: one document piece per row, right-padded, attention causal only. Synthetic data is "
    "never packed",
  ),
  "max_segments_per_seq": Key(
    int,
    -1,
    "grain/tfds/hf packing: at most this many documents in one row (-1 = as many as fit; MaxText's)",
    range=OR_MINUS_1,
  ),
  "reuse_example_batch": Key(
    int,
    0,
    "read the first batch once and train on it every step (performance testing; MaxText's; 0 = off)",
    range=NONNEGATIVE,
  ),
  "grain_max_pieces_per_document": Key(
    int,
    4096,
    "grain/tfds: a document longer than this many sequences of max_target_length is an error naming it",
    range=COUNT,
  ),
  "dataset_path": Key(str, "", "tfds: the data_dir holding <dataset_name>/<version>/"),
  "dataset_name": Key(str, "", "tfds: dataset name"),
  "train_split": Key(str, "train", "tfds: training split"),
  "eval_split": Key(str, "", "tfds: eval split ('' = no eval data)"),
  "tokenizer_type": Key(
    str,
    "byte",
    "byte (UTF-8 bytes, no file), huggingface (tokenizer.json), tiktoken (a Llama 3 tokenizer.model) or sentencepiece",
    ("byte", "huggingface", "tiktoken", "sentencepiece"),
  ),
  "tokenizer_path": Key(str, "", "the tokenizer file (not needed for byte)"),
  "add_bos": Key(
    str,
    "auto",
    "start every prompt (decode) and document (text data) with BOS: true, false, or auto (as the tokenizer says: "
    "a tokenizer.json's post-processor, else BOS where the vocabulary has one; an imported checkpoint's config.yml "
    "records what transformers does with its tokenizer files); MaxText's key, there a bool",
    ("auto", "true", "false"),
    aliases=(("True", "true"), ("False", "false")),
  ),
  # -- Hugging Face datasets (dataset_type=hf; MaxText's keys), streamed as MaxText streams them
  "hf_path": Key(
    str, "", "hf: the dataset: a Hub id (allenai/c4) or a builder for files (parquet, json, arrow, csv, text)"
  ),
  "hf_name": Key(str, "", "hf: the dataset's configuration name ('' = its default)"),
  "hf_data_dir": Key(str, "", "hf: data_dir of the dataset (e.g. 'en' for allenai/c4)"),
  "hf_train_files": Key(str, "", "hf: training files (a path or glob, local or an fsspec URL) for a file builder"),
  "hf_eval_split": Key(str, "", "hf: the eval split ('' = no eval data; 'train' when hf_eval_files is set)"),
  "hf_eval_files": Key(str, "", "hf: eval files (a path or glob) for a file builder"),
  "hf_access_token": Key(str, "", "hf: a Hub token for gated datasets ('' = $HF_TOKEN or none)"),
  "train_data_columns": Key(list, ["text"], "hf: the column holding each document's text (one column)"),
  "eval_interval": Key(
    int,
    0,
    "evaluate every this many steps and at the end (0 or -1 = never; MaxText's default is -1)",
    range=OR_MINUS_1,
  ),
  "eval_steps": Key(int, 10, "batches per evaluation (fewer if the eval split runs out)", range=COUNT),
  # -- checkpoints
  "enable_checkpointing": Key(
    bool,
    False,
    "save Orbax checkpoints under base_output_directory/run_name/checkpoints and resume from the latest one when rerun",
  ),
  "async_checkpointing": Key(bool, True, "write checkpoints in the background while training goes on"),
  "checkpoint_period": Key(
    int, 100, "save every this many steps (and when training ends or is preempted)", range=COUNT
  ),
  "max_num_checkpoints_to_keep": Key(int, 3, "keep the newest this many checkpoints (0 = all)", range=NONNEGATIVE),
  "load_parameters_path": Key(
    str,
    "",
    "start from these parameters (fresh optimizer, step 0): a checkpoint step "
    "directory (<run dir>/checkpoints/<step>, an import's checkpoints/0) or a Hugging Face "
    "Llama directory, read directly (each process reads its devices' slices)",
  ),
  "load_full_state_path": Key(
    str, "", "start from this checkpoint step directory: parameters, optimizer state, step and data position"
  ),
  # -- decode (python -m MaxText.decode; MaxText's keys)
  "prompt": Key(
    str,
    "I love to",
    "decode: the prompt, encoded as the tokenizer encodes it (BOS first as add_bos says)",
  ),
  "prompts_file": Key(
    str,
    "",
    "decode: a UTF-8 file of prompts, one per line, decoded in batches of "
    "per_device_batch_size x devices (instead of prompt)",
  ),
  "decode_output_file": Key(
    str,
    "",
    "decode: write one JSON line per prompt here (prompt, prompt_ids, "
    "completion_ids, completion, prefill and decode tokens/s)",
  ),
  "max_prefill_predict_length": Key(
    int,
    64,
    "decode: the longest prompt in tokens; prompts are prefilled at once, padded to this length",
    range=COUNT,
  ),
  "decode_sampling_strategy": Key(
    str,
    "greedy",
    "decode: greedy (argmax), weighted (sample the softmax), topk "
    "(sample the top decode_sampling_top_k) or nucleus (sample the smallest set "
    "holding decode_sampling_nucleus_p of the probability)",
    ("greedy", "weighted", "topk", "nucleus"),
  ),
  "decode_sampling_temperature": Key(float, 1.0, "decode: logits are divided by this before sampling", range=POSITIVE),
  "decode_sampling_top_k": Key(int, 0, "decode: k of decode_sampling_strategy=topk", range=NONNEGATIVE),
  "decode_sampling_nucleus_p": Key(float, -1.0, "decode: p of decode_sampling_strategy=nucleus, in (0, 1]"),
  # -- MaxText's keys that do nothing here: accepted, and a value other than the default is one warning line
  "use_iota_embed": Key(
    bool,
    False,
    "MaxText's one-hot-matmul embedding lookup",
    no_effect="the embedding is a gather; MaxText's one-hot matmul computes the same numbers (a TPU layout choice)",
  ),
  "monitor_goodput": Key(
    bool, False, "MaxText's Google goodput monitor", no_effect="goodput monitoring is a Google Cloud service"
  ),
  "enable_goodput_recording": Key(
    bool, False, "MaxText's Google goodput recording", no_effect="goodput recording is a Google Cloud service"
  ),
  "enable_pathways_goodput": Key(
    bool, False, "MaxText's Pathways goodput", no_effect="Pathways is a Google Cloud TPU service"
  ),
  "use_vertex_tensorboard": Key(
    bool,
    False,
    "MaxText's Vertex AI TensorBoard upload",
    no_effect="Vertex AI is a Google Cloud service; TensorBoard events are written under the run directory",
  ),
  "gcs_metrics": Key(
    bool,
    False,
    "MaxText's upload of the metrics to base_output_directory",
    no_effect="metrics.jsonl is written into the run directory wherever base_output_directory is (gs:// too)",
  ),
  "save_config_to_gcs": Key(
    bool,
    False,
    "MaxText's upload of the config to base_output_directory",
    no_effect="every checkpoint's meta item records the run's config",
  ),
  "force_unroll": Key(
    bool,
    False,
    "MaxText's unrolled per-layer parameter-only checkpoints",
    no_effect="it only affects MaxText's generate_param_only_checkpoint; checkpoints here hold the layers "
    "stacked whether or not scan_layers",
  ),
  "enable_dropout": Key(
    bool, False, "MaxText's dropout switch", no_effect="the Llama models here have no dropout (MaxText's set it false)"
  ),
}
# Every numeric key's range, read off the schema (Key.range).
RANGES = {name: key.range for name, key in SCHEMA.items() if key.range is not None}


# Paths get ~ and $VARIABLES expanded as a shell would and are made absolute against the directory the command was
# started in, once, when the config is loaded: nothing later (a subprocess, Orbax, a data worker) can read them
# against another directory.
PATH_KEYS = (
  "base_output_directory",
  "grain_train_files",
  "grain_eval_files",
  "dataset_path",
  "tokenizer_path",
  "load_parameters_path",
  "load_full_state_path",
  "jax_cache_dir",
  "prompts_file",
  "decode_output_file",
  "compile_report",
  "compile_hlo",
  "hf_train_files",
  "hf_eval_files",
)
_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def absolute_path(path):
  """`path` against the current working directory (~ expanded; file:// is a local path; '' and other URLs such as
  gs://... as they are)."""
  path = os.path.expanduser(str(path))
  if path.startswith("file://"):
    path = path[len("file://") :] or "/"
  return path if not path or _URL.match(path) else os.path.abspath(path)


def check_number(name, value, where):
  if isinstance(value, float) and not math.isfinite(value):
    raise ConfigError(f"{where}: {name}={value} must be a finite number")
  span = RANGES.get(name, Span(-INT32_MAX, INT32_MAX) if isinstance(value, int) else Span(-math.inf, math.inf))
  if value not in span:
    raise ConfigError(f"{where}: {name}={value} must be {span.describe(value)}")


def expand_path(name, value, where):
  """~ and $VAR / ${VAR} expanded as a shell would (an unset variable is an error: a shell makes it ''), then made
  absolute against the working directory."""
  expanded = os.path.expanduser(os.path.expandvars(value))
  unset = _VARIABLE.search(expanded)
  if unset:
    raise ConfigError(
      f"{where}: {name}={value!r}: the environment variable {unset.group(1).strip('{}')} is not "
      "set; set it or write the path out"
    )
  return absolute_path(expanded)


def _parse_bool(value):
  if isinstance(value, bool):
    return value
  if isinstance(value, str) and value.lower() in ("true", "1", "yes"):
    return True
  if isinstance(value, str) and value.lower() in ("false", "0", "no"):
    return False
  raise ValueError


def coerce(name, value, where):
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
      if not -(2**63) <= out < 2**63:
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
    check_number(name, out, where)
  if name in PATH_KEYS:
    out = expand_path(name, out, where)
  if key.aliases:
    out = dict(key.aliases).get(out, out)
  if key.choices and out not in key.choices:
    shown = ", ".join(repr(c) if c == "" else c for c in key.choices)
    raise ConfigError(f"{where}: {name}={out!r} is not one of: {shown}")
  return out


def _edit_distance(a, b):
  """Optimal string alignment distance: insertions, deletions, substitutions and swaps of neighbours."""
  prev2, prev = None, list(range(len(b) + 1))
  for i, ca in enumerate(a, 1):
    row = [i]
    for j, cb in enumerate(b, 1):
      row.append(min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb)))
      if prev2 is not None and i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
        row[j] = min(row[j], prev2[j - 2] + 1)
    prev2, prev = prev, row
  return prev[-1]


def near_misses(name, names):
  """The names `name` is a typo of, closest first: a few edits away for its length (1 up to 8 characters, 2 up to
  16, 3 beyond), not merely a shared word (opt_type is no typo of rope_type)."""
  allowed = 1 if len(name) <= 8 else 2 if len(name) <= 16 else 3
  scored = sorted((_edit_distance(name, n), n) for n in names if abs(len(n) - len(name)) <= allowed)
  return [n for d, n in scored if d <= allowed]


def unknown_key(name, where):
  close = near_misses(name, SCHEMA)
  hint = f" (did you mean '{close[0]}'?)" if close else ""
  return ConfigError(f"{where}: unknown key '{name}'{hint}")
