"""The XLA flags for NVIDIA GPUs, from JAX-Toolbox's MaxText recipes: one list, used by Slurm jobs, benchmarks and
train_compile (as per-compilation options, `compiler_options`).

    python3 scripts/xla_flags.py TOTAL_GPUS      # prints them (no jax needed), as train.sbatch does

Compute: the latency-hiding scheduler, cuBLAS rather than Triton for GEMMs, no CUDA-graph command
buffers (they hide kernels from the profiler and fight the scheduler), XLA's rematerialization pass
off (the remat policy decides). Collectives: pipelined and combined all-gather / reduce-scatter /
all-reduce with combine thresholds scaled by the job size, double-buffered while loops.

Attention: the recipes set no XLA flag for it (their cuDNN attention comes through Transformer Engine,
NVTE_FUSED_ATTN=1), and none applies here: jax's cuDNN attention (attention=cudnn_flash) is an explicit
custom call that XLA passes through (xla_gpu_enable_cudnn_fmha only governs XLA's own pattern-matching of
attention into cuDNN, off by default). What the kernel costs is decided by what it is given: a causal mask
type and no mask tensor for unpacked rows (MaxText/model/attention.py).
"""

import os
import sys

COMPUTE = (
  "--xla_gpu_enable_latency_hiding_scheduler=true",
  "--xla_gpu_enable_triton_gemm=false",
  "--xla_gpu_enable_command_buffer=",
  "--xla_gpu_enable_highest_priority_async_stream=true",
  "--xla_disable_hlo_passes=rematerialization",
)
COMBINE_BYTES = 1 << 30


def collective_flags(total_gpus):
  return (
    f"--xla_gpu_all_reduce_combine_threshold_bytes={COMBINE_BYTES}",
    f"--xla_gpu_all_gather_combine_threshold_bytes={COMBINE_BYTES // total_gpus}",
    f"--xla_gpu_reduce_scatter_combine_threshold_bytes={COMBINE_BYTES // (total_gpus * 2)}",
    "--xla_gpu_enable_pipelined_all_gather=true",
    "--xla_gpu_enable_pipelined_reduce_scatter=true",
    "--xla_gpu_enable_pipelined_all_reduce=true",
    "--xla_gpu_enable_while_loop_double_buffering=true",
    "--xla_gpu_enable_all_gather_combine_by_dim=false",
    "--xla_gpu_enable_reduce_scatter_combine_by_dim=false",
  )


def gpu_flags(total_gpus=1):
  """Every flag for a job on `total_gpus` GPUs (collective flags only when there is more than one)."""
  return COMPUTE + (collective_flags(total_gpus) if total_gpus > 1 else ())


def with_gpu_flags(xla_flags, total_gpus=1):
  """`xla_flags` (e.g. $XLA_FLAGS) with ours in front: a flag the caller already sets is left as theirs."""
  own = {f.split("=", 1)[0] for f in (xla_flags or "").split()}
  ours = [f for f in gpu_flags(total_gpus) if f.split("=", 1)[0] not in own]
  return " ".join(ours + ([xla_flags] if xla_flags else []))


def apply_if_gpu(total_gpus=1, environ=os.environ):
  """Set XLA_FLAGS for a GPU run before jax starts its backend; on a machine without an NVIDIA GPU, nothing."""
  if os.path.exists("/dev/nvidiactl") or environ.get("CUDA_VISIBLE_DEVICES"):
    environ["XLA_FLAGS"] = with_gpu_flags(environ.get("XLA_FLAGS", ""), total_gpus)
    return True
  return False


def compiler_options(total_gpus=1, xla_flags=None):
  """Our flags as jax's per-compilation `compiler_options` ({name: value}), leaving out those `xla_flags` (default
  $XLA_FLAGS, which jax reads at its start) sets: what a job on `total_gpus` GPUs compiles with."""
  xla_flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
  theirs = {f.split("=", 1)[0] for f in xla_flags.split()}
  options = {}
  for flag in gpu_flags(total_gpus):
    name, _, value = flag.partition("=")
    if name in theirs:
      continue
    options[name.lstrip("-")] = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
  return options


def main(argv):
  """python3 scripts/xla_flags.py [TOTAL_GPUS]: the flags on one line (no jax needed)."""
  if argv[:1] in (["-h"], ["--help"]):
    print(__doc__.strip())
    return 0
  if len(argv) > 1 or (argv and not (argv[0].isdigit() and int(argv[0]) >= 1)):
    print(
      f"error: expected one argument, the job's total GPU count (an integer >= 1), got {' '.join(argv)!r}",
      file=sys.stderr,
    )
    return 2
  print(" ".join(gpu_flags(int(argv[0]) if argv else 1)))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
