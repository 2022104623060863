"""What the benchmark harnesses share: modes ("RECIPE[:key=value...]" -> trainer overrides), their common
command-line arguments, running one mode through the trainer, reading its metrics, and the machine record.

    bf16                                   quantization=""
    te_nvfp4                               quantization=te_nvfp4
    te_nvfp4:disable_stochastic_rounding=true
    te_nvfp4:quantization_scope=all_dense
"""

import argparse
import json
import pathlib
import platform
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax  # noqa: E402

from benchmarks import provenance  # noqa: E402

from MaxText import config, train  # noqa: E402
from MaxText.aot import targets  # noqa: E402
from MaxText.runtime import preemption  # noqa: E402


def fail(message):
  """A user error: one line on stderr and exit code 2, as the trainer's CLI."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  raise SystemExit(2)


def load_configs(config_path, overrides, modes):
  """[(label, Config)] for every mode (run_name = its run_dir_name), all validated before any trains."""
  if not modes:
    fail("--modes names no mode (e.g. --modes bf16,te_nvfp4)")
  return [load_config(config_path, [*overrides, f"run_name={run_dir_name(mode)}"], mode) for mode in modes]


class OneLineParser(argparse.ArgumentParser):
  """argparse whose mistakes are the project's one line (error: ..., exit 2) rather than usage + error; an
  unknown --option is one too, where parse_known_args would have passed it on as a trainer override."""

  def error(self, message):
    fail(f"{self.prog}: {message} (see --help)")

  def parse_known_args(self, args=None, namespace=None):
    known, extra = super().parse_known_args(args, namespace)
    options = [a for a in extra if a.startswith("-")]
    if options:
      self.error(f"unrecognized arguments: {' '.join(options)}")
    return known, extra


def recorded_path(path):
  """A path as a record shows it: relative to the repository when inside it (the same config reads the same from
  any clone), else as given."""
  path = pathlib.Path(path)
  return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def described(config_path, overrides):
  """'CONFIG key=value ...' of a harness's header line, the config as recorded_path shows it."""
  return " ".join([recorded_path(config_path), *overrides])


def argument_parser(doc, default_modes, default_steps):
  """--config, --modes, --steps; any other key=value argument is a trainer override (parse_known_args). Paths given
  are read against the working directory (config.absolute_path); the default config is the repository's."""
  parser = OneLineParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", type=config.absolute_path, default=str(REPO / "configs/llama3_tiny.yml"))
  parser.add_argument(
    "--modes",
    type=lambda v: [m for m in v.split(",") if m],
    default=default_modes,
    help="comma-separated, each RECIPE[:key=value...] (default: %(default)s)",
  )
  parser.add_argument("--steps", type=int, default=default_steps)
  return parser


def machine():
  """Commit, devices, host and jax version: what every recorded figure names."""
  commit = provenance.commit()
  device = jax.devices()[0]
  return {
    "commit": commit or "unknown",
    "device": f"{len(jax.devices())}x {device.device_kind} ({device.platform})",
    "host": platform.platform(),
    "jax": jax.__version__,
  }


def write_json(path, machine_info, config_path, overrides, rows):
  """A harness's rows as JSON, with the machine record and the config they were measured on."""
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(path).write_text(
    json.dumps(
      {"machine": machine_info, "config": recorded_path(config_path), "overrides": overrides, "rows": rows}, indent=1
    )
    + "\n",
    encoding="utf-8",
  )


def parse_mode(mode: str):
  """(label, overrides) of one mode string."""
  recipe, *knobs = mode.split(":")
  for knob in knobs:
    if "=" not in knob:
      fail(f"mode {mode!r}: {knob!r} is not key=value (e.g. te_nvfp4:disable_rht=true)")
  name = "" if recipe in ("bf16", "none", "") else recipe
  return mode, [f"quantization={name}"] + knobs


def load_config(config_path, overrides, mode):
  label, mode_overrides = parse_mode(mode)
  try:
    return label, config.load(config_path, list(overrides) + mode_overrides)
  except config.ConfigError as e:
    fail(f"mode {label}: {e}")


def run_dir_name(label):
  return label.replace(":", "__").replace("=", "-").replace("/", "_")


def read_metrics(run_dir):
  """{step: record} from a run's metrics.jsonl; a step recorded twice (a resumed run) keeps the last record."""
  path = pathlib.Path(run_dir) / "metrics.jsonl"
  records = {}
  if path.exists():
    for line in path.read_text(encoding="utf-8").splitlines():
      if line.strip():
        record = json.loads(line)
        records[record["step"]] = record
  return records


def peak_tflops(device_kind: str):
  """The device's dense BF16 tensor-core peak in TFLOP/s (MaxText/aot/targets.py's, from XLA's GPU specs), or None
  when it isn't a GPU the target table knows."""
  gpu = targets.of_device_kind(device_kind)
  return gpu.peak_flops("bf16") / 1e12 if gpu is not None else None


def train_mode(cfg):
  """Train `cfg`; user errors become a one-line exit like the trainer's CLI."""
  try:
    return train.train(cfg)
  except train.USER_ERRORS as e:
    fail(str(e))


def train_fresh(out_dir, mode, label, cfg):
  """Train one mode in its run directory under out_dir, cleared first (the harness's own scratch: each measurement
  starts fresh), and return its metrics {step: record}; a SIGTERM / Ctrl-C during it ends the harness cleanly."""
  run_dir = pathlib.Path(out_dir) / run_dir_name(mode)
  shutil.rmtree(run_dir, ignore_errors=True)
  train_mode(cfg)
  if preemption.requested():
    print(f"{preemption.signal_name()}: stopped while measuring {label}; no table (rerun to measure)", flush=True)
    raise SystemExit(preemption.exit_code())
  return read_metrics(run_dir)
