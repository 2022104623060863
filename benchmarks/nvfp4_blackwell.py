"""NVFP4 on Blackwell, compiled: Llama 3 8B on 8 GB200s (fsdp 8, 2 x 8192 tokens per GPU, cuDNN attention), every
mode's train step compiled on the whole mesh by train_compile and estimated by its model (MaxText/aot/roofline.py:
every kernel by its bytes or its instructions -- the PTX XLA emits --, the step as scheduled, collectives exposed or
hidden, a range where a constant is uncertain). Every figure is a compiled estimate for gb200-8, never a measurement.

    scripts/te/python.sh benchmarks/nvfp4_blackwell.py [--modes NAME,...] [--keep DIR] [--json out.json]
    python benchmarks/nvfp4_blackwell.py --from-json out.json     (the tables again, compiling nothing)
    scripts/te/python.sh benchmarks/nvfp4_blackwell.py --reestimate out.json [--json new.json]
                                                   (the steps --keep kept, costed by the model as it is now)

Modes: bf16; FP8 current scaling on every Dense layer (Transformer Engine's, named: `auto` may take another); our
te_nvfp4 on every Dense layer (`quantization_backend=xla`: the Pallas quantizers writing E2M1 + E4M3 codes, cuDNN's
block-scaled FP4 dot); the seeds' recipe (ours on the MLP GEMMs, Transformer Engine's FP8 on the attention
projections); Transformer Engine's own te_nvfp4 on every Dense layer, the peer. Tables: each mode's step (point and
range), against bf16 and against FP8, model TFLOP/s per GPU, GEMM, non-GEMM and collective time (exposed / hidden);
then every quantization kernel of the NVFP4 modes with its instructions and bytes per element and what bounds it on
a GB200 (a Transformer Engine kernel, whose code is not read, by its bytes: a lower bound); then the goals (ours
all-dense >= 1.15x FP8's speed, the seeds' recipe >= 1.5x bf16's).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import provenance  # noqa: E402

GIB = 2**30
STEP = [
  "configs/llama3_8b.yml",
  "compile_topology=gb200-8",
  "ici_fsdp_parallelism=8",
  "dcn_data_parallelism=1",
  "per_device_batch_size=2",
  "max_target_length=8192",
  "attention=cudnn_flash",
]
ALL_DENSE = ["quantization_scope=all_dense"]
FP8 = "te_fp8_currentscaling all-dense"
OURS = "te_nvfp4 all-dense"
SEEDS = "seeds' recipe"
MODES = {
  "bf16": ["quantization="],
  FP8: ["quantization=te_fp8_currentscaling", *ALL_DENSE, "quantization_backend=te"],
  OURS: ["quantization=te_nvfp4", *ALL_DENSE, "quantization_backend=xla"],
  SEEDS: [
    "quantization=te_nvfp4",
    "quantization_backend=xla",
    "attention_quantization=te_fp8_currentscaling",
    "attention_quantization_backend=auto",
  ],
  "peer: TE te_nvfp4 all-dense": ["quantization=te_nvfp4", *ALL_DENSE, "quantization_backend=te"],
}
GOALS = ((OURS, FP8, 1.15), (SEEDS, "bf16", 1.5))  # (mode, against, speed ratio it should reach)


def label(k):
  """A quantization kernel's group name (a Pallas kernel's name, a Transformer Engine kernel's FFI target and site,
  XLA's quantizer fusions by site and kind), or None for a kernel that is not quantization's."""
  if k.category != "elementwise":
    return None
  if k.kind == "pallas":
    return k.pallas_name or "pallas"
  text = f"{k.scope} {k.target}".lower()
  if k.kind != "te_kernel" and not any(w in text for w in ("quantiz", "amax", "nvfp4", "e2m1", "e4m3", "threefry")):
    return None
  parts = [p for p in k.scope.split("/") if p and not p.startswith(("jit(", "while", "body", "cond", "checkpoint"))]
  site = next((p for p in parts if p in ("mlpwi_0", "mlpwi_1", "mlpwo", "query_proj", "key_proj", "value_proj",
                                         "out_proj")), "")  # fmt: skip
  what = k.target if k.kind == "te_kernel" else f"xla {parts[-1] if parts else k.kind}"
  return f"{what} ({site})" if site else what


def child(overrides, out, keep=""):
  """Compiles the step with `overrides` (its own process) and writes train_compile's report with the quantization
  kernels' rows; `keep`: a directory to keep the step's optimized HLO and the compiler's dump in."""
  if "JAX_PLATFORMS" not in os.environ and not os.path.exists("/dev/nvidiactl"):
    os.environ["JAX_PLATFORMS"] = "cpu"  # as train_compile: the target's devices are compile-only
  if keep:  # before jax starts: the dump stays where --reestimate finds it
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={keep}/dump".strip()
  from MaxText import config as config_lib, train_compile  # pylint: disable=import-outside-toplevel
  from MaxText.aot import roofline  # pylint: disable=import-outside-toplevel

  cfg = config_lib.load(str(REPO / STEP[0]), [*STEP[1:], *overrides])
  step, rep = train_compile.compile_and_report(cfg)
  rep["quantization_kernels"] = roofline.quantizer_kernels(step.kernels, step.gpu, label=label)
  if keep:
    pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(keep) / "step.hlo").write_text(step.hlo_text, encoding="utf-8")
  pathlib.Path(out).write_text(json.dumps(rep) + "\n", encoding="utf-8")


def reestimate(record):
  """The kept steps of a record costed again by the model as it is now: each report's estimate and kernel rows."""
  from MaxText import config as config_lib  # pylint: disable=import-outside-toplevel
  from MaxText.aot import roofline  # pylint: disable=import-outside-toplevel
  from MaxText.trainer import aot_step  # pylint: disable=import-outside-toplevel

  for mode, rep in record["reports"].items():
    keep = record.get("kept", {}).get(mode)
    if isinstance(rep, str) or not keep:
      continue
    cfg = config_lib.load(str(REPO / STEP[0]), [*STEP[1:], *record["modes"][mode]])
    step = aot_step.from_saved(cfg, pathlib.Path(keep) / "step.hlo", pathlib.Path(keep) / "dump")
    rep["estimate"] = step.estimate()
    rep["quantization_kernels"] = roofline.quantizer_kernels(step.kernels, step.gpu, label=label)
  return record


def compile_mode(overrides, keep=""):
  """The child's report (dict), or its error line."""
  with tempfile.TemporaryDirectory() as tmp:
    out = pathlib.Path(tmp) / "r.json"
    argv = [sys.executable, __file__, "--child", str(out), keep, *overrides]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False, env=dict(os.environ))
    if not out.exists():
      lines = [line for line in done.stderr.splitlines() if line.strip()]
      return next((line for line in lines if line.startswith("error:")), lines[-1][:300] if lines else "failed")
    return json.loads(out.read_text(encoding="utf-8"))


def _total(rep):
  return rep["estimate"]["ms_per_step"]["total"]


def step_table(reports):
  """Each mode's step: point and range, against bf16 and FP8, model TFLOP/s per GPU, its parts and peak memory."""
  print(
    "| mode (backend) | step ms (range) | vs bf16 | vs FP8 | model TFLOP/s/GPU (range) | GEMM ms | non-GEMM ms | "
    "collectives ms: exposed / hidden | peak GiB/GPU |"
  )
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
  base, fp8 = reports.get("bf16"), reports.get(FP8)
  for mode, rep in reports.items():
    if isinstance(rep, str):
      print(f"| {mode} | failed: {rep} | | | | | | | |")
      continue
    est, ms = rep["estimate"], rep["estimate"]["ms_per_step"]
    ratio = lambda other: f"{_total(other) / ms['total']:.3f}x" if isinstance(other, dict) else "-"
    low, high = est["model_tflops_range"]
    backend = ", ".join(f"{r}: {b}" for r, b in rep["backends"].items()) or "bf16"
    print(
      f"| {mode} ({backend}) | {ms['total']:.1f} ({est['range_ms']['low']:.1f} - {est['range_ms']['high']:.1f}) | "
      f"{ratio(base)} | {ratio(fp8)} | {est['model_tflops_per_s_per_device']:,.0f} ({low:,.0f} - {high:,.0f}) | "
      f"{ms['gemm']:.1f} | {ms['total'] - ms['gemm']:.1f} | {ms['collectives_exposed']:.1f} / "
      f"{ms['collectives_hidden']:.1f} | {rep['memory']['peak_bytes'] / GIB:.1f} |",
      flush=True,
    )


def kernel_table(reports):
  """The NVFP4 modes' quantization kernels: per element read, instructions and bytes, and what bounds each."""
  print(
    "\n| mode | kernel | runs/step | instructions/element (pipe) | bytes/element | instructions ms | bytes ms | "
    "bound | byte-bound at <= instructions/element |"
  )
  print("|---|---|---:|---:|---:|---:|---:|---|---:|")
  for mode, rep in reports.items():
    if isinstance(rep, str) or "nvfp4" not in mode and mode != SEEDS:
      continue
    rows = sorted(
      rep["quantization_kernels"].items(), key=lambda kv: -max(kv[1]["instructions_ms"] or 0, kv[1]["bytes_ms"])
    )
    for name, row in rows:
      per = row["instructions_per_element"]
      print(
        f"| {mode} | {name} | {row['runs_per_step']:g} | "
        + (f"{per:.1f} ({row['bound_by']})" if per is not None else "not read")
        + f" | {row['bytes_per_element']:.2f} | "
        + (f"{row['instructions_ms']:.1f}" if per is not None else "-")
        + f" | {row['bytes_ms']:.1f} | {row['bound']} | "
        + (f"{row['byte_bound_at_instructions_per_element']:.1f}" if per is not None else "-")
        + " |"
      )


def goals(reports):
  for mode, against, target in GOALS:
    a, b = reports.get(mode), reports.get(against)
    if isinstance(a, dict) and isinstance(b, dict):
      ratio = _total(b) / _total(a)
      print(f"goal: {mode} at >= {target}x {against}'s speed: {ratio:.3f}x ({'met' if ratio >= target else 'not met'})")


def tables(reports):
  print("\n### Llama 3 8B, 8 x GB200 (fsdp 8, 2 x 8192 tokens/GPU): compiled estimates for gb200-8, not measurements")
  step_table(reports)
  kernel_table(reports)
  goals(reports)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if argv and argv[0] == "--child":
    return child(argv[3:], argv[1], argv[2])
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--modes", help="comma-separated mode names to compile (default: all)")
  parser.add_argument("--json", help="write every report here")
  parser.add_argument("--from-json", help="print the tables of a JSON this wrote, compiling nothing")
  parser.add_argument("--keep", help="keep each mode's optimized HLO and the compiler's dump under this directory")
  parser.add_argument("--reestimate", help="a JSON this wrote with --keep: its steps costed by today's model")
  args = parser.parse_args(argv)
  if args.from_json or args.reestimate:
    record = json.loads(pathlib.Path(args.from_json or args.reestimate).read_text(encoding="utf-8"))
    if args.reestimate:
      record = {**reestimate(record), "estimated_at": provenance.commit(mark_dirty=True)}
      if args.json:
        pathlib.Path(args.json).write_text(json.dumps(record) + "\n", encoding="utf-8")
    tables(record["reports"])
    return 0
  commit = provenance.commit(mark_dirty=True)
  print(f"benchmarks/nvfp4_blackwell.py at commit {commit}: train_compile's estimate, {' '.join(STEP)}")
  reports, kept = {}, {}
  for number, (mode, overrides) in enumerate(MODES.items()):
    if args.modes is None or mode in args.modes.split(","):
      kept[mode] = str(pathlib.Path(args.keep).resolve() / f"{number}") if args.keep else ""
      reports[mode] = compile_mode(overrides, kept[mode])
      print(f"  compiled {mode}", file=sys.stderr, flush=True)
      if args.json:
        record = {"commit": commit, "step": STEP, "modes": MODES, "reports": reports, "kept": kept}
        pathlib.Path(args.json).write_text(json.dumps(record) + "\n", encoding="utf-8")
  tables(reports)
  return 0


if __name__ == "__main__":
  sys.exit(main())
