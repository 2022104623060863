"""Compile the trainer's own train step for an NVIDIA GPU target, on any machine (a CPU is enough): its memory, its
kernels and an estimate of its speed, before any GPU is used (MaxText's train_compile.py, for GPUs).

    python -m MaxText.train_compile [CONFIG.yml] compile_topology=NAME [compile_topology_num_slices=S]
        [compile_report=FILE.json] [compile_hlo=FILE.hlo] [key=value ...]
    make train-compile ARGS="..."        (sets up what it needs the first time: .venv-te, with jax's CUDA plugin)

compile_topology: h100-N, h200-N, b200-N, gb200-N, b300-N, gb300-N (N GPUs in one NVLink domain) or a3 (= h100-8);
compile_topology_num_slices=S: S such domains (hosts, for HGX), their processes split by the dcn_* axes. Prints the
compiled step's memory per device, its GEMMs by kind (bf16, fp8, fp4_block_scaled, mxfp8_block_scaled, te, triton,
naive_loop), its collectives, an estimate of its time as scheduled (collectives exposed and hidden behind compute, a
range beside the point; constants fitted on one H100, the targets' published rates: a compiled estimate, never a
measurement) and each quantizer kernel's instructions and bytes per element from the PTX compiled for the target;
writes them as JSON to compile_report and the optimized HLO to compile_hlo. A step over the target's
memory is one line on stderr and exit code 2 (the report is still written).
"""

import json
import os
import sys

# On a machine without an NVIDIA GPU, jax's CUDA plugin would look for one when jax starts: CPU is jax's platform
# there (the target's devices are compile-only, made by the plugin either way). Before anything imports jax.
if "JAX_PLATFORMS" not in os.environ and not os.path.exists("/dev/nvidiactl"):
  os.environ["JAX_PLATFORMS"] = "cpu"

from MaxText import cli, config as config_lib, precision, storage  # noqa: E402
from MaxText.aot import targets  # noqa: E402
from MaxText.errors import UserError  # noqa: E402
from MaxText.trainer import aot_step, preflight  # noqa: E402


def compile_and_report(cfg):
  """(the CompiledStep, its report) of `cfg` for its compile_topology; UserError for a config the target can't run."""
  if not cfg.compile_topology:
    raise UserError("compile_topology is required: the GPU target to compile for, e.g. compile_topology=h100-8")
  target = targets.parse(cfg.compile_topology, cfg.compile_topology_num_slices)
  plan = precision.plan_from_config(cfg)
  preflight.sharding_plan(cfg, plan, target.num_devices, target.hosts)
  step = aot_step.compile_for_target(cfg, target)
  return step, aot_step.report(step, cfg)


def _compile(argv):
  cfg = config_lib.load(*config_lib.split_argv(argv))
  print(f"train_compile: {preflight.model_line(cfg)} for {cfg.compile_topology or '?'} ...", flush=True)
  step, rep = compile_and_report(cfg)
  rep["command"] = ["python", "-m", "MaxText.train_compile", *argv]
  print(aot_step.format_report(rep))
  if cfg.compile_report:
    storage.write_text(cfg.compile_report, json.dumps(rep, indent=1) + "\n")
    print(f"report: {cfg.compile_report}")
  if cfg.compile_hlo:
    storage.write_text(cfg.compile_hlo, step.hlo_text)
    print(f"optimized HLO: {cfg.compile_hlo}")
  if not step.fits:
    raise UserError(aot_step.refusal(rep))
  return 0


def main(argv=None):
  return cli.run(__doc__, argv, _compile)


if __name__ == "__main__":
  sys.exit(main())
