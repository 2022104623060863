"""Throughput of quantization modes on one config, measured in one process: median step time after warm-up,
TFLOP/s/device, Tokens/s/device and the speed ratio to the first mode (the baseline).

    python benchmarks/throughput.py --config configs/llama3_tiny.yml --modes bf16,te_fp8_currentscaling,te_nvfp4 \\
        --steps 30 --warmup 5 [--json out.json] [key=value ...]

Each mode trains `warmup + steps` steps through the real trainer (same data, seed and config); the
first `warmup` steps (compilation) are dropped. Ratio = baseline median step time / mode's (> 1 = faster).
MFU is against the GPU's dense BF16 peak where the device is a known NVIDIA GPU.
"""

import json
import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from benchmarks import modes as modes_lib  # noqa: E402
from MaxText import accounting, config  # noqa: E402

DEFAULT_MODES = ["bf16", "te_fp8_currentscaling", "te_nvfp4"]


def measure(config_path, overrides, modes, steps, warmup, out_dir):
  """One row per mode: {mode, median_s, tflops_per_device, tokens_per_device, ratio, mfu, final_loss}."""
  rows = []
  peak = modes_lib.peak_tflops(jax.devices()[0].device_kind)
  for mode in modes:
    label, cfg = modes_lib.load_config(config_path, list(overrides) + [
        f"steps={warmup + steps}", f"base_output_directory={out_dir}", f"run_name={modes_lib.run_dir_name(mode)}",
        "enable_checkpointing=false", "eval_interval=0", "enable_tensorboard=false"], mode)
    modes_lib.train_mode(cfg)
    records = modes_lib.read_metrics(pathlib.Path(out_dir) / modes_lib.run_dir_name(mode))
    seconds = [records[s]["seconds"] for s in range(warmup, warmup + steps)]
    median = float(np.median(seconds))
    run_shape = config.RunShape.of(cfg, jax.device_count())
    tokens_per_device = run_shape.tokens_per_step / run_shape.num_devices
    tflops = accounting.training_flops_per_device(cfg).tflops / median
    rows.append({"mode": label, "median_s": median, "tflops_per_device": tflops,
                 "tokens_per_device": tokens_per_device / median,
                 "mfu": tflops / peak if peak else None, "final_loss": records[warmup + steps - 1]["loss"]})
  for row in rows:
    row["ratio"] = rows[0]["median_s"] / row["median_s"]
  return rows


def markdown(rows):
  lines = ["| mode | median step (s) | TFLOP/s/device | Tokens/s/device | MFU | vs " + rows[0]["mode"] + " |",
           "|---|---:|---:|---:|---:|---:|"]
  for r in rows:
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
    lines.append(f"| {r['mode']} | {r['median_s']:.4f} | {r['tflops_per_device']:.3f} | "
                 f"{r['tokens_per_device']:.1f} | {mfu} | {r['ratio']:.2f}x |")
  return "\n".join(lines)


def main(argv=None):
  parser = modes_lib.argument_parser(__doc__, DEFAULT_MODES, default_steps=30)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--json", default="")
  parser.add_argument("--out", default="", help="run directories (default: a temporary directory)")
  args, overrides = parser.parse_known_args(argv)
  if args.steps <= 0 or args.warmup < 1:
    raise SystemExit("error: --steps must be > 0 and --warmup >= 1 (the first step compiles)")
  with tempfile.TemporaryDirectory() as tmp:
    rows = measure(args.config, overrides, args.modes, args.steps, args.warmup, args.out or tmp)
  info = modes_lib.machine()
  print(f"\nthroughput: {' '.join([args.config, *overrides])} ({args.steps} steps after {args.warmup} warm-up; "
        f"commit {info['commit']}, {info['device']})\n")
  print(markdown(rows))
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps({"machine": info, "config": args.config, "overrides": overrides,
                                                   "rows": rows}, indent=1) + "\n", encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main())
