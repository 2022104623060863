"""The compiler's dump read back per HLO instruction: its kernel's PTX entry and launch, from the thunk sequence and
its metadata."""

from MaxText.aot import dump
from tests.aot.test_ptx import PTX

SEQUENCE = "\n".join(
  [
    "001: kCustomKernel   [source        | next=003 (2)] input_reduce_fusion grid: [64, 1, 1] threads: [256, 1, 1]"
    "  shared_memory: 0 bytes",
    "002: kWhile          [prev=001 (1)  | next=003 (1) ]",
    "    003: kCustomKernel       [prev=002 (1)  | next=004 (1) ] quantize_x grid: [32, 2, 1] threads: [128, 1, 1]"
    "  shared_memory: 2048 bytes",
    "    004: kCublasLtMatmul     [prev=003 (1)  | next=005 (1) ] kCublasLtMatmul",
  ]
)
METADATA = """thunk_metadata {
  thunk_info {
    profile_annotation: "input_reduce_fusion"
    thunk_id: 1
  }
  thunk_kind: "kCustomKernel"
}
thunk_metadata {
  thunk_info {
    profile_annotation: "pallas_call.7"
    thunk_id: 3
  }
  thunk_kind: "kCustomKernel"
}
thunk_metadata {
  thunk_info {
    profile_annotation: "custom-call.2"
    thunk_id: 4
  }
  thunk_kind: "kCublasLtMatmul"
}
"""


def _dump(directory, prefix="module_0001.jit_step_fn"):
  (directory / f"{prefix}.thunk_sequence.txt").write_text(SEQUENCE)
  (directory / f"{prefix}.thunk_metadata.txt").write_text(METADATA)
  (directory / f"{prefix}.3.ptx").write_text(PTX)
  (directory / "module_0000.jit_convert.thunk_sequence.txt").write_text("")  # a smaller module: not the step


def test_each_hlo_instruction_gets_its_kernels_launch_and_code(tmp_path):
  _dump(tmp_path)
  code = dump.read(tmp_path)
  assert set(code) == {"input_reduce_fusion", "pallas_call.7"}  # the cuBLAS call has no kernel of ours
  pallas = code["pallas_call.7"]
  assert pallas.launch == dump.Launch("quantize_x", 64, 128, 2048)
  assert pallas.entry.name == "quantize_x" and pallas.entry.target == "sm_100a"
  assert code["input_reduce_fusion"].launch.blocks == 64 and code["input_reduce_fusion"].entry.loops


def test_a_directory_without_a_dump_reads_as_nothing(tmp_path):
  assert dump.read(tmp_path) == {}
