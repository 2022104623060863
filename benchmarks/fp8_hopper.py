"""FP8 on Hopper, compiled: the 8B-layer bench config's train step for h100-1 in bf16, FP8 delayed scaling
(MaxText's `fp8`) and FP8 current scaling on every Dense layer; the step estimate, the speed against bf16 and the 1.3x
goal, where the time goes (GEMMs, the quantizers' extra elementwise time and bytes), the ratio with quantization for
free, and the kernels that hold the ratio back. Every figure is train_compile's roofline estimate of the program
compiled for h100-1 (deviceless, on this machine; calibrated on the H100 of 11-27), never a measurement.

    scripts/te/python.sh benchmarks/fp8_hopper.py [--ref COMMIT] [--modes bf16,fp8,...] [--top N] [--json out.json]

--ref compiles the same rows from COMMIT's tree too (git archive into a temporary directory), so a change's before
and after come from one run. Each row is its own `python -m MaxText.train_compile` process (memory freed between).
"""

import argparse
import collections
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import provenance  # noqa: E402
from MaxText.aot import hlo, roofline, targets  # noqa: E402

CONFIG = "configs/bench/llama3_8b_4layers_seq8192.yml"
TARGET = "h100-1"
GOAL = 1.3  # the goal: FP8 current and delayed scaling on every Dense layer >= 1.3x the BF16 step's speed
ALL_DENSE = "quantization_scope=all_dense"
MODES = {
  "bf16": ["quantization="],
  "fp8": ["quantization=fp8"],  # MaxText's: te_fp8_delayedscaling on every Dense layer, our emulated backend
  "fp8_current": ["quantization=te_fp8_currentscaling", ALL_DENSE, "quantization_backend=emulate"],
  "te_fp8_current": ["quantization=te_fp8_currentscaling", ALL_DENSE, "quantization_backend=te"],
}
GIB = 2**30


def compile_mode(tree, overrides, tmp):
  """(train_compile's report, the optimized HLO text) of one mode compiled from `tree`, or (None, error line)."""
  report, text = pathlib.Path(tmp) / "report.json", pathlib.Path(tmp) / "step.hlo"
  argv = [sys.executable, "-m", "MaxText.train_compile", CONFIG, f"compile_topology={TARGET}", *overrides]
  done = subprocess.run(
    [*argv, f"compile_report={report}", f"compile_hlo={text}"], cwd=tree, capture_output=True, text=True, check=False
  )
  if done.returncode != 0 or not report.exists():
    lines = done.stderr.strip().splitlines()
    error = next((ln for ln in lines if ln.startswith("error:") or re.match(r"\w+(Error|Exception): ", ln)), None)
    return None, (error or (lines[-1] if lines else f"exit code {done.returncode}"))[:200]
  return json.loads(report.read_text(encoding="utf-8")), text.read_text(encoding="utf-8")


def _group(scope):
  """A kernel's jax op path without the jit / scan / cond wrappers and numeric suffixes: one name per kind of kernel
  in every layer."""
  scope = re.sub(r"jit\(\w+\)/|while/body/closed_call/|while/body/|cond/branch_\d+_fun/|checkpoint/", "", scope)
  return re.sub(r"\.\d+", "", scope)[:120]


def kernel_groups(text, gpu):
  """{(category, kind or '', op path): [ms per step, GB per step, kernels per step]} of a compiled step."""
  groups = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
  for k in hlo.kernels(hlo.parse(text)):
    g = groups[(k.category, k.kind if k.category == "gemm" else "", _group(k.scope))]
    g[0] += roofline.kernel_seconds(k, gpu) * k.count * 1e3
    g[1] += k.bytes * k.count / 1e9
    g[2] += k.count
  return dict(groups)


def summarize(report, groups):
  """The row's figures: the report's estimate and memory, and the elementwise GB from the kernels."""
  ms = report["estimate"]["ms_per_step"]
  elementwise_gb = sum(v[1] for (cat, _, _), v in groups.items() if cat == "elementwise")
  return {
    "ms": ms,
    "elementwise_gb": elementwise_gb,
    "peak_gib": report["memory"]["peak_bytes"] / GIB,
    "gemms": report["gemms"],
    "backends": report["backends"],
  }


def held_back(groups, bf16_groups, top):
  """The elementwise kernel groups that cost most over bf16's (ms, GB, op path), largest first."""
  rows = []
  for key, (ms, gb, _) in groups.items():
    if key[0] != "elementwise":
      continue
    base = bf16_groups.get(key, [0.0, 0.0, 0.0])
    rows.append((ms - base[0], gb - base[1], key[2] or "(no op path)"))
  return sorted(rows, reverse=True)[:top]


HEADER = (
  "| tree | mode (backend) | step ms | speed vs bf16 (goal 1.3x) | GEMM ms | elementwise ms | quantization's extra "
  "elementwise ms / GB | speed with quantization free | peak GiB |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
)


def table_row(tree_name, mode, row, bf16):
  if "error" in row:
    return f"| {tree_name} | {mode} | failed: {row['error']} | | | | | | |"
  ms, base = row["ms"], bf16["ms"]
  extra_ms = ms["elementwise"] - base["elementwise"]
  extra_gb = row["elementwise_gb"] - bf16["elementwise_gb"]
  free = base["total"] / (ms["total"] - extra_ms)
  backend = ", ".join(row["backends"].values()) or "bf16"
  return (
    f"| {tree_name} | {mode} ({backend}) | {ms['total']:.1f} | {base['total'] / ms['total']:.3f}x | {ms['gemm']:.1f} | "
    f"{ms['elementwise']:.1f} | {extra_ms:+.1f} / {extra_gb:+.1f} | {free:.3f}x | {row['peak_gib']:.1f} |"
  )


def run_tree(tree, modes, top):
  """{mode: row} of every mode compiled from `tree`, each quantized row with the kernels that hold it back."""
  gpu = targets.parse(TARGET).gpu
  rows, bf16_groups = {}, {}
  for mode in ["bf16", *[m for m in modes if m != "bf16"]]:
    with tempfile.TemporaryDirectory() as tmp:
      start = time.perf_counter()
      report, text = compile_mode(tree, MODES[mode], tmp)
      if report is None:
        rows[mode] = {"error": text}
        continue
      groups = kernel_groups(text, gpu)
    rows[mode] = summarize(report, groups)
    rows[mode]["compile_seconds"] = round(time.perf_counter() - start, 1)
    if mode == "bf16":
      bf16_groups = groups
    else:
      rows[mode]["held_back"] = held_back(groups, bf16_groups, top)
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--ref", help="also compile this commit's tree (before / after in one run)")
  parser.add_argument("--modes", default="bf16,fp8,fp8_current", help=f"of {', '.join(MODES)}")
  parser.add_argument("--top", type=int, default=8, help="kernel groups listed per quantized mode")
  parser.add_argument("--json", help="write every row here")
  args = parser.parse_args(argv)
  modes = args.modes.split(",")
  unknown = [m for m in modes if m not in MODES]
  if unknown:
    print(f"error: --modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}", file=sys.stderr)
    return 2
  trees = {}
  with tempfile.TemporaryDirectory() as ref_dir:
    if args.ref:
      archive = subprocess.run(["git", "-C", str(REPO), "archive", args.ref], capture_output=True, check=False)
      if archive.returncode != 0:
        print(f"error: --ref {args.ref}: {archive.stderr.decode().strip()[:200]}", file=sys.stderr)
        return 2
      subprocess.run(["tar", "-x", "-C", ref_dir], input=archive.stdout, check=True)
      trees[f"{args.ref} (ref)"] = ref_dir
    trees[provenance.commit(mark_dirty=True)] = str(REPO)
    print(f"{CONFIG} compiled for {TARGET}: train_compile's roofline estimates (compiled, not measured)")
    results = {name: run_tree(tree, modes, args.top) for name, tree in trees.items()}
  print(HEADER)
  for name, rows in results.items():
    for mode, row in rows.items():
      print(table_row(name, mode, row, rows["bf16"]))
  for name, rows in results.items():
    for mode, row in rows.items():
      if "held_back" not in row:
        continue
      print(f"\n{name} {mode}: elementwise kernels over bf16's (ms, GB per step; op path)")
      for ms, gb, path in row["held_back"]:
        print(f"  {ms:+6.2f} ms {gb:+6.2f} GB  {path}")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main())
