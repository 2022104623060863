"""Records that are not what they claim: a DataError naming the file and the record, up front where the first record
of a shard shows it, else when the record is read (also through the pipeline's threads)."""

import grain
import numpy as np
import pytest

from MaxText import config, data
from MaxText.data import records
from tests.data.corpus import REPO, write_shard
from tests.trainer.test_train import SMALL

WORDS = ("romeo", "juliet", "light", "window", "east", "sun", "question", "fortune")


def _text(n, seed=0):
  rng = np.random.default_rng(seed)
  return [
    " ".join(f"{WORDS[w]}{k}" for w, k in zip(rng.integers(0, 8, 12), rng.integers(0, 1000, 12))).encode()
    for _ in range(n)
  ]


def _cfg(glob, *extra):
  return config.load(
    REPO / "configs" / "llama3_tiny.yml",
    SMALL + ["dataset_type=grain", f"grain_train_files={glob}", "tokenizer_type=byte", "vocab_size=258", *extra],
  )


def _corrupt_mid_file(path, n):
  """Flips bytes inside a chunk of the file's first block: (indices the reader now fails on)."""
  blob = bytearray(path.read_bytes())
  for k in range(4000, 4016):
    blob[k] ^= 0xFF
  path.write_bytes(bytes(blob))
  raw = grain.sources.ArrayRecordDataSource([str(path)])
  bad = []
  for i in range(n):
    try:
      raw[i]  # pylint: disable=pointless-statement
    except RuntimeError:
      bad.append(i)
  return bad


def test_record_failing_its_checksum_mid_file_names_file_and_record(tmp_path):
  shard = write_shard(tmp_path / "train-0.array_record", _text(300))
  bad = _corrupt_mid_file(shard, 300)
  assert bad and 0 < bad[0] < 299, bad  # damage in the middle: the shard opens and its first record reads
  source = records.array_record_source(str(shard), "grain_train_files", "text", 258)
  assert source[bad[0] - 1][1].startswith(tuple(WORDS))
  with pytest.raises(data.DataError) as e:
    source[bad[0]]  # pylint: disable=pointless-statement
  message = str(e.value)
  assert message.startswith(f"grain_train_files: record {bad[0]} of {shard} can't be read (Corrupted Riegeli")
  assert "the shard is damaged; regenerate it" in message and "\n" not in message


def test_corrupt_record_reaches_next_of_the_iterator_as_a_data_error(tmp_path):
  """Read in grain's prefetch threads, the failure still comes out of next() as the one-line DataError."""
  shard = write_shard(tmp_path / "train-0.array_record", _text(120, seed=1))
  bad = _corrupt_mid_file(shard, 120)
  cfg = _cfg(shard)
  iterator = data.make_iterator(cfg, config.RunShape.of(cfg, 1))
  with pytest.raises(data.DataError, match=rf"grain_train_files: record {bad[0]} of {shard} can't be read"):
    for _ in range(200):  # an epoch of 120 short documents is ~10 batches: the damaged one comes up
      next(iterator)


def test_non_utf8_text_record_names_file_record_and_byte(tmp_path):
  texts = _text(20)
  texts[7] = "caf\u00e9 ol\u00e9".encode("latin-1")
  shard = write_shard(tmp_path / "train-0.array_record", texts, "text")
  source = records.array_record_source(str(shard), "grain_train_files", "text", 258)
  with pytest.raises(data.DataError) as e:
    source[7]  # pylint: disable=pointless-statement
  assert str(e.value) == (
    f"grain_train_files: record 7 of {shard} is not UTF-8 text (byte 3 is b'\\xe9'); "
    "convert the text to UTF-8 and rerun scripts/prepare_data.py"
  )
  cfg = _cfg(shard)
  iterator = data.make_iterator(cfg, config.RunShape.of(cfg, 1))
  with pytest.raises(data.DataError, match=rf"record 7 of {shard} is not UTF-8 text"):
    for _ in range(50):
      next(iterator)


def test_token_ids_copied_without_metadata_are_not_read_as_text(tmp_path):
  """No metadata.json to compare with: the shard's first record shows int32 ids (NUL bytes), before training."""
  ids = [np.frombuffer(t, np.uint8).astype("<i4").tobytes() for t in _text(10)]
  shard = write_shard(tmp_path / "ids" / "train-0.array_record", ids)
  with pytest.raises(data.DataError) as e:
    records.array_record_source(str(shard), "grain_train_files", "text", 258)
  assert str(e.value).startswith(f"grain_train_files: record 0 of {shard} is not text: ")
  assert "are NUL, as in int32 token ids; if the shards hold token ids set grain_record_format=token_ids" in str(
    e.value
  )
  assert records.array_record_source(str(shard), "grain_train_files", "token_ids", 258)[3][1].dtype == np.int32
  text = write_shard(tmp_path / "text" / "train-0.array_record", [b"To be, or not to be!"])  # 20 bytes
  with pytest.raises(data.DataError, match="it reads as UTF-8 text: set grain_record_format=text"):
    records.array_record_source(str(text), "grain_train_files", "token_ids", 258)


def test_decode_tells_text_from_token_ids():
  assert records.decode(b"a NUL \0 in text is text", "text", 258) == "a NUL \0 in text is text"
  assert records.decode({"text": "caf\u00e9".encode()}, "text", 258) == "caf\u00e9"  # a TFDS record
  assert records.decode(np.array([1, 257], "<i4").tobytes(), "token_ids", 258).tolist() == [1, 257]
  with pytest.raises(data.DataError, match=r"token id 258 is outside \[0, vocab_size=258\); set vocab_size"):
    records.decode(np.array([1, 258], "<i4").tobytes(), "token_ids", 258)
  with pytest.raises(data.DataError, match=r"token id -1 is outside"):
    records.decode(np.array([-1], "<i4").tobytes(), "token_ids", 258)
  with pytest.raises(data.DataError, match="is not text: 3 of its 4 bytes are NUL"):
    records.decode(np.array([65], "<i4").tobytes(), "text", 258)
