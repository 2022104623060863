"""Parameter counts, training FLOPs (MaxText's formula, also per GEMM kind) and the per-device memory estimate."""

import dataclasses
import math

from MaxText import precision
from MaxText.config import hardware

GIB = 2**30


def param_count(cfg) -> int:
  """Exact parameter count of the Llama 3 decoder (one vocab x width matrix fewer with logits_via_embedding)."""
  d = cfg.base_emb_dim
  embeddings = (1 if cfg.logits_via_embedding else 2) * cfg.vocab_size * d
  return embeddings + cfg.base_num_decoder_layers * layer_param_count(cfg) + d


def layer_param_count(cfg) -> int:
  """Parameters of one decoder layer: q, k, v, o, the gated MLP's gate, up and down, two norms."""
  d, f, h, kv, dh = cfg.base_emb_dim, cfg.base_mlp_dim, cfg.base_num_query_heads, cfg.base_num_kv_heads, cfg.head_dim
  return d * h * dh * 2 + d * kv * dh * 2 + 3 * d * f + 2 * d


@dataclasses.dataclass(frozen=True)
class TrainingFlops:
  """Training FLOPs per device per step (forward + backward = 3 x forward), MaxText's accounting."""

  attention_projection: float  # q, k, v, o GEMMs
  mlp: float  # gate, up, down GEMMs
  embedding: float  # the unembedding (lm head) GEMM
  attention_core: float  # QK^T and PV, causal half counted

  @property
  def total(self):
    return self.attention_projection + self.mlp + self.embedding + self.attention_core

  @property
  def tflops(self):
    return self.total / 1e12


def training_flops_per_device(cfg, per_device_batch_size=None) -> TrainingFlops:
  """MaxText's calculate_tflops_training_per_device for a Llama (gated MLP) decoder."""
  b = cfg.per_device_batch_size if per_device_batch_size is None else per_device_batch_size
  tokens = b * cfg.max_target_length
  d, f, h, kv, dh = cfg.base_emb_dim, cfg.base_mlp_dim, cfg.base_num_query_heads, cfg.base_num_kv_heads, cfg.head_dim
  layers = cfg.base_num_decoder_layers
  mlp = 2 * tokens * d * f * len(cfg.mlp_activations) + 2 * tokens * f * d
  qkv = 2 * tokens * d * (h + 2 * kv) * dh
  out_proj = 2 * tokens * d * h * dh
  embedding = 2 * tokens * d * cfg.vocab_size
  causal_attention = 4 * tokens * cfg.max_target_length * h * dh / 2
  return TrainingFlops(
    attention_projection=3 * (qkv + out_proj) * layers,
    mlp=3 * mlp * layers,
    embedding=3 * embedding,
    attention_core=3 * causal_attention * layers,
  )


def gemm_flops(cfg):
  """(training FLOPs per device per step of one layer's GEMM of each kind (3 x forward), the TrainingFlops)."""
  f = training_flops_per_device(cfg)
  layers = cfg.base_num_decoder_layers
  h, kv, dh = cfg.base_num_query_heads, cfg.base_num_kv_heads, cfg.head_dim
  proj_shares = {"q": h * dh, "k": kv * dh, "v": kv * dh, "o": h * dh}
  per_layer_proj = f.attention_projection / layers / sum(proj_shares.values())
  out = {g: per_layer_proj * s for g, s in proj_shares.items()}
  mlp_shares = {"gate": 1, "up": len(cfg.mlp_activations) - 1, "down": 1}
  out.update({g: f.mlp / layers / sum(mlp_shares.values()) * s for g, s in mlp_shares.items()})
  return out, f


BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
  """Bytes per device; activations are an estimate (see activation_bytes)."""

  params: float
  grads: float
  optimizer: float
  activations: float
  amax_history: float = 0.0  # FP8 delayed scaling's histories and their updates (amax_history_bytes)
  gathered: float = 0.0  # FSDP's all-gathered layer weights (gathered_weight_bytes)

  @property
  def total_gib(self):
    return (self.params + self.grads + self.optimizer + self.activations + self.amax_history + self.gathered) / GIB


def activation_bytes(cfg, micro_batch_per_device) -> float:
  """Activation memory kept for the backward pass of one micro-batch, per device.

  Assumes: remat 'full' keeps each layer's input (L x B x T x D) plus one layer's working set;
  'minimal' also keeps the GEMM outputs (q, k, v, attention out, gate, up: T x (H+2KV)Dh + T x D
  + 2 T x F per layer); '_with_context' the attention output (T x H Dh, and cuDNN's f32 softmax
  statistics, T x H); '_with_quantization' the quantized operands the backward reuses (see
  quantized_residual_bytes); 'none' keeps norms, activations and the XLA attention probabilities (f32 B x
  H x T x T) instead. Plus the lm head's logits (see logits_bytes).
  """
  b, t = micro_batch_per_device, cfg.max_target_length
  d, f, h, kv, dh = cfg.base_emb_dim, cfg.base_mlp_dim, cfg.base_num_query_heads, cfg.base_num_kv_heads, cfg.head_dim
  act = BYTES[cfg.dtype]
  tokens = b * t
  gemm_outputs = tokens * ((h + 2 * kv) * dh + h * dh + d + 2 * f) * act
  scores = 0 if cfg.attention == "cudnn_flash" else b * h * t * t * 4
  working_set = gemm_outputs + 4 * tokens * d * act + scores + tokens * f * act
  policy = hardware.unresolved_remat(cfg.remat_policy)
  if policy in ("none", "full"):
    per_layer = working_set if policy == "none" else tokens * d * act
  else:
    per_layer = tokens * d * act + gemm_outputs
    # '_with_context' keeps the attention output and, for cuDNN, its f32 softmax statistics (decoder.py).
    per_layer += tokens * h * (dh * act + (4 if cfg.attention == "cudnn_flash" else 0)) if "context" in policy else 0
    per_layer += quantized_residual_bytes(cfg, tokens) if "quantization" in policy else 0
  return cfg.base_num_decoder_layers * per_layer + working_set + logits_bytes(cfg, tokens)


def logits_bytes(cfg, tokens) -> float:
  """The lm head's logits at their peak: f32 logits and their f32 gradient (2 x 4 x tokens x V), or with
  num_vocab_tiling = n one tile's f32 logits and bf16 gradient ((4 + 2) x tokens/n x V; model/vocab_tiling.py)."""
  if cfg.num_vocab_tiling > 1:
    return (4 + BYTES[cfg.dtype]) * tokens / cfg.num_vocab_tiling * cfg.vocab_size
  return 2 * tokens * cfg.vocab_size * 4


def quantized_residual_bytes(cfg, tokens) -> float:
  """Bytes per layer of the quantized operands kept for the backward GEMMs (remat '_with_quantization'):
  per-tensor FP8 keeps x (1 byte per element) and the weight (1 byte per parameter); NVFP4 with 16x16
  weight tiles keeps the weight's block-scaled values (bf16, 2 bytes per parameter, unsharded)."""
  d, f, h, kv, dh = cfg.base_emb_dim, cfg.base_mlp_dim, cfg.base_num_query_heads, cfg.base_num_kv_heads, cfg.head_dim
  mlp, attention = precision.configured_recipes(cfg)
  gemms = [(mlp, d, f)] * len(cfg.mlp_activations) + [(mlp, f, d)]
  gemms += [(attention, d, (h + 2 * kv) * dh), (attention, h * dh, d)]
  total = 0.0
  for recipe, k, n in gemms:
    bytes_per_weight = 1 if recipe.shares_transpose("x") else 2
    total += tokens * k if recipe.shares_transpose("x") else 0
    total += k * n * bytes_per_weight if recipe.shares_transpose("w") else 0
  return total


DENSE_PER_LAYER = 7  # q, k, v, o, gate, up, down


def amax_history_bytes(cfg) -> float:
  """FP8 delayed scaling's state per device: where any recipe of the config scales from a history, every Dense
  of every layer keeps an f32 [3, amax_history_len] history (model/layers.py), replicated on every device, and
  the step returns a new one of each (their "gradient") before the old is released."""
  return 2 * cfg.base_num_decoder_layers * DENSE_PER_LAYER * 3 * precision.amax_history_len(cfg) * 4


GATHERED_LAYERS = 2  # the layer being computed and the next, whose all-gather the latency-hiding scheduler starts early


def gathered_weight_bytes(cfg, mesh_sizes) -> float:
  """FSDP's working set: where parameters are split over fsdp (or context), each layer's weights are all-gathered
  in the compute dtype before its GEMMs, and the next layer's gather is already under way: GATHERED_LAYERS layers
  of weights (split only by tensor parallelism) beside the sharded state. Compiled for 128 GB300s, Llama 3.1 405B
  (6.4 GB of bf16 weights per layer) peaks 12.5 GiB above the state and activations (benchmarks/RESULTS.md)."""
  if mesh_sizes.get("fsdp", 1) * mesh_sizes.get("context", 1) == 1:
    return 0.0
  return GATHERED_LAYERS * layer_param_count(cfg) * BYTES[cfg.dtype] / mesh_sizes.get("tensor", 1)


def optimizer_slots(cfg) -> int:
  """f32 values the optimizer keeps per parameter: Adam's mu and nu (adamw, adam_pax), none for sgd."""
  return 0 if cfg.opt_type == "sgd" else 2


def memory_per_device(cfg, mesh_sizes, micro_batch_size) -> MemoryEstimate:
  """Parameters, f32 gradients and AdamW state (mu, nu in f32) per device, plus activations, FSDP's gathered
  weights and FP8 delayed scaling's amax histories.

  `mesh_sizes`: {axis: size} (MaxText.runtime.sharding.mesh_shape) or a device count (pure FSDP).
  Parameters, gradients and optimizer state are split over every axis but data (FSDP + context +
  tensor, the ideal split: a dimension that doesn't divide stays whole in practice); activations
  over the batch axes (data x fsdp) and context; tensor parallelism is not credited (conservative).
  """
  if isinstance(mesh_sizes, int):
    mesh_sizes = {"fsdp": mesh_sizes}
  shards = max(1, math.prod(v for k, v in mesh_sizes.items() if k != "data"))
  n = param_count(cfg)
  params = n * BYTES[cfg.weight_dtype] / shards
  grads = n * 4 / shards
  optimizer = n * optimizer_slots(cfg) * 4 / shards
  batch_shards = mesh_sizes.get("data", 1) * mesh_sizes.get("fsdp", 1)
  per_device_micro = max(micro_batch_size / batch_shards, 1e-9)
  activations = activation_bytes(cfg, per_device_micro) / mesh_sizes.get("context", 1)
  gathered = gathered_weight_bytes(cfg, mesh_sizes)
  return MemoryEstimate(params, grads, optimizer, activations, amax_history_bytes(cfg), gathered)
