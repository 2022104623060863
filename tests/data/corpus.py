"""A small text corpus prepared into ArrayRecord shards (and a TFDS dir) for the data and checkpoint tests."""

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
  assert prepare_data.main(["--text-files", str(text_dir / "*.txt"), "--output", str(out), "--num-shards", "2",
                            "--doc-chars", "300", "--eval-every", "5", *extra]) == 0
  return out


def grain_overrides(corpus_dir):
  return ["dataset_type=grain", f"grain_train_files={corpus_dir}/train-*.array_record",
          f"grain_eval_files={corpus_dir}/eval-*.array_record", "tokenizer_type=byte", "vocab_size=258"]


__all__ = ["REPO", "grain_overrides", "make_corpus"]
