"""grain and tfds pipelines: packing with segments, exact iterator state, process slices, clear data errors."""

import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from MaxText import config, data, train
from MaxText.data import tokenizers
from tests.data.corpus import REPO, grain_overrides, make_corpus, write_shard
from tests.trainer.test_train import SMALL


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
  cfg = config.load(
    REPO / "configs" / "llama3_tiny.yml",
    SMALL
    + [
      "dataset_type=tfds",
      f"dataset_path={corpus}/tfds",
      "dataset_name=plays",
      "eval_split=validation",
      "tokenizer_type=byte",
      "vocab_size=258",
      "steps=3",
      "eval_interval=3",
      "eval_steps=2",
      f"base_output_directory={tmp_path}",
      "run_name=tfds",
    ],
  )
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
  assert json.loads((out / "metadata.json").read_text())["starts_with_bos"] is True
  no_bos = make_corpus(tmp_path / "no_bos", "--pretokenize", "--add-bos", "false")
  cfg = _cfg(no_bos, "grain_record_format=token_ids")
  batches = _batches(data.make_iterator(cfg, config.RunShape.of(cfg, 1)), 6)
  assert not any((b.inputs == 256).any() for b in batches)
  assert any((b.targets == 257).any() for b in batches)  # EOS still ends every document
  assert json.loads((no_bos / "metadata.json").read_text())["starts_with_bos"] is False
  small = _cfg(out, "grain_record_format=token_ids", "vocab_size=200")
  with pytest.raises(data.DataError, match=r"token id 25[67] is outside \[0, vocab_size=200\)"):
    next(data.make_iterator(small, config.RunShape.of(small, 1)))


def test_data_errors_are_clear_cli_lines(corpus, tmp_path, capsys):
  base = [str(REPO / "configs" / "llama3_tiny.yml"), *SMALL, "steps=2", f"base_output_directory={tmp_path}"]
  assert (
    train.main(
      base
      + [
        "dataset_type=grain",
        f"grain_train_files={tmp_path}/none-*.array_record",
        "tokenizer_type=byte",
        "vocab_size=258",
      ]
    )
    == 2
  )
  assert "matches no files; run scripts/prepare_data.py" in capsys.readouterr().err
  from array_record.python.array_record_module import ArrayRecordWriter

  ArrayRecordWriter(str(tmp_path / "empty-0.array_record"), "group_size:1").close()
  assert (
    train.main(
      base
      + [
        "dataset_type=grain",
        f"grain_train_files={tmp_path}/empty-*.array_record",
        "tokenizer_type=byte",
        "vocab_size=258",
      ]
    )
    == 2
  )
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
    assert (
      train.main(
        base
        + [
          "dataset_type=grain",
          f"grain_train_files={tmp_path}/{name}-*.array_record",
          "tokenizer_type=byte",
          "vocab_size=258",
        ]
      )
      == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: grain_train_files: ") and len(err.strip().splitlines()) == 1, err
  overrides = (
    grain_overrides(corpus)[:2]
    + [f"grain_eval_files={tmp_path}/typo-*.array_record"]
    + grain_overrides(corpus)[3:]
    + ["eval_interval=1"]
  )
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
    prepare_data.main(
      [
        "--text-files",
        str(tmp_path / "a.txt"),
        "--output",
        str(tmp_path / "out"),
        "--num-shards",
        "64",
        "--doc-chars",
        "300",
      ]
    )
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert "can't fill --num-shards 64 (a shard would be empty)" in err
  assert not list((tmp_path / "out").glob("*.array_record"))


def test_packing_false_gives_one_right_padded_piece_per_row(corpus):
  """packing=false (MaxText's key): each row one document piece from position 0, padding after it with
  segment id 0 and weight 0, so causal attention alone never crosses documents. Rows of 512 hold any of the
  corpus's documents (~300 tokens) whole: every row is padded."""
  cfg = _cfg(corpus, "packing=false", "max_target_length=512")
  batch = next(data.make_iterator(cfg, config.RunShape.of(cfg, 1)))
  assert batch.inputs.shape == (8, 512)
  for row in range(8):
    n = int((batch.segment_ids[row] > 0).sum())
    assert 0 < n < 512 and batch.segment_ids[row].tolist() == [1] * n + [0] * (512 - n)
    assert batch.positions[row, :n].tolist() == list(range(n))
    assert batch.weights[row].tolist() == [1.0] * n + [0.0] * (512 - n)
    assert np.array_equal(batch.inputs[row, 1:n], batch.targets[row, : n - 1])
  packed = next(data.make_iterator(cfg.replace(packing=True), config.RunShape.of(cfg, 1)))
  assert packed.segment_ids.max() > 1  # the same data packed: several documents per row


def _ids(*docs):
  return [np.asarray(d, "<i4").tobytes() for d in docs]


def _ids_cfg(glob, *extra):
  return config.load(
    REPO / "configs" / "llama3_tiny.yml",
    SMALL
    + ["dataset_type=grain", f"grain_train_files={glob}", "grain_record_format=token_ids", "vocab_size=258", *extra],
  )


def test_documents_too_short_for_a_sequence_fail_before_the_first_batch(tmp_path):
  """1-token documents make no (input, target) pair: a DataError, not an endless read of the repeated data."""
  shard = write_shard(tmp_path / "train-0.array_record", _ids(*([t] for t in range(50))), "token_ids")
  cfg = _ids_cfg(shard)
  with pytest.raises(data.DataError) as e:
    data.make_iterator(cfg, config.RunShape.of(cfg, 1))
  assert str(e.value).startswith(
    "grain_train_files: none of the 50 documents this process reads has 2 or more "
    "tokens (BOS/EOS included), so no sequence can be made from them"
  )


def test_one_long_document_among_empty_ones_still_trains(tmp_path):
  """2n - 1 documents in a row without a sequence always hold a whole epoch: the check never fires while one
  document of the n makes sequences, however the epochs are shuffled (here ~26 epochs of 51 documents)."""
  shard = write_shard(
    tmp_path / "train-0.array_record", _ids(list(range(1, 41)), *([7] for _ in range(50))), "token_ids"
  )
  cfg = _ids_cfg(shard)
  iterator = data.make_iterator(cfg, config.RunShape.of(cfg, 1))
  batches = [next(iterator) for _ in range(3)]
  assert all(b.weights.sum() > 0 for b in batches)
  assert set(np.concatenate([b.targets[b.weights > 0] for b in batches]).tolist()) == set(range(2, 41))


def test_eval_split_without_tokens_is_refused_before_training(tmp_path):
  """Never an eval loss of 0.000: an eval split whose documents make no sequence fails when the run starts."""
  train_shard = write_shard(tmp_path / "train-0.array_record", _ids(list(range(1, 100))), "token_ids")
  write_shard(tmp_path / "eval-0.array_record", _ids(*([7] for _ in range(5))))
  cfg = _ids_cfg(train_shard, f"grain_eval_files={tmp_path}/eval-*.array_record", "eval_interval=1")
  run_shape = config.RunShape.of(cfg, 1)
  for make in (data.make_iterator, data.make_eval_iterator):
    with pytest.raises(data.DataError, match="^grain_eval_files: none of the 5 documents this process reads has 2"):
      make(cfg, run_shape)
  assert data.make_eval_iterator(cfg.replace(grain_eval_files=""), run_shape) is None  # no eval split: no eval


@pytest.mark.slow
def test_grain_workers_read_their_own_share(corpus, tmp_path):
  """grain_worker_count > 0: batches come from worker processes and resume exactly; a worker whose share of
  the documents makes no sequence is a DataError naming it (raised in the worker, out of next() here)."""
  cfg = _cfg(corpus, "grain_worker_count=2")
  run_shape = config.RunShape.of(cfg, 1)
  iterator = data.make_iterator(cfg, run_shape)
  first = _batches(iterator, 3)
  state = json.loads(json.dumps(iterator.get_state()))
  expected = _batches(iterator, 2)
  iterator.close()
  again = data.make_iterator(cfg, run_shape)
  again.set_state(state)
  assert all(np.array_equal(a.inputs, b.inputs) for a, b in zip(expected, _batches(again, 2)))
  again.close()
  assert all(b.inputs.shape == (8, 32) and b.weights.sum() > 0 for b in first)
  long_doc = list(range(1, 100))
  shard = write_shard(tmp_path / "train-0.array_record", _ids(long_doc, [5], long_doc, [5]), "token_ids")
  split = data.make_iterator(_ids_cfg(shard, "grain_worker_count=2"), run_shape)
  with pytest.raises(data.DataError, match="none of the 2 documents this process, grain worker 1 of 2 reads"):
    _batches(split, 20)
  split.close()


def test_sigterm_ends_a_trainer_on_data_that_makes_no_sequence(tmp_path):
  """The trainer takes SIGTERM as a stop request; on data that can make no batch it must still end: with the
  DataError (the data check comes before the first batch), never a read loop that outlives the signal."""
  shard = write_shard(tmp_path / "data" / "train-0.array_record", _ids(*([t] for t in range(30))), "token_ids")
  proc = subprocess.Popen(
    [
      sys.executable,
      "train.py",
      "configs/llama3_tiny.yml",
      *SMALL,
      "dataset_type=grain",
      f"grain_train_files={shard}",
      "grain_record_format=token_ids",
      "vocab_size=258",
      f"base_output_directory={tmp_path}",
      "run_name=short",
    ],
    cwd=REPO,
    text=True,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  assert proc.stdout.readline()  # the trainer has started (its signal handlers are in place by the plan)
  proc.send_signal(signal.SIGTERM)
  try:
    _, err = proc.communicate(timeout=120)
  except subprocess.TimeoutExpired:
    proc.kill()
    pytest.fail("train.py did not end after SIGTERM on data that can make no batch")
  assert "Traceback" not in err, err
  # The signal lands while the trainer runs (a stop request: the data error ends it), or after it gave up and
  # restored the default handler (the signal ends it).
  assert proc.returncode in (2, -signal.SIGTERM), err
  if proc.returncode == 2:
    assert err.strip().splitlines()[-1].startswith("error: grain_train_files: none of the 30 documents"), err


@pytest.mark.parametrize("add_bos, bos_seen", [("auto", True), ("false", False)])
def test_add_bos_decides_how_documents_start(corpus, add_bos, bos_seen):
  cfg = _cfg(corpus, f"add_bos={add_bos}")
  batches = _batches(data.make_iterator(cfg, config.RunShape.of(cfg, 1)), 4)
  inputs = np.concatenate([b.inputs[b.segment_ids > 0] for b in batches])
  targets = np.concatenate([b.targets[b.weights > 0] for b in batches])
  assert bool((inputs == 256).any()) is bos_seen and (targets == 257).any()  # the byte tokenizer's BOS, EOS
