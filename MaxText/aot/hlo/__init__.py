"""The optimized HLO text of a compiled GPU program as data, the one model of a compiled program that train_compile,
the roofline, the profiler hook and the tests read: its computations and instructions (text), how many times each
computation runs per step (while loops by their known trip counts), and every kernel the step launches with what it
is (kernels: a GEMM of which kind, attention, a collective, an elementwise / memory kernel), its FLOPs and the bytes
it moves, and the collectives' device groups and link bytes (collectives).

Pure text processing (no jax): `parse(text)` then `kernels(module)`. What a kernel is follows from XLA:GPU's own
naming: cuBLAS GEMMs are custom calls `__cublas$lt$matmul` / `__cublas$gemm` (`$f8` for FP8), cuDNN's block-scaled
GEMM is `__cudnn$blockScaledDot` (or a `__cudnn$fusion` around a scaled-dot), cuDNN attention `__cudnn$fmha*`,
Pallas kernels `__gpu$xla.gpu.triton`, Transformer Engine's its `te_*` FFI targets, XLA's own Triton GEMMs fusions of
kind `__triton_*gemm*`; a `dot` left in an ordinary fusion (or alone) is emitted by XLA as a loop, one thread per
output element (`naive_loop`: always a defect to report).
"""

from MaxText.aot.hlo.collectives import COLLECTIVES, collective_info, collective_opcode, replica_groups
from MaxText.aot.hlo.kernels import (
  CATEGORIES,
  GEMM_KINDS,
  GEMM_SCOPES,
  Kernel,
  attention_work,
  classify,
  fp8_gemm_scales,
  gemm_site,
  gemm_kind,
  kernel_bytes,
  kernel_traffic,
  kernels,
  quantizer_codes,
  summary,
)
from MaxText.aot.hlo import schedule
from MaxText.aot.hlo.text import (
  BITS,
  Array,
  Instruction,
  Module,
  arrays,
  executions,
  parse,
  split_type,
  trip_count,
  unknown_loops,
)

__all__ = [
  "BITS",
  "CATEGORIES",
  "COLLECTIVES",
  "GEMM_KINDS",
  "GEMM_SCOPES",
  "Array",
  "Instruction",
  "Kernel",
  "Module",
  "arrays",
  "attention_work",
  "classify",
  "collective_info",
  "collective_opcode",
  "executions",
  "fp8_gemm_scales",
  "gemm_site",
  "gemm_kind",
  "kernel_bytes",
  "kernel_traffic",
  "kernels",
  "quantizer_codes",
  "parse",
  "replica_groups",
  "schedule",
  "split_type",
  "summary",
  "trip_count",
  "unknown_loops",
]
