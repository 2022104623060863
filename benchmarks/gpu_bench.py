"""The single-GPU measurements (make gpu-bench), one part per call, each written as one JSON file and printed as a
table.

    python benchmarks/gpu_bench.py PART [--cpu-smoke] [--out DIR] [key=value ...]   (scripts/gpu_bench.sh: all)

Parts (each under 8 minutes on one H100; the harnesses they call are the ones named):
  throughput-8b  throughput.py at configs/bench/llama3_8b_4layers_seq8192.yml, MODES (each in its own process):
                 step time, MFU, ratio to bf16, compiled-step peak memory, the allocator's peak and train_compile's
                 figure for the same config (deviceless), device ms/step and the host gap (median wall step minus
                 device time per step, from the profiled steps)
  throughput-1b  the same at configs/bench/llama3.2_1b_like_seq4096.yml
  attention      attention_bench.py at the 8B-layer shape (cuDNN alone, our layer's kernel, ...) and attention in
                 the train step (a profiled bf16 step's attention kernels per layer)
  quantize       quantize_bench.py at [8192, 16384]: every quantizer per implementation against copy bandwidth
  restart        restart_bench.py: te_nvfp4 at the 8B-layer config, first start vs restart on a persistent cache

--cpu-smoke runs the same code at tiny shapes (the configs above shrunk by SMOKE_OVERRIDES, XLA attention)
and writes the same schema; its numbers say nothing about a GPU. key=value arguments go to every trainer config
(after the smoke ones), e.g. jax_cache_dir=DIR or quantization_kernels=xla.

The JSON (DIR/PART.json, SCHEMA = 1):
  schema, part, status ("ok" | "failed"), error (null or one line), smoke (bool), command (str),
  started (UTC ISO time), seconds (the part's wall time), machine {commit, device, host, jax},
  metrics: [{name, subject (mode / variant / quantizer, or ""), value (a finite number), unit,
             target (THROUGHPUT_TARGETS and the others below, e.g. ">= 1.3", or null),
             met (bool; null without a target or in a smoke run)}],
  detail: the harness's own rows.
The file is written "failed" before the part starts, and again with the metrics so far after each mode or step
of a part, so a part killed midway leaves one that says so and keeps what it measured.
"""

import argparse
import datetime
import json
import math
import pathlib
import platform
import sys
import tempfile
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import provenance  # noqa: E402
from scripts import xla_flags  # noqa: E402  (no jax import: flags go in before jax starts its backend)

SCHEMA = 1
BENCH_8B = "configs/bench/llama3_8b_4layers_seq8192.yml"
BENCH_1B = "configs/bench/llama3.2_1b_like_seq4096.yml"
FP8_ALL_DENSE = "te_fp8_currentscaling:quantization_scope=all_dense"
FOUR_OVER_SIX = "te_nvfp4:nvfp4_4over6=all"
MODES = ["bf16", FP8_ALL_DENSE, "te_nvfp4", "te_nvfp4_no_rht", FOUR_OVER_SIX]
# The bench configs shrunk to a few-second CPU compile; XLA attention (cuDNN needs an NVIDIA GPU).
SMOKE_OVERRIDES = [
  "base_emb_dim=64",
  "base_num_query_heads=4",
  "base_num_kv_heads=2",
  "head_dim=16",
  "base_mlp_dim=128",
  "base_num_decoder_layers=2",
  "vocab_size=258",
  "max_target_length=64",
  "per_device_batch_size=2",
  "attention=dot_product",
  "hardware=cpu",
]
# The targets per bench config: bf16 MFU; speed vs bf16 (FP8 all-dense); step time vs bf16 (NVFP4).
THROUGHPUT_TARGETS = {
  BENCH_8B: {"mfu": 0.50, FP8_ALL_DENSE: 1.3, "te_nvfp4": 1.10, "te_nvfp4_no_rht": 1.05},
  BENCH_1B: {"mfu": 0.45, FP8_ALL_DENSE: 1.2, "te_nvfp4": 1.20, "te_nvfp4_no_rht": 1.10},
}
PEAK_MEMORY_TARGET = 1.10  # no quantized mode's step memory above bf16's + 10%
ATTENTION_TARGET = 1.3  # attention within 1.3x of cuDNN alone
RHT_SR_MS_TARGET = 0.35  # the RHT + SR quantize of [8192, 16384]
COPY_SHARE_TARGET = 60.0  # every quantizer at >= 60% of copy bandwidth


class Metrics:
  """The part's metric records; `smoke` leaves every `met` null (a CPU's numbers meet no GPU target).
  `save(detail)` writes what the part has measured so far (its file still says it did not finish)."""

  def __init__(self, smoke, save=lambda detail: None):
    self.smoke, self.records, self.save = smoke, [], save

  def add(self, name, subject, value, unit, target=None):
    """One metric; `target` is (">=" or "<=", bound) or None. A missing or non-finite value is left out."""
    if value is None or not math.isfinite(float(value)):
      return
    met = None
    if target is not None and not self.smoke:
      op, bound = target
      met = bool(value >= bound) if op == ">=" else bool(value <= bound)
    self.records.append(
      {
        "name": name,
        "subject": subject,
        "value": float(value),
        "unit": unit,
        "target": f"{target[0]} {target[1]:g}" if target else None,
        "met": met,
      }
    )


def _throughput(config_path, overrides, out_dir, metrics):
  from benchmarks import throughput  # pylint: disable=import-outside-toplevel

  steps, warmup, profile = (2, 1, 1) if metrics.smoke else (10, 3, 2)
  rows = []
  for mode in MODES:  # one at a time, each in its own process, saved after each: a part cut off keeps what it measured
    args = (str(REPO / config_path), overrides, [mode], steps, warmup, out_dir, profile)
    (row,) = throughput.measure_in_processes(*args)
    row["ratio"] = rows[0]["median_s"] / row["median_s"] if rows else 1.0  # speed vs bf16, the first mode
    rows.append(row)
    _throughput_metrics(row, rows[0], THROUGHPUT_TARGETS[config_path], metrics)
    detail = {"rows": [{k: v for k, v in r.items() if k != "profile"} for r in rows]}
    metrics.save(detail)
  return detail


def _throughput_metrics(row, base, targets, metrics):
  mode, ratio = row["mode"], row["ratio"]
  metrics.add("step time", mode, 1e3 * row["median_s"], "ms")
  metrics.add("tokens/s/device", mode, row["tokens_per_device"], "tokens/s")
  metrics.add("MFU", mode, row["mfu"], "fraction", (">=", targets["mfu"]) if mode == "bf16" else None)
  metrics.add("speed vs bf16", mode, ratio, "x", (">=", targets[mode]) if mode == FP8_ALL_DENSE else None)
  step_target = ("<=", targets[mode]) if mode in ("te_nvfp4", "te_nvfp4_no_rht") else None
  metrics.add("step time vs bf16", mode, 1 / ratio, "x", step_target)
  if row.get("peak_memory_bytes") and base.get("peak_memory_bytes") and mode != "bf16":
    memory_ratio = row["peak_memory_bytes"] / base["peak_memory_bytes"]
    metrics.add("step memory vs bf16", mode, memory_ratio, "x", ("<=", PEAK_MEMORY_TARGET))
  metrics.add("step memory", mode, row.get("peak_memory_bytes"), "bytes")
  metrics.add("allocator peak", mode, row.get("allocator_peak_bytes"), "bytes")
  metrics.add("train_compile step memory", mode, row.get("train_compile_peak_bytes"), "bytes")
  metrics.add("device time per step", mode, row.get("device_ms_per_step"), "ms")
  metrics.add("host gap per step", mode, row.get("host_gap_ms"), "ms")


def _attention(overrides, out_dir, metrics):
  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks import attention_bench, throughput  # pylint: disable=import-outside-toplevel
  from MaxText import config  # pylint: disable=import-outside-toplevel

  cfg = config.load(REPO / BENCH_8B, overrides)
  on_gpu = jax.default_backend() == "gpu"
  variants = [v for v in attention_bench.VARIANTS if on_gpu or v not in attention_bench.CUDNN_VARIANTS]
  rows = attention_bench.measure(cfg, variants, iters=3 if metrics.smoke else 20)
  alone = {r["variant"]: r["ms"] for r in rows}
  for r in rows:
    metrics.add("fwd+bwd per layer", r["variant"], r["ms"], "ms")
    metrics.add("TFLOP/s", r["variant"], r["tflops"], "TFLOP/s")
  if "cudnn" in alone:
    metrics.add("layer kernel vs cudnn alone", "layer", alone["layer"] / alone["cudnn"], "x", ("<=", ATTENTION_TARGET))
  metrics.save({"alone": rows})
  (step,) = throughput.measure(str(REPO / BENCH_8B), overrides, ["bf16"], 1, 1, out_dir, profile_steps=2)
  categories = {c["category"]: c["ms_per_step"] for c in step["profile"]["categories"]}
  in_step = categories.get("attention", 0.0) / cfg.base_num_decoder_layers
  if in_step > 0:  # attention kernels of their own (cuDNN); XLA's attention runs as GEMMs and elementwise ops
    metrics.add("in the step, per layer", "bf16 step", in_step, "ms")
    if "cudnn" in alone:
      metrics.add("in the step vs cudnn alone", "bf16 step", in_step / alone["cudnn"], "x", ("<=", ATTENTION_TARGET))
  return {"alone": rows, "step_attention_ms_per_layer": in_step, "step_categories": categories}


def _quantize(metrics):
  from benchmarks import quantize_bench  # pylint: disable=import-outside-toplevel
  from MaxText.quantization.kernels import quantizer_impl  # pylint: disable=import-outside-toplevel

  smoke = metrics.smoke
  rows_cols = (256, 512) if smoke else (8192, 16384)  # the targets are for [8192, 16384]
  impls = ["xla"] if quantizer_impl.unavailable_reason() else ["xla", "pallas"]
  rows = quantize_bench.bench_quantizers(*rows_cols, impls, iters=2 if smoke else 20)
  for r in rows:
    subject = f"{r['quantizer']} [{r['impl']}]"
    is_copy = r["quantizer"].startswith("copy")
    rht_sr = r["quantizer"] == "nvfp4 RHT+SR (dy_t)"
    metrics.add("time", subject, r["ms"], "ms", ("<=", RHT_SR_MS_TARGET) if rht_sr else None)
    metrics.add("bandwidth", subject, r["gb_s"], "GB/s")
    if not is_copy:
      metrics.add("share of copy bandwidth", subject, r["pct_copy"], "%", (">=", COPY_SHARE_TARGET))
  return {"shape": list(rows_cols), "rows": rows}


def _restart(overrides, metrics):
  from benchmarks import restart_bench  # pylint: disable=import-outside-toplevel

  rows = restart_bench.measure(str(REPO / BENCH_8B), [*overrides, "quantization=te_nvfp4"])
  for r in rows:
    metrics.add("first step", r["start"], r["first_step_s"], "s")
    metrics.add("XLA compilations", r["start"], r["compilations"], "count")
    metrics.add("compile time", r["start"], r["compile_s"], "s")
    metrics.add("persistent-cache hits", r["start"], r["cache_hits"], "count")
    metrics.add("process wall time", r["start"], r["wall_s"], "s")
  return {"rows": rows}


# part: fn(trainer overrides, a scratch directory, Metrics) -> the harness's rows for "detail"
PARTS = {
  "throughput-8b": lambda overrides, tmp, metrics: _throughput(BENCH_8B, overrides, tmp, metrics),
  "throughput-1b": lambda overrides, tmp, metrics: _throughput(BENCH_1B, overrides, tmp, metrics),
  "attention": _attention,
  "quantize": lambda overrides, tmp, metrics: _quantize(metrics),
  "restart": lambda overrides, tmp, metrics: _restart(overrides, metrics),
}


def _machine(jax_started):
  """The machine record; without starting jax's backend where the part hasn't (a GPU's memory stays free for
  the restart part's children)."""
  if jax_started:
    from benchmarks import modes as modes_lib  # pylint: disable=import-outside-toplevel

    return modes_lib.machine()
  commit = provenance.commit()
  return {"commit": commit or "unknown", "device": None, "host": platform.platform(), "jax": None}


def _write(path, record):
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
  tmp.replace(path)


def markdown(record):
  """The part's metrics as a table."""
  lines = [
    f"gpu-bench {record['part']}{' (cpu smoke)' if record['smoke'] else ''}: {record['status']}, "
    f"{record['seconds']:.0f} s; commit {record['machine']['commit']}, {record['machine']['device']}",
    "",
    "| metric | subject | value | unit | target | met |",
    "|---|---|---:|---|---|---|",
  ]
  for m in record["metrics"]:
    met = "-" if m["met"] is None else ("yes" if m["met"] else "NO")
    lines.append(f"| {m['name']} | {m['subject']} | {m['value']:.4g} | {m['unit']} | {m['target'] or '-'} | {met} |")
  return "\n".join(lines)


def run_part(part, smoke, out, overrides=()):
  """Measures `part`, writes out/PART.json (first as "failed", then the outcome); returns the record."""
  started = time.time()
  record = {
    "schema": SCHEMA,
    "part": part,
    "status": "failed",
    "error": "the part did not finish (killed, timed out or crashed)",
    "smoke": smoke,
    "command": " ".join([pathlib.Path(sys.executable).name, *sys.argv]),
    "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
    "seconds": 0.0,
    "machine": _machine(jax_started=False),
    "metrics": [],
    "detail": {},
  }
  path = pathlib.Path(out) / f"{part}.json"
  _write(path, record)
  progress = lambda detail: _write(path, {**record, "metrics": metrics.records, "detail": detail})
  metrics = Metrics(smoke, save=progress)
  try:
    with tempfile.TemporaryDirectory(prefix=f"gpu-bench-{part}-") as tmp:
      record["detail"] = PARTS[part]([*(SMOKE_OVERRIDES if smoke else []), *overrides], tmp, metrics)
    record.update(status="ok", error=None)
  except BaseException as e:  # pylint: disable=broad-except  (the part's failure is its record; others still run)
    traceback.print_exc()
    text = str(e).strip().splitlines()
    record["error"] = f"{type(e).__name__}: {text[0][:300] if text else ''}".rstrip(": ")
  record.update(metrics=metrics.records, seconds=time.time() - started, machine=_machine(jax_started=True))
  _write(path, record)
  print(f"\n{markdown(record)}\n", flush=True)
  return record


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("part", choices=sorted(PARTS))
  parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, same code and schema")
  parser.add_argument("--out", default="", help="directory of PART.json (default benchmarks/results[/cpu-smoke])")
  args, overrides = parser.parse_known_args(argv)
  bad = [a for a in overrides if "=" not in a or a.startswith("-")]
  if bad:
    parser.error(f"unrecognized arguments: {' '.join(bad)} (trainer overrides are key=value)")
  out = args.out or REPO / "benchmarks" / "results" / ("cpu-smoke" if args.cpu_smoke else "")
  xla_flags.apply_if_gpu()
  record = run_part(args.part, args.cpu_smoke, out, overrides)
  if record["status"] != "ok":
    print(f"gpu-bench: {args.part} failed: {record['error']}", file=sys.stderr, flush=True)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
