"""A roofline estimate of a compiled step's device time on a GPU target, kernel by kernel, from its optimized HLO
(aot/hlo.py): library GEMMs by their FLOPs over an achievable share of the tensor-core peak for their operand type
(or by their bytes where that is slower), attention by its GEMM FLOPs plus the softmax work on every attention score,
every other kernel (elementwise, quantizers, copies, XLA's fusions) by the bytes it moves over an achievable share of
HBM bandwidth, collectives by the bytes each GPU sends over NVLink inside its domain and over its own NIC across
domains (bandwidth-optimal algorithms: hlo.collective_info). Categories add up (no overlap of collectives with
compute is assumed: an upper bound where XLA's latency-hiding scheduler overlaps them).

The achievable shares were calibrated once, on one H100's measurements of 2026-11-27 (../shared/gpu/
H100-2026-11-27.md, benchmarks/results/h100-2026-11-27/): `benchmarks/roofline_calibration.py` fits them and prints
how every measured row comes out (benchmarks/RESULTS.md). GEMM and memory shares and attention's FLOP share from the
8B-layer bf16 step; attention's per-score cost from it together with the 1B-like bf16 step (head dim 128 vs 64: two
unknowns need both). They are shares of each target's own peaks (aot/targets.py), so a B200 gets the same share of
its own rates: an assumption until a Blackwell is measured. Collectives are uncalibrated (no multi-GPU
measurement): link bandwidth at its datasheet figure, a lower bound on their time.

Every kernel whose code the compiler's dump shows (XLA's fusions and the Pallas kernels: aot.dump, aot.ptx) takes
the longer of its bytes' time and its instruction time (aot.instructions: each thread's instructions by execution
pipe over the target's per-pipe rates, a published table, nothing fitted), so a compute-bound quantizer costs its
arithmetic on every target by one model; a kernel without readable code (Transformer Engine's, where its SASS is
not read) costs its bytes, a lower bound, and says so (`quantizer_kernels`).
"""

import collections
import dataclasses

from MaxText.aot import instructions, targets


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Achievable shares of a GPU's peaks, and attention's cost per score element on the calibration GPU."""

  gemm: float  # share of the dense tensor-core peak of the GEMM's operand type
  memory: float  # share of HBM bandwidth for memory-bound kernels
  attention: float  # share of the bf16 peak on attention's GEMM FLOPs
  attention_score_ns: float  # ns per attention score (one pass over one Q-K pair) on `score_gpu`
  score_gpu: str  # the GPU the per-score cost was measured on (scaled by SMs x clock elsewhere)
  collective: float = 1.0  # share of link bandwidth (uncalibrated)
  source: str = ""


# Fitted by benchmarks/roofline_calibration.py on the H100 measurements of 2026-11-27 (its output is in RESULTS.md).
H100_2026_11_27 = Calibration(
  gemm=0.7545,
  memory=0.8951,
  attention=0.9390,
  attention_score_ns=0.000599,
  score_gpu="h100",
  source="one H100 80GB HBM3, 2026-11-27 (benchmarks/results/h100-2026-11-27/, benchmarks/roofline_calibration.py)",
)
DEFAULT = H100_2026_11_27
# cuBLAS / cuDNN run a GEMM on the tensor-core rate of its operands; fp4 and the MX block-scaled dots on their own.
_PEAK_OF_KIND = {
  "bf16": "bf16",
  "fp8": "fp8",
  "fp4_block_scaled": "fp4",
  "mxfp8_block_scaled": "fp8",
  "triton": "bf16",
  "f32": "tf32",
}


def _te_peak(dtypes):
  """The tensor-core rate a Transformer Engine GEMM runs at: its operands' type (FP4, FP8, else bf16)."""
  first = dtypes[0] if dtypes else ""
  return "fp4" if first.startswith("f4") else "fp8" if first.startswith("f8") else "bf16"


def kernel_seconds(kernel, gpu, calibration=DEFAULT):
  """Estimated seconds of one run of `kernel` on `gpu` (aot.targets.Gpu)."""
  bandwidth = gpu.memory_bandwidth * calibration.memory
  memory_time = kernel.bytes / bandwidth
  if kernel.category == "gemm":
    if kernel.kind == "naive_loop":
      scalar = 2.0 * 128 * gpu.core_count * gpu.clock_ghz * 1e9  # one FMA per CUDA core per clock, f32
      return max(kernel.flops / scalar, memory_time)
    dtype = _te_peak(kernel.dtypes) if kernel.kind == "te" else _PEAK_OF_KIND.get(kernel.kind, "bf16")
    if dtype not in gpu.matrix_ops_per_clock:
      dtype = "fp8" if kernel.kind == "fp4_block_scaled" else "bf16"  # no FP4 tensor cores: the next rate down
    return max(kernel.flops / (gpu.peak_flops(dtype) * calibration.gemm), memory_time)
  if kernel.category == "attention":
    compute = kernel.flops / (gpu.peak_flops("bf16") * calibration.attention)
    score_gpu_rate = _sm_clock(calibration.score_gpu)
    scores = kernel.scores * calibration.attention_score_ns * 1e-9 * score_gpu_rate / _sm_clock(gpu)
    return max(compute + scores, memory_time)
  if kernel.code is not None:
    return max(memory_time, instructions.seconds(kernel.code, kernel.read_bytes, gpu)[0])
  if kernel.category == "collective":
    info = kernel.collective
    nvlink = info["nvlink_bytes"] / gpu.nvlink_bytes_per_s
    return (nvlink + info["network_bytes"] / gpu.network_bytes_per_s) / calibration.collective
  return memory_time


def quantizer_kernels(kernel_list, gpu, calibration=DEFAULT):
  """{kernel name: row} of the step's quantizer kernels (the Pallas kernels by name, Transformer Engine's by FFI
  target) on `gpu`: runs per step; per element of the tensor each reads, thread-instructions, the pipe that bounds
  them and bytes; ms per step of its bytes and of its instructions; what bounds it ('bytes', 'instructions', or
  'bytes (lower bound: no code read)'); and the instructions per element it could take and still be byte-bound."""
  rows = {}
  bandwidth = gpu.memory_bandwidth * calibration.memory
  for k in kernel_list:
    if k.kind not in ("pallas", "te_kernel"):
      continue
    name = k.pallas_name or k.target
    sums = ("runs", "elements", "instructions", "bytes", "bytes_ms", "instructions_ms")
    row = rows.setdefault(
      name, {**dict.fromkeys(sums, 0.0), "code": k.code is not None, "pipes": collections.Counter()}
    )
    row["runs"] += k.count
    row["elements"] += k.elements * k.count
    row["bytes"] += k.bytes * k.count
    row["bytes_ms"] += k.bytes / bandwidth * k.count * 1e3
    if k.code is not None:
      seconds, work = instructions.seconds(k.code, k.read_bytes, gpu)
      threads = k.code.launch.blocks * k.code.launch.threads_per_block
      row["instructions"] += work.instructions * threads * k.count
      row["instructions_ms"] += seconds * k.count * 1e3
      row["pipes"][instructions.bottleneck(work)] += seconds * k.count
  return {name: _per_element(row) for name, row in sorted(rows.items())}


def _per_element(row):
  """A quantizer_kernels row from its sums: per-element figures, the bound, the affordable instruction count."""
  elements = row["elements"] or 1.0
  out = {
    "runs_per_step": row["runs"],
    "instructions_per_element": row["instructions"] / elements if row["code"] else None,
    "bytes_per_element": row["bytes"] / elements,
    "bytes_ms": row["bytes_ms"],
    "instructions_ms": row["instructions_ms"] if row["code"] else None,
    "bound_by": row["pipes"].most_common(1)[0][0] if row["pipes"] else None,
  }
  if not row["code"]:
    out["bound"] = "bytes (lower bound: no code read)"
    out["byte_bound_at_instructions_per_element"] = None
    return out
  out["bound"] = "instructions" if row["instructions_ms"] > row["bytes_ms"] else "bytes"
  ratio = row["bytes_ms"] / row["instructions_ms"] if row["instructions_ms"] else float("inf")
  out["byte_bound_at_instructions_per_element"] = out["instructions_per_element"] * ratio
  return out


def _sm_clock(gpu):
  """SMs x clock: what per-element work on the CUDA cores (attention's softmax) scales with."""
  gpu = targets.GPUS[gpu] if isinstance(gpu, str) else gpu
  return gpu.core_count * gpu.clock_ghz


def estimate(kernel_list, gpu, calibration=DEFAULT, flops_per_step=None, tokens_per_step_per_device=None):
  """{ms_per_step: {gemm, elementwise, attention, collectives, total}, mfu, tokens_per_s_per_device} of a step's
  kernels on `gpu`; mfu is `flops_per_step` (MaxText's count per device) over the total at the bf16 peak."""
  ms = {"gemm": 0.0, "elementwise": 0.0, "attention": 0.0, "collectives": 0.0}
  key = {"gemm": "gemm", "elementwise": "elementwise", "attention": "attention", "collective": "collectives"}
  for k in kernel_list:
    ms[key[k.category]] += kernel_seconds(k, gpu, calibration) * k.count * 1e3
  ms["total"] = sum(ms.values())
  out = {"ms_per_step": ms, "mfu": None, "tokens_per_s_per_device": None}
  seconds = ms["total"] / 1e3
  if flops_per_step and seconds > 0:
    out["mfu"] = flops_per_step / seconds / gpu.peak_flops("bf16")
  if tokens_per_step_per_device and seconds > 0:
    out["tokens_per_s_per_device"] = tokens_per_step_per_device / seconds
  return out
