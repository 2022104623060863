"""Benchmark modes: "RECIPE[:key=value...]" -> (label, trainer overrides), and running one mode via the trainer.

    bf16                                   quantization=""
    te_nvfp4                               quantization=te_nvfp4
    te_nvfp4:disable_stochastic_rounding=true
    te_nvfp4:quantization_scope=all_dense
"""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from MaxText import config, train  # noqa: E402

# Dense BF16 tensor-core peak per GPU (TFLOP/s, no sparsity) from NVIDIA's data sheets, for MFU.
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "B200": 2250.0, "GB200": 2500.0, "B300": 2250.0, "GB300": 2500.0}


def parse_mode(mode: str):
  """(label, overrides) of one mode string."""
  recipe, *knobs = mode.split(":")
  for knob in knobs:
    if "=" not in knob:
      raise SystemExit(f"error: mode {mode!r}: {knob!r} is not key=value (e.g. te_nvfp4:disable_rht=true)")
  name = "" if recipe in ("bf16", "none", "") else recipe
  return mode, [f"quantization={name}"] + knobs


def load_config(config_path, overrides, mode):
  label, mode_overrides = parse_mode(mode)
  try:
    return label, config.load(config_path, list(overrides) + mode_overrides)
  except config.ConfigError as e:
    raise SystemExit(f"error: {e}") from e


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
  """The device's dense BF16 peak, or None when it isn't a GPU we know."""
  kind = device_kind.upper().replace("NVIDIA", "").replace("-", " ")
  for name in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
    if name in kind.split() or kind.strip().startswith(name):
      return PEAK_BF16_TFLOPS[name]
  return None


def train_mode(cfg):
  """Train `cfg`; user errors become a one-line exit like the trainer's CLI."""
  try:
    return train.train(cfg)
  except (config.ConfigError, train.UserError, train.data.DataError, train.data.TokenizerError,
          train.checkpointing.CheckpointError) as e:
    raise SystemExit(f"error: {e}") from e
