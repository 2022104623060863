"""The roofline: each kernel by the slower of its FLOPs over the achievable share of its operand type's tensor-core
peak and its bytes over the achievable share of HBM bandwidth, attention with its per-score cost, collectives over
NVLink inside a domain and the NIC across, categories that add up, MFU against the bf16 peak."""

import collections
import dataclasses
import math
import types

import pytest

from MaxText.aot import dump, hlo, ptx, roofline, targets

H100, B200, GB200, GB300 = (targets.GPUS[g] for g in ("h100", "b200", "gb200", "gb300"))
CAL = roofline.Calibration(
  gemm=0.5, memory=0.8, attention=0.6, attention_score_ns=0.001, score_gpu="h100", source="test"
)
LINE_RATE = roofline.Scenario(collective_share=1.0, overlap_slowdown=0.0, attention_gap=1.0)


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


def test_attention_scales_with_the_tensor_peak_and_cudnns_gap_on_blackwell():
  kernel = _kernel("attention", "cudnn", flops=4e12, scores=1e9)
  compute = 4e12 / (H100.peak_flops("bf16") * 0.6)
  assert roofline.kernel_seconds(kernel, H100, CAL) == pytest.approx(compute + 1e9 * 1e-12)
  scaled = lambda gpu: (compute + 1e-3) * H100.peak_flops("bf16") / gpu.peak_flops("bf16")
  # B200: the published kernels' scaling, times cuDNN's gap there (point 1.15; 1.0 to 1.3 over the range).
  assert roofline.kernel_seconds(kernel, B200, CAL) == pytest.approx(scaled(B200) * 1.15)
  assert roofline.kernel_seconds(kernel, B200, CAL, LINE_RATE) == pytest.approx(scaled(B200))
  slow = dataclasses.replace(LINE_RATE, attention_gap=1.3)
  assert roofline.kernel_seconds(kernel, B200, CAL, slow) == pytest.approx(scaled(B200) * 1.3)
  # Blackwell Ultra's doubled exponential throughput halves the gap's excess.
  assert roofline.kernel_seconds(kernel, GB300, CAL) == pytest.approx(scaled(GB300) * 1.075)
  assert roofline.attention_gap(H100, roofline.SCENARIOS["high"]) == 1.0  # the fit's own generation


def test_collectives_over_nvlink_and_the_network():
  inside = _kernel("collective", "all-reduce", collective={"nvlink_bytes": 9e9, "network_bytes": 0.0})
  across = _kernel("collective", "all-gather", collective={"nvlink_bytes": 9e9, "network_bytes": 1e9})
  assert roofline.kernel_seconds(inside, GB300, CAL, LINE_RATE) == pytest.approx(9e9 / 900e9)
  assert roofline.kernel_seconds(across, GB300, CAL, LINE_RATE) == pytest.approx(9e9 / 900e9 + 1e9 / 100e9)  # CX-8
  assert roofline.kernel_seconds(across, H100, CAL, LINE_RATE) == pytest.approx(9e9 / 450e9 + 1e9 / 50e9)  # CX-7
  point = roofline.kernel_seconds(inside, GB300, CAL)  # the point: 85% of line rate (assumed)
  assert point == pytest.approx(9e9 / 900e9 / roofline.POINT.collective_share)


def test_estimate_adds_categories_and_counts_runs_without_a_schedule():
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
  assert ms["collectives"] == pytest.approx(1e3 * 1e9 / 450e9 / 0.85) == ms["collectives_exposed"]
  assert ms["total"] == pytest.approx(ms["gemm"] + ms["elementwise"] + ms["attention"] + ms["collectives"])
  assert est["mfu"] == pytest.approx(2e12 / (ms["total"] / 1e3) / H100.peak_flops("bf16"))
  assert est["tokens_per_s_per_device"] == pytest.approx(8192 / (ms["total"] / 1e3))
  assert est["model_tflops_per_s_per_device"] == pytest.approx(2e12 / (ms["total"] / 1e3) / 1e12)
  low, high = est["range_ms"]["low"], est["range_ms"]["high"]
  assert low < ms["total"] < high  # the collective at line rate, or at 70% of it
  assert high - low == pytest.approx(1e3 * 1e9 / 450e9 * (1 / 0.7 - 1))
  assert est["model_tflops_range"][0] < est["model_tflops_per_s_per_device"] < est["model_tflops_range"][1]


def test_with_its_module_the_step_is_its_schedule():
  from tests.aot.test_schedule import HLO  # pylint: disable=import-outside-toplevel

  module = hlo.parse(HLO)
  kernels = hlo.kernels(module, num_devices=8)
  est = roofline.estimate(kernels, GB200, CAL, module=module)
  ms = est["ms_per_step"]
  assert est["scheduled"] and ms["total"] < ms["gemm"] + ms["elementwise"] + ms["attention"] + ms["collectives"]
  assert ms["collectives_exposed"] + ms["collectives_hidden"] == pytest.approx(ms["collectives"])


def test_the_constants_say_what_was_fitted_published_and_assumed():
  found = roofline.constants()
  assert set(found) == {"fitted", "published", "assumed"}
  assert "8B-layer" in found["fitted"]["gemm"] and "1B-like" in found["fitted"]["attention, attention_score_ns"]
  assert "Blackwell Ultra" in found["published"]["fp4_blackwell_ultra"]
  assert set(found["assumed"]) == {"point", "low", "high", "nccl_sms"}


def test_the_default_calibration_says_where_it_comes_from():
  cal = roofline.DEFAULT
  assert "H100" in cal.source and "2026-11-27" in cal.source and cal.score_gpu == "h100"
  for field in ("gemm", "memory", "attention"):
    assert 0.3 < getattr(cal, field) <= 1.0, field  # shares of a peak
  assert dataclasses.replace(cal, gemm=1.0).gemm == 1.0


def _pallas(name, elements, nbytes, count=1, code=None):
  scope = f"jit(step_fn)/while/body/mlpwo/jit(quantize_operand)/{name}/pallas_call"
  kernel = hlo.Kernel("k", "custom-call", "", "elementwise", "pallas", count, 0.0, nbytes, scope, elements=elements)
  kernel.read_bytes, kernel.code = 0.8 * nbytes, code
  return kernel


def _code(blocks, instructions_per_thread):
  """Code whose threads each issue `instructions_per_thread` FP32 instructions, 128 threads a block."""
  block = ptx.Block(
    instructions_per_thread, collections.Counter(issue=instructions_per_thread, fp=instructions_per_thread)
  )
  return dump.Code(dump.Launch("quantize", blocks, 128, 0), ptx.Entry("quantize", "sm_100a", block, []))


def test_a_kernel_with_code_costs_its_instructions_or_its_bytes_whichever_is_slower():
  n = 8192 * 16384
  blocks = n // (128 * 32)  # 32 elements a thread
  busy = _pallas("quantize_nvfp4_sr_narrow", n, 2.56 * n, code=_code(blocks, 32 * 100))
  clocks = math.ceil(blocks / GB200.core_count) * 3200  # a block: 128 threads x 3200 slots / 128 per clock
  assert roofline.kernel_seconds(busy, GB200, CAL) == pytest.approx(clocks / (GB200.clock_ghz * 1e9))
  light = _pallas("quantize_nvfp4_narrow", n, 2.56 * n, code=_code(blocks, 32))
  assert roofline.kernel_seconds(light, GB200, CAL) == pytest.approx(2.56 * n / (GB200.memory_bandwidth * 0.8))
  unread = _pallas("quantize_nvfp4_narrow", n, 2.56 * n)  # no dump read: its bytes, a lower bound
  assert roofline.kernel_seconds(unread, GB200, CAL) == roofline.kernel_seconds(light, GB200, CAL)


def test_quantizer_kernels_report_per_element_work_and_what_bounds_it():
  n = 8192 * 16384
  blocks = n // (128 * 32)
  kernels = [
    _pallas("quantize_nvfp4_sr_narrow", n, 2.56 * n, count=2, code=_code(blocks, 32 * 100)),
    hlo.Kernel("te", "custom-call", "te_quantize_ffi", "elementwise", "te_kernel", 3, 0.0, 2.56 * n, "", elements=n),
  ]
  rows = roofline.quantizer_kernels(kernels, GB200, CAL)
  ours, theirs = rows["quantize_nvfp4_sr_narrow"], rows["te_quantize_ffi"]
  assert ours["runs_per_step"] == 2 and ours["instructions_per_element"] == pytest.approx(100)
  assert ours["bytes_per_element"] == pytest.approx(2.56) and ours["bound"] == "instructions"
  assert ours["bound_by"] == "issue"
  assert ours["instructions_ms"] / ours["bytes_ms"] == pytest.approx(
    100 / ours["byte_bound_at_instructions_per_element"]
  )
  assert theirs["instructions_per_element"] is None and theirs["bound"] == "bytes (lower bound: no code read)"


def test_the_pallas_kernel_name_comes_from_its_op_path():
  assert _pallas("quantize_nvfp4_rht_sr_narrow", 1, 1).pallas_name == "quantize_nvfp4_rht_sr_narrow"
  assert _kernel("elementwise", "fusion", scope="a/quantize_x/pallas_call").pallas_name == ""


def test_a_quantizer_counts_the_values_it_writes_not_its_packed_operand():
  """The narrow NVFP4 kernel reads bf16 pairs as u32 words (u32[1024,16,8]: 262,144 values) and writes two E2M1 codes
  a byte (u32[1024,16,2]) and a scale a block (u8[1024,16]): its tensor is 262,144 values; an FP8 quantizer writes
  one code a byte; an amax pass writes no codes."""
  instr = types.SimpleNamespace(shapes=[hlo.Array("u32", (1024, 16, 2)), hlo.Array("u8", (1024, 16))])
  assert hlo.quantizer_codes(_pallas("quantize_nvfp4_narrow", 0, 0), instr) == 1024 * 16 * 8 * 2
  assert hlo.quantizer_codes(_pallas("quantize_mxfp8", 0, 0), instr) == 1024 * 16 * 2 * 4
  assert hlo.quantizer_codes(_pallas("quantize_amax_rht", 0, 0), instr) == 0
