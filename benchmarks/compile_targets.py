"""The published NVFP4 benchmark's four setups compiled with our presets (configs/gb200, configs/gb300): FP8 current
scaling and NVFP4 with the same parallelism and batch, each step compiled for its GPUs by train_compile and
estimated by its model (MaxText/aot/roofline.py), beside the published per-GPU model TFLOP/s and their NVFP4/FP8
ratio. Every figure of ours is a compiled estimate for its target (deviceless, on this machine), never a measurement.

    scripts/te/python.sh benchmarks/compile_targets.py [--only SUBSTRING] [--candidates] [--keep DIR] [--json out.json]
    python benchmarks/compile_targets.py --from-json out.json        (the tables again, compiling nothing)
    scripts/te/python.sh benchmarks/compile_targets.py --reestimate out.json   (the kept programs, today's model)

Published (NVIDIA technical blog "Train Models Faster with JAX and MaxText Using NVFP4 on NVIDIA Blackwell", 2026;
Llama 3 8B and Llama 3.1 405B at sequence 8,192, FP8 and NVFP4 at the same parallelism and batch): per-GPU model
TFLOP/s, FP8 -> NVFP4. `--candidates` also compiles each setup's alternative presets in NVFP4 (the remat policy,
batch per GPU, vocabulary tiling the estimate chose among), the table that chose the preset. `--keep DIR` keeps each
step's optimized HLO and the compiler's dump there, so `--reestimate` can cost them again with the model as it is
now without compiling. Each row is its own process (memory freed between rows).
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import provenance  # noqa: E402

GIB = 2**30
SOURCE = (
  "NVIDIA technical blog 'Train Models Faster with JAX and MaxText Using NVFP4 on NVIDIA Blackwell' (2026): "
  "per-GPU model TFLOP/s, FP8 and NVFP4 at the same parallelism and batch, sequence 8,192"
)
# (model, GPU): published FP8 and NVFP4 model TFLOP/s per GPU.
PUBLISHED = {
  ("Llama 3 8B", "gb200"): (1497, 2017),
  ("Llama 3 8B", "gb300"): (1759, 2301),
  ("Llama 3.1 405B", "gb200"): (1557, 2241),
  ("Llama 3.1 405B", "gb300"): (2103, 3633),
}
TWO_DOMAINS = ["compile_topology_num_slices=2"]
# (model, GPU, preset stem, target args, {candidate: overrides on the preset})
SETUPS = [
  (
    "Llama 3 8B",
    "gb200",
    "configs/gb200/llama3_8b",
    ["compile_topology=gb200-4"],
    {
      "batch 2": ["per_device_batch_size=2"],
      "batch 4, remat minimal": ["per_device_batch_size=4", "remat_policy=minimal"],
    },
  ),
  (
    "Llama 3 8B",
    "gb300",
    "configs/gb300/llama3_8b",
    ["compile_topology=gb300-4"],
    {"batch 5, remat minimal": ["per_device_batch_size=5", "remat_policy=minimal"]},
  ),
  (
    "Llama 3.1 405B",
    "gb200",
    "configs/gb200/llama3.1_405b",
    ["compile_topology=gb200-64", *TWO_DOMAINS],
    {"batch 2": ["per_device_batch_size=2"]},
  ),
  (
    "Llama 3.1 405B",
    "gb300",
    "configs/gb300/llama3.1_405b",
    ["compile_topology=gb300-64", *TWO_DOMAINS],
    {"batch 1": ["per_device_batch_size=1"]},
  ),
]
MODES = {"fp8": "_fp8.yml", "nvfp4": "_nvfp4.yml"}


def rows(only=None, candidates=False):
  """[(model, gpu, mode, candidate name or 'preset', config, target args, overrides)] to compile."""
  out = []
  for model, gpu, stem, target, alternatives in SETUPS:
    for mode, suffix in MODES.items():
      out.append((model, gpu, mode, "preset", stem + suffix, target, []))
    for name, overrides in alternatives.items() if candidates else ():
      out.append((model, gpu, "nvfp4", name, stem + MODES["nvfp4"], target, overrides))
  text = lambda row: " ".join([row[0], row[1], row[2], row[3], row[4]])
  return [row for row in out if only is None or only in text(row)]


def compile_row(config, target, overrides, keep=None):
  """(the report as dict or None, the error line or None, seconds) of one row, in its own process; with `keep` (a
  directory) the step's optimized HLO and the compiler's dump are kept there."""
  with tempfile.TemporaryDirectory() as tmp:
    report = pathlib.Path(tmp) / "report.json"
    argv = [sys.executable, "-m", "MaxText.train_compile", config, *target, *overrides]  # cwd: REPO
    env = dict(os.environ)
    if keep:
      pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
      argv.append(f"compile_hlo={pathlib.Path(keep) / 'step.hlo'}")
      env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={pathlib.Path(keep) / 'dump'}".strip()
    start = time.perf_counter()
    done = subprocess.run([*argv, f"compile_report={report}"], cwd=REPO, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    lines = done.stderr.splitlines()
    error = next((line for line in lines if line.startswith("error:")), None)
    error = error or next((line.strip()[:200] for line in lines if re.match(r"\s*\w+(Error|Exception): ", line)), None)
    if done.returncode not in (0, 2) or not report.exists():
      return None, error or (lines[-1][:200] if lines else f"exit code {done.returncode}"), seconds
    return json.loads(report.read_text(encoding="utf-8")), error, seconds


def _tflops(report):
  """(point, low, high) model TFLOP/s per GPU of a report's estimate."""
  est = report["estimate"]
  low, high = est["model_tflops_range"]
  return est["model_tflops_per_s_per_device"], low, high


def setup_table(records):
  """One row per compiled step: memory, the estimate (range), collectives exposed / hidden, ours vs published."""
  print(
    "| model | GPUs | mode | preset | peak GiB/GPU (of available) | step ms (range) | collectives ms: exposed / "
    "hidden | model TFLOP/s/GPU (range) | published | ours / published |"
  )
  print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
  for r in records:
    rep = r["report"]
    if rep is None:
      print(f"| {r['model']} | {r['gpu']} | {r['mode']} | {r['candidate']} | failed: {r['error']} | | | | | |")
      continue
    mem, est = rep["memory"], rep["estimate"]
    ms = est["ms_per_step"]
    point, low, high = _tflops(rep)
    published = PUBLISHED[(r["model"], r["gpu"])][0 if r["mode"] == "fp8" else 1]
    fits = "" if rep["fits"] else " **over**"
    print(
      f"| {r['model']} | {rep['target']} | {r['mode']} | {r['candidate']} | {mem['peak_bytes'] / GIB:.1f}{fits} "
      f"({mem['available_bytes'] / GIB:.0f}) | {ms['total']:.0f} ({est['range_ms']['low']:.0f} - "
      f"{est['range_ms']['high']:.0f}) | {ms['collectives_exposed']:.0f} / {ms['collectives_hidden']:.0f} | "
      f"{point:,.0f} ({low:,.0f} - {high:,.0f}) | {published:,} | {point / published:.2f} |"
    )


# How close an NVFP4 / FP8 ratio of ours must come to the published one to count as reproduced.
RATIO_TOLERANCE = 0.10


def ratio_table(records):
  """Per setup: each mode's model TFLOP/s per GPU (range) beside the published, and our NVFP4 / FP8 ratio (each
  scenario's own pair: point, the range's ends) beside the published ratio, within RATIO_TOLERANCE or not."""
  presets = {(r["model"], r["gpu"], r["mode"]): r["report"] for r in records if r["candidate"] == "preset"}
  print(
    "\n| setup | FP8: ours (range) / published | NVFP4: ours (range) / published | NVFP4 / FP8: ours (range) | "
    f"published | ours / published | within {RATIO_TOLERANCE:.0%} |"
  )
  print("|---|---:|---:|---:|---:|---:|---|")
  for (model, gpu), (fp8, nvfp4) in PUBLISHED.items():
    a, b = presets.get((model, gpu, "fp8")), presets.get((model, gpu, "nvfp4"))
    if not a or not b:
      continue
    ours = a["estimate"]["ms_per_step"]["total"] / b["estimate"]["ms_per_step"]["total"]
    ends = [a["estimate"]["range_ms"][e] / b["estimate"]["range_ms"][e] for e in ("low", "high")]
    tflops = lambda report, published: "{:,.0f} ({:,.0f} - {:,.0f}) / {:,}".format(*_tflops(report), published)
    versus = ours / (nvfp4 / fp8)
    within = "yes" if abs(versus - 1) <= RATIO_TOLERANCE else "**no**"
    print(
      f"| {model}, {a['num_devices']} {gpu.upper()} | {tflops(a, fp8)} | {tflops(b, nvfp4)} | {ours:.3f} "
      f"({min(ends):.3f} - {max(ends):.3f}) | {nvfp4 / fp8:.3f} | {versus:.3f} | {within} |"
    )


def reestimate(records):
  """The kept steps costed again by today's model (each record's `kept` directory: step.hlo and dump/)."""
  from MaxText import config as config_lib  # pylint: disable=import-outside-toplevel
  from MaxText.trainer import aot_step  # pylint: disable=import-outside-toplevel

  for r in records:
    if r["report"] is None or not r.get("kept"):
      continue
    cfg = config_lib.load(str(REPO / r["config"]), [*r["target"], *r["overrides"]])
    step = aot_step.from_saved(cfg, pathlib.Path(r["kept"]) / "step.hlo", pathlib.Path(r["kept"]) / "dump")
    r["report"]["estimate"] = step.estimate()
  return records


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--only", help="rows whose model, GPU, mode, candidate or config contains this")
  parser.add_argument("--candidates", action="store_true", help="also each setup's alternative presets (NVFP4)")
  parser.add_argument("--keep", help="keep each step's HLO and dump under this directory (for --reestimate)")
  parser.add_argument("--json", help="write every row's report here")
  parser.add_argument("--from-json", help="print the tables of a JSON this wrote, compiling nothing")
  parser.add_argument("--reestimate", help="a JSON this wrote with --keep: its steps costed again, tables printed")
  args = parser.parse_args(argv)
  if args.from_json or args.reestimate:
    records = json.loads(pathlib.Path(args.from_json or args.reestimate).read_text(encoding="utf-8"))["records"]
    records = reestimate(records) if args.reestimate else records
  else:
    commit = provenance.commit(mark_dirty=True)
    print(f"train_compile of commit {commit}: compiled estimates for each target; published: {SOURCE}", flush=True)
    records = []
    for number, (model, gpu, mode, candidate, config, target, overrides) in enumerate(rows(args.only, args.candidates)):
      keep = str(pathlib.Path(args.keep) / f"{number:02d}") if args.keep else None
      report, error, seconds = compile_row(config, target, overrides, keep)
      record = dict(model=model, gpu=gpu, mode=mode, candidate=candidate, config=config, target=target)
      records.append({**record, "overrides": overrides, "report": report, "error": error, "kept": keep})
      records[-1]["compile_wall_seconds"] = round(seconds, 1)
      print(f"  compiled {model} {gpu} {mode} {candidate} ({seconds:.0f} s)", file=sys.stderr, flush=True)
      if args.json:
        out = {"commit": commit, "published": SOURCE, "records": records}
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
  setup_table(records)
  ratio_table(records)
  if args.json and args.reestimate:
    out = {"commit": provenance.commit(mark_dirty=True), "published": SOURCE, "records": records}
    pathlib.Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main())
