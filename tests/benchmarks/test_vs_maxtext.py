"""benchmarks/vs_maxtext.py without upstream MaxText: its log parsing, per-pair ratios, table and command lines, and
its launcher on our trainer."""

import subprocess
import sys

import pytest

from benchmarks import vs_maxtext
from benchmarks.vs_maxtext import RunResult

OURS_LOG = """vs_maxtext: imported
parameters: 3410176
CPU GEMM operands: float32 (auto: no amx_bf16 or ARM bf16 on this CPU)
vs_maxtext: compile trace=0.100 lower=0.200 xla=0.300
vs_maxtext: compile trace=0.500 lower=1.000 xla=3.000
completed step: 0, seconds: 9.957, TFLOP/s/device: 0.002, Tokens/s/device: 102.842, total_weights: 1024, loss: 6.705
completed step: 1, seconds: 0.675, TFLOP/s/device: 0.031, Tokens/s/device: 1516.274, total_weights: 1024, loss: 5.824
completed step: 2, seconds: 0.400, TFLOP/s/device: 0.048, Tokens/s/device: 2370.202, total_weights: 1024, loss: 5.253
completed step: 3, seconds: 0.500, TFLOP/s/device: 0.040, Tokens/s/device: 1966.825, total_weights: 1024, loss: 4.680
"""
# MaxText's absl lines: a prefix, and more fields after the loss.
THEIRS_LOG = """vs_maxtext: imported
vs_maxtext: compile trace=0.500 lower=0.500 xla=1.000
I1125 23:50:18.137679 139645571259264 metric_logger.py:425] number parameters: 0.003 billion
I1125 23:50:19.677813 139645571259264 metric_logger.py:265] completed step: 0, seconds: 0.097, TFLOP/s/device: 0.215, \
Tokens/s/device: 10511.728, total_weights: 1024, loss: 6.726, lm_loss: 6.726, perplexity: 833.900
I1125 23:50:20.225435 139645571259264 metric_logger.py:265] completed step: 1, seconds: 0.559, TFLOP/s/device: 0.037, \
Tokens/s/device: 1830.310, total_weights: 1024, loss: 6.654, lm_loss: 6.654, perplexity: 775.764
I1125 23:50:20.818963 139645571259264 metric_logger.py:265] completed step: 2, seconds: 0.800, TFLOP/s/device: 0.024, \
Tokens/s/device: 1158.138, total_weights: 1024, loss: 6.584, lm_loss: 6.584, perplexity: 723.788
I1125 23:50:21.527119 139645571259264 metric_logger.py:265] completed step: 3, seconds: 0.600, TFLOP/s/device: 0.036, \
Tokens/s/device: 1754.320, total_weights: 1024, loss: 6.525, lm_loss: 6.525, perplexity: 681.831
"""


def _stamped(log, first_at):
  """[(seconds since launch, line)]: the first line at `first_at`, then one second apart."""
  return [(first_at + i, line) for i, line in enumerate(log.splitlines())]


def _run(side, log, first_at, mode="bf16", first_cpu=None, step_cpu=None):
  stamped = _stamped(log, first_at)
  step_seconds, first = vs_maxtext.parse_log(stamped)
  phases = vs_maxtext.parse_phases(stamped)
  return RunResult(side, mode, step_seconds, first, 30.0, 0, (1.0, 1.0), first_cpu, step_cpu or {}, **phases)


def test_parse_log_reads_both_trainers_lines():
  ours, first = vs_maxtext.parse_log(_stamped(OURS_LOG, 10.0))
  assert ours == {0: 9.957, 1: 0.675, 2: 0.4, 3: 0.5} and first == 15.0  # the step-0 line is the log's sixth
  theirs, first = vs_maxtext.parse_log(_stamped(THEIRS_LOG, 20.0))
  assert theirs == {0: 0.097, 1: 0.559, 2: 0.8, 3: 0.6} and first == 23.0
  assert vs_maxtext.parse_log(_stamped("no steps\n", 0.0)) == ({}, None)


def test_first_step_splits_into_imports_compilation_and_the_rest():
  ours = _run("ours", OURS_LOG + "vs_maxtext: compile trace=9.0 lower=9.0 xla=9.0\n", 10.0)
  assert ours.import_s == 10.0 and ours.compile_s == 4.5  # the last totals before step 0, not the later ones
  assert ours.rest_s == 15.0 - 10.0 - 4.5
  assert ours.gemm_operands == "float32 (auto: no amx_bf16 or ARM bf16 on this CPU)"
  theirs = _run("theirs", THEIRS_LOG, 20.0)
  assert (theirs.import_s, theirs.compile_s, theirs.gemm_operands) == (20.0, 2.0, None)
  bare = _run("ours", "completed step: 0, seconds: 1.0\n", 0.0)
  assert (bare.import_s, bare.compile_s, bare.rest_s) == (None, None, None)


def test_step_cpu_is_the_median_cpu_between_step_lines_after_the_warmup():
  run = _run("ours", OURS_LOG, 10.0, step_cpu={0: 9.0, 1: 9.6, 2: 10.0, 3: 10.5, 4: 10.8})
  assert run.median_step_cpu(warmup=2) == pytest.approx(0.4)  # steps 3 and 4: 0.5 and 0.3
  assert run.median_step_cpu(warmup=4) is None


def test_median_leaves_out_the_warmup_steps():
  ours = _run("ours", OURS_LOG, 10.0)
  assert ours.median_step(warmup=2) == 0.45  # steps 2 and 3; step 0's compile and step 1 left out
  assert ours.median_step(warmup=4) is None


def test_pair_ratios_and_summary():
  ours = _run("ours", OURS_LOG, 10.0, first_cpu=8.0, step_cpu={2: 3.0, 3: 3.2})
  theirs = _run("theirs", THEIRS_LOG, 20.0, first_cpu=16.0, step_cpu={2: 5.0, 3: 5.8})
  ratios = vs_maxtext.pair_ratios(ours, theirs, warmup=2)
  assert ratios == pytest.approx(
    {"step": 0.45 / 0.7, "step_cpu": 0.25, "first_step": 15.0 / 23.0, "first_step_cpu": 0.5}
  )
  failed = RunResult("theirs", "bf16", {}, None, 5.0, 1, (1.0, 1.0))
  assert vs_maxtext.pair_ratios(ours, failed, warmup=2) == dict.fromkeys(ratios)

  slower = RunResult("ours", "bf16", {2: 1.4, 3: 1.4}, 42.0, 60.0, 0, (1.0, 1.0), 24.0)
  rows = vs_maxtext.summarize([(ours, theirs), (slower, theirs)], warmup=2)
  (row,) = rows
  assert row["pairs"] == 2 and row["step_ratios"] == [0.45 / 0.7, 2.0]
  assert row["step_ratio"] == (0.45 / 0.7 + 2.0) / 2  # the median of two
  table = vs_maxtext.markdown_table(rows)
  assert table.splitlines()[2].startswith("| bf16 | 2 | 0.925 | 0.700 | **1.32x** (0.64, 2.00) |")
  assert "| 0.200 / 0.800 = 0.25x |" in table  # the second pair has no step CPU seconds: the first's
  assert "| 28.5 = 10.0 + 4.5 + 0.5 | 23.0 = 20.0 + 2.0 + 1.0 |" in table  # medians: the second ours has no split
  assert table.splitlines()[2].endswith("| 16.0 / 16.0 = 1.00x |")  # CPU: 8 and 24 against 16 twice


def test_process_cpu_seconds_reads_proc():
  import os

  assert vs_maxtext.process_cpu_seconds(os.getpid()) > 0
  assert vs_maxtext.process_cpu_seconds(2**31 - 1) is None  # no such process


def test_both_sides_get_the_same_model_and_settings(tmp_path):
  ours = vs_maxtext.ours_command("fp8", 12, tmp_path / "ours", "fp8_0")
  assert ours[:5] == [sys.executable, "-c", vs_maxtext.LAUNCHER, "ours", str(vs_maxtext.REPO)]
  keys = dict(arg.split("=", 1) for arg in ours[5:])
  assert keys["quantization"] == "fp8" and keys["steps"] == "12" and keys["base_emb_dim"] == "256"
  assert keys["remat_policy"] == "full" and keys["dataset_type"] == "synthetic" and keys["jax_cache_dir"] == ""
  shared = {k: str(v) for k, v in vs_maxtext.SHARED_KEYS.items()}
  assert shared.items() <= keys.items()


def test_cpu_line_says_what_ran_the_table():
  cpu = {"model": "Some CPU", "cpus": 2, "flags": ["avx2"], "isa_cap": "avx2"}
  line = vs_maxtext.cpu_line(cpu, "float32 (auto: no amx_bf16 or ARM bf16 on this CPU)")
  assert line.startswith("CPU: Some CPU, 2 CPUs; flags: avx2, ISA capped to avx2 (benchmarks/isa_cap.py")
  assert line.endswith("; our CPU GEMM operands: float32 (auto: no amx_bf16 or ARM bf16 on this CPU)")
  native = vs_maxtext.cpu_info(vs_maxtext.base_env())
  assert native["isa_cap"] is None and native["cpus"] >= 1 and set(native["flags"]) <= set(vs_maxtext.DECIDING_FLAGS)


@pytest.mark.slow
def test_the_launcher_runs_our_trainer_and_marks_imports_and_compilation(tmp_path):
  """LAUNCHER on our real trainer, one step of the harness's model: the marks come before the step-0 line."""
  cmd = vs_maxtext.ours_command("bf16", 1, tmp_path / "ours", "launch")
  done = subprocess.run(cmd, env=vs_maxtext.base_env(), cwd=vs_maxtext.REPO, capture_output=True, text=True)
  assert done.returncode == 0, done.stdout[-2000:]
  stamped = list(enumerate(done.stdout.splitlines()))  # line numbers as time stamps: the order is what's checked
  phases = vs_maxtext.parse_phases(stamped)
  _, first = vs_maxtext.parse_log(stamped)
  assert phases["import_s"] is not None and phases["import_s"] < first
  assert phases["compile_s"] > 0 and phases["gemm_operands"].split()[0] in ("float32", "bfloat16")
