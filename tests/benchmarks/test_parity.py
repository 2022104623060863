"""parity.py over seeds: t quantiles, confidence intervals on constructed curves, the seed plan, packed runs
identical to sequential ones, and clean stops that resume."""

import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import packed, parity, stats
from tests.conftest import REPO
from tests.trainer.test_train import SMALL

# Student t 97.5% quantiles (two-sided 95%) from the standard tables.
T975 = {
  1: 12.7062047,
  2: 4.30265273,
  3: 3.18244631,
  4: 2.77644511,
  5: 2.57058184,
  9: 2.26215716,
  10: 2.22813885,
  20: 2.08596345,
  29: 2.04522964,
  30: 2.04227246,
}


def test_t_quantile_matches_the_tables():
  for df, expected in T975.items():
    assert stats.t_quantile(0.95, df) == pytest.approx(expected, abs=1e-7), df
  assert stats.t_quantile(0.99, 5) == pytest.approx(4.03214298, abs=1e-7)
  assert stats.t_quantile(0.90, 1) == pytest.approx(6.31375151, abs=1e-7)
  assert stats.t_cdf_two_sided(T975[3], 3) == pytest.approx(0.95, abs=1e-9)
  mean, half = stats.mean_ci([1.0, 2.0, 3.0])
  assert mean == 2.0 and half == pytest.approx(T975[2] * 1.0 / np.sqrt(3))
  assert stats.mean_ci([0.5]) == (0.5, None) and stats.verdict(0.5, None) == "n/a"
  assert stats.verdict(0.3, 0.2) == "> 0" and stats.verdict(-0.3, 0.2) == "< 0" and stats.verdict(0.1, 0.2) == "0 in CI"


def _curves(rng, seeds, gaps, steps=120, seed_sd=0.01, step_sd=0.03):
  """{mode: {seed: losses}}: a shared decaying curve per seed plus, per mode, its gap, a per-seed offset and noise."""
  t = np.arange(1, steps + 1)
  curves = {mode: {} for mode in gaps}
  for s in seeds:
    base = 2.0 + 3.0 / np.sqrt(t) + rng.normal(0, step_sd, steps)  # batch-to-batch noise every mode shares
    for mode, gap in gaps.items():
      extra = 0.0 if mode == "bf16" else gap + rng.normal(0, seed_sd) + rng.normal(0, step_sd, steps)
      curves[mode][s] = (base + extra).tolist()
  return curves


def test_ci_covers_a_known_gap_at_its_stated_rate():
  rng = np.random.default_rng(1234)
  trials, covered, covered_zero, excludes_zero = 400, 0, 0, 0
  for _ in range(trials):
    rows = parity.analyse_seeds(_curves(rng, [0, 1, 2], {"bf16": 0.0, "slow": 0.02, "same": 0.0, "far": 0.1}))
    slow, same, far = (r["gap_nats_seeds"] for r in rows[1:])
    covered += abs(slow["mean"] - 0.02) <= slow["ci"]
    covered_zero += abs(same["mean"]) <= same["ci"]
    excludes_zero += far["verdict"] == "> 0"
  assert 0.92 <= covered / trials <= 0.98, covered / trials
  assert 0.92 <= covered_zero / trials <= 0.98, covered_zero / trials
  # A 0.1-nat gap is ~15 standard errors of a 3-seed mean here: resolved every time.
  assert excludes_zero == trials


def test_identical_modes_give_an_interval_at_zero_and_the_table_reports_seeds():
  rng = np.random.default_rng(0)
  curves = _curves(rng, [3, 4, 5], {"bf16": 0.0, "te_nvfp4": 0.05, "mxfp4": 0.10})
  curves["copy"] = {s: list(v) for s, v in curves["bf16"].items()}
  rows = parity.analyse_seeds(curves, converged=0.3)
  copy = rows[3]["gap_nats_seeds"]
  assert copy["mean"] == 0.0 and copy["ci"] == 0.0 and copy["verdict"] == "0 in CI"
  nv = rows[1]["gap_nats_seeds"]
  tail = slice(120 - 36, 120)
  expected = [np.mean(np.subtract(curves["te_nvfp4"][s], curves["bf16"][s])[tail]) for s in (3, 4, 5)]
  assert nv["per_seed"] == pytest.approx(expected, rel=1e-12)
  assert nv["ci"] == pytest.approx(T975[2] * np.std(expected, ddof=1) / np.sqrt(3), rel=1e-9)
  pairs = parity.pairwise(curves)
  ranks = {(a, b): iv for a, b, iv in pairs}
  assert ranks["te_nvfp4", "mxfp4"]["verdict"] == "< 0"  # te_nvfp4's gap is 0.05 smaller on every seed
  table = parity.markdown_seeds(rows, 0.3, pairs)
  assert "3 seeds 3, 4, 5" in table and "| copy | " in table and "te_nvfp4 better" in table
  assert f"{nv['mean']:+.4f} ± {nv['ci']:.4f}" in table and ", ".join(f"{g:+.4f}" for g in expected) in table
  one = parity.analyse_seeds({m: {3: c[3]} for m, c in curves.items()})
  assert one[1]["gap_nats_seeds"]["ci"] is None
  assert parity.markdown(one, 0.3).startswith("| mode | final loss | gap to bf16 (last 30%) |")


def test_the_table_carries_each_modes_tokens_per_second_and_step_memory():
  rng = np.random.default_rng(1)
  curves = _curves(rng, [0, 1], {"te_fp8_currentscaling": 0.0, "te_nvfp4": 0.03})
  speed = {"te_fp8_currentscaling": {0: 1000.0, 1: 1200.0}, "te_nvfp4": {0: 1650.0, 1: 1650.0}}
  rows = parity.measured(parity.analyse_seeds(curves), speed, {"te_fp8_currentscaling": 1.5, "te_nvfp4": 1.25})
  assert [r["tokens_per_s_per_device"] for r in rows] == [1100.0, 1650.0]
  table = parity.markdown_seeds(rows, 0.3)
  assert "tokens/s/device (vs baseline)" in table.splitlines()[2] and "| 1,650 (1.50x) | 1.25 |" in table
  assert table.splitlines()[3].count("|") == table.splitlines()[2].count("|")  # the separator matches the head
  one = parity.markdown(
    parity.measured(
      parity.analyse_seeds({m: {0: c[0]} for m, c in curves.items()}),
      speed,
      {"te_fp8_currentscaling": 1.5, "te_nvfp4": 1.25},
    ),
    0.3,
  )
  assert "| 1,650 (1.65x) | 1.25 |" in one and one.splitlines()[0].count("|") == one.splitlines()[1].count("|")


def test_a_small_model_gap_is_labelled_not_comparable_with_the_published_one():
  assert "not comparable" in parity.scope_note("llama3_tiny", 200, "1x cpu (cpu)")
  assert "not comparable" in parity.scope_note("llama3-8b", 500, "8x NVIDIA H100 80GB HBM3 (gpu)")
  assert "not comparable" not in parity.scope_note("llama3-8b", 10_000, "32x NVIDIA GB200 (gpu)")


def test_final_eval_gaps_are_paired_by_seed():
  rng = np.random.default_rng(5)
  curves = _curves(rng, [0, 1], {"bf16": 0.0, "te_nvfp4": 0.02})
  evals = {"bf16": {0: 3.0, 1: 3.2}, "te_nvfp4": {0: 3.1, 1: 3.25}}
  row = parity.analyse_seeds(curves, evals)[1]
  assert row["eval_gap_nats_seeds"]["per_seed"] == pytest.approx([0.1, 0.05])
  assert row["eval_gap_percent_seeds"]["per_seed"] == pytest.approx([100 * 0.1 / 3.0, 100 * 0.05 / 3.2])
  assert row["eval_loss_seeds"]["mean"] == pytest.approx(3.175)
  assert "eval_loss_seeds" not in parity.analyse_seeds(curves, {"bf16": {0: 3.0}})[0]  # a seed without eval


def test_seed_plan_pairs_modes_and_sizes_the_final_eval(tmp_path):
  seeds, runs = parity.plan_runs(
    REPO / "configs" / "llama3_tiny.yml", ["seed=5"], ["bf16", "te_nvfp4"], 50, 3, 100_000, tmp_path
  )
  assert seeds == [5, 6, 7]
  assert [(r.mode, r.seed) for r in runs] == [(m, s) for s in seeds for m in ("bf16", "te_nvfp4")]
  assert all(r.cfg.seed == r.seed and r.run_dir == tmp_path / "runs" / f"seed{r.seed}" / r.mode for r in runs)
  # The final eval covers 100k tokens at 8 x 128 per batch, only after the last step.
  assert {(r.cfg.eval_steps, r.cfg.eval_interval) for r in runs} == {(98, 50)}
  assert runs[1].cfg.quantization == "te_nvfp4" and "quantization=te_nvfp4" in runs[1].train_args


def test_cpu_slots_split_cores():
  assert packed.cpu_slots(2, [0, 1, 2, 3, 4]) == [[0, 1], [2, 3, 4]]
  assert packed.cpu_slots(3, [0, 1]) == [[0], [1], [0]]
  assert packed.child_env(4, {})["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.225"
  assert packed.child_env(4, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"


ARGS = ["--config", str(REPO / "configs" / "llama3_tiny.yml"), "--modes", "bf16,te_nvfp4", *SMALL]


def _losses(out):
  return json.loads((out / "curves.json").read_text())["losses"]


def _parity(*args):
  return subprocess.Popen(
    [sys.executable, "benchmarks/parity.py", *args],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


@pytest.mark.slow
def test_parallel_runs_give_the_sequential_curves(tmp_path):
  assert parity.main([*ARGS, "--steps", "6", "--seeds", "2", "--out", str(tmp_path / "seq")]) == 0
  proc = _parity(*ARGS, "--steps", "6", "--seeds", "2", "--parallel", "2", "--out", str(tmp_path / "par"))
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, out
  assert "[te_nvfp4 seed 1] completed step: 5" in out and "2 seeds 0, 1" in out
  assert _losses(tmp_path / "par") == _losses(tmp_path / "seq")
  assert set(_losses(tmp_path / "seq")["te_nvfp4"]) == {"0", "1"}
  rows = json.loads((tmp_path / "seq" / "curves.json").read_text())["table"]
  assert all(r["tokens_per_s_per_device"] > 0 and 0 < r["step_memory_gib"] < 8 for r in rows)
  page = (tmp_path / "seq" / "parity.md").read_text()
  assert "small-model check" in page and "![loss curves and gaps](parity.png)" in page


def _stop_after_first_step(proc, signum):
  """Send `signum` once the first step line shows; (exit code, output)."""
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if "completed step: 0," in line:
      proc.send_signal(signum)
      break
  rest, _ = proc.communicate(timeout=300)
  return proc.returncode, "".join(lines) + rest


@pytest.mark.slow
@pytest.mark.parametrize(
  "parallel,signum,code",
  [(1, signal.SIGTERM, 0), (2, signal.SIGINT, 130)],
  ids=["sigterm_sequential", "sigint_parallel"],
)
def test_a_stopped_harness_exits_cleanly_and_resumes_to_the_same_curves(tmp_path, parallel, signum, code):
  args = [*ARGS, "--steps", "60", "--parallel", str(parallel)]
  rc, out = _stop_after_first_step(_parity(*args, "--out", str(tmp_path / "cut")), signum)
  assert rc == code, out
  name = signal.Signals(signum).name
  assert f"parity: {name} stopped bf16 seed 0" in out and "rerun the same command to resume" in out
  # Promptly: after the step in flight and a checkpoint, not at the end of the run or of the next mode.
  assert "completed step: 59," not in out and "=== te_nvfp4 seed 0" not in out
  assert "Traceback" not in out and not (tmp_path / "cut" / "curves.json").exists()
  assert parity.main([*args, "--out", str(tmp_path / "cut")]) == 0
  assert parity.main([*ARGS, "--steps", "60", "--out", str(tmp_path / "whole")]) == 0
  assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")
