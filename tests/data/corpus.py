"""A small text corpus prepared into ArrayRecord shards (and a TFDS dir) for the data and checkpoint tests."""

import json
import pathlib

from tests.conftest import REPO

TEXT = """ROMEO. But soft, what light through yonder window breaks?
It is the east, and Juliet is the sun.

JULIET. O Romeo, Romeo, wherefore art thou Romeo?
Deny thy father and refuse thy name.

HAMLET. To be, or not to be, that is the question:
Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune.
"""


def make_corpus(directory: pathlib.Path, *extra):
  from scripts import prepare_data  # pylint: disable=import-outside-toplevel

  text_dir = directory / "text"
  text_dir.mkdir(parents=True, exist_ok=True)
  for i in range(6):
    (text_dir / f"part{i}.txt").write_text(f"Part {i}.\n\n" + TEXT * (i + 2), encoding="utf-8")
  out = directory / "data"
  assert (
    prepare_data.main(
      [
        "--text-files",
        str(text_dir / "*.txt"),
        "--output",
        str(out),
        "--num-shards",
        "2",
        "--doc-chars",
        "300",
        "--eval-every",
        "5",
        *extra,
      ]
    )
    == 0
  )
  return out


def write_shard(path: pathlib.Path, records, record_format=None):
  """An ArrayRecord shard of `records` (bytes), with a metadata.json beside it when `record_format` is given."""
  from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=import-outside-toplevel

  path.parent.mkdir(parents=True, exist_ok=True)
  writer = ArrayRecordWriter(str(path), "group_size:1")
  for record in records:
    writer.write(record)
  writer.close()
  if record_format:
    (path.parent / "metadata.json").write_text(json.dumps({"record_format": record_format}), encoding="utf-8")
  return path


def grain_overrides(corpus_dir):
  return [
    "dataset_type=grain",
    f"grain_train_files={corpus_dir}/train-*.array_record",
    f"grain_eval_files={corpus_dir}/eval-*.array_record",
    "tokenizer_type=byte",
    "vocab_size=258",
  ]


__all__ = ["REPO", "grain_overrides", "make_corpus", "write_shard"]
