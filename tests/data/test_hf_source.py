"""dataset_type=hf (MaxText's keys) on local parquet and JSON files this test writes (no Hub access): the grain
path's packing, process slices, exact resume, an eval split from hf_eval_files, and one-line errors."""

import json
import re

import numpy as np
import pytest

from MaxText import config, data
from tests.data.corpus import REPO
from tests.trainer.test_train import SMALL

datasets = pytest.importorskip("datasets")  # requirements.txt pins it; skipped only in an environment without it


@pytest.fixture(autouse=True)
def _offline_and_prompt(monkeypatch):
  """No Hub access; and no 5 s pause where datasets closes a shuffled multi-file stream (its workaround for an Arrow
  thread-shutdown crash, apache/arrow#45214, which these small in-memory reads don't need)."""
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0)


WORDS = "the quick brown fox jumps over a lazy dog and then runs far away into the night".split()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(0)
  docs = [" ".join(rng.choice(WORDS, rng.integers(3, 40))) + f" #{i}" for i in range(120)]
  root = tmp_path_factory.mktemp("hf")
  for i in range(2):
    pq.write_table(pa.table({"text": docs[i * 50 : (i + 1) * 50], "n": list(range(50))}), root / f"train-{i}.parquet")
  pq.write_table(pa.table({"text": docs[100:]}), root / "eval-0.parquet")
  with open(root / "docs.jsonl", "w", encoding="utf-8") as f:
    for d in docs[:100]:
      f.write(json.dumps({"content": d}) + "\n")
  return root, docs


def _cfg(files, *extra):
  root, _ = files
  return config.load(
    REPO / "configs" / "llama3_tiny.yml",
    SMALL
    + ["dataset_type=hf", "hf_path=parquet", f"hf_train_files={root}/train-*.parquet", "tokenizer_type=byte"]
    + list(extra),
  )


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_documents_are_packed_as_grain_packs_them(files):
  cfg = _cfg(files, "max_target_length=256")
  batch = next(data.make_iterator(cfg, config.RunShape.of(cfg, 1)))
  assert batch.inputs.shape == (8, 256) and batch.segment_ids.max() >= 2
  row = batch.segment_ids[0]
  idx = np.flatnonzero(row == 1)
  np.testing.assert_array_equal(batch.inputs[0, idx[1:]], batch.targets[0, idx[:-1]])
  text = bytes(t for t in batch.inputs[batch.segment_ids > 0].tolist() if t < 256).decode()
  assert "#" in text and any(w in text for w in WORDS)


def test_state_resumes_exactly_across_epochs_and_processes_split_the_documents(files):
  cfg = _cfg(files, "max_target_length=64")
  shape = config.RunShape.of(cfg, 1)
  it = data.make_iterator(cfg, shape)
  _take(it, 12)  # past the first epoch of 100 documents
  state = json.loads(json.dumps(it.get_state()))
  expected = _take(it, 3)
  again = data.make_iterator(cfg, shape)
  again.set_state(state)
  for a, b in zip(expected, _take(again, 3)):
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
  halves = [next(data.make_iterator(cfg, shape, process_index=p, process_count=2)) for p in (0, 1)]
  assert all(h.inputs.shape == (4, 64) for h in halves)
  assert not np.array_equal(halves[0].inputs, halves[1].inputs)


def test_eval_files_and_json_columns(files):
  root, docs = files
  cfg = _cfg(files, f"hf_eval_files={root}/eval-0.parquet", "eval_interval=5", "max_target_length=512")
  evals = list(data.make_eval_iterator(cfg, config.RunShape.of(cfg, 1)))  # rows longer than any document
  text = "".join(bytes(t for t in b.inputs[b.segment_ids > 0].tolist() if t < 256).decode() for b in evals)
  assert {int(m) for m in re.findall(r"#(\d+)", text)} == set(range(100, 120))  # the eval documents, no others
  shape = config.RunShape.of(_cfg(files), 1)
  json_cfg = _cfg(files, "hf_path=json", f"hf_train_files={root}/docs.jsonl", "train_data_columns=content")
  assert next(data.make_iterator(json_cfg, shape)).inputs.shape == (8, 32)
  with pytest.raises(data.DataError, match=r"document 0 has no column 'text' \(it has content\)"):
    next(data.make_iterator(json_cfg.replace(train_data_columns=["text"]), shape))


@pytest.mark.parametrize(
  "extra, message",
  [
    (["hf_train_files=/nowhere/x-*.parquet"], "can't open the dataset"),
    (["eval_interval=2"], "needs hf_eval_split or hf_eval_files (MaxText's rule)"),
    (["grain_worker_count=2"], "grain_worker_count=2 must be 0"),
  ],
)
def test_mistakes_are_one_line(files, extra, message):
  with pytest.raises((config.ConfigError, data.DataError)) as e:
    cfg = _cfg(files, *extra)
    data.make_iterator(cfg, config.RunShape.of(cfg, 1))
  assert message in str(e.value) and "\n" not in str(e.value)
