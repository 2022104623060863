"""Run outputs on a URL: an fsspec filesystem (memory://) takes the run directory and metrics.jsonl; a scheme whose
package is missing, or that the checkpoint or TensorBoard libraries can't write, is one line before anything is
written; file:// is a local path. Storage faults (a full disk, a file-size limit, a quota, permissions, a name too
long), from the operating system or TensorStore, are one line on every command line (cli.run)."""

import errno
import json

import fsspec
import pytest

from MaxText import cli, config, storage, train
from MaxText.errors import UserError
from tests.conftest import REPO
from tests.trainer.test_train import SMALL


def _memory():
  fs = fsspec.filesystem("memory")
  if fs.exists("/runs"):
    fs.rm("/runs", recursive=True)
  return fs


def test_a_run_writes_its_metrics_to_an_fsspec_url():
  fs = _memory()
  cfg = config.load(REPO / "configs" / "llama3_tiny.yml", SMALL + ["steps=3", "base_output_directory=memory://runs"])
  losses = train.train(cfg.replace(run_name="r"))
  rows = [json.loads(l) for l in fs.cat_file("/runs/r/metrics.jsonl").decode().splitlines()]
  assert [r["step"] for r in rows] == [0, 1, 2] and [r["loss"] for r in rows] == pytest.approx(losses)
  # metrics.jsonl is there: a second run without checkpoints is refused rather than appended to, as locally
  with pytest.raises(UserError, match="already holds the metrics of an earlier run"):
    train.train(cfg.replace(run_name="r"))


def test_append_file_rewrites_whole_objects_and_keeps_earlier_rows():
  fs = _memory()
  fs.pipe_file("/runs/a/metrics.jsonl", b"old\n")
  f = storage.AppendFile("memory://runs/a/metrics.jsonl")
  f.write("new\n")
  assert fs.cat_file("/runs/a/metrics.jsonl") == b"old\n"  # nothing until the flush
  f.close()
  assert fs.cat_file("/runs/a/metrics.jsonl") == b"old\nnew\n"


@pytest.mark.parametrize(
  "extra, message",
  [
    (["base_output_directory=gs://bucket/runs"], "gs:// needs the gcsfs package, which is not installed: pip install"),
    (
      ["base_output_directory=memory://runs", "enable_checkpointing=true", "enable_tensorboard=false"],
      "checkpoints go through Orbax and TensorStore, which read and write local paths, gs:// and s3://, not memory://",
    ),
    (["base_output_directory=memory://runs", "enable_tensorboard=true"], "tensorboardX, which writes local paths"),
    (["load_parameters_path=s3://b/ckpt/3"], "s3:// needs the s3fs package"),
    (
      ["dataset_type=grain", "grain_train_files=gs://b/train-*", "grain_eval_files="],
      "ArrayRecord shards are read from a local or mounted path",
    ),
  ],
)
def test_unservable_urls_are_one_line_before_anything_is_written(tmp_path, capsys, extra, message):
  fs = _memory()
  argv = [str(REPO / "configs" / "llama3_tiny.yml"), *SMALL, "steps=2", f"base_output_directory={tmp_path}", *extra]
  assert train.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and message in err[0], err
  assert not fs.exists("/runs") and not list(tmp_path.iterdir())


def test_file_urls_are_local_paths(tmp_path):
  cfg = config.load(None, [f"base_output_directory=file://{tmp_path}/runs", "load_parameters_path=file:///x/3"])
  assert (cfg.base_output_directory, cfg.load_parameters_path) == (f"{tmp_path}/runs", "/x/3")
  assert config.load(None, ["base_output_directory=gs://b/runs"]).base_output_directory == "gs://b/runs"


_TS_EFBIG = (
  'OUT_OF_RANGE: Error writing local file "/d/x/0.0": Failed writing: "/d/x/0.0.__lock": Failed to write 28672 '
  "bytes to file 6: File too large [os_error_code='27'] [source locations='tensorstore/internal/os/file_util.cc:1']"
)


def _chained(outer, inner):
  try:
    raise inner
  except OSError:
    try:
      raise outer  # pylint: disable=raise-missing-from  (raised while handling, as library code does)
    except RuntimeError as e:
      return e


@pytest.mark.parametrize(
  "error, line",
  [
    (OSError(errno.ENOSPC, "No space left on device", "/d/f"), "/d/f: No space left on device: the filesystem is full"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/d/f"), "/d/f: Disk quota exceeded: your disk quota is used up"),
    (OSError(errno.EFBIG, "File too large", "/d/f"), "/d/f: File too large: the file outgrew the file-size limit"),
    (PermissionError(errno.EACCES, "Permission denied", "/d"), "/d: Permission denied: fix its permissions"),
    (OSError(errno.EROFS, "Read-only file system", "/m/f"), "/m/f: Read-only file system: the filesystem is read-only"),
    (OSError(errno.ENAMETOOLONG, "File name too long", "/x"), "/x: File name too long: shorten the name"),
    (ValueError(_TS_EFBIG), "/d/x/0.0: File too large: the file outgrew the file-size limit (ulimit -f)"),
    (ValueError("RESOURCE_EXHAUSTED: Error writing file: [OS error: 28]"), "a file: No space left on device: the"),
    (_chained(RuntimeError("the writer failed"), OSError(errno.ENOSPC, "No space", "/d/g")), "/d/g: No space"),
  ],
)
def test_a_storage_fault_anywhere_is_one_line_on_every_command_line(capsys, error, line):
  def command(argv):
    raise error

  assert cli.run("doc", ["x"], command) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: {line}") and err.count("\n") == 1, err


@pytest.mark.parametrize(
  "error",
  [
    OSError(errno.EBADF, "Bad file descriptor"),  # a bug, not the storage
    ValueError('OUT_OF_RANGE: Error reading "a" in OCDBT database: Requested byte range [5, 9) is not valid'),
    ValueError("could not convert string to float: '10k'"),
  ],
)
def test_anything_else_stays_a_traceback(error):
  def command(argv):
    raise error

  with pytest.raises(type(error)):
    cli.run("doc", ["x"], command)
