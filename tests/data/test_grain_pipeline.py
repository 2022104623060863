"""grain and tfds pipelines: packing with segments, exact iterator state, process slices, clear data errors."""

import json

import numpy as np
import pytest

from MaxText import config, data, train
from MaxText.data import tokenizers
from tests.data.corpus import REPO, grain_overrides, make_corpus
from tests.test_train import SMALL


def _cfg(corpus, *extra):
  return config.load(REPO / "configs" / "llama3_tiny.yml", SMALL + grain_overrides(corpus) + list(extra))


def _batches(it, n):
  return [next(it) for _ in range(n)]


def test_packing_keeps_documents_apart_and_targets_shifted(corpus):
  cfg = _cfg(corpus)
  rs = config.RunShape.of(cfg, 1)
  batch = next(data.make_iterator(cfg, rs))
  tok = tokenizers.load("byte")
  assert batch.inputs.shape == (8, 32) and batch.weights.dtype == np.float32
  for row in range(8):
    seg, pos = batch.segment_ids[row], batch.positions[row]
    assert np.array_equal(batch.weights[row] > 0, seg > 0)
    for s in set(seg[seg > 0].tolist()):
      idx = np.flatnonzero(seg == s)
      assert np.array_equal(idx, np.arange(idx[0], idx[-1] + 1)) and np.array_equal(pos[idx], np.arange(len(idx)))
      # Within a piece the next input is the current target: next-token pairs never cross documents.
      assert np.array_equal(batch.inputs[row, idx[1:]], batch.targets[row, idx[:-1]])
  text = tok.decode(batch.inputs[batch.segment_ids > 0].tolist())
  assert "Romeo" in text or "question" in text or "Juliet" in text


def test_iterator_state_resumes_exactly_and_is_json(corpus):
  cfg = _cfg(corpus)
  rs = config.RunShape.of(cfg, 1)
  it = data.make_iterator(cfg, rs)
  _batches(it, 5)
  state = json.loads(json.dumps(it.get_state()))
  expected = _batches(it, 3)
  again = data.make_iterator(cfg, rs)
  again.set_state(state)
  for a, b in zip(expected, _batches(again, 3)):
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_processes_read_disjoint_documents(corpus):
  cfg = _cfg(corpus, "seed=3")
  rs = config.RunShape.of(cfg, 1)
  firsts = [next(data.make_iterator(cfg, rs, process_index=p, process_count=2)) for p in (0, 1)]
  assert all(b.inputs.shape == (4, 32) for b in firsts)
  assert not np.array_equal(firsts[0].inputs, firsts[1].inputs)


def test_tfds_source_trains_and_evaluates(corpus, tmp_path, capsys):
  cfg = config.load(REPO / "configs" / "llama3_tiny.yml", SMALL + [
      "dataset_type=tfds", f"dataset_path={corpus}/tfds", "dataset_name=plays", "eval_split=validation",
      "tokenizer_type=byte", "vocab_size=258", "steps=3", "eval_interval=3", "eval_steps=2",
      f"base_output_directory={tmp_path}", "run_name=tfds"])
  losses = train.train(cfg)
  assert len(losses) == 3 and "eval after step 2: loss:" in capsys.readouterr().out
  record = [json.loads(l) for l in (tmp_path / "tfds" / "metrics.jsonl").read_text().splitlines()][-1]
  assert 2.0 < record["eval_loss"] < 7.0 and record["eval_weights"] > 0
  import sys
  assert "tensorflow" not in sys.modules  # read through the ArrayRecord data source, no TensorFlow


def test_pretokenized_records_and_bad_token_ids(tmp_path):
  out = make_corpus(tmp_path, "--pretokenize")  # byte ids with BOS 256 / EOS 257
  cfg = _cfg(out, "grain_record_format=token_ids")
  inputs = np.stack([b.inputs for b in _batches(data.make_iterator(cfg, config.RunShape.of(cfg, 1)), 6)])
  assert inputs.max() <= 257 and (inputs == 256).any()  # every document starts with BOS
  small = _cfg(out, "grain_record_format=token_ids", "vocab_size=200")
  with pytest.raises(data.DataError, match=r"token id 25[67] is outside \[0, vocab_size=200\)"):
    next(data.make_iterator(small, config.RunShape.of(small, 1)))


def test_data_errors_are_clear_cli_lines(corpus, tmp_path, capsys):
  base = [str(REPO / "configs" / "llama3_tiny.yml"), *SMALL, "steps=2", f"base_output_directory={tmp_path}"]
  assert train.main(base + ["dataset_type=grain", f"grain_train_files={tmp_path}/none-*.array_record",
                            "tokenizer_type=byte", "vocab_size=258"]) == 2
  assert "matches no files; run scripts/prepare_data.py" in capsys.readouterr().err
  from array_record.python.array_record_module import ArrayRecordWriter
  ArrayRecordWriter(str(tmp_path / "empty-0.array_record"), "group_size:1").close()
  assert train.main(base + ["dataset_type=grain", f"grain_train_files={tmp_path}/empty-*.array_record",
                            "tokenizer_type=byte", "vocab_size=258"]) == 2
  assert "holds no records" in capsys.readouterr().err
  # Text tokenized with the byte tokenizer has ids up to 257: vocab_size 258 is right, 200 is not.
  assert train.main(base + grain_overrides(corpus)[:-1] + ["vocab_size=200"]) == 2
  assert "has 258 tokens but vocab_size=200" in capsys.readouterr().err
  ids = make_corpus(tmp_path / "ids", "--pretokenize")
  assert train.main(base + grain_overrides(ids)[:-1] + ["grain_record_format=token_ids", "vocab_size=200"]) == 2
  assert "is outside [0, vocab_size=200); set vocab_size or re-tokenize the data" in capsys.readouterr().err


def test_shards_are_checked_before_training(corpus, tmp_path, capsys):
  """Record format against metadata.json, damaged shards, and the eval glob: one line each, before any step."""
  base = [str(REPO / "configs" / "llama3_tiny.yml"), *SMALL, "steps=2", f"base_output_directory={tmp_path}"]
  ids = make_corpus(tmp_path / "ids", "--pretokenize")
  assert train.main(base + grain_overrides(ids)) == 2  # int32 records read as text
  err = capsys.readouterr().err
  assert "hold token_ids records" in err and "set grain_record_format=token_ids" in err
  assert train.main(base + grain_overrides(corpus) + ["grain_record_format=token_ids"]) == 2
  err = capsys.readouterr().err
  assert err.strip().splitlines() == [err.strip()] and "hold text records" in err
  assert "set grain_record_format=text" in err
  for name, content in (("zero", b""), ("junk", b"not an array record file" * 10)):
    (tmp_path / f"{name}-0.array_record").write_bytes(content)
    assert train.main(base + ["dataset_type=grain", f"grain_train_files={tmp_path}/{name}-*.array_record",
                              "tokenizer_type=byte", "vocab_size=258"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: grain_train_files: ") and len(err.strip().splitlines()) == 1, err
  overrides = grain_overrides(corpus)[:2] + [f"grain_eval_files={tmp_path}/typo-*.array_record"] + grain_overrides(
      corpus)[3:] + ["eval_interval=1"]
  assert train.main(base + overrides) == 2
  err = capsys.readouterr().err
  assert "grain_eval_files=" in err and "matches no files" in err


def test_prepare_data_refuses_what_it_would_corrupt(tmp_path, capsys):
  """Non-UTF-8 input is named (not turned into U+FFFD); too few documents for the shards is refused."""
  from scripts import prepare_data  # pylint: disable=import-outside-toplevel
  (tmp_path / "a.txt").write_bytes("To be, or not to be.\n\n".encode() * 40 + "caf\u00e9\n".encode("latin-1"))
  with pytest.raises(SystemExit) as e:
    prepare_data.main(["--text-files", str(tmp_path / "a.txt"), "--output", str(tmp_path / "out")])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert f"{tmp_path / 'a.txt'} is not UTF-8 text (byte 883, line 81)" in err
  (tmp_path / "a.txt").write_text("To be, or not to be.\n\n" * 40, encoding="utf-8")
  with pytest.raises(SystemExit) as e:
    prepare_data.main(["--text-files", str(tmp_path / "a.txt"), "--output", str(tmp_path / "out"),
                       "--num-shards", "64", "--doc-chars", "300"])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "can't fill --num-shards 64 (a shard would be empty)" in err
  assert not list((tmp_path / "out").glob("*.array_record"))
