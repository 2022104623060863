"""The profile summary's categories: what an optimized-HLO op is, for GPU-style ops too (no GPU needed)."""

from MaxText import profiling

# Shaped like XLA's optimized GPU HLO: cuBLAS and cuBLASLt FP8 GEMM custom calls, a Triton GEMM fusion,
# cuDNN attention, a collective, a transpose-only fusion and a quantizer's elementwise fusion.
GPU_HLO = """
HloModule jit_step_fn, entry_computation_layout={()->()}

%triton_gemm_dot.7 (p0: bf16[128,64], p1: bf16[64,32]) -> bf16[128,32] {
  %p0 = bf16[128,64]{1,0} parameter(0)
  %p1 = bf16[64,32]{1,0} parameter(1)
  ROOT %dot.1 = bf16[128,32]{1,0} dot(bf16[128,64]{1,0} %p0, bf16[64,32]{1,0} %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
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
  %gemm_fusion_dot.7 = bf16[128,32]{1,0} fusion(bf16[128,64]{1,0} %a, bf16[64,32]{1,0} %b), kind=kCustom, calls=%triton_gemm_dot.7
  %custom-call.5 = (bf16[1,128,4,64]{3,2,1,0}, u8[0]{0}) custom-call(bf16[1,128,4,64]{3,2,1,0} %q, bf16[1,128,4,64]{3,2,1,0} %k), custom_call_target="__cudnn$fmhaSoftmax"
  %all-reduce-start.1 = f32[128,32]{1,0} all-reduce-start(f32[128,32]{1,0} %y), replica_groups={}, to_apply=%add
  %transpose_fusion = bf16[128,64]{1,0} fusion(bf16[64,128]{1,0} %t), kind=kLoop, calls=%fused_transpose
  %loop_convert_fusion = bf16[128,64]{1,0} fusion(f32[128,64]{1,0} %f), kind=kLoop, calls=%fused_quantize
  ROOT %while.4 = (s32[]) while((s32[]) %init), condition=%cond, body=%body
}
"""


def test_gpu_ops_are_classified_by_what_they_compute():
  instructions, computations = profiling.parse_hlo(GPU_HLO)
  expected = {"custom-call.12": "gemm bf16", "cublas-lt-matmul.3": "gemm f8", "gemm_fusion_dot.7": "gemm bf16",
              "custom-call.5": "attention", "all-reduce-start.1": "collective", "transpose_fusion": "copy/transpose",
              "loop_convert_fusion": "quantization/elementwise", "while.4": "container"}
  assert {op: profiling.classify(op, instructions, computations) for op in expected} == expected
  assert profiling.classify("not-an-op", instructions, computations) is None
