"""The config's `auto` values made concrete for the hardware a step runs or is compiled for (the attention kernel,
the lm head's tiling, the remat policy): one rule each, pure Python; the caller says what the hardware is."""

import dataclasses
import math
import typing

from MaxText.config.derived import RunShape

GIB = 2**30
# The lm head's f32 logits and their gradient may take this share of a device's memory before the head tiles itself:
# on a GB200 (138.2 GiB for jax) 8.6 GiB, which Llama 3 8B's 32,768 tokens per GPU (31.3 GiB untiled) exceed, and
# its 8,192 (7.8 GiB) do not. A tiled head costs a few hundred microseconds per tile (the lm head's GEMM split).
LOGITS_SHARE = 1 / 16
CUDNN_FLASH_MIN_CAPABILITY = 8.0  # cuDNN's fused flash attention: Ampere and newer
# remat_policy=auto on a GPU: the first of these (least recompute first) whose estimated memory per device fits in
# MEMORY_SHARE of it. The analytic estimate (model/accounting.py) is within 5% of the compiled step's memory on the
# GB200/GB300 presets; the compiled check still refuses a step that does not fit before it trains.
REMAT_BY_MEMORY = ("minimal_with_context", "minimal", "full")
MEMORY_SHARE = 0.9


@dataclasses.dataclass(frozen=True)
class Hardware:
  """The devices a step runs or is compiled for: jax's platform name ('gpu', 'cpu'), an NVIDIA GPU's compute
  capability (None where unknown), the memory one device leaves the step (bytes; 0 = unknown) and, for the log,
  what they are."""

  platform: str
  compute_capability: typing.Optional[float] = None
  memory_bytes: float = 0
  what: str = ""


def attention_kernel(hw):
  """(kernel, why) for attention=auto: cuDNN's fused flash attention on an NVIDIA GPU that runs it, as MaxText's
  `autoselected` picks a fused kernel on accelerators; XLA's dot_product everywhere else."""
  if hw.platform != "gpu":
    return "dot_product", f"XLA attention on {hw.what or hw.platform}"
  capability = hw.compute_capability
  if capability is not None and capability < CUDNN_FLASH_MIN_CAPABILITY:
    return "dot_product", f"{hw.what} (compute capability {capability}) predates cuDNN's flash attention"
  return "cudnn_flash", f"cuDNN's fused flash attention on {hw.what or 'an NVIDIA GPU'}"


def logits_bytes(tokens, vocab_size, tiles):
  """The lm head's logits at their peak: untiled f32 logits and their f32 gradient (8 B x tokens x V); tiled, one
  tile's f32 logits and bf16 gradient (6 B x tokens / tiles x V; model/vocab_tiling.py)."""
  return 8 * tokens * vocab_size if tiles == 1 else 6 * tokens / tiles * vocab_size


def vocab_tiles(tokens_per_device, vocab_size, max_target_length, memory_bytes):
  """(tiles, why) for num_vocab_tiling=auto on a GPU: 1 while one device's logits take at most LOGITS_SHARE of its
  memory (or its memory is unknown), else the fewest tiles, a divisor of max_target_length, that bring one tile under
  it."""
  whole = logits_bytes(tokens_per_device, vocab_size, 1)
  budget = memory_bytes * LOGITS_SHARE
  share = f"1/{round(1 / LOGITS_SHARE)} of its {memory_bytes / GIB:.1f} GiB"
  if memory_bytes <= 0:
    return 1, "the device's memory is not known"
  if whole <= budget:
    return 1, f"the lm head's f32 logits and their gradient take {whole / GIB:.1f} GiB per device, under {share}"
  divisors = [n for n in range(2, max_target_length + 1) if max_target_length % n == 0]
  tiles = next((n for n in divisors if logits_bytes(tokens_per_device, vocab_size, n) <= budget), divisors[-1])
  return tiles, (
    f"the lm head's f32 logits of {tokens_per_device:,.0f} tokens x {vocab_size:,} and their gradient would take "
    f"{whole / GIB:.1f} GiB per device, over {share}"
  )


def remat_policy(hw, memory_of):
  """(policy, why) for remat_policy=auto: MaxText's `full` on a CPU (or where the memory is unknown); on a GPU the
  first of REMAT_BY_MEMORY whose memory per device, `memory_of(policy)` bytes, fits in MEMORY_SHARE of it."""
  if hw.platform != "gpu" or hw.memory_bytes <= 0:
    return "full", ""
  budget = hw.memory_bytes * MEMORY_SHARE
  for policy in REMAT_BY_MEMORY:
    need = memory_of(policy)
    if need <= budget or policy == "full":
      return policy, (
        f"estimated {need / GIB:.1f} GiB per device of {hw.memory_bytes / GIB:.1f} GiB"
        + ("" if policy == REMAT_BY_MEMORY[0] else f"; {REMAT_BY_MEMORY[0]} would not fit")
      )
  raise AssertionError("unreachable: full is the last candidate")


def unresolved_remat(policy):
  """The remat policy a model built from a config not made concrete for a target runs (tests, conversions): auto is
  MaxText's full there."""
  return "full" if policy == "auto" else policy


def resolve(cfg, hw, num_devices, memory_of=None):
  """(cfg with its `auto` values made concrete for `hw`, {key: (value, why)} of what auto chose). `memory_of(cfg)`:
  the estimated memory per device of a concrete cfg, in bytes (remat_policy=auto; without it: full)."""
  chosen = {}
  if cfg.attention == "auto":
    chosen["attention"] = attention_kernel(hw)
  if cfg.num_vocab_tiling == -1 and hw.platform != "gpu":  # a CPU's memory is the host's: the same program anywhere
    chosen["num_vocab_tiling"] = (1, "")
  elif cfg.num_vocab_tiling == -1:
    tokens = RunShape.of(cfg, num_devices).micro_batch_size * cfg.max_target_length / num_devices
    chosen["num_vocab_tiling"] = vocab_tiles(tokens, cfg.vocab_size, cfg.max_target_length, hw.memory_bytes)
  cfg = cfg.replace(**{k: v for k, (v, _) in chosen.items()})
  if cfg.remat_policy == "auto":
    estimate = (lambda policy: memory_of(cfg.replace(remat_policy=policy))) if memory_of else lambda _: math.inf
    chosen["remat_policy"] = remat_policy(hw, estimate)
    cfg = cfg.replace(remat_policy=chosen["remat_policy"][0])
  return cfg, chosen


def describe(chosen):
  """One line for the log: 'auto: attention=cudnn_flash (why), num_vocab_tiling=1'."""
  parts = [f"{k}={v}" + (f" ({why})" if why else "") for k, (v, why) in chosen.items()]
  return "auto: " + "; ".join(parts) if parts else ""
