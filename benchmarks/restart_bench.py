"""Restart compile time: the trainer's first start and a restart, each a fresh process, sharing one empty
persistent compilation cache.

    python benchmarks/restart_bench.py --config configs/bench/llama3_8b_4layers_seq8192.yml [--steps 2] \\
        [--json out.json] [key=value ...]

Each start trains --steps steps (no checkpoints, no eval) in a new process and reports: the first step's
seconds (from the loop's start to the step's metrics: its compilation included), the XLA compilations of the
whole process and their seconds, the programs the persistent cache supplied, and the process's wall time
(Python and jax imports included). The first start compiles everything into the empty cache; the restart
should compile nothing. On an NVIDIA GPU both use scripts/xla_flags.py's flags.
"""

import json
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts import xla_flags  # noqa: E402  (no jax import: flags go in before jax starts its backend)

RESULT_MARK = "restart_bench result: "  # the child's one line of JSON on stdout


def child(config_path, overrides):
  """In the child process: train and print what it compiled, as one line of JSON."""
  started = time.perf_counter()
  xla_flags.apply_if_gpu()
  from benchmarks import modes as modes_lib  # pylint: disable=import-outside-toplevel
  from MaxText import config  # pylint: disable=import-outside-toplevel
  from MaxText.runtime.compile_count import CompileCounter  # pylint: disable=import-outside-toplevel

  cfg = config.load(config_path, overrides)
  with CompileCounter() as counter:
    modes_lib.train_mode(cfg)
  first = modes_lib.read_metrics(pathlib.Path(cfg.base_output_directory) / cfg.run_name)[0]
  result = {
    "first_step_s": first["seconds"],
    "compilations": counter.compilations,
    "compile_s": counter.compile_seconds,
    "cache_hits": sum(counter.cache_hits.values()),
    "process_s": time.perf_counter() - started,
  }
  print(RESULT_MARK + json.dumps(result), flush=True)


def _start(config_path, overrides, run_name):
  """One start in a fresh process: its result dict, with the process's wall time from launch ("wall_s")."""
  cmd = [sys.executable, __file__, "--child", str(config_path), *overrides, f"run_name={run_name}"]
  started = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - started
  lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
  if proc.returncode != 0 or not lines:
    last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
    raise RuntimeError(f"the {run_name} start exited with code {proc.returncode}: {last[:200]}")
  return {"start": run_name, **json.loads(lines[-1][len(RESULT_MARK) :]), "wall_s": wall}


def measure(config_path, overrides, steps=2):
  """[first start, restart]: each {start, first_step_s, compilations, compile_s, cache_hits, process_s, wall_s}."""
  with tempfile.TemporaryDirectory(prefix="restart-bench-") as tmp:
    fixed = [
      *overrides,
      f"steps={steps}",
      f"base_output_directory={tmp}/runs",
      f"jax_cache_dir={tmp}/cache",
      "enable_checkpointing=false",
      "eval_interval=0",
      "enable_tensorboard=false",
    ]
    return [_start(config_path, fixed, name) for name in ("first", "restart")]


def markdown(rows):
  lines = [
    "| start | first step (s) | XLA compilations | compile (s) | cache hits | process wall (s) |",
    "|---|---:|---:|---:|---:|---:|",
  ]
  for r in rows:
    lines.append(
      f"| {r['start']} | {r['first_step_s']:.2f} | {r['compilations']} | {r['compile_s']:.2f} | "
      f"{r['cache_hits']} | {r['wall_s']:.1f} |"
    )
  return "\n".join(lines)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ["--child"]:
    child(argv[1], argv[2:])
    return 0
  from benchmarks import modes as modes_lib  # pylint: disable=import-outside-toplevel

  parser = modes_lib.argument_parser(__doc__, ["te_nvfp4"], default_steps=2)
  parser.add_argument("--json", default="")
  args, overrides = parser.parse_known_args(argv)
  if len(args.modes) != 1 or args.steps < 1:
    modes_lib.fail("--modes names one mode and --steps is >= 1")
  modes_lib.load_configs(args.config, overrides, args.modes)  # a bad override: one line here, not in a child
  rows = measure(args.config, [*overrides, *modes_lib.parse_mode(args.modes[0])[1]], args.steps)
  print(f"\nrestart: {modes_lib.described(args.config, overrides)} {args.modes[0]}\n\n{markdown(rows)}")
  if args.json:
    modes_lib.write_json(args.json, modes_lib.machine(), args.config, overrides, rows)
  return 0


if __name__ == "__main__":
  sys.exit(main())
