"""How a Hugging Face checkpoint's tokenizer starts a prompt (BOS or not), read from its files in the order
transformers 5 reads them; the importer records it in config.yml as add_bos.

transformers (>= 5; AutoTokenizer.from_pretrained, TokenizersBackend):
1. beside a tokenizer.json, tokenizer_config.json's add_bos_token / add_eos_token are dropped unread;
2. the tokenizer.json's post-processor encodes every prompt (Llama 3's TemplateProcessing puts
   <|begin_of_text|> first; a ByteLevel one adds nothing);
3. a tokenizer.json without a post-processor gets transformers' own template with add_bos_token false: the text
   alone, no BOS.
transformers 4's Llama, Gemma and CodeLlama tokenizer classes instead rebuilt the template from add_bos_token
(default true), so such a checkpoint could start with BOS there; the importer says so when the two disagree.
"""

import json
import pathlib

from MaxText.checkpointing.hf import HFError


def _add_bos_token(hf_dir):
  """tokenizer_config.json's add_bos_token, or None (no such file or key, or not JSON)."""
  path = pathlib.Path(hf_dir) / "tokenizer_config.json"
  try:
    value = json.loads(path.read_text(encoding="utf-8")).get("add_bos_token")
  except (OSError, ValueError, AttributeError):
    return None
  return value if isinstance(value, bool) else None


def read(hf_dir):
  """(add_bos value for config.yml: "true", "false" or "auto", one line saying why) for HF_DIR's tokenizer.json."""
  from MaxText.data import tokenizers  # pylint: disable=import-outside-toplevel  (tokenizers is optional)

  path = pathlib.Path(hf_dir) / "tokenizer.json"
  try:
    tok = tokenizers.load("huggingface", str(path))
  except tokenizers.TokenizerError as e:
    raise HFError(str(e)) from None
  prefix = tok.post_processor_prefix
  if prefix is None:
    value, why = "false", "tokenizer.json has no post-processor, so transformers starts a prompt with its text alone"
  elif not prefix:
    value, why = "false", "tokenizer.json's post-processor puts nothing before a prompt's text"
  else:
    names = " ".join(f"{tok.id_to_token(i)} (id {i})" for i in prefix)
    value = "true" if list(prefix) == [tok.bos_id] else "auto"  # auto: the post-processor's own prefix, as is
    why = f"tokenizer.json's post-processor starts a prompt with {names}"
  stated = _add_bos_token(hf_dir)
  if stated is not None and stated != bool(prefix):
    why += (
      f"; tokenizer_config.json's add_bos_token={str(stated).lower()} is not read beside a tokenizer.json by "
      f"transformers 5 (transformers 4's Llama/Gemma tokenizer classes followed it: add_bos={str(stated).lower()})"
    )
  return value, why
