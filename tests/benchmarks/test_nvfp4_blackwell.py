"""benchmarks/nvfp4_blackwell.py: which kernels it calls quantization's and how it names them, and its tables'
arithmetic (against bf16 and FP8, the goals)."""

from benchmarks import nvfp4_blackwell as nb
from MaxText.aot import hlo


def _kernel(scope, kind="fusion", category="elementwise", target=""):
  return hlo.Kernel("k", "fusion", target, category, kind, 1, 0.0, 1.0, scope)


def test_what_the_table_counts_as_quantization_and_how_it_names_it():
  scope = "jit(step_fn)/while/body/closed_call/mlpwo/jit(_qmatmul_2d)/jit(quantize_operand)/reduce_max"
  assert nb.label(_kernel(scope)) == "xla reduce_max (mlpwo)"
  assert nb.label(_kernel("a/quantize_nvfp4_sr_narrow/pallas_call", kind="pallas")) == "quantize_nvfp4_sr_narrow"
  te = _kernel("jit(step_fn)/mlpwi_0/te", kind="te_kernel", target="te_dbias_quantize_ffi")
  assert nb.label(te) == "te_dbias_quantize_ffi (mlpwi_0)"
  assert nb.label(_kernel("jit(step_fn)/while/body/mlpwo/add")) is None
  assert nb.label(_kernel("a/quantize/x", category="gemm", kind="fp4_block_scaled")) is None


def _report(total, gemm, peak_gib=50.0, quantization_kernels=None):
  ms = {"total": total, "gemm": gemm, "collectives_exposed": 2.0, "collectives_hidden": 8.0}
  estimate = {
    "ms_per_step": ms,
    "range_ms": {"low": total * 0.9, "high": total * 1.2},
    "model_tflops_per_s_per_device": 1e6 / total,
    "model_tflops_range": [1e6 / total / 1.2, 1e6 / total / 0.9],
  }
  return {
    "estimate": estimate,
    "backends": {},
    "memory": {"peak_bytes": peak_gib * 2**30},
    "quantization_kernels": quantization_kernels or {},
  }


def test_the_tables_compare_each_mode_with_bf16_and_fp8_and_say_the_goals(capsys):
  row = {
    "runs_per_step": 96,
    "instructions_per_element": 100.0,
    "bound_by": "alu",
    "bytes_per_element": 2.56,
    "instructions_ms": 40.0,
    "bytes_ms": 4.0,
    "bound": "instructions",
    "byte_bound_at_instructions_per_element": 10.0,
  }
  reports = {
    "bf16": _report(800.0, 400.0),
    nb.FP8: _report(600.0, 200.0),
    nb.OURS: _report(500.0, 120.0, quantization_kernels={"quantize_nvfp4_narrow": row}),
    nb.SEEDS: _report(640.0, 140.0),
  }
  nb.tables(reports)
  out = capsys.readouterr().out
  ours = next(line for line in out.splitlines() if line.startswith(f"| {nb.OURS} (bf16)"))
  cells = ours.split(" | ")
  assert cells[1] == "500.0 (450.0 - 600.0)" and cells[2] == "1.600x" and cells[3] == "1.200x"
  assert cells[7] == "2.0 / 8.0" and cells[8].startswith("50.0")
  assert f"| {nb.OURS} | quantize_nvfp4_narrow | 96 | 100.0 (alu) | 2.56 | 40.0 | 4.0 | instructions | 10.0 |" in out
  assert f"goal: {nb.OURS} at >= 1.15x {nb.FP8}'s speed: 1.200x (met)" in out
  assert f"goal: {nb.SEEDS} at >= 1.5x bf16's speed: 1.250x (not met)" in out
