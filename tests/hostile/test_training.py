"""train.py tried as a new user would: stop signals during start-up, the environment variables jax and XLA read, keys
that do nothing under the recipe, the metrics writers on a full disk, and resuming after a save that was killed
mid-write. The one-line promise and its judging: tests/hostile/harness.py."""

import json
import shutil

import pytest

from MaxText import config, precision, train
from MaxText.quantization.errors import BackendError
from tests.hostile import harness
from tests.hostile.harness import TINY


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_stop_signal_during_start_up_is_one_line_and_writes_nothing(tmp_path, sig, code):
  """From the first line of main (before jax loads): no traceback, no crash at exit, no interrupt swallowed by a
  library's callback, no run directory."""
  proc = harness.run(
    harness.train_py(*TINY, "steps=2", f"base_output_directory={tmp_path / 'runs'}"),
    **{"MAXTEXT_SIGNAL_AT": f"start:{sig}"},
  )
  harness.assert_one_line(proc, code, prefix=f"{sig}: stopped during start-up, before training; nothing was written")
  assert "completed step" not in proc.stdout and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
  "flags, needle",
  [
    ("--xla_no_such_flag=1", "XLA has no flag --xla_no_such_flag=1"),
    ("--xla_backend_optimization_level=fast", "XLA can't read the value 'fast' of --xla_backend_optimization_level"),
    ("xla_dump_to=/tmp/x", "'xla_dump_to=/tmp/x' doesn't start with '--'"),
  ],
)
def test_xla_flags_xla_would_abort_on_are_one_line(tmp_path, flags, needle):
  """XLA's parser aborts the process with its usage text (exit 1): the trainer says which flag, before jax starts."""
  proc = harness.run(harness.train_py(*TINY, "steps=1", f"base_output_directory={tmp_path}"), XLA_FLAGS=flags)
  harness.assert_one_line(proc, 2, f"error: XLA_FLAGS={flags!r}: {needle}")
  assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["abc", "5", "0"])
def test_a_memory_fraction_out_of_range_is_one_line(tmp_path, value):
  proc = harness.run(harness.train_py(*TINY, "steps=1"), XLA_PYTHON_CLIENT_MEM_FRACTION=value)
  harness.assert_one_line(proc, 2, f"error: XLA_PYTHON_CLIENT_MEM_FRACTION={value!r} must be a number in (0, 1]")


@pytest.mark.parametrize(
  "overrides, message",
  [
    (
      ["quantization=te_nvfp4", "quantization_scope=all_dense", "attention_quantization=te_fp8_currentscaling"],
      "attention_quantization=te_fp8_currentscaling does nothing with quantization_scope=all_dense: the attention "
      "projections run quantization='te_nvfp4' there",
    ),
    (
      ["quantization=te_nvfp4", "attention_quantization_backend=te"],
      "attention_quantization_backend=te does nothing: the attention projections run in BF16 "
      "(quantization='te_nvfp4' and attention_quantization='')",
    ),
    (
      ["quantization=", "quantization_scope=all_dense", "attention_quantization_backend=emulate"],
      "attention_quantization_backend=emulate does nothing: the attention projections run in BF16 "
      "(quantization='' with quantization_scope=all_dense)",
    ),
    (
      ["quantization=te_fp8_currentscaling", "disable_rht=true"],
      "disable_rht=true applies to the NVFP4 recipes only, but quantization='te_fp8_currentscaling' and "
      "attention_quantization=''",
    ),
    (
      ["quantization=te_nvfp4", "amax_history_len=16"],
      "amax_history_len=16 applies to FP8 delayed scaling only (te_fp8_delayedscaling, fp8: scales from an amax "
      "history), but quantization='te_nvfp4' and attention_quantization=''",
    ),
    (
      ["quantization=", "amax_compute_algo=most_recent"],
      "amax_compute_algo=most_recent applies to FP8 delayed scaling only",
    ),
  ],
)
def test_keys_that_do_nothing_under_the_recipe_are_refused_naming_them(overrides, message):
  with pytest.raises(config.ConfigError) as refused:
    config.load(TINY[0], TINY[1:] + overrides)
  assert str(refused.value).startswith(message), str(refused.value)


def test_keys_in_effect_are_accepted():
  """The same keys where they do something: the attention's own recipe and backend, FP8 delayed scaling's history."""
  config.load(TINY[0], TINY[1:] + ["quantization=te_nvfp4", "attention_quantization=te_fp8_delayedscaling"])
  config.load(TINY[0], TINY[1:] + ["attention_quantization=te_fp8_delayedscaling", "amax_history_len=16"])
  config.load(TINY[0], TINY[1:] + ["attention_quantization=te_mxfp8", "attention_quantization_backend=emulate"])
  config.load(TINY[0], TINY[1:] + ["quantization=te_nvfp4", "quantization_scope=all_dense", "disable_rht=true"])


@pytest.mark.parametrize("key", ["compile_report", "compile_hlo"])
def test_train_compile_outputs_given_to_train_py_are_refused(tmp_path, capsys, key):
  assert train.main([*TINY, f"{key}={tmp_path / 'r'}", f"base_output_directory={tmp_path}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err == (
    f"error: {key}={tmp_path / 'r'} does nothing in a training run: it is where python -m MaxText.train_compile writes "
    f"its {'report' if key == 'compile_report' else 'optimized HLO'}; run train_compile with it, or drop it"
  )
  assert not any(tmp_path.iterdir())


def test_a_backend_refusal_for_the_attention_names_attention_quantization_backend():
  """The quantization library names the one key it knows (quantization_backend) and advises auto, which may be in
  force: the refusal of the attention's backend names the key the user set."""
  cfg = config.load(
    TINY[0],
    TINY[1:]
    + ["quantization=te_nvfp4", "attention_quantization=te_fp8_currentscaling"]
    # attention_quantization_backend=te, quantization_backend=auto (the default): the library says "te"
    + ["attention_quantization_backend=te"],
  )
  said = precision.backend_error_for_key(
    cfg,
    BackendError(
      "quantization_backend=te: te_fp8_currentscaling: no GPU here; use quantization_backend=auto or emulate"
    ),
  )
  assert str(said) == (
    "attention_quantization_backend=te: te_fp8_currentscaling: no GPU here; use attention_quantization_backend=auto "
    "or emulate, or drop it (the attention projections then follow quantization_backend=auto)"
  )
  mlp = BackendError("quantization_backend=xla: te_nvfp4: not here; use quantization_backend=auto or emulate")
  assert precision.backend_error_for_key(cfg, mlp) is mlp  # the MLP's request: quantization_backend's, as said


def test_an_attention_backend_that_cannot_run_here_is_one_line_naming_its_key(tmp_path):
  proc = harness.run(
    harness.train_py(
      *TINY,
      "steps=1",
      "quantization=te_nvfp4",
      "attention_quantization=te_fp8_currentscaling",
      "attention_quantization_backend=te",
      f"base_output_directory={tmp_path}",
    )
  )
  line = harness.assert_one_line(proc, 2, "error: attention_quantization_backend=te: te_fp8_currentscaling: ")
  assert line.endswith("or drop it (the attention projections then follow quantization_backend=auto)")


def test_the_cpu_emulation_warning_leaves_stderr_to_the_error(tmp_path):
  """te_nvfp4 on a CPU runs emulated, which is logged (on stdout): a later mistake is still one line on stderr."""
  (tmp_path / "a_file").write_text("")
  proc = harness.run(
    harness.train_py(*TINY, "steps=1", "quantization=te_nvfp4", f"base_output_directory={tmp_path / 'a_file'}")
  )
  harness.assert_one_line(proc, 2, "error: can't write the run directory")
  assert "running emulated NVFP4 numerics" in proc.stdout


@pytest.mark.slow
def test_metrics_on_a_full_disk_with_tensorboard_are_one_line(tmp_path):
  """The TensorBoard events and metrics.jsonl on a disk that fills mid-run: one line naming the metrics (neither a
  writer thread's traceback, nor a run blocked on that thread's queue, nor exit hooks' tracebacks)."""
  with harness.mounted("nearly", tmp_path / "mnt") as mnt:
    proc = harness.run(
      harness.train_py(*TINY, "steps=400", "enable_tensorboard=true", "log_period=1000", f"base_output_directory={mnt}")
      + ["run_name=r"],
      timeout=600,
    )
    harness.assert_one_line(proc, 2, f"metrics in {mnt}/r")
    assert "(No space left on device); free space or fix the directory" in proc.stderr
    assert not harness.debris(mnt)


def _losses(run_dir):
  return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def _steps(run_dir):
  return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize(
  "stop, code, lines",
  [
    ("SIGKILL", -9, []),
    (
      "SIGTERM+SIGTERM",  # the second signal of a clean stop ends the process at once, mid-save
      143,
      [
        "SIGTERM: stopping after the current step (send it again to exit at once)",
        "SIGTERM again: exiting now without a checkpoint",
      ],
    ),
    ("leftover", 0, []),  # Orbax's temporary directory of the step the rerun saves first, made by hand
  ],
)
def test_a_resume_after_a_killed_save_saves_and_matches_an_uninterrupted_run(tmp_path, stop, code, lines):
  """A save killed mid-write leaves `4.orbax-checkpoint-tmp`: the resumed run removes it before Orbax starts (whose
  own cleanup raced the first save: "No such file or directory"), saves step 4, and its losses are an uninterrupted
  run's."""
  keys = [*TINY, "enable_checkpointing=true", "checkpoint_period=2", "async_checkpointing=true"]
  full = harness.run(harness.train_py(*keys, "steps=6", f"base_output_directory={tmp_path}", "run_name=full"))
  assert full.returncode == 0, full.stderr[-2000:]
  cut = [*keys, f"base_output_directory={tmp_path}", "run_name=cut"]
  first = harness.run(harness.train_py(*cut, "steps=2"))
  assert first.returncode == 0 and _steps(tmp_path / "cut") == ["2"], first.stderr[-2000:]
  if stop == "leftover":  # as a large model's step leaves it: many files (two deletions of it overlap for long)
    leftover = tmp_path / "cut" / "checkpoints" / "4.orbax-checkpoint-tmp"
    shutil.copytree(tmp_path / "cut" / "checkpoints" / "2", leftover)
    for i in range(2000):
      (leftover / "state" / f"shard{i // 100}").mkdir(exist_ok=True)
      (leftover / "state" / f"shard{i // 100}" / str(i)).write_bytes(b"x" * 64)
  else:
    killed = harness.run(harness.train_py(*cut, "steps=6"), MAXTEXT_SIGNAL_AT=f"save:{stop}")
    assert killed.returncode == code and harness.stderr_lines(killed) == lines, killed.stderr[-2000:]
    assert _steps(tmp_path / "cut") == ["2", "4.orbax-checkpoint-tmp"]
  resumed = harness.run(harness.train_py(*cut, "steps=6"))
  assert resumed.returncode == 0 and not harness.stderr_lines(resumed), resumed.stderr[-2000:]
  assert f"resuming from checkpoint {tmp_path}/cut/checkpoints/2" in resumed.stdout
  assert _steps(tmp_path / "cut") == ["2", "4", "6"]
  assert _losses(tmp_path / "cut") == _losses(tmp_path / "full")  # bit for bit, every step
