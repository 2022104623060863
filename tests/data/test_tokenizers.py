"""Tokenizers: byte, Hugging Face, tiktoken (Llama 3 tokenizer.model format), SentencePiece, and their errors."""

import base64

import pytest

from MaxText.data import tokenizers

SAMPLE = "To be, or not to be: that is the question.\nWhether 'tis nobler... 1234 ünïcödé"


def test_byte_round_trip_and_specials():
  tok = tokenizers.load("byte")
  ids = tok.encode(SAMPLE)
  assert max(ids) < 256 and tok.decode(ids) == SAMPLE and (tok.bos_id, tok.eos_id, tok.vocab_size) == (256, 257, 258)


def _llama3_style_model(path, merges=(b"th", b"the", b" t", b"be")):
  """A tokenizer.model in Meta's format: every byte, then a few merges, "<base64> <rank>" per line."""
  tokens = [bytes([b]) for b in range(256)] + list(merges)
  path.write_text("\n".join(f"{base64.b64encode(t).decode()} {r}" for r, t in enumerate(tokens)) + "\n")
  return len(tokens)


def test_tiktoken_reads_a_llama3_tokenizer_model(tmp_path):
  n = _llama3_style_model(tmp_path / "tokenizer.model")
  tok = tokenizers.load("tiktoken", str(tmp_path / "tokenizer.model"))
  assert tok.vocab_size == n + 256 and tok.bos_id == n and tok.eos_id == n + 1  # <|begin_of_text|>, <|end_of_text|>
  assert tok.encode("the") == [257]  # the merge "the" (rank 257)
  assert tok.encode(" to be") == [258, ord("o"), ord(" "), 259]  # Llama 3's split keeps the leading space
  assert tok.decode(tok.encode(SAMPLE)) == SAMPLE
  assert tok.encode("<|end_of_text|>") != [tok.eos_id]  # special-token text in data is plain text
  assert len(tokenizers.llama3_special_tokens()) == 256 and tokenizers.llama3_special_tokens()[9] == "<|eot_id|>"


def test_huggingface_and_sentencepiece(tmp_path):
  from scripts import prepare_data

  docs = [SAMPLE * 3, "Good night, good night! Parting is such sweet sorrow." * 5] * 20
  prepare_data.train_bpe(docs, 300, tmp_path / "tokenizer.json")
  tok = tokenizers.load("huggingface", str(tmp_path / "tokenizer.json"))
  assert tok.vocab_size <= 300 and tok.bos_id == 0 and tok.eos_id == 1
  assert tok.decode(tok.encode(SAMPLE)) == SAMPLE and len(tok.encode(SAMPLE)) < len(SAMPLE.encode())

  import sentencepiece

  (tmp_path / "corpus.txt").write_text("\n".join(docs))
  sentencepiece.SentencePieceTrainer.train(
    input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "sp"), vocab_size=40, minloglevel=2
  )
  sp = tokenizers.load("sentencepiece", str(tmp_path / "sp.model"))
  assert sp.vocab_size == 40 and sp.eos_id == 2 and sp.decode(sp.encode("to be or not")) == "to be or not"


def test_errors_are_one_line(tmp_path):
  with pytest.raises(tokenizers.TokenizerError, match=r"tokenizer_path='nope.model': no such file"):
    tokenizers.load("tiktoken", "nope.model")
  (tmp_path / "bad.model").write_text("not base64 at all\n")
  with pytest.raises(tokenizers.TokenizerError, match=r"bad.model:1: not a tiktoken BPE file"):
    tokenizers.load("tiktoken", str(tmp_path / "bad.model"))
  with pytest.raises(tokenizers.TokenizerError, match=r"has 258 tokens but vocab_size=128; set vocab_size >= 258"):
    tokenizers.load("byte", vocab_size=128)
  (tmp_path / "x.json").write_text("{}")
  with pytest.raises(tokenizers.TokenizerError, match=r"can't load it as huggingface"):
    tokenizers.load("huggingface", str(tmp_path / "x.json"))


def test_add_bos_decides_how_prompts_and_documents_start(tmp_path):
  from scripts import prepare_data

  prepare_data.train_bpe([SAMPLE * 3] * 20, 300, tmp_path / "tokenizer.json")
  text = tokenizers.load("huggingface", str(tmp_path / "tokenizer.json")).encode(SAMPLE)
  for tokenizer_type, path, bos, eos in (("huggingface", tmp_path / "tokenizer.json", 0, 1), ("byte", "", 256, 257)):
    auto = tokenizers.load(tokenizer_type, str(path))  # prepare_data.py's tokenizers (and byte) keep BOS
    body = auto.encode(SAMPLE)
    assert tokenizer_type == "byte" or body == text
    assert auto.start_ids == (bos,) and auto.encode_prompt(SAMPLE) == [bos] + body
    assert auto.encode_document(SAMPLE) == [bos] + body + [eos]
    off = tokenizers.load(tokenizer_type, str(path), add_bos="false")
    assert off.encode_prompt(SAMPLE) == body and off.encode_document(SAMPLE) == body + [eos]
    assert tokenizers.load(tokenizer_type, str(path), add_bos="true").encode_prompt(SAMPLE) == [bos] + body


def test_add_bos_errors_are_one_line(tmp_path):
  from tokenizers import Tokenizer, models

  Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "nobos.json"))
  assert tokenizers.load("huggingface", str(tmp_path / "nobos.json")).encode_prompt("a") == [0]  # auto: no BOS to add
  with pytest.raises(tokenizers.TokenizerError, match=r"^add_bos=true but the huggingface tokenizer has no BOS token"):
    tokenizers.load("huggingface", str(tmp_path / "nobos.json"), add_bos="true")
  with pytest.raises(tokenizers.TokenizerError, match=r"^add_bos='maybe'; valid: auto, true, false$"):
    tokenizers.load("byte", add_bos="maybe")
