"""Checkpoints: bit-exact resume after SIGTERM (synthetic and grain data, BF16 and NVFP4), corrupt-checkpoint
fallback, load paths, and a NaN loss that keeps the last good checkpoint."""

import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from MaxText import checkpointing, config, metrics, train
from tests.conftest import REPO
from tests.data.corpus import grain_overrides
from tests.test_train import SMALL


def _cfg(tmp_path, *extra, run="r"):
  return config.load(REPO / "configs" / "llama3_tiny.yml",
                     SMALL + [f"base_output_directory={tmp_path}", f"run_name={run}", "enable_checkpointing=true",
                              "steps=8", "checkpoint_period=3"] + list(extra))


def _sigterm_after(monkeypatch, stop_step):
  """Deliver a real SIGTERM to this process while step `stop_step` is being recorded."""
  real = metrics.MetricsWriter.write

  def write(self, step, record):
    real(self, step, record)
    if step == stop_step:
      os.kill(os.getpid(), signal.SIGTERM)
  monkeypatch.setattr(metrics.MetricsWriter, "write", write)


@pytest.mark.parametrize("extra", [
    [],
    ["quantization=te_nvfp4"],
    ["quantization=te_fp8_delayedscaling", "amax_history_len=4"],  # the amax histories are state too
    pytest.param("grain", id="grain"),
    pytest.param("grain+nvfp4", id="grain-te_nvfp4"),
])
def test_sigterm_then_rerun_gives_identical_losses(tmp_path, monkeypatch, corpus, extra):
  if isinstance(extra, str):
    extra = grain_overrides(corpus) + (["quantization=te_nvfp4"] if "nvfp4" in extra else [])
  full = train.train(_cfg(tmp_path, *extra, run="full"))
  with monkeypatch.context() as m:
    _sigterm_after(m, 4)
    first = train.train(_cfg(tmp_path, *extra, run="cut"))
  assert len(first) == 5  # steps 0..4, then a checkpoint at 5 and a clean stop
  assert sorted(int(p.name) for p in (tmp_path / "cut" / "checkpoints").iterdir() if p.name.isdigit()) == [3, 5]
  second = train.train(_cfg(tmp_path, *extra, run="cut"))
  assert first + second == full  # bit for bit


def test_cli_sigterm_exits_cleanly_and_resumes(tmp_path):
  args = [sys.executable, "train.py", "configs/llama3_tiny.yml", *SMALL, f"base_output_directory={tmp_path}",
          "run_name=cli", "enable_checkpointing=true", "checkpoint_period=1000", "steps=400",
          "async_checkpointing=false"]
  proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if line.startswith("completed step: 2,"):
      proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=120) == 0, "".join(lines[-5:])
  stop = [l for l in lines if l.startswith("SIGTERM: stopped after step")]
  assert stop, "".join(lines[-5:])
  done = int(stop[0].split("step ")[1].split(",")[0]) + 1
  assert (tmp_path / "cli" / "checkpoints" / str(done)).is_dir()
  rerun = subprocess.run(args[:-3] + ["steps=" + str(done + 2)], cwd=REPO, capture_output=True, text=True, check=True)
  assert f"resuming from checkpoint {tmp_path}/cli/checkpoints/{done}" in rerun.stdout
  assert f"completed step: {done}," in rerun.stdout and "completed step: 0," not in rerun.stdout


def _corrupt(step_dir: pathlib.Path):
  for f in (step_dir / "state").rglob("*"):
    if f.is_file():
      f.write_bytes(b"garbage")


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
  full = train.train(_cfg(tmp_path, "steps=7"))  # checkpoints 3, 6 and the final 7
  for step in ("7", "6"):
    _corrupt(tmp_path / "r" / "checkpoints" / step)
  resumed = train.train(_cfg(tmp_path, "steps=7"))
  out = capsys.readouterr().out
  assert "checkpoints/7 is unreadable" in out and "checkpoints/6 is unreadable" in out
  assert f"resuming from checkpoint {tmp_path}/r/checkpoints/3" in out
  assert resumed == full[3:]
  for step in ("7", "6", "3"):
    _corrupt(tmp_path / "r" / "checkpoints" / step)
  assert train.main([str(REPO / "configs" / "llama3_tiny.yml"), *SMALL, f"base_output_directory={tmp_path}",
                     "run_name=r", "enable_checkpointing=true", "steps=7"]) == 2
  err = capsys.readouterr().err
  assert "error: no readable checkpoint in" in err and "to start from step 0" in err


def test_load_parameters_and_full_state_paths(tmp_path):
  full = train.train(_cfg(tmp_path, "steps=5", run="src"))  # checkpoints 3 and 5
  src = tmp_path / "src" / "checkpoints" / "3"
  cont = train.train(_cfg(tmp_path, "steps=5", f"load_full_state_path={src}", "enable_checkpointing=false", run="b"))
  assert cont == full[3:]
  fresh = train.train(_cfg(tmp_path, "steps=2", f"load_parameters_path={src}", "enable_checkpointing=false", run="c"))
  assert len(fresh) == 2 and fresh[0] < full[0] - 0.2  # starts from trained weights
  with pytest.raises(checkpointing.CheckpointError, match="is not a checkpoint step directory"):
    train.train(_cfg(tmp_path, f"load_parameters_path={tmp_path}", "enable_checkpointing=false", run="d"))


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
  code = train.main([str(REPO / "configs" / "llama3_tiny.yml"), *SMALL, f"base_output_directory={tmp_path}",
                     "run_name=nan", "enable_checkpointing=true", "checkpoint_period=1", "steps=30",
                     "learning_rate=1e9", "warmup_steps_fraction=0", "gradient_clipping_threshold=0"])
  err = capsys.readouterr().err
  assert code == 2 and "error: loss is nan at step" in err and "the last good checkpoint is" in err
  bad_step = int(err.split("at step ")[1].split(";")[0])
  kept = sorted(int(p.name) for p in (tmp_path / "nan" / "checkpoints").iterdir() if p.name.isdigit())
  assert kept[-1] == bad_step and np.isfinite(bad_step)
