"""How a Hugging Face checkpoint's tokenizer starts a prompt (BOS or not), read from its files in the order
transformers 5 reads them; the importer records it in config.yml as add_bos, and an export's tokenizer.json is
made to start prompts as the model was trained where transformers would read the copied files otherwise.

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


def match_in_export(out_dir, start_ids, log=print):
  """Makes transformers start a prompt of the export OUT_DIR with `start_ids` (what the model was trained and
  decoded with): where its reading of the copied tokenizer files differs, tokenizer.json gets the post-processor
  transformers itself builds for that (a TemplateProcessing "[BOS] $A", or "$A"). True if it rewrote the file."""
  import tokenizers as hf_tokenizers  # pylint: disable=import-outside-toplevel

  from MaxText.data import tokenizers  # pylint: disable=import-outside-toplevel

  path = pathlib.Path(out_dir) / "tokenizer.json"
  theirs = tokenizers.load("huggingface", str(path), add_bos=read(out_dir)[0])
  if tuple(theirs.start_ids) == tuple(start_ids):
    return False
  tok = hf_tokenizers.Tokenizer.from_file(str(path))
  names = [tok.id_to_token(i) for i in start_ids]
  single = " ".join([f"{n}:0" for n in names] + ["$A:0"])  # transformers' update_post_processor's template
  tok.post_processor = hf_tokenizers.processors.TemplateProcessing(
    single=single,
    pair=" ".join([single] + [f"{n}:1" for n in names] + ["$B:1"]),
    special_tokens=sorted(set(zip(names, start_ids))),
  )
  tok.save(str(path))
  said = " ".join(names) or "no BOS"
  log(f"tokenizer.json: a post-processor that starts a prompt with {said}, as the model was trained (add_bos)")
  return True
