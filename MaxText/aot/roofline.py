"""An estimate of a compiled step's device time on a GPU target, kernel by kernel, from its optimized HLO (aot.hlo):
library GEMMs by their FLOPs over an achievable share of the tensor-core peak for their operand type (or by their
bytes where that is slower), attention by its GEMM FLOPs plus the softmax work on every attention score, every other
kernel by the bytes it moves over an achievable share of HBM bandwidth or its instructions (below), collectives by
the bytes each GPU sends over NVLink inside its domain and over its own NIC across domains (bandwidth-optimal
algorithms: hlo.collective_info). The step's time is its schedule's (hlo.schedule): kernels in the compiled order on
the compute stream, asynchronous collectives beside them, a collective costing only the part nothing hides (its
exposed time); without the module, categories add up.

The achievable shares were calibrated once, on one H100's measurements of 2026-11-27 (benchmarks/results/
h100-2026-11-27/): `benchmarks/roofline_calibration.py` fits them and prints how every measured row comes out
(benchmarks/RESULTS.md). GEMM and memory shares from the 8B-layer bf16 step; attention's FLOP share and per-score
cost from it together with the 1B-like bf16 step (head dim 128 vs 64: two unknowns need both). They are shares of
each target's own peaks (aot/targets.py): an assumption until a Blackwell is measured.

Attention on another GPU scales with its bf16 tensor-core peak, as published attention kernels do from H100 to B200
(FlashAttention-3, arXiv 2407.08608: up to 740 TFLOP/s on an H100; FlashAttention-4, arXiv 2603.05451: up to
1,605 on a B200, 2.2x for 2.25x the peak), less the gap FlashAttention-4 measured to cuDNN 9.13 on Blackwell (up to
1.3x) which it puts on the exponential units: on a Blackwell GPU cuDNN's attention takes `attention_gap` times the
scaled time, the part of the gap beyond 1 shrinking with the GPU's exponential throughput (Blackwell Ultra doubles
it, aot.targets).

Where a constant is uncertain the estimate is a range (SCENARIOS; `low` the fastest, `high` the slowest): the share
of link bandwidth collectives reach (assumed, no multi-GPU measurement: 0.7 to 1.0, point 0.85), how much compute
slows beside a running collective (0 to the SMs NCCL may take, point 0), and cuDNN's attention gap on Blackwell
(1.0 to 1.3, point 1.15).

Every kernel whose code the compiler's dump shows (XLA's fusions and the Pallas kernels: aot.dump, aot.ptx) takes
the longer of its bytes' time and its instruction time (aot.instructions: each thread's instructions by execution
pipe over the target's per-pipe rates, a published table, nothing fitted), so a compute-bound quantizer costs its
arithmetic on every target by one model; a kernel without readable code (Transformer Engine's, where its SASS is
not read) costs its bytes, a lower bound, and says so (`quantizer_kernels`).
"""

import collections
import dataclasses

from MaxText.aot import hlo, instructions, targets


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Achievable shares of a GPU's peaks, and attention's cost per score element on the calibration GPU."""

  gemm: float  # share of the dense tensor-core peak of the GEMM's operand type
  memory: float  # share of HBM bandwidth for memory-bound kernels
  attention: float  # share of the bf16 peak on attention's GEMM FLOPs
  attention_score_ns: float  # ns per attention score (one pass over one Q-K pair) on `score_gpu`
  score_gpu: str  # the GPU the per-score cost was measured on (scaled by SMs x clock elsewhere)
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


@dataclasses.dataclass(frozen=True)
class Scenario:
  """The uncertain constants, one choice each: link share of collectives, compute slowdown beside a running
  collective (a share of its time; None: NCCL_SMS of the GPU's SMs), and cuDNN attention's time on Blackwell over
  the tensor-peak-scaled time (at 16 exponentials per SM per clock)."""

  collective_share: float
  overlap_slowdown: float
  attention_gap: float


NCCL_SMS = 16  # assumed: the SMs NCCL's collectives occupy at most while they run beside compute
SCENARIOS = {
  "point": Scenario(0.85, 0.0, 1.15),
  "low": Scenario(1.0, 0.0, 1.0),
  "high": Scenario(0.7, None, 1.3),
}
POINT = SCENARIOS["point"]
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


def kernel_seconds(kernel, gpu, calibration=DEFAULT, scenario=POINT):
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
    reference = targets.GPUS[calibration.score_gpu]
    scores = (
      kernel.scores * calibration.attention_score_ns * 1e-9 * reference.peak_flops("bf16") / gpu.peak_flops("bf16")
    )
    return max((compute + scores) * attention_gap(gpu, scenario), memory_time)
  if kernel.code is not None:
    return max(memory_time, instructions.seconds(kernel.code, kernel.read_bytes, gpu)[0])
  if kernel.category == "collective":
    info = kernel.collective
    nvlink = info["nvlink_bytes"] / gpu.nvlink_bytes_per_s
    return (nvlink + info["network_bytes"] / gpu.network_bytes_per_s) / scenario.collective_share
  return memory_time


def quantizer_kernels(kernel_list, gpu, calibration=DEFAULT, label=None):
  """{kernel name: row} of the step's quantizer kernels on `gpu` -- the Pallas kernels by name, Transformer
  Engine's by FFI target; with `label(kernel)` (a name, or None to leave a kernel out) any kernels, grouped so:
  runs per step; per element of the tensor each reads, thread-instructions, the pipe that bounds them and bytes; ms
  per step of its bytes and of its instructions; what bounds it ('bytes', 'instructions', or 'bytes (lower bound: no
  code read)'); and the instructions per element it could take and still be byte-bound."""
  rows = {}
  bandwidth = gpu.memory_bandwidth * calibration.memory
  label = label or (lambda k: (k.pallas_name or k.target) if k.kind in ("pallas", "te_kernel") else None)
  for k in kernel_list:
    name = label(k)
    if name is None:
      continue
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


def attention_gap(gpu, scenario=POINT):
  """cuDNN attention's time on `gpu` over the tensor-peak-scaled time: 1 before Blackwell (the fit's generation), on
  Blackwell the scenario's gap, its excess over 1 in proportion to 16 / the GPU's exponentials per SM per clock."""
  if gpu.sm < 100:
    return 1.0
  return 1.0 + (scenario.attention_gap - 1.0) * 16 / gpu.exp_per_clock


ATTENTION_SOURCES = (
  "FlashAttention-3 (arXiv 2407.08608): up to 740 TFLOP/s bf16 on H100; FlashAttention-4 (arXiv 2603.05451): up to "
  "1,605 TFLOP/s bf16 on B200, up to 1.3x cuDNN 9.13, the exponential units its forward's bottleneck"
)


def constants(calibration=DEFAULT):
  """What the estimate's constants are and where each comes from: fitted (on which measurement), published (the
  target facts' and the instruction rates' sources), assumed (the uncertain ones, with the range they span)."""
  fitted_on = "8B-layer bench step in bf16 (H100, 2026-11-27)"
  return {
    "fitted": {
      "gemm": f"{calibration.gemm}: GEMM time of the {fitted_on}",
      "memory": f"{calibration.memory}: elementwise time of the {fitted_on}",
      "attention, attention_score_ns": f"{calibration.attention}, {calibration.attention_score_ns}: attention time "
      f"of the {fitted_on} and of the 1B-like bench step in bf16",
    },
    "published": {**targets.SOURCES, "instructions": instructions.SOURCE, "attention": ATTENTION_SOURCES},
    "assumed": {name: dataclasses.asdict(s) for name, s in SCENARIOS.items()} | {"nccl_sms": NCCL_SMS},
  }


CATEGORY_KEYS = {"gemm": "gemm", "elementwise": "elementwise", "attention": "attention", "collective": "collectives"}


def step_ms(kernel_list, gpu, calibration=DEFAULT, scenario=POINT, module=None):
  """{gemm, elementwise, attention, collectives, collectives_exposed, collectives_hidden, total} ms per step under
  one scenario: categories summed over the kernels' runs; the total as the module's schedule runs them (hlo.schedule),
  or the categories' sum without the module (every collective exposed)."""
  ms = dict.fromkeys(CATEGORY_KEYS.values(), 0.0)
  seconds = {}
  for k in kernel_list:
    seconds[k.name] = kernel_seconds(k, gpu, calibration, scenario)
    ms[CATEGORY_KEYS[k.category]] += seconds[k.name] * k.count * 1e3
  if module is None:
    ms.update(collectives_exposed=ms["collectives"], collectives_hidden=0.0, total=sum(ms.values()))
    return ms
  slowdown = scenario.overlap_slowdown
  slowdown = NCCL_SMS / gpu.core_count if slowdown is None else slowdown
  walked = hlo.schedule.walk(module, lambda name: seconds.get(name, 0.0), slowdown)
  ms.update(
    collectives_exposed=walked["exposed_s"] * 1e3,
    collectives_hidden=walked["hidden_s"] * 1e3,
    total=walked["total_s"] * 1e3,
  )
  return ms


def estimate(kernel_list, gpu, calibration=DEFAULT, flops_per_step=None, tokens_per_step_per_device=None, module=None):
  """{ms_per_step (step_ms at the point scenario), range_ms: {low, high}, mfu, tokens_per_s_per_device,
  model_tflops_per_s_per_device (each with its range)} of a step's kernels on `gpu`; mfu is `flops_per_step`
  (MaxText's count per device) over the total at the bf16 peak."""
  runs = {name: step_ms(kernel_list, gpu, calibration, scenario, module) for name, scenario in SCENARIOS.items()}
  ms = runs["point"]
  out = {"ms_per_step": ms, "range_ms": {"low": runs["low"]["total"], "high": runs["high"]["total"]}}
  out["scheduled"] = module is not None
  per_second = lambda amount, total_ms: amount / (total_ms / 1e3) if amount and total_ms > 0 else None
  for key, amount in (("tokens_per_s_per_device", tokens_per_step_per_device), ("model_flops", flops_per_step)):
    out[key] = per_second(amount, ms["total"])
    out[key + "_range"] = [per_second(amount, runs["high"]["total"]), per_second(amount, runs["low"]["total"])]
  flops = out.pop("model_flops"), out.pop("model_flops_range")
  out["model_tflops_per_s_per_device"] = flops[0] / 1e12 if flops[0] else None
  out["model_tflops_range"] = [f / 1e12 if f else None for f in flops[1]]
  out["mfu"] = flops[0] / gpu.peak_flops("bf16") if flops[0] else None
  return out
