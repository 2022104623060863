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

# Light imports only: jax and the trainer load in the functions below, after main's first line took the stop signals
# (cli.run), so a Ctrl-C while they load is one line too.
from MaxText import cli, config as config_lib, storage  # noqa: E402
from MaxText.aot import targets  # noqa: E402
from MaxText.config import hardware  # noqa: E402
from MaxText.errors import UserError  # noqa: E402
from MaxText.runtime import environment, preemption  # noqa: E402

# The most GPUs a target may have (compile_topology x compile_topology_num_slices): the largest clusters built have
# about 10^5; XLA's compile-only topology is a list of devices, and a count past what the host can hold fails natively.
MAX_TARGET_GPUS = 1 << 17
OUTPUTS = {"compile_report": "report.json", "compile_hlo": "step.hlo"}  # key: an example file name


def compile_and_report(cfg):
  """(the CompiledStep, its report) of `cfg` for its compile_topology; UserError for a config the target can't run."""
  from MaxText import precision  # pylint: disable=import-outside-toplevel
  from MaxText.trainer import aot_step, preflight  # pylint: disable=import-outside-toplevel

  target = parse_target(cfg)
  hw = aot_step.gpu_hardware(target.gpu, target.name)
  cfg, auto = preflight.resolve_auto(cfg, hw, target.num_devices, target.hosts)
  if auto:
    print(hardware.describe(auto), flush=True)
  plan = precision.plan_from_config(cfg)
  preflight.sharding_plan(cfg, plan, target.num_devices, target.hosts)
  step = aot_step.compile_for_target(cfg, target)
  rep = aot_step.report(step, cfg)
  rep["auto"] = {key: {"value": value, "why": why} for key, (value, why) in auto.items()}
  return step, rep


def parse_target(cfg):
  """The compile_topology's Target, of at most MAX_TARGET_GPUS GPUs; UserError naming the key otherwise."""
  if not cfg.compile_topology:
    raise UserError("compile_topology is required: the GPU target to compile for, e.g. compile_topology=h100-8")
  target = targets.parse(cfg.compile_topology, cfg.compile_topology_num_slices)
  if target.num_devices > MAX_TARGET_GPUS:
    raise UserError(
      f"compile_topology={cfg.compile_topology} compile_topology_num_slices={cfg.compile_topology_num_slices} is "
      f"{target.num_devices} GPUs; train_compile compiles for at most {MAX_TARGET_GPUS} (the largest clusters hold "
      "about 10^5): lower compile_topology_num_slices"
    )
  return target


def check_outputs(cfg):
  """compile_report and compile_hlo can be written where they point: said before the minutes of compiling."""
  for key, example in OUTPUTS.items():
    if getattr(cfg, key):
      storage.check_output_file(getattr(cfg, key), key, example)


def recorded_command(argv):
  """The command a report records: what was compiled, without where its outputs went (compile_report=,
  compile_hlo=: paths of the machine that wrote them, which would make the same setup read as a different one)."""
  outputs = ("compile_report=", "compile_hlo=")
  return ["python", "-m", "MaxText.train_compile", *(a for a in argv if not a.startswith(outputs))]


def _compile(argv):
  cfg = config_lib.load(*config_lib.split_argv(argv))
  parse_target(cfg)
  check_outputs(cfg)
  from MaxText.precision import backend_error_for_key  # pylint: disable=import-outside-toplevel
  from MaxText.quantization.errors import BackendError  # pylint: disable=import-outside-toplevel
  from MaxText.trainer import aot_step, preflight  # pylint: disable=import-outside-toplevel

  environment.start_backend()
  print(f"train_compile: {preflight.model_line(cfg)} for {cfg.compile_topology or '?'} ...", flush=True)
  try:
    step, rep = compile_and_report(cfg)
  except BackendError as e:
    raise backend_error_for_key(cfg, e) from None
  rep["command"] = recorded_command(argv)
  print(aot_step.format_report(rep))
  with preemption.deferred():  # both files or, on a stop signal, neither
    if cfg.compile_report:
      storage.write_file(cfg.compile_report, json.dumps(rep, indent=1) + "\n")
      print(f"report: {cfg.compile_report}")
    if cfg.compile_hlo:
      storage.write_file(cfg.compile_hlo, step.hlo_text)
      print(f"optimized HLO: {cfg.compile_hlo}")
  if not step.fits:
    raise UserError(aot_step.refusal(rep))
  return 0


def main(argv=None):
  return cli.run(__doc__, argv, _compile, stopped="stopped before compile_report and compile_hlo were written")


if __name__ == "__main__":
  sys.exit(main())
