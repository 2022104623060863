"""The bench configs and the project's target setups compiled for their GPUs, in bf16, FP8 and NVFP4: memory per
device, GEMMs by kind, collectives and the roofline estimate, one table. Every figure is a compiled estimate for its
target (train_compile: deviceless, on this machine), never a measurement.

    scripts/te/python.sh benchmarks/compile_targets.py [--only SUBSTRING] [--json out.json]

Rows: the two single-GPU bench configs on h100-1 and b200-1; Llama 3 8B on 8 GB200 and on 8 GB300 GPUs (the
configs/gb200|gb300 presets, two 4-GPU trays of one NVL72 domain, data parallel across them as submit.sh makes a
2-node job); Llama 3.1 405B on 128 GB300 GPUs (configs/gb300/llama3.1_405b_*.yml: 32 trays of 4, two NVL72 domains
of 64). Modes: bf16, FP8 (te_fp8_currentscaling) and te_nvfp4 with the backend the target takes (auto: Transformer
Engine where importable and supported), FP8 also emulated (XLA's own FP8 GEMMs), te_nvfp4 also on the xla backend
on Blackwell. A row whose step doesn't compile says why in one line (the compiler's or Python's error). Each row is
its own `python -m MaxText.train_compile` process (memory freed between rows).
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
MODES = {
  "bf16": ["quantization="],
  "fp8": ["quantization=te_fp8_currentscaling"],
  "fp8 emulate": ["quantization=te_fp8_currentscaling", "quantization_backend=emulate"],
  "te_nvfp4": ["quantization=te_nvfp4"],
  "te_nvfp4 xla": ["quantization=te_nvfp4", "quantization_backend=xla"],
}
TWO_TRAYS = ["dcn_data_parallelism=-1"]  # the 4-GPU presets on 2 trays: data parallel across them, as submit.sh
SETUPS = [
  # (name, config, target args, extra overrides, modes)
  ("8B-layer bench", "configs/bench/llama3_8b_4layers_seq8192.yml", ["compile_topology=h100-1"], [], MODES),
  ("8B-layer bench", "configs/bench/llama3_8b_4layers_seq8192.yml", ["compile_topology=b200-1"], [], MODES),
  ("1B-like bench", "configs/bench/llama3.2_1b_like_seq4096.yml", ["compile_topology=h100-1"], [], MODES),
  ("1B-like bench", "configs/bench/llama3.2_1b_like_seq4096.yml", ["compile_topology=b200-1"], [], MODES),
  ("Llama 3 8B", "configs/gb200/llama3_8b_fp8.yml", ["compile_topology=gb200-8"], TWO_TRAYS, MODES),
  ("Llama 3 8B", "configs/gb300/llama3_8b_fp8.yml", ["compile_topology=gb300-8"], TWO_TRAYS, MODES),
  (
    "Llama 3.1 405B",
    "configs/gb300/llama3.1_405b_fp8.yml",
    ["compile_topology=gb300-64", "compile_topology_num_slices=2"],
    [],
    MODES,
  ),
]


def rows(only=None):
  """[(setup name, config, target args, overrides, mode)] of the table, `only` those whose text contains it."""
  out = []
  for name, config, target, extra, modes in SETUPS:
    for mode, overrides in modes.items():
      if mode == "te_nvfp4 xla" and any(t.startswith("compile_topology=h100") for t in target):
        continue  # no FP4 GEMM on Hopper: the xla backend would dequantize to bf16
      row = (name, config, target, [*extra, *overrides], mode)
      if only is None or only in " ".join([name, config, *target, mode]):
        out.append(row)
  return out


def compile_row(config, target, overrides):
  """(the report as dict or None, the error line or None, seconds) of one row, in its own process."""
  with tempfile.TemporaryDirectory() as tmp:
    report = pathlib.Path(tmp) / "report.json"
    argv = [sys.executable, "-m", "MaxText.train_compile", str(REPO / config), *target, *overrides]
    start = time.perf_counter()
    done = subprocess.run(
      [*argv, f"compile_report={report}"], cwd=REPO, capture_output=True, text=True, check=False, env=dict(os.environ)
    )
    seconds = time.perf_counter() - start
    lines = done.stderr.splitlines()
    error = next((line for line in lines if line.startswith("error:")), None)
    error = error or next((line.strip()[:200] for line in lines if re.match(r"\s*\w+(Error|Exception): ", line)), None)
    if done.returncode not in (0, 2) or not report.exists():
      return None, error or (lines[-1][:200] if lines else f"exit code {done.returncode}"), seconds
    return json.loads(report.read_text(encoding="utf-8")), error, seconds


def _kinds(counts):
  return ", ".join(f"{k} {v:g}" for k, v in sorted(counts.items())) or "-"


def table_row(name, target, mode, report, error):
  target_text = " ".join(t.split("=", 1)[1] for t in target)
  if report is None:
    return f"| {name} | {target_text} | {mode} | failed: {error} | | | | |"
  mem = report["memory"]
  fits = "fits" if report["fits"] else "**over**"
  backend = ", ".join(report["backends"].values()) or "bf16"
  coll = sum(report["collectives"].values()) / GIB
  est = report["estimate"] or {}
  ms = est.get("ms_per_step", {})
  est_text = (
    f"{ms['total']:.0f} ms (gemm {ms['gemm']:.0f}, elem {ms['elementwise']:.0f}, attn {ms['attention']:.0f}, "
    f"coll {ms['collectives']:.0f}); MFU {est['mfu']:.1%}; {est['tokens_per_s_per_device']:,.0f} tok/s/GPU"
    if ms
    else "-"
  )
  return (
    f"| {name} | {target_text} | {mode} ({backend}) | {mem['peak_bytes'] / GIB:.1f} GiB {fits} "
    f"({mem['available_bytes'] / GIB:.0f}) | {_kinds(report['gemms'])} | {coll:.2f} | {est_text} |"
  )


HEADER = (
  "| setup | target | mode (backend) | memory/GPU, compiled (of available) | GEMMs per step by kind | "
  "collectives GiB/step/GPU | estimate: step time; MFU; tokens/s/GPU (compiled estimate, not measured) |\n"
  "|---|---|---|---|---|---:|---|"
)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--only", help="rows whose setup, config, target or mode contains this")
  parser.add_argument("--json", help="write every row's report here")
  args = parser.parse_args(argv)
  print(f"train_compile of commit {provenance.commit(mark_dirty=True)}: compiled estimates for each target")
  print(HEADER, flush=True)
  records = []
  for name, config, target, overrides, mode in rows(args.only):
    report, error, seconds = compile_row(config, target, overrides)
    print(table_row(name, target, mode, report, error), flush=True)
    records.append(
      {"setup": name, "config": config, "target": target, "overrides": overrides, "mode": mode, "report": report}
    )
    records[-1]["compile_wall_seconds"] = round(seconds, 1)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main())
