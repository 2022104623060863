"""The optimized-HLO reader: parsed as XLA's own parser parses it (computations, instructions, opcodes, operands), loops
counted by their trip counts, every kernel classified (GEMM kinds, naive loops, attention, collectives), the bytes a
kernel moves (sliced and in-place operands as XLA counts them) and collectives' groups in all three printed forms.

The module texts are in XLA's printed syntax; each is also parsed by XLA's parser (jaxlib's hlo_module_from_text, the
reference implementation of the format), so a test can't pass on text XLA would reject.
"""

import gzip
import math

import numpy as np
import pytest
from jax._src.lib import xla_client

from MaxText.aot import hlo
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "data" / "hlo"

# A scanned step's shape: a loop of 3 trips whose body slices one layer's weight out of a stacked [3, 64, 32] f32
# buffer, converts it, runs a cuBLAS GEMM, and writes a result into a stacked buffer in place; an FP8 GEMM, a
# block-scaled FP4 GEMM on cuDNN, a dot XLA left in a loop fusion, and a cuDNN attention call outside the loop.
LOOP = """HloModule test_loop, entry_computation_layout={(f32[3,64,32]{2,1,0}, bf16[16,64]{1,0}, f32[3,16,32]{2,1,0})->f32[3,16,32]{2,1,0}}

%fused_convert (param_0: f32[3,64,32], param_1: s32[]) -> bf16[64,32] {
  %param_0 = f32[3,64,32]{2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %constant_0 = s32[] constant(0)
  %dynamic-slice = f32[1,64,32]{2,1,0} dynamic-slice(%param_0, %param_1, %constant_0, %constant_0), dynamic_slice_sizes={1,64,32}
  %bitcast = f32[64,32]{1,0} bitcast(%dynamic-slice)
  ROOT %convert = bf16[64,32]{1,0} convert(%bitcast)
}

%fused_update (param_0.1: f32[3,16,32], param_1.1: bf16[16,32], param_2: s32[]) -> f32[3,16,32] {
  %param_0.1 = f32[3,16,32]{2,1,0} parameter(0)
  %param_1.1 = bf16[16,32]{1,0} parameter(1)
  %convert.1 = f32[16,32]{1,0} convert(%param_1.1)
  %bitcast.1 = f32[1,16,32]{2,1,0} bitcast(%convert.1)
  %param_2 = s32[] parameter(2)
  %constant_1 = s32[] constant(0)
  ROOT %dynamic-update-slice = f32[3,16,32]{2,1,0} dynamic-update-slice(%param_0.1, %bitcast.1, %param_2, %constant_1, %constant_1)
}

%fused_increment (param_0.2: s32[]) -> s32[] {
  %param_0.2 = s32[] parameter(0)
  %constant_2 = s32[] constant(1)
  ROOT %add = s32[] add(%param_0.2, %constant_2)
}

%body (arg: (s32[], f32[3,64,32], bf16[16,64], f32[3,16,32])) -> (s32[], f32[3,64,32], bf16[16,64], f32[3,16,32]) {
  %arg = (s32[], f32[3,64,32]{2,1,0}, bf16[16,64]{1,0}, f32[3,16,32]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %w = f32[3,64,32]{2,1,0} get-tuple-element(%arg), index=1
  %x = bf16[16,64]{1,0} get-tuple-element(%arg), index=2
  %acc = f32[3,16,32]{2,1,0} get-tuple-element(%arg), index=3
  %loop_convert_fusion = bf16[64,32]{1,0} fusion(%w, %i), kind=kLoop, calls=%fused_convert
  %custom-call = (bf16[16,32]{1,0}, s8[1024]{0}) custom-call(%x, %loop_convert_fusion), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/while/body/mlpwi_0/mk,kn->mn/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %gemm = bf16[16,32]{1,0} get-tuple-element(%custom-call), index=0
  %loop_update_fusion = f32[3,16,32]{2,1,0} fusion(%acc, %gemm, %i), kind=kLoop, calls=%fused_update
  %next = s32[] fusion(%i), kind=kLoop, calls=%fused_increment
  ROOT %tuple = (s32[], f32[3,64,32]{2,1,0}, bf16[16,64]{1,0}, f32[3,16,32]{2,1,0}) tuple(%next, %w, %x, %loop_update_fusion)
}

%condition (arg.1: (s32[], f32[3,64,32], bf16[16,64], f32[3,16,32])) -> pred[] {
  %arg.1 = (s32[], f32[3,64,32]{2,1,0}, bf16[16,64]{1,0}, f32[3,16,32]{2,1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%arg.1), index=0
  %constant_3 = s32[] constant(3)
  ROOT %compare = pred[] compare(%i.1, %constant_3), direction=LT
}

%fused_naive (param_0.3: f32[16,64], param_1.3: f32[64,32]) -> f32[16,32] {
  %param_0.3 = f32[16,64]{1,0} parameter(0)
  %param_1.3 = f32[64,32]{1,0} parameter(1)
  %dot = f32[16,32]{1,0} dot(%param_0.3, %param_1.3), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %negate = f32[16,32]{1,0} negate(%dot)
}

ENTRY %main (w.1: f32[3,64,32], x.1: bf16[16,64], acc.1: f32[3,16,32]) -> f32[3,16,32] {
  %w.1 = f32[3,64,32]{2,1,0} parameter(0)
  %x.1 = bf16[16,64]{1,0} parameter(1)
  %acc.1 = f32[3,16,32]{2,1,0} parameter(2)
  %constant_4 = s32[] constant(0)
  %tuple.1 = (s32[], f32[3,64,32]{2,1,0}, bf16[16,64]{1,0}, f32[3,16,32]{2,1,0}) tuple(%constant_4, %w.1, %x.1, %acc.1)
  %while = (s32[], f32[3,64,32]{2,1,0}, bf16[16,64]{1,0}, f32[3,16,32]{2,1,0}) while(%tuple.1), condition=%condition, body=%body, backend_config={"known_trip_count":{"n":"3"},"known_init_step":{"init":"0","step":"1"}}
  %a8 = f8e4m3fn[16,64]{1,0} convert(%x.1)
  %b8 = f8e4m3fn[32,64]{1,0} constant({...})
  %cublas-lt-matmul.f8 = (bf16[16,32]{1,0}, s8[1024]{0}) custom-call(%a8, %b8), custom_call_target="__cublas$lt$matmul$f8", metadata={op_name="jit(step)/transpose(jvp(mlpwo/mk,kn->mn))/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %a4 = f4e2m1fn[1,16,64]{2,1,0} constant({...})
  %b4 = f4e2m1fn[1,32,64]{2,1,0} constant({...})
  %sa = f8e4m3fn[1,16,4]{2,1,0} constant({...})
  %sb = f8e4m3fn[1,32,4]{2,1,0} constant({...})
  %block-scaled = (bf16[1,16,32]{2,1,0}, s8[1024]{0}) custom-call(%a4, %b4, %sa, %sb), custom_call_target="__cudnn$blockScaledDot", metadata={op_name="jit(step)/mlpwo/dot_general"}
  %xf = f32[16,64]{1,0} convert(%x.1)
  %wf = f32[64,32]{1,0} constant({...})
  %loop_naive_fusion = f32[16,32]{1,0} fusion(%xf, %wf), kind=kLoop, calls=%fused_naive
  %ia = s32[4,8]{1,0} constant({...})
  %ib = s32[8,2]{1,0} constant({...})
  %index-dot = s32[4,2]{1,0} dot(%ia, %ib), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %q = bf16[2,128,4,64]{3,2,1,0} constant({...})
  %k = bf16[2,128,2,64]{3,2,1,0} constant({...})
  %attention = (bf16[2,4,128,64]{3,1,2,0}, f32[2,4,128]{2,1,0}, u8[0]{0}) custom-call(%q, %k, %k), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config":{"intermediate_tensor_shape":{"element_type":"BF16","dimensions":["2","4","128","128"]},"mask_type":"CAUSAL"}}
  ROOT %result = f32[3,16,32]{2,1,0} get-tuple-element(%while), index=3
}
"""


def _xla_view(text):
  """{computation: [(instruction, opcode, operand names)]} as XLA's own parser reads `text`."""
  module = xla_client.hlo.hlo_module_from_text(text)
  out = {}
  for computation in module.computations():
    out[computation.name] = [
      (i.name, i.opcode.name, tuple(o.name for o in i.operands())) for i in computation.instructions()
    ]
  return out


def _our_view(module):
  return {c: [(i.name, i.opcode, i.operands) for i in instrs] for c, instrs in module.computations.items()}


# Where XLA's opcode enum (kAdd, kDynamicUpdateSlice, ...) isn't the text's name without dashes.
ENUM_NAMES = {
  "exponential": "kexp",
  "exponential-minus-one": "kexpm1",
  "log-plus-one": "klog1p",
  "sine": "ksin",
  "cosine": "kcos",
}


def _enum_name(opcode):
  return ENUM_NAMES.get(opcode, "k" + opcode.replace("-", ""))


def _same_instructions(text):
  ours = _our_view(hlo.parse(text))
  # XLA's parser turns the text's asynchronous sugar (reduce-scatter-start, ...) into async-start / async-done and
  # a computation it makes up (async_wrapped*): not in the text, so not in ours.
  xla = {c: instrs for c, instrs in _xla_view(text).items() if not c.startswith("async_wrapped")}
  assert set(ours) == set(xla)
  for computation, instructions in xla.items():
    spelled = {name: (opcode, operands) for name, opcode, operands in instructions}
    mine = {name: (opcode, operands) for name, opcode, operands in ours[computation]}
    assert set(mine) == set(spelled), computation
    for name, (opcode, operands) in mine.items():
      assert operands == spelled[name][1], (computation, name)
      sugar = {"-start": "kasyncstart", "-done": "kasyncdone"}
      expected = {_enum_name(opcode).lower()} | {v for k, v in sugar.items() if opcode.endswith(k)}
      assert spelled[name][0].lower() in expected, (computation, name, opcode, spelled[name][0])


def test_parses_as_xla_does():
  _same_instructions(LOOP)


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.hlo.gz")))
def test_parses_real_compiled_programs_as_xla_does(fixture):
  _same_instructions(gzip.decompress((FIXTURES / fixture).read_bytes()).decode("utf-8"))


def test_loops_count_their_trips():
  module = hlo.parse(LOOP)
  runs = hlo.executions(module)
  assert runs == {"main": 1, "body": 3, "condition": 4}
  by_name = {k.name: k for k in hlo.kernels(module)}
  assert by_name["custom-call"].count == 3 and by_name["loop_convert_fusion"].count == 3
  assert by_name["cublas-lt-matmul.f8"].count == 1
  assert "tuple" not in by_name and "while" not in by_name and "w" not in by_name  # no kernel launched


def test_gemm_kinds_and_flops():
  kernels = {k.name: k for k in hlo.kernels(hlo.parse(LOOP))}
  assert (kernels["custom-call"].category, kernels["custom-call"].kind) == ("gemm", "bf16")
  assert kernels["custom-call"].flops == 2 * 16 * 32 * 64
  assert kernels["cublas-lt-matmul.f8"].kind == "fp8"
  assert kernels["block-scaled"].kind == "fp4_block_scaled"
  assert kernels["block-scaled"].flops == 2 * 16 * 32 * 64
  assert kernels["loop_naive_fusion"].kind == "naive_loop"  # a dot in an ordinary fusion: one thread per output
  # Integer dots (index arithmetic) have no library GEMM to go to: not GEMMs of the model, not defects.
  assert (kernels["index-dot"].category, kernels["index-dot"].kind) == ("elementwise", "integer_dot")
  attention = kernels["attention"]
  assert attention.category == "attention"
  assert attention.flops == 4 * 2 * 4 * 128 * 128 * 64 / 2  # causal: half the scores
  assert attention.scores == 2 * 4 * 128 * 128 / 2
  summary = hlo.summary(hlo.kernels(hlo.parse(LOOP)))
  assert summary["gemms"] == {"bf16": 3, "fp8": 1, "fp4_block_scaled": 1, "naive_loop": 1}
  assert summary["gemm_sites"]["gate"] == {"bf16": 3}
  assert summary["gemm_sites"]["down"] == {"fp8": 1, "fp4_block_scaled": 1}


def test_bytes_of_sliced_and_in_place_operands():
  kernels = {k.name: k for k in hlo.kernels(hlo.parse(LOOP))}
  # The convert reads one layer's slice of the stacked f32 weight (64 x 32 x 4 bytes), not the whole [3, 64, 32],
  # and the loop index; it writes bf16 [64, 32].
  assert kernels["loop_convert_fusion"].bytes == 64 * 32 * 4 + 4 + 64 * 32 * 2
  # The in-place update reads the bf16 GEMM output and the index and writes one f32 [16, 32] slice; the stacked
  # buffer it updates is neither read nor written whole.
  assert kernels["loop_update_fusion"].bytes == 16 * 32 * 2 + 4 + 16 * 32 * 4
  # A library call reads its operands and writes its results (the workspace included).
  assert kernels["custom-call"].bytes == 16 * 64 * 2 + 64 * 32 * 2 + 16 * 32 * 2 + 1024


COLLECTIVES = """HloModule test_collectives, entry_computation_layout={(f32[64,32]{1,0})->f32[64,32]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

ENTRY %main (p: f32[64,32]) -> f32[64,32] {
  %p = f32[64,32]{1,0} parameter(0)
  %all-reduce-start = f32[64,32]{1,0} all-reduce-start(%p), channel_id=1, replica_groups=[2,4]<=[8], use_global_device_ids=true, to_apply=%add
  %all-reduce-done = f32[64,32]{1,0} all-reduce-done(%all-reduce-start)
  %all-gather-start = (f32[64,32]{1,0}, f32[256,32]{1,0}) all-gather-start(%all-reduce-done), channel_id=2, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true
  %all-gather-done = f32[256,32]{1,0} all-gather-done(%all-gather-start)
  %reduce-scatter = f32[128,32]{1,0} reduce-scatter(%all-gather-done), channel_id=3, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}, use_global_device_ids=true, to_apply=%add
  %collective-permute-start = (f32[128,32]{1,0}, f32[128,32]{1,0}) collective-permute-start(%reduce-scatter), channel_id=4, source_target_pairs={{0,1},{1,0},{2,2}}
  %collective-permute-done = f32[128,32]{1,0} collective-permute-done(%collective-permute-start)
  ROOT %slice = f32[64,32]{1,0} slice(%collective-permute-done), slice={[0:64], [0:32]}
}
"""


def test_collectives_bytes_and_groups():
  _same_instructions(COLLECTIVES)
  module = hlo.parse(COLLECTIVES)
  kernels = {k.name: k for k in hlo.kernels(module, num_devices=8, devices_per_domain=4)}
  size = 64 * 32 * 4
  reduce = kernels["all-reduce-start"].collective
  assert reduce["kind"] == "all-reduce" and reduce["group_size"] == 4 and reduce["data_bytes"] == size
  # groups {0..3}, {4..7}: one NVLink domain each; a ring all-reduce sends 2 (n-1)/n of the data
  assert reduce["domains"] == 1 and reduce["nvlink_bytes"] == size * 2 * 3 / 4 and reduce["network_bytes"] == 0
  gather = kernels["all-gather-start"].collective
  # groups {0,2,4,6}, {1,3,5,7}: 2 devices in each domain; of the 4-shard output, one shard comes over the network
  # (from the peer in the other domain), two over NVLink (the other's and, relayed, the peer's peer's)
  assert gather["data_bytes"] == 4 * size and gather["domains"] == 2
  assert gather["network_bytes"] == size and gather["nvlink_bytes"] == 2 * size
  scatter = kernels["reduce-scatter"].collective
  assert scatter["group_size"] == 2 and scatter["data_bytes"] == 4 * size and scatter["nvlink_bytes"] == 2 * size
  permute = kernels["collective-permute-start"].collective  # {0,1}, {1,0}: inside domain 0; {2,2}: no transfer
  assert permute["data_bytes"] == 2 * size and permute["nvlink_bytes"] == 2 * size and permute["network_bytes"] == 0
  assert "all-reduce-done" not in kernels and "all-gather-done" not in kernels
  assert hlo.summary(kernels.values())["collectives"] == {
    "all-reduce": size,
    "all-gather": 4 * size,
    "reduce-scatter": 4 * size,
    "collective-permute": 2 * size,
  }


def _numpy_groups(shape, reshape, perm):
  return np.arange(math.prod(reshape)).reshape(reshape).transpose(perm).reshape(shape).tolist()


@pytest.mark.parametrize(
  "text, expected",
  [
    ("replica_groups=[2,4]<=[8]", _numpy_groups((2, 4), (8,), (0,))),
    ("replica_groups=[2,4]<=[4,2]T(1,0)", _numpy_groups((2, 4), (4, 2), (1, 0))),
    ("replica_groups=[4,2]<=[2,2,2]T(2,0,1)", _numpy_groups((4, 2), (2, 2, 2), (2, 0, 1))),
    # over mesh axis 'a' (size 4) of a ['a'=4, 'b'=2] mesh: one group per index of b
    ("replica_groups=mesh['a'=4,'b'=2] {'a'}", _numpy_groups((2, 4), (4, 2), (1, 0))),
    ("replica_groups=mesh['a'=2,'b'=2,'c'=2] {'a','c'}", _numpy_groups((2, 4), (2, 2, 2), (1, 0, 2))),
    ("replica_groups={{0,3},{1,2}}", [[0, 3], [1, 2]]),
    ("replica_groups={}", [list(range(8))]),
  ],
)
def test_replica_group_forms(text, expected):
  instr = hlo.Instruction("ar", "all-reduce", (), (), text, "main")
  assert hlo.replica_groups(instr, 8) == expected


def test_gemm_sites():
  assert hlo.gemm_site("jit(step_fn)/while/body/closed_call/checkpoint/mlpwo/transpose(jvp(mk,kn->mn))/dot") == "down"
  assert hlo.gemm_site("jit(step_fn)/transpose(jvp(transpose(jvp(bld,dv->blv))))/dot_general") == "lm_head"
  assert hlo.gemm_site("jit(step_fn)/while/body/closed_call/key_proj/mk,kn->mn/dot_general") == "k"
  assert hlo.gemm_site("jit(step_fn)/transpose(jvp(blkgd,bskd->bkgls))/dot_general") == "attention"
  assert hlo.gemm_site("jit(step_fn)/something/else") == "other"


@pytest.mark.parametrize(
  "fixture, overrides, kinds",
  [
    ("llama3_tiny_h100-8_bf16", ["ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"], {"bf16"}),
    ("llama3_tiny_h100-1_te_fp8", ["quantization=te_fp8_currentscaling"], {"bf16", "te"}),
  ],
)
def test_real_programs_gemm_flops_are_maxtexts_count(fixture, overrides, kinds):
  """Every GEMM of a compiled step, its loops counted by their trip counts, sums to MaxText's training FLOPs per
  device (plus the masked half of causal attention that XLA's attention computes); TE's GEMMs are the MLP's."""
  from MaxText import config  # pylint: disable=import-outside-toplevel
  from MaxText.model import accounting  # pylint: disable=import-outside-toplevel

  text = gzip.decompress((FIXTURES / f"{fixture}.hlo.gz").read_bytes()).decode("utf-8")
  summary = hlo.summary(hlo.kernels(hlo.parse(text), num_devices=8, devices_per_domain=8))
  flops = accounting.training_flops_per_device(
    config.load(REPO / "configs" / "llama3_tiny.yml", ["dataset_type=synthetic", *overrides])
  )
  assert set(summary["gemms"]) == kinds
  assert sum(summary["gemm_flops"].values()) == pytest.approx(flops.total + flops.attention_core, rel=1e-9)
  if "te" in kinds:
    assert summary["gemm_flops"]["te"] == pytest.approx(flops.mlp, rel=1e-9)
    assert set(summary["gemm_sites"]["gate"]) == {"te"}
  else:  # fsdp 4 x tensor 2: weights gathered, gradients reduced and scattered
    assert {"all-gather", "reduce-scatter", "all-reduce"} <= set(summary["collectives"])


# Three FP8 GEMMs as XLA's GEMM rewriter leaves them: a scale read in f32, one read through a bf16 round trip, and one
# with an epilogue's C matrix (bf16, added in) before its two scales.
FP8_SCALES = """HloModule test_fp8_scales, entry_computation_layout={(f8e4m3fn[16,64]{1,0}, f8e4m3fn[32,64]{1,0}, f32[1]{0}, bf16[16,32]{1,0})->(bf16[16,32]{1,0}, bf16[16,32]{1,0}, bf16[16,32]{1,0})}

%fused_round_trip (param_0: f32[1]) -> f32[] {
  %param_0 = f32[1]{0} parameter(0)
  %convert = bf16[1]{0} convert(%param_0)
  %bitcast = bf16[] bitcast(%convert)
  ROOT %convert.1 = f32[] convert(%bitcast)
}

%fused_product (param_0.1: f32[1]) -> f32[] {
  %param_0.1 = f32[1]{0} parameter(0)
  %multiply = f32[1]{0} multiply(%param_0.1, %param_0.1)
  ROOT %bitcast.1 = f32[] bitcast(%multiply)
}

ENTRY %main (a: f8e4m3fn[16,64], b: f8e4m3fn[32,64], s: f32[1], c: bf16[16,32]) -> (bf16[16,32], bf16[16,32], bf16[16,32]) {
  %a = f8e4m3fn[16,64]{1,0} parameter(0)
  %b = f8e4m3fn[32,64]{1,0} parameter(1)
  %s = f32[1]{0} parameter(2)
  %c = bf16[16,32]{1,0} parameter(3)
  %one = f32[] constant(1)
  %scale = f32[] bitcast(%s)
  %gemm.0 = (bf16[16,32]{1,0}, s8[1024]{0}) custom-call(%a, %b, %scale, %one), custom_call_target="__cublas$lt$matmul$f8"
  %rounded = f32[] fusion(%s), kind=kLoop, calls=%fused_round_trip
  %gemm.1 = (bf16[16,32]{1,0}, s8[1024]{0}) custom-call(%a, %b, %rounded, %one), custom_call_target="__cublas$lt$matmul$f8"
  %product = f32[] fusion(%s), kind=kLoop, calls=%fused_product
  %gemm.2 = (bf16[16,32]{1,0}, s8[1024]{0}) custom-call(%a, %b, %c, %product, %one), custom_call_target="__cublas$lt$matmul$f8"
  %y.0 = bf16[16,32]{1,0} get-tuple-element(%gemm.0), index=0
  %y.1 = bf16[16,32]{1,0} get-tuple-element(%gemm.1), index=0
  %y.2 = bf16[16,32]{1,0} get-tuple-element(%gemm.2), index=0
  ROOT %tuple = (bf16[16,32]{1,0}, bf16[16,32]{1,0}, bf16[16,32]{1,0}) tuple(%y.0, %y.1, %y.2)
}
"""


def test_fp8_gemm_scales_tell_an_f32_scale_from_a_rounded_one():
  _same_instructions(FP8_SCALES)
  scales = hlo.fp8_gemm_scales(hlo.parse(FP8_SCALES))
  # gemm.0: f32 and 1; gemm.1: through bf16, and 1; gemm.2: the C matrix skipped, an f32 product, and 1.
  assert scales == {"f32": 2, "bf16": 1, "constant": 3}
