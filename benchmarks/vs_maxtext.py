"""Ours vs upstream MaxText on the same machine: step time and time to first step, in interleaved pairs of runs.

    python benchmarks/vs_maxtext.py [--modes bf16,fp8] [--pairs 3] [--steps 20] [--warmup 3] [--json out.json]
    python benchmarks/vs_maxtext.py --isa-cap avx2 ...   # both as on a CPU without AVX-512/AMX (isa_cap.py)
    python benchmarks/vs_maxtext.py --setup-only      # create the upstream venv and exit

Both trainers run as subprocesses, one after the other, for every mode and pair (the side that goes first
alternates between pairs, so a drifting machine load falls on both): ours is `train.py` in this repo's
.venv, theirs `python -m maxtext.trainers.pre_train.train` from PyPI's maxtext==0.2.5 in its own Python 3.12
venv (`.venv-maxtext`, ignored by git; created here from UPSTREAM_REQUIREMENTS when missing). Both get the
same keys (SHARED_KEYS, the model in MODEL_KEYS: llama3-tiny's shape, 3.4M parameters, batch 8 x 128):
synthetic data, full remat, scanned layers, bf16 activations with f32 weights, dot-product attention, no
checkpoints, no TensorBoard, the persistent compilation cache off (every start compiles). Mode `fp8` is
`quantization=fp8` on both sides: MaxText's Flax Fp8DotGeneralOp, ours its equivalent (te_fp8_delayedscaling on
every Dense layer).

Both print MaxText's line, `completed step: N, seconds: S, ...`. A run's step time is the median of its
`seconds` over steps >= warmup (MaxText compiles before step 0, we inside it, so the first steps are dropped
on both sides), its step CPU seconds the median CPU time (all threads, from /proc) between consecutive step lines
there: what a machine other jobs share inflates less. Its time to first step is measured here, from launching the
process to reading its step-0 line (both log a step one step late), and split in three: start + imports (launch to
the trainer's module imported), compilation (jax's own trace + lowering + XLA compile seconds before that line,
from jax.monitoring) and the rest (config, initialisation, data, the first steps' execution). Both trainers are
started through LAUNCHER, which adds those two marks and nothing else. Per pair: ours / theirs; the table gives
each mode's per-pair ratios and their median, and says which CPU ran it: its model, the flags that decide the GEMM
kernels, an ISA cap if any, and the operand dtype our CPU GEMMs took.

What cannot be the same: the jax version (maxtext 0.2.5 needs jax >= 0.11.1, which needs Python >= 3.12; ours is
pinned to 0.10.2 on Python 3.11), and each trainer's own synthetic data (MaxText slices one fixed random batch
on the device every step; ours draws a Markov chain per step on the host, ahead of the step, in a background
thread).
"""

import argparse
import dataclasses
import glob
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import isa_cap, provenance  # noqa: E402

UPSTREAM_VENV = REPO / ".venv-maxtext"
UPSTREAM_INTERPRETER = "python3.12"  # maxtext 0.2.5: Requires-Python >= 3.12
# maxtext 0.2.5 declares its dependencies only under extras (cuda12, tpu, ...) that pull accelerator wheels and
# Google Cloud clients; this is what its CPU pre-training path imports (DECOUPLE_GCLOUD=TRUE stubs the rest).
# jax 0.11.1 is the oldest it accepts (it imports jax.experimental.xla_metadata.must_fuse_call, new in 0.11).
UPSTREAM_REQUIREMENTS = [
  "maxtext==0.2.5",
  "jax==0.11.1",
  "jaxlib==0.11.1",
  "flax==0.12.12",
  "optax==0.2.8",
  "orbax-checkpoint==0.12.8",
  "grain==0.2.18",
  "qwix==0.1.8",
  "aqtp==0.9.0",
  "tokamax==0.0.15",
  "drjax",
  "chex",
  "jaxtyping",
  "ml-collections",
  "omegaconf",
  "pydantic",
  "absl-py",
  "pathwaysutils",
  "sentencepiece",
  "tiktoken",
  "tensorboardx",
  "jinja2",
  "huggingface_hub",
  "transformers",
  "pillow",
  "sympy",
]
UPSTREAM_ENV = {"DECOUPLE_GCLOUD": "TRUE"}  # MaxText's switch for running without Google Cloud packages

# llama3-tiny (MaxText/config/models.py), spelled out: MaxText has no such model name.
MODEL_KEYS = {
  "base_emb_dim": 256,
  "base_num_query_heads": 4,
  "base_num_kv_heads": 2,
  "head_dim": 64,
  "base_mlp_dim": 768,
  "base_num_decoder_layers": 4,
  "vocab_size": 512,
  "normalization_layer_epsilon": 1e-5,
  "rope_max_timescale": 500000,
}
SHARED_KEYS = {
  **MODEL_KEYS,
  "per_device_batch_size": 8,
  "max_target_length": 128,
  "dataset_type": "synthetic",
  "packing": "false",  # MaxText's synthetic data would otherwise cut each row into random segments
  "remat_policy": "full",
  "scan_layers": "true",
  "dtype": "bfloat16",
  "weight_dtype": "float32",
  "attention": "dot_product",
  "learning_rate": 3e-4,
  "enable_checkpointing": "false",
  "enable_tensorboard": "false",
  "eval_interval": -1,
  "log_period": 100,
  "jax_cache_dir": "",
}
# skip_jax_distributed_system: single process (MaxText otherwise expects a launcher's environment on CPU).
THEIRS_KEYS = {"skip_jax_distributed_system": "true", "enable_dropout": "false", "log_config": "false"}
# mode -> (our keys, MaxText's keys). fp8 is the same key on both sides; te_fp8_currentscaling pits our current-scaling
# recipe on every Dense layer against MaxText's fp8 (delayed scaling): different recipes, paired as
# users compare them.
MODES = {
  "bf16": ({}, {}),
  "fp8": ({"quantization": "fp8"}, {"quantization": "fp8"}),
  "te_fp8_currentscaling": (
    {"quantization": "te_fp8_currentscaling", "quantization_scope": "all_dense"},
    {"quantization": "fp8"},
  ),
}

STEP_LINE = re.compile(r"completed step: (\d+), seconds: ([0-9.]+)")
IMPORTED_LINE = "vs_maxtext: imported"
COMPILE_LINE = re.compile(r"vs_maxtext: compile trace=([0-9.]+) lower=([0-9.]+) xla=([0-9.]+)")
OURS_GEMM_LINE = re.compile(r"CPU GEMM operands: (.*)")
# `python -c LAUNCHER {ours REPO | theirs BASE_YML} KEY=VALUE...`: each trainer's own entry point (ours: train.py's
# main; theirs: `python -m maxtext.trainers.pre_train.train`'s app.run(main)), with a line once its module is imported
# and jax's cumulative compile seconds after every XLA compile.
LAUNCHER = """
import sys
import jax
totals = {"trace": 0.0, "lower": 0.0, "xla": 0.0}
parts = {"/jax/core/compile/jaxpr_trace_duration": "trace", "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
         "/jax/core/compile/backend_compile_duration": "xla"}
def on_event(event, seconds, **_):
  if event in parts:
    totals[parts[event]] += seconds
    if parts[event] == "xla":
      print("vs_maxtext: compile " + " ".join(f"{k}={v:.3f}" for k, v in totals.items()), flush=True)
jax.monitoring.register_event_duration_secs_listener(on_event)
side, where, *keys = sys.argv[1:]
if side == "ours":
  sys.path.insert(0, where)
  from MaxText import train as entry
  print("vs_maxtext: imported", flush=True)
  sys.argv = [where + "/train.py", *keys]
  sys.exit(entry.main())
from absl import app
from maxtext.trainers.pre_train import train as entry
print("vs_maxtext: imported", flush=True)
sys.argv = [entry.__file__, where, *keys]
app.run(entry.main)
"""


@dataclasses.dataclass
class RunResult:
  """One trainer run: per-step seconds as it logged them, launch -> step-0 line, and the process's exit."""

  side: str  # "ours" or "theirs"
  mode: str
  step_seconds: dict  # step -> seconds
  first_step_s: float  # None when no step-0 line came
  wall_s: float
  returncode: int
  load: tuple  # 1-minute load average before and after
  first_step_cpu_s: float = None  # the process's CPU seconds (all threads) when its step-0 line came
  step_cpu: dict = dataclasses.field(default_factory=dict)  # step -> the process's CPU seconds when its line came
  import_s: float = None  # launch -> the trainer's module imported
  compile_s: float = None  # jax's trace + lowering + XLA compile seconds before the step-0 line
  gemm_operands: str = None  # ours: the operand dtype of its CPU GEMMs, as its log says

  def median_step(self, warmup):
    """Median logged seconds over the steps >= warmup (None without any)."""
    steady = [s for step, s in self.step_seconds.items() if step >= warmup]
    return statistics.median(steady) if steady else None

  def median_step_cpu(self, warmup):
    """Median CPU seconds between consecutive step lines over the steps >= warmup (None without any)."""
    steady = [c - self.step_cpu[s - 1] for s, c in self.step_cpu.items() if s > warmup and s - 1 in self.step_cpu]
    return statistics.median(steady) if steady else None

  @property
  def rest_s(self):
    """The time to the first step that is neither imports nor compilation."""
    if None in (self.first_step_s, self.import_s, self.compile_s):
      return None
    return self.first_step_s - self.import_s - self.compile_s


def parse_log(stamped_lines):
  """(step -> seconds, the time stamp of the step-0 line or None) from [(seconds since launch, line)]."""
  step_seconds, first = {}, None
  for stamp, line in stamped_lines:
    match = STEP_LINE.search(line)
    if not match:
      continue
    step = int(match.group(1))
    step_seconds[step] = float(match.group(2))
    if step == 0 and first is None:
      first = stamp
  return step_seconds, first


def parse_phases(stamped_lines):
  """{import_s, compile_s, gemm_operands} from LAUNCHER's and our trainer's lines before the step-0 line."""
  phases = {"import_s": None, "compile_s": None, "gemm_operands": None}
  for stamp, line in stamped_lines:
    if _is_step(line, 0):
      break
    compiled = COMPILE_LINE.search(line)
    gemm = OURS_GEMM_LINE.search(line)
    if line.startswith(IMPORTED_LINE) and phases["import_s"] is None:
      phases["import_s"] = stamp
    elif compiled:
      phases["compile_s"] = sum(float(v) for v in compiled.groups())
    elif gemm:
      phases["gemm_operands"] = gemm.group(1).strip()
  return phases


def pair_ratios(ours: RunResult, theirs: RunResult, warmup):
  """{step, step_cpu, first_step, first_step_cpu}: ours / theirs for one pair (None where a side has no value)."""

  def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b

  return {
    "step": ratio(ours.median_step(warmup), theirs.median_step(warmup)),
    "step_cpu": ratio(ours.median_step_cpu(warmup), theirs.median_step_cpu(warmup)),
    "first_step": ratio(ours.first_step_s, theirs.first_step_s),
    "first_step_cpu": ratio(ours.first_step_cpu_s, theirs.first_step_cpu_s),
  }


def summarize(pairs, warmup):
  """One row per mode from [(ours, theirs)] pairs: both sides' medians and every pair's ratios."""
  rows = []
  for mode in dict.fromkeys(ours.mode for ours, _ in pairs):
    mode_pairs = [(o, t) for o, t in pairs if o.mode == mode]
    ratios = [pair_ratios(o, t, warmup) for o, t in mode_pairs]

    def med(values):
      values = [v for v in values if v is not None]
      return statistics.median(values) if values else None

    rows.append(
      {
        "mode": mode,
        "pairs": len(mode_pairs),
        "ours_step_s": med(o.median_step(warmup) for o, _ in mode_pairs),
        "theirs_step_s": med(t.median_step(warmup) for _, t in mode_pairs),
        "step_ratios": [r["step"] for r in ratios],
        "step_ratio": med(r["step"] for r in ratios),
        "ours_step_cpu_s": med(o.median_step_cpu(warmup) for o, _ in mode_pairs),
        "theirs_step_cpu_s": med(t.median_step_cpu(warmup) for _, t in mode_pairs),
        "step_cpu_ratio": med(r["step_cpu"] for r in ratios),
        "ours_first_step_s": med(o.first_step_s for o, _ in mode_pairs),
        "theirs_first_step_s": med(t.first_step_s for _, t in mode_pairs),
        **{
          f"{side}_{phase}": med(getattr(run, phase) for run in runs)
          for side, runs in (("ours", [o for o, _ in mode_pairs]), ("theirs", [t for _, t in mode_pairs]))
          for phase in ("import_s", "compile_s", "rest_s")
        },
        "first_step_ratios": [r["first_step"] for r in ratios],
        "first_step_ratio": med(r["first_step"] for r in ratios),
        "ours_first_step_cpu_s": med(o.first_step_cpu_s for o, _ in mode_pairs),
        "theirs_first_step_cpu_s": med(t.first_step_cpu_s for _, t in mode_pairs),
        "first_step_cpu_ratio": med(r["first_step_cpu"] for r in ratios),
      }
    )
  return rows


def markdown_table(rows):
  """The rows as a Markdown table: medians of each side and of the per-pair ratios (each pair's in brackets); the
  step's CPU seconds beside its wall seconds and the CPU seconds to the first step (all threads) beside the wall
  ones, as a machine other jobs share inflates the wall ones; the first step split into start + imports, jax's
  compilation and the rest."""

  def num(value, digits=3):
    return "n/a" if value is None else f"{value:.{digits}f}"

  def ratios(values):
    return ", ".join(num(v, 2) for v in values)

  def split(r, side):
    parts = " + ".join(num(r[f"{side}_{p}"], 1) for p in ("import_s", "compile_s", "rest_s"))
    return f"{num(r[f'{side}_first_step_s'], 1)} = {parts}"

  lines = [
    "| mode | pairs | ours step (s) | MaxText step (s) | step ours/MaxText | step CPU s ours/MaxText "
    "| ours first step (s) = imports + compile + rest | MaxText first step (s) = imports + compile + rest "
    "| first step ours/MaxText | its CPU s ours/MaxText |",
    "|---|---:|---:|---:|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['mode']} | {r['pairs']} | {num(r['ours_step_s'])} | {num(r['theirs_step_s'])} "
      f"| **{num(r['step_ratio'], 2)}x** ({ratios(r['step_ratios'])}) "
      f"| {num(r['ours_step_cpu_s'])} / {num(r['theirs_step_cpu_s'])} = {num(r['step_cpu_ratio'], 2)}x "
      f"| {split(r, 'ours')} | {split(r, 'theirs')} "
      f"| **{num(r['first_step_ratio'], 2)}x** ({ratios(r['first_step_ratios'])}) "
      f"| {num(r['ours_first_step_cpu_s'], 1)} / {num(r['theirs_first_step_cpu_s'], 1)} "
      f"= {num(r['first_step_cpu_ratio'], 2)}x |"
    )
  return "\n".join(lines)


def cpu_line(cpu, gemm_operands):
  """What ran the table, in one line: the CPU, the flags that pick the GEMM kernels, the ISA cap, our GEMMs' dtype."""
  cap = (
    f", ISA capped to {cpu['isa_cap']} (benchmarks/isa_cap.py: the libraries see that CPU kind)"
    if cpu.get("isa_cap")
    else ""
  )
  flags = " ".join(cpu["flags"]) or "none of " + ", ".join(DECIDING_FLAGS)
  return f"CPU: {cpu['model']}, {cpu['cpus']} CPUs; flags: {flags}{cap}; our CPU GEMM operands: {gemm_operands}"


DECIDING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "bf16")  # the GEMM kernels' (and cpu_gemm's) choice


def cpu_info(env):
  """{model, cpus, flags (DECIDING_FLAGS present), isa_cap}: /proc/cpuinfo as a process with `env` reads it (an ISA
  cap hides flags there too)."""
  code = "print(open('/proc/cpuinfo').read())"
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout
  fields = {}
  for line in out.splitlines():
    key, sep, value = line.partition(":")
    if sep:
      fields.setdefault(key.strip().lower(), value.strip())
  flags = set((fields.get("flags") or fields.get("features") or "").split())
  return {
    "model": fields.get("model name") or fields.get("cpu model") or platform.processor() or platform.machine(),
    "cpus": os.cpu_count(),
    "flags": [f for f in DECIDING_FLAGS if f in flags],
    "isa_cap": env.get("ISA_CAP"),
  }


def key_args(keys):
  return [f"{k}={v}" for k, v in keys.items()]


def ours_command(mode, steps, out_dir, run_name, repo=REPO):
  """Our trainer's command line; `repo`: the checkout whose train.py runs (another commit's, for a before/after)."""
  keys = {**SHARED_KEYS, **MODES[mode][0], "steps": steps}
  keys.update(base_output_directory=out_dir, run_name=run_name)
  return [sys.executable, "-c", LAUNCHER, "ours", str(pathlib.Path(repo)), *key_args(keys)]


def theirs_command(python, mode, steps, out_dir, run_name):
  base_yml = upstream_package_dir(python) / "configs" / "base.yml"
  keys = {**SHARED_KEYS, **THEIRS_KEYS, **MODES[mode][1], "steps": steps}
  keys.update(base_output_directory=out_dir, run_name=run_name)
  return [str(python), "-c", LAUNCHER, "theirs", str(base_yml), *key_args(keys)]


def upstream_package_dir(python):
  """Where the upstream venv's maxtext package lives (its configs/base.yml is the first argument)."""
  out = subprocess.run(
    [str(python), "-c", "import importlib.util as u; print(u.find_spec('maxtext').submodule_search_locations[0])"],
    capture_output=True,
    text=True,
    check=True,
  )
  return pathlib.Path(out.stdout.strip())


def process_cpu_seconds(pid):
  """User + system CPU seconds the process (all its threads) has used so far; None where /proc can't say."""
  try:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15 of stat


def run_timed(cmd, env, cwd, log_path):
  """Runs `cmd` with stdout and stderr merged into `log_path`; (returncode, [(seconds since launch, line)], wall,
  {step: the process's CPU seconds when that step's line came})."""
  stamped, step_cpu = [], {}
  start = time.perf_counter()
  with open(log_path, "w", encoding="utf-8") as log:
    proc = subprocess.Popen(
      cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    for line in proc.stdout:
      stamped.append((time.perf_counter() - start, line))
      step = STEP_LINE.search(line)
      if step is not None and int(step.group(1)) not in step_cpu:
        step_cpu[int(step.group(1))] = process_cpu_seconds(proc.pid)
      log.write(line)
    proc.wait()
  return proc.returncode, stamped, time.perf_counter() - start, step_cpu


def _is_step(line, step):
  match = STEP_LINE.search(line)
  return match is not None and int(match.group(1)) == step


def run_side(side, mode, cmd, env, cwd, log_path):
  load_before = os.getloadavg()[0]
  returncode, stamped, wall, step_cpu = run_timed(cmd, env, cwd, log_path)
  step_seconds, first = parse_log(stamped)
  load = (load_before, os.getloadavg()[0])
  step_cpu = {s: c for s, c in step_cpu.items() if c is not None}
  result = RunResult(
    side, mode, step_seconds, first, wall, returncode, load, step_cpu.get(0), step_cpu, **parse_phases(stamped)
  )
  if returncode != 0 or first is None:
    print(f"{side} {mode} failed (exit {returncode}); its log: {log_path}", file=sys.stderr, flush=True)
  return result


def base_env(isa_cap_level=None):
  """The environment both sides run in: CPU, unbuffered output, none of the caller's JAX/XLA settings; under
  benchmarks/isa_cap.py's cap `isa_cap_level` if given."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_", "MAXTEXT_", "LIBTPU", "ISA_CAP"))}
  env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  if isa_cap_level:
    env.update(isa_cap.env(isa_cap_level))
  return env


def find_python312():
  """A working Python 3.12: `python3.12` on PATH, else pyenv's (whose shim fails where a .python-version picks
  another version, as in this repo)."""
  candidates = [UPSTREAM_INTERPRETER, *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))]
  for candidate in candidates:
    if subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
      return candidate
  raise SystemExit("error: no working python3.12 found; pass --upstream-interpreter PATH")


def ensure_upstream(venv=UPSTREAM_VENV, interpreter=UPSTREAM_INTERPRETER):
  """The upstream venv's python, creating the venv (pinned UPSTREAM_REQUIREMENTS) first unless a finished one is there
  (its marker file: a venv whose install failed halfway is installed again)."""
  python, marker = venv / "bin" / "python", venv / ".vs_maxtext_installed"
  if marker.exists():
    return python
  print(f"creating {venv} ({interpreter}, {len(UPSTREAM_REQUIREMENTS)} requirements) ...", flush=True)
  start = time.perf_counter()
  subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
  subprocess.run([str(python), "-m", "pip", "install", "-q", *UPSTREAM_REQUIREMENTS], check=True)
  marker.write_text("\n".join(UPSTREAM_REQUIREMENTS) + "\n")
  print(f"created {venv} in {time.perf_counter() - start:.0f} s", flush=True)
  return python


def versions(python):
  """{jax, jaxlib, maxtext?, python} of an interpreter, read in a subprocess."""
  code = (
    "import importlib.metadata as m, json, platform\n"
    "d = {'python': platform.python_version()}\n"
    "for p in ('jax', 'jaxlib', 'flax', 'maxtext'):\n"
    "  try: d[p] = m.version(p)\n"
    "  except m.PackageNotFoundError: pass\n"
    "print(json.dumps(d))"
  )
  return json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout)


def measure(modes, pairs, steps, warmup, upstream_python, work_dir, ours_repo=REPO, env=None):
  """[(ours, theirs)] RunResults, `pairs` per mode; which side runs first alternates between pairs."""
  env = base_env() if env is None else env
  theirs_env = {**env, **UPSTREAM_ENV}
  results = []
  for index in range(pairs):
    for mode in modes:
      name = f"{mode}_{index}"
      ours_cmd = ours_command(mode, steps, work_dir / "ours", name, ours_repo)
      theirs_cmd = theirs_command(upstream_python, mode, steps, work_dir / "theirs", name)
      sides = [
        ("ours", ours_cmd, env, ours_repo),
        ("theirs", theirs_cmd, theirs_env, work_dir),
      ]
      if index % 2:
        sides.reverse()
      ran = {side: run_side(side, mode, cmd, e, cwd, work_dir / f"{side}_{name}.log") for side, cmd, e, cwd in sides}
      ours, theirs = ran["ours"], ran["theirs"]
      results.append((ours, theirs))
      print(f"pair {index} {mode}: ours {_summary(ours, warmup)} | MaxText {_summary(theirs, warmup)}", flush=True)
  return results


def _s(seconds):
  return "n/a" if seconds is None else f"{seconds:.3f} s"


def _summary(run, warmup):
  return (
    f"step {_s(run.median_step(warmup))} (CPU {_s(run.median_step_cpu(warmup))}), first step {_s(run.first_step_s)} "
    f"= imports {_s(run.import_s)} + compile {_s(run.compile_s)} + rest {_s(run.rest_s)} "
    f"(CPU {_s(run.first_step_cpu_s)}), load {run.load[0]:.1f}-{run.load[1]:.1f}"
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--modes", default="bf16,fp8", help=f"comma-separated, of {sorted(MODES)}")
  parser.add_argument("--pairs", type=int, default=3, help="interleaved (ours, theirs) runs per mode")
  parser.add_argument("--steps", type=int, default=20, help="steps per run, warm-up included")
  parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the step time")
  parser.add_argument("--upstream-venv", type=pathlib.Path, default=UPSTREAM_VENV)
  parser.add_argument("--upstream-interpreter", help="the Python >= 3.12 to create it with (default: found)")
  parser.add_argument(
    "--ours-repo", type=pathlib.Path, default=REPO, help="the checkout whose train.py is ours (e.g. an older commit's)"
  )
  parser.add_argument("--work-dir", type=pathlib.Path, help="logs and run directories (default: a temporary one)")
  parser.add_argument("--json", type=pathlib.Path, help="also write the rows and every run's step times here")
  parser.add_argument("--setup-only", action="store_true", help="create the upstream venv and exit")
  parser.add_argument(
    "--isa-cap",
    choices=isa_cap.LEVELS,
    help="run both trainers with newer x86 instructions hidden (benchmarks/isa_cap.py: the libraries' choice on "
    "that CPU kind, run on this machine's cores)",
  )
  args = parser.parse_args(argv)
  modes = [m for m in args.modes.split(",") if m]
  unknown = [m for m in modes if m not in MODES]
  if unknown or not modes:
    parser.error(f"--modes: unknown {unknown}; known: {sorted(MODES)}")
  if args.steps <= args.warmup:
    parser.error(f"--steps {args.steps} leaves no step after --warmup {args.warmup}")
  upstream_python = ensure_upstream(args.upstream_venv, args.upstream_interpreter or find_python312())
  if args.setup_only:
    return
  try:
    env = base_env(args.isa_cap)
  except isa_cap.IsaCapError as e:
    raise SystemExit(f"error: --isa-cap {args.isa_cap}: {e}") from None
  machine = {
    "machine": platform.machine(),
    "cpus": os.cpu_count(),
    "cpu": cpu_info(env),
    "ours": {
      **versions(sys.executable),
      "repo": str(args.ours_repo),
      "commit": provenance.commit(args.ours_repo, mark_dirty=True),
    },
    "theirs": versions(upstream_python),
  }
  print(f"machine: {json.dumps(machine)}", flush=True)
  work_dir = args.work_dir or pathlib.Path(tempfile.mkdtemp(prefix="vs_maxtext_"))
  work_dir.mkdir(parents=True, exist_ok=True)
  pairs = measure(modes, args.pairs, args.steps, args.warmup, upstream_python, work_dir, args.ours_repo.resolve(), env)
  rows = summarize(pairs, args.warmup)
  machine["ours_gemm_operands"] = sorted({o.gemm_operands or "n/a (no such line in its log)" for o, _ in pairs})
  print(cpu_line(machine["cpu"], ", ".join(machine["ours_gemm_operands"])), flush=True)
  print(markdown_table(rows), flush=True)
  print(f"logs: {work_dir}", flush=True)
  if args.json:
    runs = [dataclasses.asdict(r) for pair in pairs for r in pair]
    args.json.write_text(json.dumps({"machine": machine, "rows": rows, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
  main()
