"""Training end to end on the tiny model: falling loss, the MaxText step line, dry run, preflight."""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from MaxText import config, train
from MaxText.trainer import run_setup, train_step
from tests.conftest import JAX_CACHE, REPO

# vocab_size: the byte tokenizer's 258, so the grain-data tests compile the same programs as the synthetic ones.
SMALL = [
  "base_emb_dim=64",
  "base_num_query_heads=4",
  "base_num_kv_heads=2",
  "head_dim=16",
  "base_mlp_dim=128",
  "base_num_decoder_layers=2",
  "vocab_size=258",
  "max_target_length=32",
  "per_device_batch_size=8",
  "learning_rate=3e-3",
  "enable_tensorboard=false",
  "dataset_type=synthetic",
  "eval_interval=0",
  # One LR schedule whatever a test's step count (the schedule's constants are part of the compiled
  # step), so the suite's trainings of one config share their compilations through the cache.
  "learning_rate_schedule_steps=100",
  f"jax_cache_dir={JAX_CACHE}",
]
STEP_LINE = re.compile(
  r"^completed step: (\d+), seconds: [\d.]+, TFLOP/s/device: [\d.]+, "
  r"Tokens/s/device: [\d.]+, total_weights: (\d+), loss: ([\d.]+)$"
)


def _cfg(tmp_path, *extra, run="t"):
  return config.load(
    REPO / "configs" / "llama3_tiny.yml", SMALL + [f"base_output_directory={tmp_path}", f"run_name={run}"] + list(extra)
  )


def test_loss_falls_and_metrics_are_written(tmp_path):
  losses = train.train(_cfg(tmp_path, "steps=25"))
  assert len(losses) == 25
  assert np.mean(losses[-5:]) < np.mean(losses[:3]) - 0.8
  records = [json.loads(l) for l in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == list(range(25)) and records[-1]["total_weights"] == 8 * 32


@pytest.mark.slow
@jax.default_matmul_precision("highest")  # f32 means f32 (a GPU's default for f32 dots is TF32)
def test_scan_and_loop_and_remat_train_the_same(tmp_path):
  ref = train.train(_cfg(tmp_path, "steps=3", "dtype=float32", "remat_policy=none"))
  for i, extra in enumerate((["remat_policy=full"], ["remat_policy=minimal", "scan_layers=false"])):
    losses = train.train(_cfg(tmp_path, "steps=3", "dtype=float32", *extra, run=f"t{i}"))
    np.testing.assert_allclose(losses, ref, rtol=2e-5)


@jax.default_matmul_precision("highest")
def test_gradient_accumulation_matches_the_full_batch(tmp_path):
  ref = train.train(_cfg(tmp_path, "steps=3", "dtype=float32"))
  acc = train.train(_cfg(tmp_path, "steps=3", "dtype=float32", "gradient_accumulation_steps=4", run="acc"))
  np.testing.assert_allclose(acc, ref, rtol=2e-5)


def test_nvfp4_mlp_trains(tmp_path):
  losses = train.train(_cfg(tmp_path, "steps=12", "quantization=te_nvfp4"))
  assert np.mean(losses[-3:]) < losses[0] - 0.5


@pytest.mark.slow
def test_cpu_gemm_dtype_changes_the_gemms_dtype_not_the_numbers(tmp_path, capsys, cpu_gemm_choice):
  """FP8 MLP GEMMs and bf16 attention and lm head GEMMs on f32 or on bf16 operands (the cpu_gemm_dtype key), and the
  plan says which ran: the first loss is the same up to the f32 sums' order; later ones drift apart only by the few
  bf16-rounded gradients that order moves by one bf16 step (measured: 3e-5 relative by step 3; a wrong operand,
  scale or transpose moves them by whole percents)."""
  losses = {}
  for choice in ("float32", "bfloat16"):
    keys = ("steps=4", "quantization=te_fp8_currentscaling", f"cpu_gemm_dtype={choice}")
    losses[choice] = train.train(_cfg(tmp_path, *keys, run=choice))
    assert f"CPU GEMM operands: {choice} (cpu_gemm_dtype={choice})\n" in capsys.readouterr().out
  np.testing.assert_allclose(losses["float32"][0], losses["bfloat16"][0], rtol=1e-6)
  np.testing.assert_allclose(losses["float32"], losses["bfloat16"], rtol=5e-4)


def _run(*args):
  return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_cli_prints_maxtext_step_lines(tmp_path):
  proc = _run("configs/llama3_tiny.yml", *SMALL, "steps=4", f"base_output_directory={tmp_path}")
  assert proc.returncode == 0, proc.stderr
  steps = [STEP_LINE.match(l) for l in proc.stdout.splitlines() if l.startswith("completed step")]
  assert len(steps) == 4 and all(steps)
  assert [int(m.group(1)) for m in steps] == [0, 1, 2, 3] and steps[0].group(2) == str(8 * 32)


@pytest.mark.parametrize(
  "cfg, extra, params, tflops",
  [
    ("llama3_8b.yml", ["per_device_batch_size=1", "max_target_length=8192"], 8030261248, "421.65"),
    ("llama3.1_405b.yml", [], 405853388800, None),
  ],
)
def test_dry_run_summary(cfg, extra, params, tflops):
  proc = _run(f"configs/{cfg}", "dry_run=true", *extra)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert f"parameters: {params}" in lines
  if tflops:
    assert f"TFLOPs per device per step: {tflops}" in lines
  assert any(re.fullmatch(r"memory per device: [\d.]+ GiB", l) for l in lines)
  assert "completed step" not in proc.stdout


def test_8b_on_this_box_is_refused_before_allocating():
  proc = _run("configs/llama3_8b.yml", "hardware_memory_gib=24")
  assert proc.returncode == 2
  msg = proc.stderr.strip().splitlines()
  assert len(msg) == 1 and re.search(r"estimated memory per device [\d.]+ GiB exceeds the 24.0 GiB", msg[0])


def _main(tmp_path, *extra):
  return train.main(
    [str(REPO / "configs" / "llama3_tiny.yml"), *SMALL, f"base_output_directory={tmp_path}", "steps=2", *extra]
  )


def test_setup_mistakes_fail_before_compiling(tmp_path, capsys):
  (tmp_path / "file").write_text("x")
  assert _main(tmp_path / "file") == 2
  err = capsys.readouterr().err
  assert err.startswith("error: can't write the run directory ") and "set base_output_directory" in err
  # te_nvfp4's wgrad RHT works on 16-token blocks: 1 x 100 tokens is refused up front, naming the keys.
  assert _main(tmp_path, "quantization=te_nvfp4", "per_device_batch_size=1", "max_target_length=100") == 2
  err = capsys.readouterr().err
  assert "a micro-batch holds 100 tokens per device (per_device_batch_size x max_target_length" in err
  assert len(err.strip().splitlines()) == 1


def test_sigterm_before_the_first_step_is_a_clean_stop(tmp_path, monkeypatch, capsys):
  import os
  import signal  # pylint: disable=import-outside-toplevel,multiple-imports

  real = run_setup.init_sharded

  def init_then_sigterm(*args):
    os.kill(os.getpid(), signal.SIGTERM)  # arrives while the model is being built
    return real(*args)

  monkeypatch.setattr(run_setup, "init_sharded", init_then_sigterm)
  assert _main(tmp_path, "run_name=early") == 0
  out = capsys.readouterr().out
  assert "SIGTERM before step 0: stopped, nothing trained" in out and "completed step" not in out


def test_high_precision_switch_past_the_end_is_not_announced(tmp_path, capsys):
  assert _main(tmp_path, "quantization=te_nvfp4", "high_precision_from_step=50", "dry_run=true") == 0
  out = capsys.readouterr().out
  assert "high_precision_from_step=50 is past the last step (steps=2)" in out and "from step 50:" not in out


def _slow_and_poisoned(monkeypatch, nan_at=None, sleep=0.0):
  """Wrap the real compiled steps: each also waits `sleep` s on the device, and step `nan_at` reports a NaN loss."""
  import time  # pylint: disable=import-outside-toplevel

  real = train_step.StepFunctions.for_step

  def slow(step_metrics, step):
    def wait(_):
      time.sleep(sleep)

    jax.debug.callback(wait, step, ordered=True)  # one after another, as a device runs its steps
    return {**step_metrics, "loss": jax.numpy.where(step == nan_at, jax.numpy.nan, step_metrics["loss"])}

  def for_step(self, step):
    plan, fn = real(self, step)
    post = jax.jit(slow)

    def wrapped(*args):
      *state, step_metrics = fn(*args)
      return (*state, post(step_metrics, args[4]))  # args: params, rest, opt_state, batch, step, seed_key

    wrapped.lower = fn.lower
    return plan, wrapped

  monkeypatch.setattr(train_step.StepFunctions, "for_step", for_step)


def test_step_seconds_are_between_completions_under_asynchrony(tmp_path, monkeypatch):
  """Steps are dispatched one ahead of their metrics; each step's seconds still cover that step's device time."""
  _slow_and_poisoned(monkeypatch, sleep=0.3)
  train.train(_cfg(tmp_path, "steps=5"))
  records = [json.loads(l) for l in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == list(range(5))
  assert min(r["seconds"] for r in records) >= 0.3  # dispatch times would be near 0 for all but a few


def test_a_nan_under_asynchrony_names_its_step_and_no_checkpoint_holds_it(tmp_path, monkeypatch, capsys):
  _slow_and_poisoned(monkeypatch, nan_at=4)
  code = _main(tmp_path, "run_name=nan", "steps=9", "enable_checkpointing=true", "checkpoint_period=2")
  err = capsys.readouterr().err
  assert code == 2 and "error: loss is nan at step 4;" in err and "the last good checkpoint is 4" in err
  kept = sorted(int(p.name) for p in (tmp_path / "nan" / "checkpoints").iterdir() if p.name.isdigit())
  assert kept == [2, 4]  # 4 = steps 0-3 done: nothing of step 4 or later
  rows = [json.loads(l)["step"] for l in (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()]
  assert rows == [0, 1, 2, 3]


def test_relative_paths_mean_the_same_from_any_directory(tmp_path):
  """train.py started from another directory, every path relative to it: the config, the shards, the output
  directory, then load_parameters_path from a third directory. Everything lands where the caller meant."""
  from tests.data.corpus import make_corpus  # pylint: disable=import-outside-toplevel

  make_corpus(tmp_path / "corpus")
  work = tmp_path / "work"
  work.mkdir()
  cfg_path = os.path.relpath(REPO / "configs" / "llama3_tiny.yml", work)
  data = [
    "dataset_type=grain",
    "grain_train_files=../corpus/data/train-*.array_record",
    "grain_eval_files=../corpus/data/eval-*.array_record",
    "tokenizer_type=byte",
  ]
  first = subprocess.run(
    [
      sys.executable,
      str(REPO / "train.py"),
      cfg_path,
      *SMALL,
      *data,
      "steps=2",
      "base_output_directory=runs",
      "run_name=a",
      "enable_checkpointing=true",
    ],
    cwd=work,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert first.returncode == 0, first.stderr
  assert (work / "runs" / "a" / "checkpoints" / "2").is_dir() and (work / "runs" / "a" / "metrics.jsonl").exists()
  second = subprocess.run(
    [
      sys.executable,
      str(REPO / "train.py"),
      str(REPO / "configs" / "llama3_tiny.yml"),
      *SMALL,
      "steps=1",
      "load_parameters_path=work/runs/a/checkpoints/2",
      "base_output_directory=work/runs",
      "run_name=b",
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert second.returncode == 0, second.stderr
  assert f"{work}/runs/a/checkpoints/2" in second.stdout and (work / "runs" / "b" / "metrics.jsonl").exists()
  assert not (tmp_path / "runs").exists() and not (work / "work").exists()
