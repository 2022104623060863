"""Tokenizers behind one interface: byte, Hugging Face tokenizer.json, tiktoken (Llama 3) and SentencePiece."""

import base64
import pathlib

from MaxText.errors import UserError

# Llama 3's pre-tokenizer split (from Meta's reference tokenizer.py).
LLAMA3_PATTERN = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
  r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_NUM_RESERVED_SPECIAL = 256
# Special tokens a trained tokenizer may use for document boundaries, most specific first.
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[BOS]")
EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[EOS]")
ADD_BOS = ("auto", "true", "false")  # the add_bos key's values
PROBE = "Hello world"  # a text to see what a post-processor puts around it


class TokenizerError(UserError, ValueError):
  """A tokenizer that can't be loaded or doesn't fit the model: a user error."""


def llama3_special_tokens():
  """Llama 3's 256 special tokens in id order (they follow the BPE ranks)."""
  names = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|reserved_special_token_2|>",
    "<|reserved_special_token_3|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|reserved_special_token_4|>",
    "<|eot_id|>",
  ]
  names += [f"<|reserved_special_token_{i}|>" for i in range(5, LLAMA3_NUM_RESERVED_SPECIAL - 5)]
  return names


class Tokenizer:
  """text -> ids. `bos_id` / `eos_id` are None when the vocabulary has no such token; `start_ids` (set by `load`
  from add_bos) are what a prompt and a training document start with: [BOS] or nothing."""

  vocab_size: int
  bos_id: int | None = None
  eos_id: int | None = None
  start_ids: tuple = ()

  def encode(self, text: str) -> list:
    raise NotImplementedError

  def decode(self, ids) -> str:
    raise NotImplementedError

  def own_start_ids(self) -> tuple:
    """What the tokenizer itself starts a text with (add_bos=auto): BOS where the vocabulary has one."""
    return (self.bos_id,) if self.bos_id is not None else ()

  def encode_prompt(self, text: str) -> list:
    """A prompt's ids as generation starts from them: `start_ids`, then the text."""
    return list(self.start_ids) + self.encode(text)

  def encode_document(self, text: str) -> list:
    """A training document's ids: as its prompt would start, then EOS where the vocabulary has one."""
    return self.encode_prompt(text) + ([self.eos_id] if self.eos_id is not None else [])


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes 0..255, then BOS 256 and EOS 257: needs no file."""

  vocab_size, bos_id, eos_id = 258, 256, 257

  def encode(self, text):
    return list(text.encode("utf-8"))

  def decode(self, ids):
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HuggingFaceTokenizer(Tokenizer):
  """A `tokenizers` tokenizer.json (what scripts/prepare_data.py trains)."""

  def __init__(self, path):
    import tokenizers  # pylint: disable=import-outside-toplevel

    self._tok = tokenizers.Tokenizer.from_file(str(path))
    self.vocab_size = self._tok.get_vocab_size()
    vocab = self._tok.get_vocab()
    self.bos_id = next((vocab[n] for n in BOS_NAMES if n in vocab), None)
    self.eos_id = next((vocab[n] for n in EOS_NAMES if n in vocab), None)
    self.post_processor_prefix = self._post_processor_prefix()
    if self.bos_id is None and self.post_processor_prefix:
      self.bos_id = self.post_processor_prefix[0]  # the token its template starts a text with, whatever its name

  def _post_processor_prefix(self):
    """The ids the tokenizer.json's post-processor puts before a text (Llama 3's: <|begin_of_text|>; a ByteLevel
    one: none), as transformers encodes a prompt; None when it has no post-processor."""
    if self._tok.post_processor is None:
      return None
    plain = self._tok.encode(PROBE, add_special_tokens=False).ids
    full = self._tok.encode(PROBE, add_special_tokens=True).ids
    at = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), 0)
    return tuple(full[:at])

  def own_start_ids(self):
    """As transformers reads a tokenizer.json: its post-processor's prefix. One without a post-processor is a
    tokenizer scripts/prepare_data.py trained (its documents start with BOS); an imported checkpoint's such
    tokenizer (transformers adds nothing) has add_bos=false written into its config.yml by the importer."""
    if self.post_processor_prefix is None:
      return super().own_start_ids()
    return self.post_processor_prefix

  def encode(self, text):
    return self._tok.encode(text, add_special_tokens=False).ids

  def id_to_token(self, i):
    return self._tok.id_to_token(i)

  def decode(self, ids):
    return self._tok.decode(list(ids))


class TiktokenTokenizer(Tokenizer):
  """A Llama 3 `tokenizer.model`: lines of "<base64 token> <rank>", Llama 3's split regex, 256 specials."""

  def __init__(self, path):
    import tiktoken  # pylint: disable=import-outside-toplevel

    ranks = {}
    for n, line in enumerate(pathlib.Path(path).read_text(encoding="ascii").splitlines(), 1):
      if not line.strip():
        continue
      try:
        token, rank = line.split()
        ranks[base64.b64decode(token, validate=True)] = int(rank)
      except ValueError as e:
        raise TokenizerError(f"{path}:{n}: not a tiktoken BPE file (expected '<base64 token> <rank>' per line)") from e
    specials = {name: len(ranks) + i for i, name in enumerate(llama3_special_tokens())}
    self._enc = tiktoken.Encoding(
      name=pathlib.Path(path).name, pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )
    self.vocab_size = len(ranks) + len(specials)
    self.bos_id, self.eos_id = specials["<|begin_of_text|>"], specials["<|end_of_text|>"]

  def encode(self, text):
    return self._enc.encode(text, disallowed_special=())  # special-token text in data is plain text

  def decode(self, ids):
    return self._enc.decode(list(ids))


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece .model file."""

  def __init__(self, path):
    import sentencepiece  # pylint: disable=import-outside-toplevel

    self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    self.vocab_size = self._sp.get_piece_size()
    self.bos_id = self._sp.bos_id() if self._sp.bos_id() >= 0 else None
    self.eos_id = self._sp.eos_id() if self._sp.eos_id() >= 0 else None

  def encode(self, text):
    return self._sp.encode(text)

  def decode(self, ids):
    return self._sp.decode(list(ids))


TOKENIZERS = {
  "byte": ByteTokenizer,
  "huggingface": HuggingFaceTokenizer,
  "tiktoken": TiktokenTokenizer,
  "sentencepiece": SentencePieceTokenizer,
}


def start_ids(tok: Tokenizer, add_bos, tokenizer_type: str) -> tuple:
  """What a prompt or document starts with under add_bos: auto (the tokenizer's own rule), true ([BOS]), false."""
  add_bos = str(add_bos).lower()
  if add_bos not in ADD_BOS:
    raise TokenizerError(f"add_bos={add_bos!r}; valid: {', '.join(ADD_BOS)}")
  if add_bos == "auto":
    return tuple(tok.own_start_ids())
  if add_bos == "true" and tok.bos_id is None:
    raise TokenizerError(f"add_bos=true but the {tokenizer_type} tokenizer has no BOS token; set add_bos=false or auto")
  return (tok.bos_id,) if add_bos == "true" else ()


def load(tokenizer_type: str, tokenizer_path: str = "", vocab_size: int | None = None, add_bos="auto") -> Tokenizer:
  """The tokenizer, starting texts as `add_bos` says; TokenizerError (one line) if it is missing, unreadable or
  larger than `vocab_size`."""
  if tokenizer_type not in TOKENIZERS:
    raise TokenizerError(f"tokenizer_type={tokenizer_type!r}; valid: {', '.join(TOKENIZERS)}")
  if tokenizer_type == "byte":
    tok = ByteTokenizer()
  else:
    path = pathlib.Path(tokenizer_path)
    if not tokenizer_path or not path.is_file():
      raise TokenizerError(
        f"tokenizer_path={tokenizer_path!r}: no such file (tokenizer_type={tokenizer_type}); "
        "give the tokenizer file, or run scripts/prepare_data.py --train-tokenizer"
      )
    try:
      tok = TOKENIZERS[tokenizer_type](path)
    except TokenizerError:
      raise
    except Exception as e:  # the libraries raise assorted types for a wrong file
      raise TokenizerError(
        f"tokenizer_path={tokenizer_path}: can't load it as {tokenizer_type} "
        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
      ) from e
  if vocab_size is not None and tok.vocab_size > vocab_size:
    raise TokenizerError(
      f"the {tokenizer_type} tokenizer has {tok.vocab_size} tokens but vocab_size={vocab_size}; "
      f"set vocab_size >= {tok.vocab_size}"
    )
  tok.start_ids = start_ids(tok, add_bos, tokenizer_type)
  return tok
