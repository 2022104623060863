"""Checkpoints: bit-exact resume after SIGTERM (synthetic and grain data, BF16 and NVFP4), corrupt-checkpoint
fallback, load paths, and a NaN loss that keeps the last good checkpoint."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from MaxText import checkpointing, config, train
from MaxText.trainer.hooks import metrics
from tests.conftest import REPO
from tests.data.corpus import grain_overrides
from tests.trainer.test_train import SMALL


def _cfg(tmp_path, *extra, run="r"):
  return config.load(
    REPO / "configs" / "llama3_tiny.yml",
    SMALL
    + [
      f"base_output_directory={tmp_path}",
      f"run_name={run}",
      "enable_checkpointing=true",
      "steps=8",
      "checkpoint_period=3",
    ]
    + list(extra),
  )


def _sigterm_after(monkeypatch, stop_step):
  """Deliver a real SIGTERM to this process while step `stop_step` is being recorded."""
  real = metrics.MetricsWriter.write

  def write(self, step, record):
    real(self, step, record)
    if step == stop_step:
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(metrics.MetricsWriter, "write", write)


@pytest.mark.parametrize(
  "extra",
  [
    [],
    pytest.param(["quantization=te_fp8_delayedscaling", "amax_history_len=4"], marks=pytest.mark.slow),  # amax state
    pytest.param("grain+nvfp4", id="grain-te_nvfp4", marks=pytest.mark.slow),  # the data position, NVFP4's SR keys
  ],
)
@pytest.mark.heavy
def test_sigterm_then_rerun_gives_identical_losses(tmp_path, monkeypatch, corpus, extra):
  if isinstance(extra, str):
    extra = grain_overrides(corpus) + (["quantization=te_nvfp4"] if "nvfp4" in extra else [])
  full = train.train(_cfg(tmp_path, *extra, run="full"))
  with monkeypatch.context() as m:
    _sigterm_after(m, 4)
    first = train.train(_cfg(tmp_path, *extra, run="cut"))
  # Steps 0..4, and step 5 when it was already dispatched (steps run one ahead of their metrics); then a
  # checkpoint after the last finished step and a clean stop.
  assert len(first) in (5, 6)
  assert sorted(int(p.name) for p in (tmp_path / "cut" / "checkpoints").iterdir() if p.name.isdigit()) == [
    3,
    len(first),
  ]
  second = train.train(_cfg(tmp_path, *extra, run="cut"))
  assert first + second == full  # bit for bit


@pytest.mark.parametrize(
  "sig, code",
  [  # SIGTERM's handling runs in-process in test_sigterm_then_rerun_...
    pytest.param(signal.SIGTERM, 0, marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow),
  ],
)
def test_cli_stop_signal_exits_cleanly_and_resumes(tmp_path, sig, code):
  """SIGTERM (Slurm) and SIGINT (Ctrl-C) both checkpoint and stop; a second trainer on the live run is refused."""
  args = [
    sys.executable,
    "train.py",
    "configs/llama3_tiny.yml",
    *SMALL,
    f"base_output_directory={tmp_path}",
    "run_name=cli",
    "enable_checkpointing=true",
    "checkpoint_period=100000",
    "steps=100000",
    "async_checkpointing=false",
  ]  # runs until the signal
  proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if line.startswith("completed step: 2,"):
      second = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
      assert second.returncode == 2 and second.stderr.strip() == (
        f"error: run directory {tmp_path}/cli is in use by pid {proc.pid} on {os.uname().nodename} (since "
        f"{second.stderr.split('(since ')[1].split(')')[0]}); wait for it to finish, stop it, or pick another "
        "run_name"
      ), second.stderr
      proc.send_signal(sig)
  assert proc.wait(timeout=120) == code, "".join(lines[-5:])
  stop = [l for l in lines if l.startswith(f"{sig.name}: stopped after step")]
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
  # The damaged steps were moved aside and written again by the resumed run.
  ckpts = tmp_path / "r" / "checkpoints"
  assert sorted(p.name for p in ckpts.iterdir()) == ["3", "6", "6.corrupt", "7", "7.corrupt"]
  for step in ("7", "6", "3"):
    _corrupt(tmp_path / "r" / "checkpoints" / step)
  assert (
    train.main(
      [
        str(REPO / "configs" / "llama3_tiny.yml"),
        *SMALL,
        f"base_output_directory={tmp_path}",
        "run_name=r",
        "enable_checkpointing=true",
        "steps=7",
      ]
    )
    == 2
  )
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
  code = train.main(
    [
      str(REPO / "configs" / "llama3_tiny.yml"),
      *SMALL,
      f"base_output_directory={tmp_path}",
      "run_name=nan",
      "enable_checkpointing=true",
      "checkpoint_period=1",
      "steps=30",
      "learning_rate=1e9",
      "warmup_steps_fraction=0",
      "gradient_clipping_threshold=0",
    ]
  )
  err = capsys.readouterr().err
  assert code == 2 and "error: loss is nan at step" in err and "the last good checkpoint is" in err
  bad_step = int(err.split("at step ")[1].split(";")[0])
  kept = sorted(int(p.name) for p in (tmp_path / "nan" / "checkpoints").iterdir() if p.name.isdigit())
  assert kept[-1] == bad_step and np.isfinite(bad_step)


def _cli(tmp_path, *extra, run="cli"):
  return subprocess.run(
    [
      sys.executable,
      "train.py",
      "configs/llama3_tiny.yml",
      *SMALL,
      f"base_output_directory={tmp_path}",
      f"run_name={run}",
      "enable_checkpointing=true",
      "checkpoint_period=2",
      "async_checkpointing=false",
      *extra,
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )


@pytest.mark.slow
def test_damaged_changed_and_finished_runs_lose_nothing(tmp_path):
  """One run (checkpoints 2, 4) resumed four ways: another model shape (named, nothing moved), a finished
  run (nothing to train), damage at 4 plus a junk 99 with keep=2 (both moved aside, 4 rewritten,
  retention keeps the readable 4 and 6, Orbax's noise off stderr), and the rewritten steps read back."""
  assert _cli(tmp_path, "steps=4", "max_num_checkpoints_to_keep=2").returncode == 0
  ckpts = tmp_path / "cli" / "checkpoints"

  proc = _cli(tmp_path, "steps=6", "base_mlp_dim=96")
  assert proc.returncode == 2 and proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr[-2000:]
  assert proc.stderr.startswith(f"error: checkpoint {ckpts}/4 holds another model shape (a parameter stored as ")
  assert sorted(p.name for p in ckpts.iterdir()) == ["2", "4"]  # not moved aside: it is not damaged

  proc = _cli(tmp_path, "steps=3")
  assert proc.returncode == 0 and "the run is at step 4 already (steps=3): nothing to train" in proc.stdout

  _corrupt(ckpts / "4")
  (ckpts / "99").mkdir()
  proc = _cli(tmp_path, "steps=6", "max_num_checkpoints_to_keep=2")
  assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]  # Orbax's noise went to the log
  assert f"resuming from checkpoint {ckpts}/2" in proc.stdout
  assert f"moved the unreadable checkpoint {ckpts}/4 aside to 4.corrupt" in proc.stdout
  assert sorted(p.name for p in ckpts.iterdir()) == ["4", "4.corrupt", "6", "99.corrupt"]
  assert (tmp_path / "cli" / "checkpoint_errors.log").stat().st_size > 0
  assert "resuming from checkpoint " + str(ckpts / "6") in _cli(tmp_path, "steps=7").stdout  # 6 is readable
  # Every step's metrics row reached disk with its checkpoint.
  rows = [json.loads(l)["step"] for l in (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()]
  assert rows == [0, 1, 2, 3, 4, 5, 6]  # once each: a resume rewrites the steps after its checkpoint


def _limited_file_size(limit_bytes):
  """preexec_fn: files larger than `limit_bytes` fail to write (EFBIG), as on a full disk, without privileges."""
  import resource  # pylint: disable=import-outside-toplevel

  def apply():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

  return apply


def test_a_save_that_fails_in_the_background_stops_the_run_at_once(tmp_path):
  """Checkpoints too big for the storage (async saves): one line naming the step, no step directory a resume
  would pick, and the run stops at the next step rather than training on without checkpoints."""
  args = [
    sys.executable,
    "train.py",
    "configs/llama3_tiny.yml",
    *SMALL,
    f"base_output_directory={tmp_path}",
    "run_name=full",
    "enable_checkpointing=true",
    "checkpoint_period=2",
    "steps=40",
    "async_checkpointing=true",
  ]
  proc = subprocess.run(
    args, cwd=REPO, capture_output=True, text=True, timeout=300, preexec_fn=_limited_file_size(150_000)
  )
  assert proc.returncode == 2 and proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr[-3000:]
  assert "Traceback" not in proc.stdout  # the compilation cache's failed writes: one warning line at most
  assert proc.stderr.startswith(
    f"error: saving the checkpoint at step 2 in {tmp_path}/full/checkpoints failed (File "
    "too large); no checkpoint was saved before it"
  )
  # Nothing a resume or a listing would see: no step directory, and not Orbax's unfinished '2.orbax-checkpoint-tmp'.
  assert sorted(p.name for p in (tmp_path / "full" / "checkpoints").iterdir()) == []
  assert proc.stdout.count("completed step") <= 6  # noticed within a few steps, not at the next period


def test_what_an_interrupted_save_left_is_gone_when_the_next_run_starts(tmp_path):
  """A save killed midway leaves Orbax's '<step>.orbax-checkpoint-tmp*' directory: the next checkpointer removes it
  before anything lists the steps, and the newest complete checkpoint is the one resumed."""
  state = {"w": np.arange(4.0)}
  first = checkpointing.Checkpointer(tmp_path / "ck", period=1, max_to_keep=0, async_save=False)
  first.save(1, state, {}, force=True)
  first.close()
  unfinished = tmp_path / "ck" / "2.orbax-checkpoint-tmp-1732512345"
  (unfinished / "state").mkdir(parents=True)
  (unfinished / "state" / "half_written").write_bytes(b"x" * 100)
  again = checkpointing.Checkpointer(tmp_path / "ck", period=1, max_to_keep=0, async_save=False)
  try:
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["1"] and again.steps() == [1]
    step, restored, _ = again.restore_latest(state)
    assert step == 1 and np.array_equal(restored["w"], state["w"])
  finally:
    again.close()


def test_a_checkpoint_directory_gone_mid_run_names_the_step_and_the_last_good_one(tmp_path, monkeypatch, capsys):
  real = metrics.MetricsWriter.write
  ckpts = tmp_path / "gone" / "checkpoints"

  def write(self, step, record):
    real(self, step, record)
    if step == 4:  # after checkpoint 4 is written: the directory is removed and a file takes its place
      shutil.rmtree(ckpts)
      ckpts.write_text("not a directory")

  monkeypatch.setattr(metrics.MetricsWriter, "write", write)
  code = train.main(
    [
      str(REPO / "configs" / "llama3_tiny.yml"),
      *SMALL,
      f"base_output_directory={tmp_path}",
      "run_name=gone",
      "enable_checkpointing=true",
      "checkpoint_period=3",
      "steps=9",
      "async_checkpointing=false",
    ]
  )
  err = capsys.readouterr().err
  assert code == 2 and err.startswith(f"error: saving the checkpoint at step 6 in {ckpts} failed ("), err
  assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_resume_under_other_data_or_recipe_state_is_named_and_nothing_is_moved(tmp_path, corpus, capsys):
  def run(*extra, name="x"):
    code = train.main(
      [
        str(REPO / "configs" / "llama3_tiny.yml"),
        *SMALL,
        f"base_output_directory={tmp_path}",
        f"run_name={name}",
        "enable_checkpointing=true",
        "checkpoint_period=2",
        "async_checkpointing=false",
        *extra,
      ]
    )
    out, err = capsys.readouterr()
    return code, out, err

  assert run("steps=2")[0] == 0  # synthetic data, checkpoint 2
  ckpts = tmp_path / "x" / "checkpoints"
  code, _, err = run("steps=4", *grain_overrides(corpus))
  assert (
    code == 2
    and "can't continue under this config: it was written reading other data (dataset_type: 'synthetic' -> 'grain'"
    in err
    and len(err.strip().splitlines()) == 1
  ), err
  code, _, err = run("steps=4", "quantization=te_fp8_delayedscaling", "amax_history_len=4")
  assert code == 2 and "FP8 delayed scaling's amax histories" in err, err
  assert sorted(p.name for p in ckpts.iterdir()) == ["2"]  # good checkpoints stay where they are
  # load_full_state_path on a copy not named by its step: the step comes from the checkpoint itself.
  shutil.copytree(ckpts / "2", tmp_path / "best")
  code, out, _ = run("steps=3", f"load_full_state_path={tmp_path / 'best'}", "enable_checkpointing=false", name="y")
  assert code == 0 and f"loaded the full state from {tmp_path / 'best'} (step 2)" in out
  assert "completed step: 2," in out and "completed step: 1," not in out
  assert "recipe change" not in out
  # Another recipe on resume (a late switch to NVFP4): it goes on, saying so in one line, and metrics.jsonl says it.
  code, out, _ = run("steps=3", "quantization=te_nvfp4")
  change = [line for line in out.splitlines() if "recipe change" in line]
  assert code == 0 and change == [
    "recipe change on resume at step 2: the checkpoint was trained with quantization=bf16 (layers 0-1: bf16); "
    "this run goes on with quantization=te_nvfp4 (layers 0-1: mlp te_nvfp4, attention bf16)"
  ], out
  rows = [json.loads(l) for l in (tmp_path / "x" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [0, 1, 2] and "recipe_change" not in rows[1]
  assert rows[2]["recipe_change"] == {
    "step": 2,
    "from": {"recipe": "quantization=bf16", "plan": "layers 0-1: bf16"},
    "to": {"recipe": "quantization=te_nvfp4", "plan": "layers 0-1: mlp te_nvfp4, attention bf16"},
  }
  assert "recipe change" not in run("steps=4", "quantization=te_nvfp4")[1]  # the same recipe as checkpoint 3's


def test_checkpoints_from_before_absolute_paths_still_match(tmp_path, monkeypatch):
  """A checkpoint's meta written when paths were kept as typed (relative) is read against the working directory,
  as the run that wrote it read them: the same data is no 'change' on resume; other data still is."""
  monkeypatch.chdir(tmp_path)
  cfg = config.load(REPO / "configs" / "llama3_tiny.yml", ["grain_train_files=data/train-*.array_record"])
  stored = {**cfg.to_dict(), "grain_train_files": "data/train-*.array_record", "tokenizer_path": cfg.tokenizer_path}
  assert checkpointing.settings_difference(stored, cfg) is None
  stored["grain_train_files"] = "other/train-*.array_record"
  assert checkpointing.settings_difference(stored, cfg) == (
    f"grain_train_files: 'other/train-*.array_record' -> '{tmp_path}/data/train-*.array_record'"
  )


def test_a_fused_mlp_checkpoint_under_an_unfused_config_names_the_key():
  fused = {"params.layers.mlp.gate_up.kernel.value", "params.layers.mlp.down.kernel.value"}
  unfused = {"params": {"layers": {"mlp": {k: {"kernel": {"value": np.zeros(1)}} for k in ("gate", "up", "down")}}}}
  assert checkpointing.checkpointer.structure_difference(fused, unfused) == (
    "its MLP was trained with fused_mlp=true (gate and up as one kernel) and this config has fused_mlp=false"
  )
  unfused_names = {f"params.layers.mlp.{k}.kernel.value" for k in ("gate", "up", "down")}
  fused_tree = {"params": {"layers": {"mlp": {k: {"kernel": {"value": np.zeros(1)}} for k in ("gate_up", "down")}}}}
  assert "trained with fused_mlp=false (gate and up as two kernels)" in checkpointing.checkpointer.structure_difference(
    unfused_names, fused_tree
  )
