"""The profile summary's categories: what an optimized-HLO op is, for GPU-style ops too (no GPU needed)."""

import json

import pytest

from MaxText.aot import hlo
from MaxText.trainer.hooks import profiler as profiling

# Shaped like XLA's optimized GPU HLO: cuBLAS and cuBLASLt FP8 GEMM custom calls, a Triton GEMM fusion,
# cuDNN attention, a collective, a transpose-only fusion and a quantizer's elementwise fusion.
GPU_HLO = """
HloModule jit_step_fn, entry_computation_layout={()->()}

%triton_gemm_dot.7 (p0: bf16[128,64], p1: bf16[64,32]) -> bf16[128,32] {
  %p0 = bf16[128,64]{1,0} parameter(0)
  %p1 = bf16[64,32]{1,0} parameter(1)
  ROOT %dot.1 = bf16[128,32]{1,0} dot(bf16[128,64]{1,0} %p0, bf16[64,32]{1,0} %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%nested_lhs (p.0: bf16[128,64]) -> bf16[128,64] {
  %p.0 = bf16[128,64]{1,0} parameter(0)
  ROOT %negate.2 = bf16[128,64]{1,0} negate(bf16[128,64]{1,0} %p.0)
}

%gemm_fusion_dot.9_computation (p0.2: bf16[128,64], p1.2: bf16[64,32]) -> f32[128,32] {
  %p0.2 = bf16[128,64]{1,0} parameter(0)
  %p1.2 = bf16[64,32]{1,0} parameter(1)
  %lhs.1 = bf16[128,64]{1,0} fusion(bf16[128,64]{1,0} %p0.2), kind=kCustom, calls=%nested_lhs
  ROOT %dot.9 = f32[128,32]{1,0} dot(bf16[128,64]{1,0} %lhs.1, bf16[64,32]{1,0} %p1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_transpose (param_0: bf16[64,128]) -> bf16[128,64] {
  %param_0 = bf16[64,128]{1,0} parameter(0)
  ROOT %transpose.3 = bf16[128,64]{1,0} transpose(bf16[64,128]{1,0} %param_0), dimensions={1,0}
}

%fused_quantize (param_0.1: f32[128,64]) -> bf16[128,64] {
  %param_0.1 = f32[128,64]{1,0} parameter(0)
  %round.1 = f32[128,64]{1,0} round-nearest-even(f32[128,64]{1,0} %param_0.1)
  ROOT %convert.2 = bf16[128,64]{1,0} convert(f32[128,64]{1,0} %round.1)
}

ENTRY %main (a: bf16[128,64], b: bf16[64,32], x8: f8e4m3fn[128,64], w8: f8e4m3fn[32,64], s: f32[]) -> f32[128,32] {
  %a = bf16[128,64]{1,0} parameter(0)
  %b = bf16[64,32]{1,0} parameter(1)
  %x8 = f8e4m3fn[128,64]{1,0} parameter(2)
  %w8 = f8e4m3fn[32,64]{1,0} parameter(3)
  %s = f32[] parameter(4)
  %custom-call.12 = (bf16[128,32]{1,0}, s8[4194304]{0}) custom-call(bf16[128,64]{1,0} %a, bf16[64,32]{1,0} %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{}}
  %cublas-lt-matmul.3 = (f32[128,32]{1,0}, s8[4194304]{0}) custom-call(f8e4m3fn[128,64]{1,0} %x8, f8e4m3fn[32,64]{1,0} %w8, f32[] %s, f32[] %s), custom_call_target="__cublas$lt$matmul$f8"
  %gemm_fusion_dot.7 = bf16[128,32]{1,0} fusion(bf16[128,64]{1,0} %a, bf16[64,32]{1,0} %b), kind=kCustom, calls=%triton_gemm_dot.7, backend_config={"operation_queue_id":"0","fusion_backend_config":{"kind":"__triton_gemm","triton_gemm_config":{"block_m":"64"}}}
  %gemm_fusion_dot.9 = f32[128,32]{1,0} fusion(bf16[128,64]{1,0} %a, bf16[64,32]{1,0} %b), kind=kCustom, calls=%gemm_fusion_dot.9_computation, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion","block_level_fusion_config":{}}}
  %custom-call.5 = (bf16[1,128,4,64]{3,2,1,0}, u8[0]{0}) custom-call(bf16[1,128,4,64]{3,2,1,0} %q, bf16[1,128,4,64]{3,2,1,0} %k), custom_call_target="__cudnn$fmhaSoftmax"
  %all-reduce-start.1 = f32[128,32]{1,0} all-reduce-start(f32[128,32]{1,0} %y), replica_groups={}, to_apply=%add
  %transpose_fusion = bf16[128,64]{1,0} fusion(bf16[64,128]{1,0} %t), kind=kLoop, calls=%fused_transpose
  %loop_convert_fusion = bf16[128,64]{1,0} fusion(f32[128,64]{1,0} %f), kind=kLoop, calls=%fused_quantize
  ROOT %while.4 = (s32[]) while((s32[]) %init), condition=%cond, body=%body
}
"""


def test_gpu_ops_are_classified_in_the_hlo_models_categories():
  """The profile's categories are aot.hlo's (what train_compile's estimate uses), with its kinds."""
  ops = profiling.op_categories(GPU_HLO)
  expected = {
    "custom-call.12": ("gemm", "bf16"),
    "cublas-lt-matmul.3": ("gemm", "fp8"),
    "gemm_fusion_dot.7": ("gemm", "triton"),
    "gemm_fusion_dot.9": ("gemm", "triton"),
    "custom-call.5": ("attention", "cudnn"),
    "all-reduce-start.1": ("collective", "all-reduce"),
    "transpose_fusion": ("elementwise", "copy"),
    "loop_convert_fusion": ("elementwise", "fusion"),
    "while.4": ("container", "while"),
  }
  assert {op: ops[op] for op in expected} == expected
  assert {category for category, _ in ops.values()} <= {*hlo.CATEGORIES, "container"}
  assert "not-an-op" not in ops and "p0" not in ops  # parameters launch nothing


def test_a_dot_on_the_host_is_the_librarys_gemm_not_xlas_loop():
  text = """HloModule m

ENTRY %main (a: f32[8,4], b: f32[4,2]) -> f32[8,2] {
  %a = f32[8,4]{1,0} parameter(0)
  %b = f32[4,2]{1,0} parameter(1)
  ROOT %dot.3 = f32[8,2]{1,0} dot(f32[8,4]{1,0} %a, f32[4,2]{1,0} %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
  assert profiling.op_categories(text)["dot.3"] == ("gemm", "naive_loop")
  assert profiling.op_categories(text, on_gpu=False)["dot.3"] == ("gemm", "f32")


def test_triton_gemm_kernels_without_an_hlo_op_are_found_by_name():
  """XLA:GPU names a Triton GEMM's kernel after its fusion (triton_gemm_* / gemm_fusion_*): when the trace
  gives no hlo_op we know, the name leads to the op, not to a bare pattern match."""
  ops = profiling.op_categories(GPU_HLO)
  names = profiling.kernel_names(ops)
  for kernel, op in (
    ("gemm_fusion_dot_7", "gemm_fusion_dot.7"),
    ("gemm_fusion_dot_9_0", "gemm_fusion_dot.9"),
    ("loop_convert_fusion_1", "loop_convert_fusion"),
    ("sm90_xmma_gemm_bf16", None),
  ):
    assert profiling.kernel_op(kernel, names) == op
  assert profiling._event_category("gemm_fusion_dot_9_0", "", ops, names) == ("gemm", "triton")
  assert profiling._event_category("sm90_xmma_gemm_bf16", "", ops, names) == ("gemm", "other")
  assert profiling._event_category("ncclDevKernel_AllGather", "", ops, names) == ("collective", "nccl")


def test_attention_tflops_from_the_attention_kernels_time():
  summary = {
    "categories": [{"category": "gemm bf16", "ms_per_step": 50.0}, {"category": "attention", "ms_per_step": 29.2}]
  }
  # 4 layers of the 8B bench shape: 3 x 4 x (4 x B S^2 x H Dh / 2) = 13.2 TFLOP per step.
  flops = 3 * 4 * 4 * 2 * 8192**2 * 32 * 128 / 2
  assert profiling.attention_tflops(summary, flops) == pytest.approx(flops / 29.2e-3 / 1e12)
  assert round(profiling.attention_tflops(summary, flops)) == 452
  assert profiling.attention_tflops({"categories": summary["categories"][:1]}, flops) is None


def _profiled_run(tmp_path, steps, *keys, stop_after=None):
  """Drives a Profiler through `steps` steps of a small jitted matmul as the train loop does; (profiler, summaries).
  stop_after: the run stops after that step (a preemption), and close() ends the window."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from MaxText import config  # pylint: disable=import-outside-toplevel
  from tests.conftest import REPO  # pylint: disable=import-outside-toplevel

  cfg = config.load(REPO / "configs" / "llama3_tiny.yml", ["dataset_type=synthetic", f"steps={steps}", *keys])
  profiler = profiling.Profiler(cfg, str(tmp_path))
  step_fn, x = jax.jit(lambda a: jnp.tanh(a @ a)), jnp.ones((64, 64), jnp.float32)
  summaries = []
  for step in range(steps if stop_after is None else stop_after + 1):
    profiler.before_step(step)
    y = step_fn(x)
    summaries.append(profiler.after_step(step, y, lambda: step_fn.lower(x).compile()))
  profiler.close()
  return profiler, summaries


def test_a_window_past_the_last_step_is_summarised_at_the_last_step(tmp_path):
  _, summaries = _profiled_run(tmp_path, 3, "profiler=xplane", "skip_first_n_steps_for_profiler=1", "profiler_steps=5")
  assert summaries[:2] == [None, None] and summaries[2]["steps"] == [1, 2]
  assert summaries[2]["device_ms_per_step"] > 0
  assert json.loads((tmp_path / "profile_summary.json").read_text())["steps"] == [1, 2]


def test_a_run_stopped_inside_the_window_still_writes_its_summary(tmp_path):
  _, summaries = _profiled_run(
    tmp_path, 10, "profiler=xplane", "skip_first_n_steps_for_profiler=1", "profiler_steps=5", stop_after=2
  )
  assert summaries == [None, None, None]
  assert json.loads((tmp_path / "profile_summary.json").read_text())["steps"] == [1, 2]


def test_a_window_after_the_last_step_is_said_up_front(tmp_path, capsys):
  profiler, summaries = _profiled_run(tmp_path, 2, "profiler=xplane", "skip_first_n_steps_for_profiler=2")
  assert capsys.readouterr().out.strip() == (
    "warning: profiler=xplane: skip_first_n_steps_for_profiler=2 is not "
    "before steps=2, so no step will be profiled; lower it"
  )
  assert summaries == [None, None] and not profiler.mode and not (tmp_path / "tensorboard").exists()


def test_nsys_without_a_working_cuda_runtime_is_one_line(tmp_path, capsys):
  """No libcudart: a user error before training. A libcudart whose cudaProfilerStart fails (no GPU, an old
  driver): one warning line and the run goes on unprofiled. A GPU with nsys: the capture range opens."""
  try:
    profiler, _ = _profiled_run(tmp_path, 3, "profiler=nsys", "skip_first_n_steps_for_profiler=1")
  except profiling.ProfilerError as e:
    assert str(e).startswith("profiler=nsys needs the CUDA runtime (libcudart.so), which is not on this machine")
    return
  out = capsys.readouterr().out.strip().splitlines()
  if profiler.mode:  # a GPU: started and stopped
    assert out == []
  else:
    assert len(out) == 1 and out[0].startswith("warning: profiler=nsys: cudaProfilerStart failed (cudaError ")
