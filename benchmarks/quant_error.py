"""Quantization error per GEMM operand on a real training step, one table for several NVFP4 variants (e.g. plain
vs Four Over Six), from the trainer's own telemetry (quantization_stats_period=1).

    python benchmarks/quant_error.py --config configs/llama3_tiny.yml \\
        --modes te_nvfp4,te_nvfp4:nvfp4_4over6=all,te_nvfp4:nvfp4_4over6=all:nvfp4_4over6_err_mode=mae \\
        --steps 1 [load_parameters_path=RUN_DIR/checkpoints/STEP] [key=value ...]

Every mode trains `--steps` steps from the same parameters (load_parameters_path: a trained checkpoint; without
it, the seed's initialisation) on the same batches. Per GEMM (gate, up, down) and operand role (x, w, dy and the
wgrad/dgrad views w_t, x_t, dy_t) the table gives the relative quantization error ||dequant(q) - x|| / ||x||
(mean over the layers and steps; x after the RHT where the recipe applies one), and for every mode after the
first its relative MSE as a change from the first mode's: (err / err_first)**2 - 1. The operands are each mode's
own: identical at the first GEMM of the first step, then as far apart as the modes' forward passes make them.
"""

import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import modes as modes_lib  # noqa: E402
from MaxText import config  # noqa: E402
from MaxText.runtime import preemption  # noqa: E402
from MaxText.quantization.recipes import ROLES  # noqa: E402

DEFAULT_MODES = ["te_nvfp4", "te_nvfp4:nvfp4_4over6=all", "te_nvfp4:nvfp4_4over6=all:nvfp4_4over6_err_mode=mae"]
GEMMS = ("gate", "up", "down")


def measure(config_path, overrides, modes, steps, out_dir):
  """{mode: {(gemm, role): mean relative error over the steps}} for every mode."""
  configs = modes_lib.load_configs(
    config_path,
    list(overrides)
    + [
      f"steps={steps}",
      "quantization_stats_period=1",
      f"base_output_directory={out_dir}",
      "enable_checkpointing=false",
      "eval_interval=0",
      "enable_tensorboard=false",
    ],
    modes,
  )
  errors = {}
  for mode, (label, cfg) in zip(modes, configs):
    records = list(modes_lib.train_fresh(out_dir, mode, label, cfg).values())
    keys = {(g, r): f"quant/{g}/{r}/rel_err" for g in GEMMS for r in ROLES}
    errors[label] = {
      k: float(np.mean([rec[name] for rec in records]))
      for k, name in keys.items()
      if all(name in rec for rec in records)
    }
    if not errors[label]:
      modes_lib.fail(f"mode {label}: no MLP GEMM is quantized, so there is no quantization error to report")
  return errors


def markdown(errors):
  """One row per (gemm, role): each mode's relative error, then each later mode's MSE change vs the first."""
  labels = list(errors)
  first, rest = labels[0], labels[1:]
  lines = [
    "| GEMM | operand | "
    + " | ".join(f"{m} rel. err" for m in labels)
    + " | "
    + " | ".join(f"{m}: MSE vs {first}" for m in rest)
    + " |",
    "|---|---|" + "---:|" * (len(labels) + len(rest)),
  ]
  for key in errors[first]:
    values = [errors[m].get(key, float("nan")) for m in labels]
    changes = [(v / values[0]) ** 2 - 1 if values[0] > 0 else float("nan") for v in values[1:]]
    lines.append(
      f"| {key[0]} | {key[1]} | "
      + " | ".join(f"{v:.4f}" for v in values)
      + " | "
      + " | ".join(f"{c:+.1%}" for c in changes)
      + " |"
    )
  return "\n".join(lines)


def main(argv=None):
  parser = modes_lib.argument_parser(__doc__, DEFAULT_MODES, default_steps=1)
  parser.add_argument(
    "--out", type=config.absolute_path, default="", help="run directories (default: a temporary directory)"
  )
  args, overrides = parser.parse_known_args(argv)
  if args.steps <= 0:
    modes_lib.fail("--steps must be > 0")
  with tempfile.TemporaryDirectory() as tmp, preemption.installed():  # SIGTERM / Ctrl-C: a clean stop
    errors = measure(args.config, overrides, args.modes, args.steps, args.out or tmp)
  info = modes_lib.machine()
  print(
    f"\nquantization error: {modes_lib.described(args.config, overrides)} ({args.steps} step(s) per mode; "
    f"commit {info['commit']}, {info['device']})\n"
  )
  print(markdown(errors))
  return 0


if __name__ == "__main__":
  sys.exit(main())
