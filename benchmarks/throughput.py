"""Throughput of quantization modes on one config, each mode measured in its own process (no mode's buffers left
on the device under the next): median step time after warm-up, TFLOP/s/device, Tokens/s/device, the speed ratio
to the first mode (the baseline) and where the device time goes.

    python benchmarks/throughput.py --config configs/llama3_tiny.yml --modes bf16,te_fp8_currentscaling,te_nvfp4 \\
        --steps 30 --warmup 5 [--profile-steps 2] [--json out.json] [key=value ...]

Each mode trains `warmup + steps` steps through the real trainer (same data, seed and config); the
first `warmup` steps (compilation) are dropped. Ratio = baseline median step time / mode's (> 1 = faster).
MFU is against the GPU's dense BF16 peak where the device is a known NVIDIA GPU. Then `--profile-steps`
more steps run under the profiler (profiler=xplane, outside the timed window) for a second table:
device milliseconds per step by category (GEMMs by operand dtype, attention, quantization and other
elementwise work, collectives, copies) and the attention kernels' achieved TFLOP/s (cuDNN attention only:
causal FLOPs, forward + backward = 3 x forward). Memory per mode: the compiled step's peak device memory from
XLA's memory analysis (the trainer's step as profiled; without a profile, compiled again here) and, on GPUs, the
allocator's peak_bytes_in_use (the mode's process's peak), beside train_compile's figure for the same config (the
step compiled deviceless for this GPU model and count, MaxText/trainer/aot_step.py). The host gap per step: the
median wall step time minus the profiled device time per step, the time a GPU waits on the host (on CPU, whose ops
run on several threads at once, it means nothing). On an NVIDIA GPU the run uses scripts/xla_flags.py's flags
(--no-gpu-xla-flags: only $XLA_FLAGS).
"""

import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from benchmarks import modes as modes_lib  # noqa: E402
from MaxText import config  # noqa: E402
from MaxText.model import accounting  # noqa: E402
from MaxText.aot import devices as aot_devices, targets  # noqa: E402
from MaxText.runtime import preemption  # noqa: E402
from MaxText.trainer import aot_step  # noqa: E402
from scripts import xla_flags  # noqa: E402

DEFAULT_MODES = ["bf16", "te_fp8_currentscaling", "te_nvfp4"]


def measure(config_path, overrides, modes, steps, warmup, out_dir, profile_steps=0):
  """One row per mode: {mode, median_s, tflops_per_device, tokens_per_device, ratio, mfu, final_loss,
  peak_memory_bytes, step_memory, allocator_peak_bytes, profile, attention_tflops, device_ms_per_step,
  host_gap_ms (median wall step time minus the profiled device time per step; None without a profile)}."""
  rows = []
  peak = modes_lib.peak_tflops(jax.devices()[0].device_kind)
  profile = (
    ["profiler=xplane", f"skip_first_n_steps_for_profiler={warmup + steps}", f"profiler_steps={profile_steps}"]
    if profile_steps
    else []
  )
  configs = modes_lib.load_configs(
    config_path,
    list(overrides)
    + profile
    + [
      f"steps={warmup + steps + profile_steps}",
      f"base_output_directory={out_dir}",
      "enable_checkpointing=false",
      "eval_interval=0",
      "enable_tensorboard=false",
    ],
    modes,
  )
  for mode, (label, cfg) in zip(modes, configs):
    records = modes_lib.train_fresh(out_dir, mode, label, cfg)
    allocator_peak = allocator_peak_bytes()  # before step_memory compiles (autotuning allocates too)
    seconds = [records[s]["seconds"] for s in range(warmup, warmup + steps)]
    median = float(np.median(seconds))
    run_shape = config.RunShape.of(cfg, jax.device_count())
    tokens_per_device = run_shape.tokens_per_step / run_shape.num_devices
    tflops = accounting.training_flops_per_device(cfg).tflops / median
    run_dir = pathlib.Path(out_dir) / modes_lib.run_dir_name(mode)
    profile_summary = (
      json.loads((run_dir / "profile_summary.json").read_text(encoding="utf-8")) if profile_steps else None
    )
    memory = step_memory(cfg, profile_summary)
    compiled = train_compile_memory(cfg)
    device_ms = profile_summary["device_ms_per_step"] if profile_summary else None
    rows.append(
      {
        "mode": label,
        "median_s": median,
        "tflops_per_device": tflops,
        "tokens_per_device": tokens_per_device / median,
        "mfu": tflops / peak if peak else None,
        "final_loss": records[warmup + steps - 1]["loss"],
        "peak_memory_bytes": (memory or {}).get("peak_bytes"),
        "step_memory": memory,
        "allocator_peak_bytes": allocator_peak,
        "train_compile_peak_bytes": (compiled or {}).get("peak_bytes"),
        "train_compile_target": (compiled or {}).get("target"),
        "profile": profile_summary,
        "attention_tflops": (profile_summary or {}).get("attention_tflops"),
        "device_ms_per_step": device_ms,
        # What the device doesn't spend in kernels per step: the host's dispatch, data and sync time it waits on.
        "host_gap_ms": 1e3 * median - device_ms if device_ms is not None else None,
      }
    )
  for row in rows:
    row["ratio"] = rows[0]["median_s"] / row["median_s"]
  return rows


def step_memory(cfg, profile_summary=None):
  """The compiled train step's device memory per device (XLA's memory analysis): the trainer's own compiled step as
  the profile recorded it, else the trainer's step compiled here on this machine's devices (aot_step)."""
  if profile_summary and profile_summary.get("memory"):
    return profile_summary["memory"]
  return aot_step.compile_step(cfg, jax.devices(), compile_only=False).memory


def train_compile_memory(cfg):
  """{peak_bytes, target} of train_compile's figure for this config on this machine's GPU model and count (the
  step compiled deviceless, as on a machine without the GPU), or None off a GPU the target table knows."""
  gpu = targets.of_device_kind(jax.devices()[0].device_kind)
  if gpu is None or aot_devices.plugin_missing_reason() is not None or jax.device_count() > gpu.max_nvlink_domain:
    return None
  target = targets.parse(f"{gpu.name}-{jax.device_count()}")
  step = aot_step.compile_for_target(cfg, target)
  return {"peak_bytes": step.memory["peak_bytes"], "target": target.name}


def measure_in_processes(config_path, overrides, modes, steps, warmup, out_dir, profile_steps=0, gpu_xla_flags=True):
  """measure(), each mode in a fresh process of this script (a mode's buffers never sit under the next's, as they
  did on the H100 of 11-27: two quantized modes out of memory behind bf16's state); the ratios to the first. Every
  mode's config is checked here first, before any trains."""
  modes_lib.load_configs(config_path, list(overrides), modes)
  rows = []
  for mode in modes:
    with tempfile.TemporaryDirectory() as tmp:
      out = pathlib.Path(tmp) / "row.json"
      argv = [sys.executable, __file__, "--config", str(config_path), "--modes", mode, "--steps", str(steps)]
      argv += ["--warmup", str(warmup), "--profile-steps", str(profile_steps), "--out", str(out_dir)]
      argv += ["--json", str(out), "--in-process", *([] if gpu_xla_flags else ["--no-gpu-xla-flags"]), *overrides]
      print(f"throughput: {mode} in its own process ...", flush=True)
      done = subprocess.run(argv, capture_output=True, text=True, check=False)
      if done.returncode != 0 or not out.exists():
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        error = next((line for line in lines if line.startswith("error:")), lines[-1] if lines else "no output")
        if done.returncode == 2 and error.startswith("error:"):
          modes_lib.fail(error[len("error: ") :])
        raise RuntimeError(f"measuring {mode} failed (exit {done.returncode}): {error}")
      rows += json.loads(out.read_text(encoding="utf-8"))["rows"]
  for row in rows:
    row["ratio"] = rows[0]["median_s"] / row["median_s"]
  return rows


def allocator_peak_bytes():
  """The device allocator's peak_bytes_in_use where the device reports it (GPUs; None on CPU). It is the
  process's peak so far: in a run of several modes a mode's own peak is this figure when it exceeds the
  previous mode's, and at most this figure otherwise."""
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def _gib(n):
  return f"{n / 2**30:.2f}" if n else "n/a"


def markdown(rows):
  lines = [
    "| mode | median step (s) | TFLOP/s/device | Tokens/s/device | MFU | vs "
    + rows[0]["mode"]
    + " | step memory (GiB) | allocator peak (GiB) | train_compile (GiB) |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
    lines.append(
      f"| {r['mode']} | {r['median_s']:.4f} | {r['tflops_per_device']:.3f} | "
      f"{r['tokens_per_device']:.1f} | {mfu} | {r['ratio']:.2f}x | {_gib(r.get('peak_memory_bytes'))} | "
      f"{_gib(r.get('allocator_peak_bytes'))} | {_gib(r.get('train_compile_peak_bytes'))} |"
    )
  return "\n".join(lines)


def breakdown_markdown(rows):
  """Device ms per step by category, one row per mode (from each mode's profiled steps)."""
  profiled = [r for r in rows if r.get("profile")]
  if not profiled:
    return ""
  categories = []
  for r in profiled:
    categories += [c["category"] for c in r["profile"]["categories"] if c["category"] not in categories]
  lines = [
    "| mode | device ms/step | " + " | ".join(categories) + " | attention TFLOP/s | host gap ms/step |",
    "|---|---:|" + "---:|" * (len(categories) + 2),
  ]
  for r in profiled:
    ms = {c["category"]: c["ms_per_step"] for c in r["profile"]["categories"]}
    attention = r["profile"].get("attention_tflops")
    lines.append(
      f"| {r['mode']} | {r['profile']['device_ms_per_step']:.2f} | "
      + " | ".join(f"{ms.get(c, 0.0):.2f}" for c in categories)
      + f" | {f'{attention:.0f}' if attention else 'n/a'} | {r['host_gap_ms']:.2f} |"
    )
  return "\n".join(lines)


def main(argv=None):
  parser = modes_lib.argument_parser(__doc__, DEFAULT_MODES, default_steps=30)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--json", type=config.absolute_path, default="")
  parser.add_argument(
    "--out", type=config.absolute_path, default="", help="run directories (default: a temporary directory)"
  )
  parser.add_argument(
    "--profile-steps", type=int, default=2, help="profiled steps per mode after the timed ones (0 = no breakdown)"
  )
  parser.add_argument("--no-gpu-xla-flags", action="store_true", help="don't add scripts/xla_flags.py's flags")
  parser.add_argument("--in-process", action="store_true", help="measure every mode in this process")
  args, overrides = parser.parse_known_args(argv)
  if args.steps <= 0 or args.warmup < 1 or args.profile_steps < 0:
    modes_lib.fail("--steps must be > 0, --warmup >= 1 (the first step compiles), --profile-steps >= 0")
  if not args.no_gpu_xla_flags:
    xla_flags.apply_if_gpu()  # before jax starts its backend
  with tempfile.TemporaryDirectory() as tmp, preemption.installed():  # SIGTERM / Ctrl-C: a clean stop
    measure_args = (args.config, overrides, args.modes, args.steps, args.warmup, args.out or tmp, args.profile_steps)
    if args.in_process or len(args.modes) == 1:
      rows = measure(*measure_args)
    else:
      rows = measure_in_processes(*measure_args, gpu_xla_flags=not args.no_gpu_xla_flags)
  info = modes_lib.machine()
  print(
    f"\nthroughput: {modes_lib.described(args.config, overrides)} ({args.steps} steps after {args.warmup} warm-up; "
    f"commit {info['commit']}, {info['device']})\n"
  )
  print(markdown(rows))
  if args.profile_steps:
    print(f"\ndevice time per step by category (ms, {args.profile_steps} profiled steps after the timed ones):\n")
    print(breakdown_markdown(rows))
  if args.json:
    modes_lib.write_json(args.json, info, args.config, overrides, rows)
  return 0


if __name__ == "__main__":
  sys.exit(main())
