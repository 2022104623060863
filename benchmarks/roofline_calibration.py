"""The roofline's calibration (MaxText/aot/roofline.py) against one H100's measurements of 2026-11-27
(benchmarks/results/h100-2026-11-27/): each measured configuration compiled for h100-1 (deviceless, on any machine),
the achievable shares fitted once, then every measured row beside its compiled estimate.

    scripts/te/python.sh benchmarks/roofline_calibration.py [--quantizers-only] [--json out.json]

(jax's CUDA plugin needed: .venv-te from `make te`.) The fit: HBM share from the 8B-layer bf16 step's elementwise
time (its kernels' bytes over that time, each kernel the longer of its bytes and its instructions), then the GEMM
share from its GEMM time, then attention's two constants (its FLOP share and a cost per attention score) from the
8B-layer (head dim 128) and 1B-like (head dim 64) bf16 steps' attention times. Everything else is a check, never
fitted on: every quantizer the quantize part timed (each compiled as the bench ran it, every kernel costed by the
one kernel model: bytes, or the instructions its PTX shows at the published per-pipe rates, aot/instructions.py),
the 8B-layer step's total (296.5 ms measured), remat_policy=full, the quantized rows, the 1B-like rows (GEMM and
elementwise from the 8B fit alone), and cuDNN attention alone (attention part). It prints the fitted constants and
whether roofline.DEFAULT holds them, and each row's step memory as the H100 measured it (XLA's analysis of the
executable it ran) beside the compiled figure.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import sys

if "JAX_PLATFORMS" not in os.environ and not os.path.exists("/dev/nvidiactl"):
  os.environ["JAX_PLATFORMS"] = "cpu"  # compile-only devices need no GPU; jax must not look for one

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import provenance  # noqa: E402
from MaxText import config  # noqa: E402
from MaxText.aot import devices as aot_devices, dump, hlo, roofline, targets  # noqa: E402
from MaxText.trainer import aot_step  # noqa: E402

MEASURED = REPO / "benchmarks" / "results" / "h100-2026-11-27"
BENCH_8B = REPO / "configs" / "bench" / "llama3_8b_4layers_seq8192.yml"
BENCH_1B = REPO / "configs" / "bench" / "llama3.2_1b_like_seq4096.yml"
CATEGORIES = ("gemm", "elementwise", "attention")
# What ran on the H100: the te_* modes on the emulated backend (no Transformer Engine there), gpu_bench's parts with
# quantization_kernels=xla, the remat_policy=full run with the default (Pallas) kernels.
EMULATED = ["quantization_backend=emulate"]
MODES = {
  "bf16": [],
  "te_fp8_currentscaling:quantization_scope=all_dense": [
    "quantization=te_fp8_currentscaling",
    "quantization_scope=all_dense",
    *EMULATED,
  ],
  "te_nvfp4": ["quantization=te_nvfp4", *EMULATED],
  "te_nvfp4_no_rht": ["quantization=te_nvfp4_no_rht", *EMULATED],
  "te_nvfp4:nvfp4_4over6=all": ["quantization=te_nvfp4", "nvfp4_4over6=all", *EMULATED],
}


def _read(name):
  return json.loads((MEASURED / name).read_text(encoding="utf-8"))


def _categories(profile_categories):
  """{gemm, elementwise, attention} ms from a profile's categories: GEMMs of every kind, attention, and the rest as
  elementwise (the H100's profiles of 2026-11-27 named them quantization/elementwise, copy/transpose and other --
  the Pallas quantizers --, as the profiler did before it took aot.hlo's categories)."""
  out = dict.fromkeys(CATEGORIES, 0.0)
  for c in profile_categories:
    name, ms = c["category"], c["ms_per_step"]
    out["gemm" if name.startswith("gemm") else "attention" if name == "attention" else "elementwise"] += ms
  return out


# What the H100 ran on 2026-11-27 beyond each bench config: the lm head untiled (num_vocab_tiling's `auto`, which
# tiles it where the logits would take much of a GPU's memory, came later).
AS_MEASURED = ["num_vocab_tiling=1"]


def measured_rows():
  """[(label, config, overrides, {category: ms} or None, total device ms, step memory bytes)] of the H100's rows
  (step memory: XLA's memory analysis of the executable the H100 ran)."""
  rows = []
  attention_part = _read("attention_attention.json")
  step_8b = _read("throughput-8b_throughput-8b.json")
  total_8b = next(m["value"] for m in step_8b["metrics"] if m["name"] == "device time per step")
  categories = {k: {"category": k, "ms_per_step": v} for k, v in attention_part["detail"]["step_categories"].items()}
  memory_8b = next(m["value"] for m in step_8b["metrics"] if m["name"] == "step memory" and m["subject"] == "bf16")
  rows.append(
    (
      "8B-layer bf16",
      BENCH_8B,
      ["quantization_kernels=xla", *AS_MEASURED],
      _categories(categories.values()),
      total_8b,
      memory_8b,
    )
  )
  for row in _read("throughput-8b-remat-full.json")["rows"]:
    rows.append(
      (
        f"8B-layer {row['mode']} remat=full",
        BENCH_8B,
        ["remat_policy=full", *AS_MEASURED, *MODES[row["mode"]]],
        _categories(row["profile"]["categories"]),
        row["device_ms_per_step"],
        row["peak_memory_bytes"],
      )
    )
  # The 1B-like rows' categories are in the H100 report's table (H100-2026-11-27.md), not in the part's JSON.
  table_1b = {
    "bf16": {"gemm": 164.7, "elementwise": 86.0, "attention": 62.5},
    "te_fp8_currentscaling:quantization_scope=all_dense": {
      "gemm": 67.7 + 32.9,
      "elementwise": 133.3,
      "attention": 57.5,
    },
    "te_nvfp4": {"gemm": 152.2, "elementwise": 253.6, "attention": 54.2},
  }
  for row in _read("throughput-1b_throughput-1b.json")["detail"]["rows"]:
    rows.append(
      (
        f"1B-like {row['mode']}",
        BENCH_1B,
        ["quantization_kernels=xla", *AS_MEASURED, *MODES[row["mode"]]],
        table_1b.get(row["mode"]),
        row["device_ms_per_step"],
        row["peak_memory_bytes"],
      )
    )
  return rows


def compiled(config_path, overrides, gpu_name="h100"):
  """The step compiled for one `gpu_name` (aot_step.CompiledStep)."""
  cfg = config.load(config_path, [*overrides, f"compile_topology={gpu_name}-1"])
  return aot_step.compile_for_target(cfg, targets.parse(f"{gpu_name}-1"))


def attention_alone_kernels(gpu_name="h100"):
  """cuDNN causal attention forward + backward of one layer at the 8B-layer shape (the attention bench's 'cudnn')."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  devices = aot_devices.for_target(targets.parse(f"{gpu_name}-1"))
  mesh = jax.sharding.Mesh(devices, ("d",))
  shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  q = jax.ShapeDtypeStruct((2, 8192, 32, 128), jnp.bfloat16, sharding=shard)
  kv = jax.ShapeDtypeStruct((2, 8192, 8, 128), jnp.bfloat16, sharding=shard)

  def loss(q_, k_, v_):
    return jax.nn.dot_product_attention(q_, k_, v_, is_causal=True, implementation="cudnn").astype(jnp.float32).sum()

  with jax.default_device(devices[0]):
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv)
  text = lowered.compile().as_text()
  return [k for k in hlo.kernels(hlo.parse(text)) if k.category == "attention"]


def by_category(kernels, gpu, calibration):
  out = dict.fromkeys(CATEGORIES, 0.0)
  for k in kernels:
    if k.category in out:
      out[k.category] += roofline.kernel_seconds(k, gpu, calibration) * k.count * 1e3
  return out


def _solve(f, target, lo=1e-3, hi=1.0):
  """x in [lo, hi] with f(x) = target, f decreasing (bisection)."""
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if f(mid) < target else (mid, hi)
  return (lo + hi) / 2


def fit(k8, m8, k1, m1, gpu):
  """The Calibration fitted on the 8B-layer bf16 step (kernels k8, measured m8) and the 1B-like one's attention."""
  c = roofline.DEFAULT
  memory = _solve(lambda s: by_category(k8, gpu, dataclasses.replace(c, memory=s))["elementwise"], m8["elementwise"])
  c = dataclasses.replace(c, memory=memory)
  gemm = _solve(lambda s: by_category(k8, gpu, dataclasses.replace(c, gemm=s))["gemm"], m8["gemm"])
  c = dataclasses.replace(c, gemm=gemm)
  # attention ms = FLOPs / (share x peak) + scores x ns: two equations (8B, 1B), two unknowns.
  flops = [sum(k.flops * k.count for k in ks if k.category == "attention") for ks in (k8, k1)]
  scores = [sum(k.scores * k.count for k in ks if k.category == "attention") for ks in (k8, k1)]
  t = [m8["attention"] * 1e-3, m1["attention"] * 1e-3]
  det = flops[0] * scores[1] - flops[1] * scores[0]
  inverse_rate = (t[0] * scores[1] - t[1] * scores[0]) / det  # seconds per FLOP
  per_score = (flops[0] * t[1] - flops[1] * t[0]) / det
  return dataclasses.replace(
    c,
    attention=1.0 / (inverse_rate * gpu.peak_flops("bf16")),
    attention_score_ns=per_score * 1e9,
    score_gpu=gpu.name,
  )


QUANTIZE_SHAPE = (8192, 16384)  # the quantize part's operand


def quantizer_kernels(name, impl, gpu, compiler_options=None):
  """The kernels of quantize_bench's quantizer `name` on implementation `impl` (xla | pallas), compiled for one
  `gpu` as the bench ran it (the project's GPU flags, and `compiler_options`), each with its code (the dump)."""
  import jax  # pylint: disable=import-outside-toplevel
  from benchmarks import quantize_bench  # pylint: disable=import-outside-toplevel
  from MaxText.quantization import target as quant_target  # pylint: disable=import-outside-toplevel
  from MaxText.runtime import xla_flags  # pylint: disable=import-outside-toplevel

  devices = aot_devices.for_target(targets.parse(f"{gpu.name}-1"))
  shard = jax.sharding.SingleDeviceSharding(devices[0])
  key = jax.eval_shape(lambda: jax.random.key(0))
  x = jax.ShapeDtypeStruct(QUANTIZE_SHAPE, quantize_bench.QUANTIZERS[name][3], sharding=shard)
  k = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=shard)
  with quant_target.compiling_for(gpu.sm, 1), jax.default_device(devices[0]):
    lowered = quantize_bench._quantizer_fn(name, impl).lower(x, k)  # pylint: disable=protected-access
    options = {**xla_flags.compiler_options(1), **(compiler_options or {})}
    compiled, code = dump.compile_reading_code(lowered, options)
  kernels = hlo.kernels(hlo.parse(compiled.as_text()))
  for kernel in kernels:
    kernel.code = code.get(kernel.name)
  return kernels


def quantizer_rows(gpu, calibration):
  """[{quantizer, impl, measured_ms, estimate_ms, bytes_ms, ratio}] of every quantizer the H100 timed (the
  quantize part), each compiled and estimated by the one kernel model (nothing here was fitted on these times)."""
  rows = []
  for subject, measured in measured_quantizer_ms().items():
    name, impl = subject.rsplit(" [", 1)
    kernels = quantizer_kernels(name, impl.rstrip("]"), gpu)
    estimate = sum(roofline.kernel_seconds(k, gpu, calibration) * k.count for k in kernels) * 1e3
    nbytes = sum(k.bytes * k.count for k in kernels) / (gpu.memory_bandwidth * calibration.memory) * 1e3
    row = {"quantizer": name, "impl": impl.rstrip("]"), "measured_ms": measured, "estimate_ms": estimate}
    rows.append({**row, "bytes_ms": nbytes, "ratio": estimate / measured})
  return rows


def measured_quantizer_ms():
  """{'quantizer [impl]': ms} of every quantizer the H100 timed (quantize part; copy left out)."""
  metrics = _read("quantize_quantize.json")["metrics"]
  return {m["subject"]: m["value"] for m in metrics if m["name"] == "time" and not m["subject"].startswith("copy")}


def step_rows(rows, kernels, memory, gpu, calibration):
  """Prints and returns each measured step row beside its estimate (and its compiled memory)."""
  out = []
  print(
    "\n| row (H100, measured 2026-11-27) | measured ms: gemm / elementwise / attention / total | estimate ms "
    "| est/meas | step memory, measured / compiled (bytes) |"
  )
  print("|---|---|---|---|---|")
  for label, _, _, meas, total, measured_memory in rows:
    est = by_category(kernels[label], gpu, calibration)
    est_total = sum(est.values())
    ratios = [f"{est[c] / meas[c]:.2f}" for c in CATEGORIES] if meas else ["-"] * 3
    meas_text = " / ".join(f"{meas[c]:.1f}" for c in CATEGORIES) if meas else "- / - / -"
    print(
      f"| {label} | {meas_text} / {total:.1f} | "
      + " / ".join(f"{est[c]:.1f}" for c in CATEGORIES)
      + f" / {est_total:.1f} | {' / '.join(ratios)} / {est_total / total:.2f} | "
      + f"{int(measured_memory):,} / {memory[label]:,} ({memory[label] - measured_memory:+,.0f}) |"
    )
    out.append(
      {
        "row": label,
        "measured": meas,
        "measured_total_ms": total,
        "estimate": est,
        "estimate_total_ms": est_total,
        "measured_step_memory_bytes": measured_memory,
        "compiled_step_memory_bytes": memory[label],
      }
    )
  alone = attention_alone_kernels()
  alone_ms = by_category(alone, gpu, calibration)["attention"]
  bench = next(m["value"] for m in _read("attention_attention.json")["metrics"] if m["subject"] == "cudnn")
  print(f"| cuDNN attention alone, one 8B layer fwd+bwd | {bench:.2f} | {alone_ms:.2f} | {alone_ms / bench:.2f} | |")
  out.append({"row": "cudnn attention alone", "measured_total_ms": bench, "estimate_total_ms": alone_ms})
  return out


def print_quantizers(rows):
  print(
    "\n| quantizer on [8192, 16384] (H100, measured 2026-11-27) | impl | measured ms | estimate ms "
    "| bytes alone ms | est/meas |"
  )
  print("|---|---|---:|---:|---:|---:|")
  for r in rows:
    print(
      f"| {r['quantizer']} | {r['impl']} | {r['measured_ms']:.3f} | {r['estimate_ms']:.3f} | {r['bytes_ms']:.3f} "
      f"| {r['ratio']:.2f} |"
    )


# -- predictions for `make gpu-bench` ------------------------------------------------------------------------------

PREDICTIONS = REPO / "benchmarks" / "results" / "gpu_bench_predictions"
# How the bench runs each mode on a GPU host: its overrides (benchmarks/modes.py), on the backend `auto` takes
# where Transformer Engine is not installed (the emulated one), the default kernels and remat policy.
BENCH_HOST = ["quantization_backend=emulate"]


def _metric(part, name, subject, estimate, unit, low=None, high=None):
  return {"part": part, "name": name, "subject": subject, "value": estimate, "unit": unit, "range": [low, high]}


def predict_throughput(gpu, part, config_path):
  """The throughput part's predictions: device ms per step (point and range) and step memory, per mode."""
  from benchmarks import gpu_bench, modes  # pylint: disable=import-outside-toplevel

  out = []
  for mode in gpu_bench.MODES:
    overrides = modes.parse_mode(mode)[1] + (BENCH_HOST if mode != "bf16" else [])
    print(f"compiling {part} {mode} for {gpu.name}-1 ...", flush=True)
    step = compiled(config_path, overrides, gpu.name)
    est = step.estimate()
    ms = est["ms_per_step"]
    out.append(
      _metric(part, "device time per step", mode, ms["total"], "ms", est["range_ms"]["low"], est["range_ms"]["high"])
    )
    out.append(_metric(part, "step memory", mode, step.memory["peak_bytes"], "bytes"))
  return out


def predict_attention(gpu):
  """The attention part's prediction: cuDNN alone, forward + backward of one 8B layer."""
  kernels = attention_alone_kernels(gpu.name)
  point = by_category(kernels, gpu, roofline.DEFAULT)["attention"]
  ends = [
    sum(roofline.kernel_seconds(k, gpu, roofline.DEFAULT, roofline.SCENARIOS[e]) for k in kernels) * 1e3
    for e in ("low", "high")
  ]
  return [_metric("attention", "fwd+bwd per layer", "cudnn", point, "ms", *ends)]


def predict_quantize(gpu):
  """The quantize part's predictions: every quantizer's time on [8192, 16384], per implementation."""
  from benchmarks import quantize_bench  # pylint: disable=import-outside-toplevel

  out = []
  for name in quantize_bench.QUANTIZERS:
    for impl in ("xla", "pallas"):
      kernels = quantizer_kernels(name, impl, gpu)
      estimate = sum(roofline.kernel_seconds(k, gpu, roofline.DEFAULT) * k.count for k in kernels) * 1e3
      out.append(_metric("quantize", "time", f"{name} [{impl}]", estimate, "ms"))
  return out


def predict_gpu_bench(gpu_name):
  """{gpu, commit, what, metrics} of every `make gpu-bench` configuration on one `gpu_name`, before it runs."""
  gpu = targets.GPUS[gpu_name]
  metrics = predict_quantize(gpu) + predict_attention(gpu)
  metrics += predict_throughput(gpu, "throughput-8b", BENCH_8B) + predict_throughput(gpu, "throughput-1b", BENCH_1B)
  return {
    "gpu": gpu.description,
    "commit": provenance.commit(mark_dirty=True),
    "what": f"compiled estimates for {gpu_name}-1 (train_compile's model), written before any GPU ran them; "
    "the restart part is not predicted (compile time)",
    "assumes": "the bench on a GPU host without Transformer Engine (te_* modes on the emulated backend), default "
    "kernels and remat policy; device time per step, not wall time",
    "constants": roofline.constants(),
    "metrics": metrics,
  }


def predictions_for(measured_dir, predictions):
  """The predictions file for a measured run: `predictions` itself, or in that directory the one of the GPU the
  run's JSONs name (machine.device), None where there is none."""
  predictions = pathlib.Path(predictions)
  if predictions.is_file():
    return predictions
  for part in sorted(pathlib.Path(measured_dir).glob("*.json")):
    device = json.loads(part.read_text(encoding="utf-8")).get("machine", {}).get("device", "")
    gpu = targets.of_device_kind(device)
    if gpu is not None and (predictions / f"{gpu.name}.json").is_file():
      return predictions / f"{gpu.name}.json"
  return None


def score(measured_dir, predictions_path):
  """Each measured metric (DIR/PART.json of gpu_bench) beside its prediction: [(part, name, subject, predicted,
  measured, measured / predicted, whether inside the predicted range)]."""
  path = predictions_for(measured_dir, predictions_path)
  if path is None:
    return []
  predicted = json.loads(path.read_text(encoding="utf-8"))["metrics"]
  out = []
  for p in predicted:
    path = pathlib.Path(measured_dir) / f"{p['part']}.json"
    if not path.exists():
      continue
    found = [
      m
      for m in json.loads(path.read_text(encoding="utf-8"))["metrics"]
      if (m["name"], m["subject"]) == (p["name"], p["subject"])
    ]
    if found and found[0]["value"]:
      value = found[0]["value"]
      low, high = p["range"]
      inside = None if low is None else low <= value <= high
      out.append((p["part"], p["name"], p["subject"], p["value"], value, value / p["value"], inside))
  return out


def print_score(rows):
  print("| part | metric | subject | predicted | measured | measured / predicted | inside the range |")
  print("|---|---|---|---:|---:|---:|---|")
  for part, name, subject, predicted, measured, ratio, inside in rows:
    print(
      f"| {part} | {name} | {subject} | {predicted:.4g} | {measured:.4g} | {ratio:.2f} | "
      f"{'-' if inside is None else inside} |"
    )


# The predictions benchmarks/RESULTS.md shows, per GPU side by side: the Pallas quantizers, cuDNN attention and each
# mode's device time per step (the JSONs also hold the XLA-path quantizers and step memory).
TABLE_GPUS = ("h100", "h200")


def _shown(metric):
  return metric["unit"] == "ms" and (metric["part"] != "quantize" or metric["subject"].endswith("[pallas]"))


def predictions_table(directory=PREDICTIONS, gpus=TABLE_GPUS):
  """RESULTS.md's table of the predictions in `directory`: one row per shown metric, one column per GPU."""
  files = [json.loads((pathlib.Path(directory) / f"{g}.json").read_text(encoding="utf-8")) for g in gpus]
  columns = [{(m["part"], m["name"], m["subject"]): m["value"] for m in f["metrics"] if _shown(m)} for f in files]
  lines = [f"| part | metric | subject | {' | '.join(f'{g}-1' for g in gpus)} |", "|---|---|---|" + "---:|" * len(gpus)]
  for part, name, subject in columns[0]:
    digits = 1 if part.startswith("throughput") else 3
    values = " | ".join(f"{c[(part, name, subject)]:.{digits}f}" for c in columns)
    lines.append(f"| {part} | {name} (ms) | {subject} | {values} |")
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--json", help="write the rows and the fit here")
  parser.add_argument("--quantizers-only", action="store_true", help="only the quantizer rows (no step compiles)")
  parser.add_argument("--predict-gpu-bench", metavar="GPU", help="write every gpu-bench configuration's prediction")
  parser.add_argument("--score", nargs=2, metavar=("MEASURED_DIR", "PREDICTIONS"), help="measured vs predicted")
  parser.add_argument("--predictions-table", action="store_true", help="print RESULTS.md's table of the predictions")
  args = parser.parse_args(argv)
  if args.predictions_table:
    print("\n".join(predictions_table()))
    return 0
  if args.score:
    rows = score(*args.score)
    print_score(rows) if rows else print(f"no predictions in {args.score[1]} for the GPU of {args.score[0]}")
    return 0
  if args.predict_gpu_bench:
    out = predict_gpu_bench(args.predict_gpu_bench)
    path = pathlib.Path(args.json or PREDICTIONS / f"{args.predict_gpu_bench}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"predictions: {path}")
    return 0
  gpu = targets.GPUS["h100"]
  out = {"quantizers": quantizer_rows(gpu, roofline.DEFAULT)}
  print_quantizers(out["quantizers"])
  if not args.quantizers_only:
    rows = measured_rows()
    kernels, memory = {}, {}
    for label, path, overrides, *_ in rows:
      print(f"compiling {label} for h100-1 ...", flush=True)
      step = compiled(path, overrides)
      kernels[label], memory[label] = step.kernels, step.memory["peak_bytes"]
    m8, m1 = rows[0][3], next(row[3] for row in rows if row[0] == "1B-like bf16")
    fitted = fit(kernels["8B-layer bf16"], m8, kernels["1B-like bf16"], m1, gpu)
    print(
      f"\nfit: gemm {fitted.gemm:.4f}, memory {fitted.memory:.4f}, attention {fitted.attention:.4f}, "
      f"attention_score_ns {fitted.attention_score_ns:.6f} (roofline.DEFAULT: gemm {roofline.DEFAULT.gemm}, memory "
      f"{roofline.DEFAULT.memory}, attention {roofline.DEFAULT.attention}, attention_score_ns "
      f"{roofline.DEFAULT.attention_score_ns})"
    )
    out["fit"] = dataclasses.asdict(fitted)
    out["rows"] = step_rows(rows, kernels, memory, gpu, roofline.DEFAULT)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main())
