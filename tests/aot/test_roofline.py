"""The roofline: each kernel by the slower of its FLOPs over the achievable share of its operand type's tensor-core
peak and its bytes over the achievable share of HBM bandwidth, attention with its per-score cost, collectives over
NVLink inside a domain and the NIC across, categories that add up, MFU against the bf16 peak."""

import dataclasses

import pytest

from MaxText.aot import hlo, roofline, targets

H100, B200, GB300 = targets.GPUS["h100"], targets.GPUS["b200"], targets.GPUS["gb300"]
CAL = roofline.Calibration(
  gemm=0.5, memory=0.8, attention=0.6, attention_score_ns=0.001, score_gpu="h100", collective=1.0, source="test"
)


def _kernel(category, kind, flops=0.0, nbytes=0.0, count=1, **extra):
  return hlo.Kernel("k", "custom-call", "", category, kind, count, flops, nbytes, **extra)


def test_gemm_is_compute_or_memory_bound():
  big = _kernel("gemm", "bf16", flops=1e12, nbytes=1e6)
  assert roofline.kernel_seconds(big, H100, CAL) == pytest.approx(1e12 / (H100.peak_flops("bf16") * 0.5))
  skinny = _kernel("gemm", "bf16", flops=1e6, nbytes=1e9)  # a GEMV: its bytes bound it
  assert roofline.kernel_seconds(skinny, H100, CAL) == pytest.approx(1e9 / (H100.memory_bandwidth * 0.8))


def test_each_gemm_kind_runs_at_its_operand_types_rate():
  seconds = lambda kind, gpu, **kw: roofline.kernel_seconds(_kernel("gemm", kind, flops=1e12, **kw), gpu, CAL)
  assert seconds("fp8", H100) == pytest.approx(seconds("bf16", H100) / 2)
  assert seconds("fp4_block_scaled", B200) == pytest.approx(seconds("bf16", B200) / 4)
  assert seconds("mxfp8_block_scaled", B200) == pytest.approx(seconds("fp8", B200))
  assert seconds("fp4_block_scaled", H100) == pytest.approx(seconds("fp8", H100))  # no FP4 tensor cores: FP8's
  assert seconds("te", B200, dtypes=("f4e2m1fn", "f4e2m1fn")) == pytest.approx(seconds("fp4_block_scaled", B200))
  assert seconds("te", H100, dtypes=("f8e4m3fn", "f8e5m2")) == pytest.approx(seconds("fp8", H100))
  # A dot XLA emits as a loop runs on the CUDA cores: one f32 FMA per core per clock at best.
  assert seconds("naive_loop", H100) == pytest.approx(1e12 / (2 * 128 * 132 * 1.98e9))


def test_attention_adds_its_per_score_cost_scaled_by_sms_and_clock():
  kernel = _kernel("attention", "cudnn", flops=4e12, scores=1e9)
  compute = 4e12 / (H100.peak_flops("bf16") * 0.6)
  assert roofline.kernel_seconds(kernel, H100, CAL) == pytest.approx(compute + 1e9 * 1e-12)
  on_b200 = 4e12 / (B200.peak_flops("bf16") * 0.6) + 1e9 * 1e-12 * (132 * 1.98) / (148 * 1.965)
  assert roofline.kernel_seconds(kernel, B200, CAL) == pytest.approx(on_b200)


def test_collectives_over_nvlink_and_the_network():
  inside = _kernel("collective", "all-reduce", collective={"nvlink_bytes": 9e9, "network_bytes": 0.0})
  across = _kernel("collective", "all-gather", collective={"nvlink_bytes": 9e9, "network_bytes": 1e9})
  assert roofline.kernel_seconds(inside, GB300, CAL) == pytest.approx(9e9 / 900e9)
  assert roofline.kernel_seconds(across, GB300, CAL) == pytest.approx(9e9 / 900e9 + 1e9 / 100e9)  # ConnectX-8
  assert roofline.kernel_seconds(across, H100, CAL) == pytest.approx(9e9 / 450e9 + 1e9 / 50e9)  # NVLink 4, CX-7


def test_estimate_adds_categories_and_counts_runs():
  kernels = [
    _kernel("gemm", "bf16", flops=1e12, count=3),
    _kernel("elementwise", "fusion", nbytes=2e9, count=2),
    _kernel("attention", "cudnn", flops=1e12, scores=0.0),
    _kernel("collective", "all-gather", collective={"nvlink_bytes": 1e9, "network_bytes": 0.0}),
  ]
  est = roofline.estimate(kernels, H100, CAL, flops_per_step=2e12, tokens_per_step_per_device=8192)
  ms = est["ms_per_step"]
  assert ms["gemm"] == pytest.approx(3e3 * 1e12 / (H100.peak_flops("bf16") * 0.5))
  assert ms["elementwise"] == pytest.approx(2e3 * 2e9 / (H100.memory_bandwidth * 0.8))
  assert ms["collectives"] == pytest.approx(1e3 * 1e9 / 450e9)
  assert ms["total"] == pytest.approx(ms["gemm"] + ms["elementwise"] + ms["attention"] + ms["collectives"])
  assert est["mfu"] == pytest.approx(2e12 / (ms["total"] / 1e3) / H100.peak_flops("bf16"))
  assert est["tokens_per_s_per_device"] == pytest.approx(8192 / (ms["total"] / 1e3))


def test_the_default_calibration_says_where_it_comes_from():
  cal = roofline.DEFAULT
  assert "H100" in cal.source and "2026-11-27" in cal.source and cal.score_gpu == "h100"
  for field in ("gemm", "memory", "attention"):
    assert 0.3 < getattr(cal, field) <= 1.0, field  # shares of a peak
  assert dataclasses.replace(cal, gemm=1.0).gemm == 1.0


def _pallas(name, elements, nbytes, count=1):
  scope = f"jit(step_fn)/while/body/mlpwo/jit(quantize_operand)/{name}/pallas_call"
  return hlo.Kernel("k", "custom-call", "", "elementwise", "pallas", count, 0.0, nbytes, scope, elements=elements)


def test_a_pallas_quantizer_costs_its_calibrated_work_or_its_bytes_whichever_is_slower():
  cal = dataclasses.replace(CAL, quantizer_ns_per_element={"quantize_nvfp4_sr": 0.004})
  n = 8192 * 16384
  busy = _pallas("quantize_nvfp4_sr", n, 4.0 * n)
  compute = n * 0.004e-9
  assert roofline.kernel_seconds(busy, H100, cal) == pytest.approx(compute)
  # The narrow twin does the same arithmetic; another GPU scales it by SMs x clock, not by its bandwidth.
  assert roofline.kernel_seconds(_pallas("quantize_nvfp4_sr_narrow", n, 2.6 * n), H100, cal) == pytest.approx(compute)
  scale = (132 * 1.98) / (B200.core_count * B200.clock_ghz)
  assert roofline.kernel_seconds(busy, B200, cal) == pytest.approx(compute * scale)
  # Bytes win where they take longer; a kernel without a calibrated cost (the plain amax) is its bytes.
  heavy = _pallas("quantize_nvfp4_sr", n, 1e3 * n)
  assert roofline.kernel_seconds(heavy, H100, cal) == pytest.approx(1e3 * n / (H100.memory_bandwidth * 0.8))
  amax = _pallas("quantize_amax", n, 2.0 * n)
  assert roofline.kernel_seconds(amax, H100, cal) == pytest.approx(2.0 * n / (H100.memory_bandwidth * 0.8))


def test_the_pallas_kernel_name_comes_from_its_op_path():
  assert _pallas("quantize_nvfp4_rht_sr_narrow", 1, 1).pallas_name == "quantize_nvfp4_rht_sr_narrow"
  assert _kernel("elementwise", "fusion", scope="a/quantize_x/pallas_call").pallas_name == ""


def test_the_default_quantizer_costs_are_the_fit_of_the_h100_quantizer_times():
  """roofline.DEFAULT's per-kernel costs are what roofline_calibration fits from the committed H100 JSON: amax
  memory-bound, each quantize kernel the rest of its quantizer's time, the RHT's extra split between its two kernels."""
  from benchmarks import roofline_calibration as rc  # pylint: disable=import-outside-toplevel

  times = rc.measured_quantizer_ms()
  fitted = rc.fit_quantizers(times, H100, roofline.DEFAULT)
  assert fitted == roofline.DEFAULT.quantizer_ns_per_element
  n = rc.QUANTIZE_ELEMENTS
  amax_ms = 2.0 * n / (H100.memory_bandwidth * roofline.DEFAULT.memory) * 1e3
  assert fitted["quantize_nvfp4"] * n / 1e6 == pytest.approx(times["nvfp4 1x16 (x)"] - amax_ms, abs=1e-6)
  rht_total = (fitted["quantize_amax_rht"] + fitted["quantize_nvfp4_rht"]) * n / 1e6
  assert rht_total == pytest.approx(times["nvfp4 RHT (x_t)"], abs=1e-6)
  # Measured 2026-11-27: each NVFP4 quantize kernel takes 2.3x or more the time its bytes need on the H100.
  for name in ("quantize_nvfp4", "quantize_nvfp4_sr", "quantize_nvfp4_rht", "quantize_nvfp4_rht_sr"):
    assert fitted[name] * n * 1e-9 > 2.2 * 4.0 * n / (H100.memory_bandwidth * roofline.DEFAULT.memory), name
