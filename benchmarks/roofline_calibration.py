"""The roofline's calibration (MaxText/aot/roofline.py) against one H100's measurements of 2026-11-27
(benchmarks/results/h100-2026-11-27/): each measured configuration compiled for h100-1 (deviceless, on any machine),
the achievable shares fitted once, then every measured row beside its compiled estimate.

    scripts/te/python.sh benchmarks/roofline_calibration.py [--fit-only] [--json out.json]

(jax's CUDA plugin needed: .venv-te from `make te`.) The fit: HBM share from the 8B-layer bf16 step's elementwise
time (its kernels' bytes over that time), then the GEMM share from its GEMM time, then attention's two constants (its
FLOP share and a cost per attention score) from the 8B-layer (head dim 128) and 1B-like (head dim 64) bf16 steps'
attention times. Everything else is a check: the 8B-layer step's total (296.5 ms measured), remat_policy=full, the
quantized rows, the 1B-like rows (GEMM and elementwise from the 8B fit alone), and cuDNN attention alone
(attention bench). It prints the fitted constants and whether roofline.DEFAULT holds them, and each row's step
memory as the H100 measured it (XLA's analysis of the executable it ran) beside the compiled figure.
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

from MaxText import config  # noqa: E402
from MaxText.aot import devices as aot_devices, hlo, roofline, targets  # noqa: E402
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
    ("8B-layer bf16", BENCH_8B, ["quantization_kernels=xla"], _categories(categories.values()), total_8b, memory_8b)
  )
  for row in _read("throughput-8b-remat-full.json")["rows"]:
    rows.append(
      (
        f"8B-layer {row['mode']} remat=full",
        BENCH_8B,
        ["remat_policy=full", *MODES[row["mode"]]],
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
        ["quantization_kernels=xla", *MODES[row["mode"]]],
        table_1b.get(row["mode"]),
        row["device_ms_per_step"],
        row["peak_memory_bytes"],
      )
    )
  return rows


def compiled(config_path, overrides):
  """The step compiled for h100-1 (aot_step.CompiledStep)."""
  cfg = config.load(config_path, overrides)
  return aot_step.compile_for_target(cfg, targets.parse("h100-1"))


def attention_alone_kernels():
  """cuDNN causal attention forward + backward of one layer at the 8B-layer shape (the attention bench's 'cudnn')."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  devices = aot_devices.for_target(targets.parse("h100-1"))
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


QUANTIZE_ELEMENTS = 8192 * 16384  # the quantize part's operand ([8192, 16384])
# Each measured Pallas quantizer ([pallas] rows of quantize_quantize.json): (its amax kernel or None, its quantize
# kernel, bytes per element of its input). Kernel names as pallas_quantize.py gives them.
QUANTIZER_KERNELS = {
  "nvfp4 1x16 (x)": ("quantize_amax", "quantize_nvfp4", 2),
  "nvfp4 1x16 SR (dy)": ("quantize_amax", "quantize_nvfp4_sr", 2),
  "nvfp4 16x16 (w, f32)": ("quantize_amax", "quantize_nvfp4_16x16", 4),
  "nvfp4 RHT (x_t)": ("quantize_amax_rht", "quantize_nvfp4_rht", 2),
  "nvfp4 RHT+SR (dy_t)": ("quantize_amax_rht", "quantize_nvfp4_rht_sr", 2),
  "fp8 current (x)": ("quantize_amax", "quantize_fp8_e4m3", 2),
  "mxfp8 (x)": (None, "quantize_mx_e4m3", 2),
  "mxfp4 (x)": (None, "quantize_mx_e2m1", 2),
}
FOUR_OVER_SIX = " + 4/6"  # quantize_bench's rows with Four Over Six (mse) on every operand
SAME_WORK = {  # kernels the bench didn't time, costed as the one that does the same work
  "quantize_fp8_e5m2": "quantize_fp8_e4m3",
  **{
    f"{name}_4over6_mae": f"{name}_4over6_mse"
    for name in (
      "quantize_nvfp4",
      "quantize_nvfp4_sr",
      "quantize_nvfp4_16x16",
      "quantize_nvfp4_rht",
      "quantize_nvfp4_rht_sr",
    )
  },
}


def fit_quantizers(times_ms, gpu, calibration):
  """{kernel: ns per element} from the H100's per-quantizer times ({bench row: ms}). A quantizer is an amax kernel
  (max |x|: memory-bound, its bytes' time) then its quantize kernel, whose time is the rest; the RHT's butterfly,
  which both kernels of an RHT quantizer run, costs each half of what the RHT quantizer takes beyond the plain one
  (the only split the totals allow). The 4/6 rows' kernels follow the same way."""
  bandwidth = gpu.memory_bandwidth * calibration.memory

  def amax_ms(name, in_bytes):
    return QUANTIZE_ELEMENTS * in_bytes / bandwidth * 1e3 if name else 0.0

  butterfly_ms = (times_ms["nvfp4 RHT (x_t)"] - times_ms["nvfp4 1x16 (x)"]) / 2
  kernel_ms = {"quantize_amax_rht": amax_ms("quantize_amax", 2) + butterfly_ms}
  for row, (amax, quantize, in_bytes) in QUANTIZER_KERNELS.items():
    before = kernel_ms.get(amax, amax_ms(amax, in_bytes))
    kernel_ms[quantize] = times_ms[row] - before
    if row + FOUR_OVER_SIX in times_ms:
      kernel_ms[quantize + "_4over6_mse"] = times_ms[row + FOUR_OVER_SIX] - before
  for name, same in SAME_WORK.items():
    kernel_ms[name] = kernel_ms[same]
  return {name: round(ms * 1e6 / QUANTIZE_ELEMENTS, 8) for name, ms in sorted(kernel_ms.items())}


def measured_quantizer_ms():
  """{bench row: ms} of the Pallas quantizers the H100 timed (quantize part)."""
  suffix = " [pallas]"
  metrics = _read("quantize_quantize.json")["metrics"]
  return {
    m["subject"][: -len(suffix)]: m["value"] for m in metrics if m["name"] == "time" and m["subject"].endswith(suffix)
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--json", help="write the rows and the fit here")
  args = parser.parse_args(argv)
  gpu = targets.GPUS["h100"]
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
  out = []
  print(
    "\n| row (H100, measured 2026-11-27) | measured ms: gemm / elementwise / attention / total | estimate ms "
    "| est/meas | step memory, measured / compiled (bytes) |"
  )
  print("|---|---|---|---|---|")
  for label, _, _, meas, total, measured_memory in rows:
    est = by_category(kernels[label], gpu, roofline.DEFAULT)
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
  alone_ms = by_category(alone, gpu, roofline.DEFAULT)["attention"]
  bench = next(m["value"] for m in _read("attention_attention.json")["metrics"] if m["subject"] == "cudnn")
  print(f"| cuDNN attention alone, one 8B layer fwd+bwd | {bench:.2f} | {alone_ms:.2f} | {alone_ms / bench:.2f} | |")
  out.append({"row": "cudnn attention alone", "measured_total_ms": bench, "estimate_total_ms": alone_ms})
  if args.json:
    pathlib.Path(args.json).write_text(
      json.dumps({"fit": dataclasses.asdict(fitted), "rows": out}, indent=1) + "\n", encoding="utf-8"
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
