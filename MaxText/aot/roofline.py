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

The Pallas quantizer kernels (quantization/kernels/pallas_quantize.py) are not memory-bound: exact rounding, the RHT
butterfly and stochastic rounding's threefry draws bound them (the H100 ran them at 2.3x-3.9x the time their bytes
need). Each gets its own cost, ns per element of the tensor it reads, fitted on the H100's per-quantizer times of
the same day (`quantizer_ns_per_element`, benchmarks/roofline_calibration.py says how) and scaled by SMs x clock to
other GPUs, as attention's per-score cost is; the kernel takes the longer of that and its bytes' time. A `_narrow`
kernel (E2M1 and E4M3 codes for the block-scaled dot) does the same arithmetic as its bf16-writing twin and is
costed as it.
"""

import dataclasses

from MaxText.aot import targets


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
  # {Pallas kernel name: ns per element of its largest operand on `score_gpu`}: compute-bound kernels' own cost.
  quantizer_ns_per_element: dict = dataclasses.field(default_factory=dict)


# Fitted by benchmarks/roofline_calibration.py on the H100 measurements of 2026-11-27 (its output is in RESULTS.md).
# The Pallas quantizers' ns per element (roofline_calibration.fit_quantizers on the H100's quantize part).
H100_QUANTIZER_NS_PER_ELEMENT = {
  "quantize_amax_rht": 0.00181577,
  "quantize_fp8_e4m3": 0.00237946,
  "quantize_fp8_e5m2": 0.00237946,
  "quantize_mx_e2m1": 0.00263204,
  "quantize_mx_e4m3": 0.002159,
  "quantize_nvfp4": 0.00303644,
  "quantize_nvfp4_16x16": 0.00330658,
  "quantize_nvfp4_16x16_4over6_mae": 0.01100525,
  "quantize_nvfp4_16x16_4over6_mse": 0.01100525,
  "quantize_nvfp4_4over6_mae": 0.01049422,
  "quantize_nvfp4_4over6_mse": 0.01049422,
  "quantize_nvfp4_rht": 0.00418547,
  "quantize_nvfp4_rht_4over6_mae": 0.02549659,
  "quantize_nvfp4_rht_4over6_mse": 0.02549659,
  "quantize_nvfp4_rht_sr": 0.00598679,
  "quantize_nvfp4_rht_sr_4over6_mae": 0.01321099,
  "quantize_nvfp4_rht_sr_4over6_mse": 0.01321099,
  "quantize_nvfp4_sr": 0.00440454,
  "quantize_nvfp4_sr_4over6_mae": 0.01135992,
  "quantize_nvfp4_sr_4over6_mse": 0.01135992,
}
H100_2026_11_27 = Calibration(
  gemm=0.7545,
  memory=0.8948,
  attention=0.9390,
  attention_score_ns=0.000599,
  score_gpu="h100",
  source="one H100 80GB HBM3, 2026-11-27 (benchmarks/results/h100-2026-11-27/, benchmarks/roofline_calibration.py)",
  # roofline_calibration.fit_quantizers on quantize_quantize.json ([8192, 16384], quantization_kernels=pallas).
  quantizer_ns_per_element=H100_QUANTIZER_NS_PER_ELEMENT,
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
  if kernel.kind == "pallas":
    return max(memory_time, quantizer_compute_seconds(kernel, gpu, calibration))
  if kernel.category == "collective":
    info = kernel.collective
    nvlink = info["nvlink_bytes"] / gpu.nvlink_bytes_per_s
    return (nvlink + info["network_bytes"] / gpu.network_bytes_per_s) / calibration.collective
  return memory_time


def quantizer_compute_seconds(kernel, gpu, calibration=DEFAULT):
  """A Pallas kernel's compute time on `gpu` from its calibrated ns per element (0 for a kernel not calibrated)."""
  name = kernel.pallas_name
  per_element = calibration.quantizer_ns_per_element.get(name.removesuffix("_narrow"), 0.0)
  return kernel.elements * per_element * 1e-9 * _sm_clock(calibration.score_gpu) / _sm_clock(gpu)


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
