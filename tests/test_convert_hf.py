"""convert_hf's command line: which parameters to-hf exports (a run's newest readable checkpoint with its recorded
config, a config's run, else its load_parameters_path), its one-line refusals, and what a failure leaves: storage
faults (a full disk, a file-size limit, a name too long) as one line naming the file, stop signals, a killed
conversion's partial output, damaged checkpoints skipped as a resuming run skips them."""

import errno
import os
import pathlib
import resource
import shutil
import signal
import subprocess
import sys

import pytest
import yaml

from MaxText import convert_hf
from MaxText.checkpointing.hf import HFError
from tests.conftest import HF_TINY, REPO, cpu_subprocess_env


def test_export_sources(hf_tiny_import, tmp_path):
  config_yml = hf_tiny_import / "config.yml"
  cfg, step_dir = convert_hf.export_source(config_yml)
  assert step_dir == pathlib.Path(cfg.load_parameters_path) and cfg.base_emb_dim == 64
  cfg, step_dir = convert_hf.export_source(hf_tiny_import)  # the import's directory: its checkpoints/0, config.yml
  assert step_dir == hf_tiny_import / "checkpoints" / "0" and cfg.vocab_size == 384
  cfg, _ = convert_hf.export_source(hf_tiny_import, ["base_output_directory=/elsewhere"])
  assert cfg.base_output_directory == "/elsewhere"
  with pytest.raises(HFError, match="is a Hugging Face directory already"):
    convert_hf.export_source(config_yml, [f"load_parameters_path={HF_TINY}"])
  with pytest.raises(HFError, match="nothing to export"):
    convert_hf.export_source(config_yml, ["load_parameters_path="])
  with pytest.raises(HFError, match="no checkpoints/<step> and no config.yml"):
    convert_hf.export_source(tmp_path)


@pytest.mark.parametrize(
  "argv, message",
  [
    (["to-hf"], "the following arguments are required"),
    (["to-hf", "x.yml", "out", "--dtype", "int8"], "invalid choice: 'int8'"),
    (["export", "a", "b"], "invalid choice: 'export'"),
  ],
)
def test_bad_command_lines_are_one_line_errors(capsys, argv, message):
  assert convert_hf.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


# Hardening (#45): the three command lines' one error path, staged outputs, shared checkpoint reading.


def _cli(*args, preexec_fn=None, cwd=REPO):
  return subprocess.run(
    [sys.executable, "-m", "MaxText.convert_hf", *map(str, args)],
    cwd=cwd,
    capture_output=True,
    text=True,
    check=False,
    preexec_fn=preexec_fn,
    env=cpu_subprocess_env(1),
  )


def _run_dir(hf_tiny_import, where, steps=(0,)):
  """A run directory made of the import: config.yml and its parameter checkpoint copied to each of `steps`."""
  where.mkdir(parents=True)
  shutil.copyfile(hf_tiny_import / "config.yml", where / "config.yml")
  for step in steps:
    shutil.copytree(hf_tiny_import / "checkpoints" / "0", where / "checkpoints" / str(step))
  return where


def _truncate_chunks(step_dir):
  """Every array chunk of a checkpoint's state cut to 10 bytes (a copy interrupted midway)."""
  for f in (step_dir / "state").rglob("*"):
    if f.is_file() and not f.name.startswith((".", "_")):
      f.write_bytes(f.read_bytes()[:10])


def _leftovers(root):
  return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".partial-" in p.name)


@pytest.mark.parametrize(
  "argv, message",
  [
    (["to-hf", "run", "out", "--max-shard-size", "0"], "argument --max-shard-size: 0 must be >= 1"),
    (["to-hf", "run", "out", "--max-shard-size", "-5"], "argument --max-shard-size: -5 must be >= 1"),
    (["to-hf", "run", "out", "--max-shard-size", "5GB"], "argument --max-shard-size: '5GB' is not an integer"),
    (["to-hf", "run", "out", "--nvfp4", "--calibration-batches", "0"], "--calibration-batches: 0 must be >= 1"),
  ],
)
def test_counts_and_sizes_below_one_are_refused(capsys, argv, message):
  assert convert_hf.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_relative_paths_are_made_absolute_where_they_are_parsed(hf_tiny_import, tmp_path, monkeypatch, capsys):
  """Orbax reads absolute paths only: a run directory given relative to the working directory exports all the
  same, and an import given relative paths writes absolute ones into its config.yml."""
  _run_dir(hf_tiny_import, tmp_path / "run")
  monkeypatch.chdir(tmp_path)
  assert convert_hf.main(["to-hf", "run", "out"]) == 0
  assert f"exported {tmp_path}/run/checkpoints/0 -> {tmp_path}/out" in capsys.readouterr().out
  shutil.copytree(HF_TINY, tmp_path / "hf")
  assert convert_hf.main(["to-maxtext", "hf", "imported"]) == 0
  written = yaml.safe_load((tmp_path / "imported" / "config.yml").read_text())
  assert written["load_parameters_path"] == f"{tmp_path}/imported/checkpoints/0"
  assert written["tokenizer_path"] == f"{tmp_path}/imported/hf/tokenizer.json"


def test_an_unreadable_newer_checkpoint_is_said_and_the_previous_one_exported(hf_tiny_import, tmp_path, capsys):
  """As a resuming run does: a damaged newest step and a junk one (an empty state directory) are each one line,
  and the newest readable step is exported; with none readable, one error line."""
  run = _run_dir(hf_tiny_import, tmp_path / "run", steps=(1, 2))
  _truncate_chunks(run / "checkpoints" / "2")
  (run / "checkpoints" / "7" / "state").mkdir(parents=True)
  assert convert_hf.main(["to-hf", str(run), str(tmp_path / "out")]) == 0
  out = capsys.readouterr().out.splitlines()
  ckpts = run / "checkpoints"
  assert (
    out[0] == f"warning: checkpoint {ckpts}/7 is unreadable (its state directory is empty); trying the previous one"
  )
  assert out[1].startswith(
    f"warning: checkpoint {ckpts}/2 is unreadable (FAILED_PRECONDITION: Error reading local file"
  )
  assert out[1].endswith("; trying the previous one") and "Not enough data" in out[1]
  assert out[-1].startswith(f"exported {ckpts}/1 -> {tmp_path}/out: 30 tensors")
  _truncate_chunks(ckpts / "1")
  assert convert_hf.main(["to-hf", str(run), str(tmp_path / "out2")]) == 2
  err = capsys.readouterr().err
  assert err == (
    f"error: no readable checkpoint in {ckpts} (tried steps [7, 2, 1]); train the run again, or point at another "
    "checkpoint\n"
  )
  assert not (tmp_path / "out2").exists() and not _leftovers(tmp_path)


def test_a_full_disk_while_writing_tensors_is_the_error_not_the_cleanup(hf_tiny_import, tmp_path, monkeypatch, capsys):
  """os.pwrite failing with ENOSPC (patched at the OS boundary): the line names the file and what to do; closing
  the half-written files doesn't replace the error with theirs ("tensors not written in full")."""
  real, written = os.pwrite, []

  def pwrite(fd, data, offset):
    written.append(len(data))
    if sum(written) > 200_000:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real(fd, data, offset)

  monkeypatch.setattr(os, "pwrite", pwrite)
  assert convert_hf.main(["to-hf", str(hf_tiny_import), str(tmp_path / "out"), "--dtype", "float32"]) == 2
  assert capsys.readouterr().err == (
    f"error: writing {tmp_path}/out/model.safetensors: No space left on device: the filesystem is full: free space "
    "on it (or write elsewhere) and rerun; nothing was written (the partial output was removed)\n"
  )
  assert not list(tmp_path.iterdir())


def _file_size_limit(limit_bytes):
  def apply():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of the process being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

  return apply


@pytest.mark.parametrize("command", ["to-maxtext", "to-hf"])
def test_a_file_size_limit_is_one_line_naming_the_file(hf_tiny_import, tmp_path, command):
  """RLIMIT_FSIZE makes writes fail with EFBIG: TensorStore reports it as OUT_OF_RANGE (the import's zarr chunks),
  os.pwrite as an OSError (the export's safetensors); both are the same line, and nothing is left."""
  source = HF_TINY if command == "to-maxtext" else hf_tiny_import
  result = _cli(command, source, tmp_path / "out", preexec_fn=_file_size_limit(20_000))
  assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-3000:]
  first = "checkpoints/0/state/params." if command == "to-maxtext" else "model"
  assert result.stderr.startswith(f"error: writing {tmp_path}/out/{first}"), result.stderr
  assert ": File too large: the file outgrew the file-size limit (ulimit -f)" in result.stderr
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["to-maxtext", "to-hf"])
def test_an_output_name_too_long_is_one_line_before_any_work(hf_tiny_import, tmp_path, capsys, command):
  source = HF_TINY if command == "to-maxtext" else hf_tiny_import
  out = tmp_path / ("x" * 300)
  assert convert_hf.main([command, str(source), str(out)]) == 2
  assert capsys.readouterr().err == (
    f"error: output directory {out}: File name too long: shorten the name (a file name holds at most 255 bytes, a "
    "path 4095); nothing was written\n"
  )


STOP_MIDWAY = """
import os, signal, sys
from MaxText import convert_hf
from MaxText.checkpointing.hf import orbax_writer, safetensors_file
writer = orbax_writer.ParamCheckpointWriter if sys.argv[1] == "to-maxtext" else safetensors_file.SafetensorsWriter
real, calls = writer.write, []
def write(self, *args, **kwargs):
  calls.append(1)
  if len(calls) == 3:  # mid-write: files in the partial output already
    os.kill(os.getpid(), signal.{signal})
  return real(self, *args, **kwargs)
writer.write = write
sys.exit(convert_hf.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["to-maxtext", "to-hf"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_mid_write_leaves_nothing(hf_tiny_import, tmp_path, command, sig):
  source = HF_TINY if command == "to-maxtext" else hf_tiny_import
  result = subprocess.run(
    [sys.executable, "-c", STOP_MIDWAY.format(signal=sig.name), command, str(source), str(tmp_path / "new" / "out")],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=False,
    env=cpu_subprocess_env(1),
  )
  assert result.returncode == 128 + sig, result.stderr[-3000:]
  assert result.stderr == (
    f"stopped by {sig.name}: {tmp_path}/new/out was not written (the partial output was removed)\n"
  )
  assert not list(tmp_path.iterdir())  # the partial output and the parent made for it


def test_a_killed_conversions_partial_output_is_removed_and_a_live_ones_named(tmp_path, capsys):
  stale = tmp_path / ".out.partial-4194999"  # above any pid_max: its process can't be running
  (stale / "checkpoints").mkdir(parents=True)
  (stale / "checkpoints" / "half").write_bytes(b"x" * 1000)
  assert convert_hf.main(["to-maxtext", str(HF_TINY), str(tmp_path / "out")]) == 0
  assert (
    f"removed {stale}: the partial output of a conversion that was killed (process 4194999, no longer running)"
    in (capsys.readouterr().out)
  )
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
  # A partial output whose process still holds it (its flock): named, left alone.
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import fcntl, os, sys, time; d = f'{sys.argv[1]}/.out2.partial-{os.getpid()}'; os.mkdir(d); "
      "fd = os.open(d, os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
      str(tmp_path),
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline() == "held\n"
    assert convert_hf.main(["to-maxtext", str(HF_TINY), str(tmp_path / "out2")]) == 2
    assert capsys.readouterr().err == (
      f"error: output directory {tmp_path}/out2 is being written by process {holder.pid} (into "
      f"{tmp_path}/.out2.partial-{holder.pid}); wait for it to finish or stop it, or give another directory "
      "(nothing was written)\n"
    )
    assert (tmp_path / f".out2.partial-{holder.pid}").is_dir() and not (tmp_path / "out2").exists()
  finally:
    holder.kill()
    holder.wait()
