"""Run outputs on a URL: an fsspec filesystem (memory://) takes the run directory and metrics.jsonl; a scheme whose
package is missing, or that the checkpoint or TensorBoard libraries can't write, is one line before anything is
written; file:// is a local path."""

import json

import fsspec
import pytest

from MaxText import config, storage, train
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
