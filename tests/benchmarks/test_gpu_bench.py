"""scripts/gpu_bench.sh --cpu-smoke: every part's JSON in the one schema with finite numbers, one line per failed
part while the others run, and the exit status counting the failures."""

import json
import math
import os
import subprocess

import pytest

from benchmarks import gpu_bench
from tests.conftest import JAX_CACHE, REPO

METRIC_KEYS = {"name", "subject", "value", "unit", "target", "met"}
# What each part measures on a CPU too (cuDNN attention and MFU need an NVIDIA GPU).
EXPECTED = {
  "throughput-8b": {("step time vs bf16", "te_nvfp4"), ("host gap per step", "bf16"), ("step memory", "bf16")},
  "throughput-1b": {("speed vs bf16", gpu_bench.FP8_ALL_DENSE), ("step time", gpu_bench.FOUR_OVER_SIX)},
  "attention": {("fwd+bwd per layer", "layer"), ("fwd+bwd per layer", "xla")},
  "quantize": {("share of copy bandwidth", "nvfp4 RHT+SR (dy_t) [xla]"), ("time", "copy (bf16 read + write) [xla]")},
  "restart": {("XLA compilations", "first"), ("XLA compilations", "restart"), ("first step", "restart")},
}


def _gpu_bench(out, *args, **env):
  return subprocess.run(
    [str(REPO / "scripts" / "gpu_bench.sh"), "--cpu-smoke", "--out", str(out), *args, f"jax_cache_dir={JAX_CACHE}"],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=dict(os.environ, **env),
    check=False,
    timeout=900,
  )


def _check_record(out, part):
  record = json.loads((out / f"{part}.json").read_text())
  assert record["schema"] == gpu_bench.SCHEMA and record["part"] == part
  assert record["status"] == "ok" and record["error"] is None and record["smoke"] is True
  assert set(record["machine"]) == {"commit", "device", "host", "jax"} and "cpu" in record["machine"]["device"]
  assert isinstance(record["seconds"], float) and record["seconds"] > 0 and record["started"].endswith("+00:00")
  assert record["metrics"] and isinstance(record["detail"], dict)
  for metric in record["metrics"]:
    assert set(metric) == METRIC_KEYS, metric
    assert isinstance(metric["value"], float) and math.isfinite(metric["value"]), metric
    assert metric["met"] is None  # a CPU's numbers meet no GPU target
    assert metric["target"] is None or metric["target"].split()[0] in (">=", "<=")
  assert EXPECTED[part] <= {(m["name"], m["subject"]) for m in record["metrics"]}
  return {(m["name"], m["subject"]): m["value"] for m in record["metrics"]}


@pytest.mark.slow
def test_a_failed_part_is_one_line_and_the_others_still_run(tmp_path):
  proc = _gpu_bench(tmp_path, "no-such-part", "quantize")
  assert proc.returncode == 1, proc.stdout + proc.stderr
  values = _check_record(tmp_path, "quantize")
  assert values[("share of copy bandwidth", "nvfp4 1x16 (x) [xla]")] > 0
  summary = proc.stdout[proc.stdout.index("=== gpu-bench: 2 part(s), 1 failed") :].splitlines()
  assert summary[1].startswith("  no-such-part: FAILED (exit code 2: ") and "invalid choice" in summary[1]
  assert summary[2].startswith("  quantize: ok (")
  assert "| share of copy bandwidth | nvfp4 RHT+SR (dy_t) [xla] |" in proc.stdout
  assert (tmp_path / "gpu_bench.log").read_text().endswith(proc.stdout.splitlines()[-1] + "\n")


def test_a_part_past_its_time_is_cut_off_and_said(tmp_path):
  proc = _gpu_bench(tmp_path, "quantize", GPU_BENCH_PART_TIMEOUT="2")
  assert proc.returncode == 1
  assert proc.stdout.splitlines()[-1] == "  quantize: FAILED (timed out after 2 s)"
  if (tmp_path / "quantize.json").exists():  # written as failed before it starts: killed, it stays so
    record = json.loads((tmp_path / "quantize.json").read_text())
    assert record["status"] == "failed" and "did not finish" in record["error"]


@pytest.mark.slow
def test_every_part_in_the_cpu_smoke(tmp_path):
  proc = _gpu_bench(tmp_path)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
  for part in gpu_bench.PARTS:
    values = _check_record(tmp_path, part)
    if part == "restart":  # the restart compiled nothing: every program came from the persistent cache
      assert values[("XLA compilations", "first")] >= 2 and values[("XLA compilations", "restart")] == 0
      assert values[("persistent-cache hits", "restart")] >= 2
