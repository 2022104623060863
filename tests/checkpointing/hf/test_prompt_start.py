"""How an imported checkpoint's tokenizer starts a prompt, against transformers' own reading of the same files: the
five tokenizer variants of tests/data/hf_bos (a BOS post-processor, none, add_bos_token false beside a BOS
post-processor, add_bos_token true without one, a ByteLevel one) and the ids transformers 5.24 encoded every prompt
to (reference.json, written by scripts/make_bos_cases.py); the import's config.yml records it, and an export's
tokenizer.json starts prompts as the model was trained."""

import json
import shutil

import pytest
import yaml

from MaxText import config
from MaxText.checkpointing.hf import exporter, importer, prompt_start
from MaxText.data import tokenizers
from scripts import make_bos_cases
from tests.conftest import REPO

HF_BOS = REPO / "tests" / "data" / "hf_bos"
REFERENCE = json.loads((HF_BOS / "reference.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(REFERENCE["cases"]))
def test_prompts_start_as_transformers_starts_them(name):
  case = REFERENCE["cases"][name]
  value, _ = prompt_start.read(HF_BOS / name)
  tok = tokenizers.load("huggingface", str(HF_BOS / name / "tokenizer.json"), add_bos=value)
  assert len(case["prompt_ids"]) == 10
  for prompt, ids in case["prompt_ids"].items():
    assert tok.encode_prompt(prompt) == ids, prompt
  assert (ids[0] == 0) == case["starts_with_bos"] == (value == "true")


def test_the_three_cases_of_the_issue_are_recorded_as_transformers_5_reads_them():
  cases = REFERENCE["cases"]
  assert REFERENCE["transformers"].startswith("5.")
  assert cases["post_processor_bos"]["starts_with_bos"] and cases["add_bos_token_false"]["starts_with_bos"]
  assert not cases["no_post_processor"]["starts_with_bos"]
  # The same text either way: only the BOS differs.
  assert cases["post_processor_bos"]["prompt_ids"]["ROMEO."] == [0] + cases["no_post_processor"]["prompt_ids"]["ROMEO."]


def test_why_names_the_files_and_a_disagreeing_add_bos_token():
  value, why = prompt_start.read(HF_BOS / "no_post_processor")
  assert value == "false" and "has no post-processor" in why and "add_bos_token" not in why
  value, why = prompt_start.read(HF_BOS / "post_processor_bos")
  assert value == "true" and why == "tokenizer.json's post-processor starts a prompt with <|begin_of_text|> (id 0)"
  value, why = prompt_start.read(HF_BOS / "add_bos_token_false")
  assert value == "true" and "add_bos_token=false is not read beside a tokenizer.json" in why
  assert "add_bos=false" in why
  value, why = prompt_start.read(HF_BOS / "add_bos_token_true_no_post_processor")
  assert value == "false" and "add_bos_token=true" in why
  assert prompt_start.read(HF_BOS / "byte_level_post_processor") == (
    "false",
    "tokenizer.json's post-processor puts nothing before a prompt's text",
  )


def test_auto_alone_keeps_bos_for_a_tokenizer_without_post_processor():
  """Why the importer records add_bos: a tokenizer.json without a post-processor is, to add_bos=auto, one that
  prepare_data.py trained (documents start with BOS); transformers starts the same file's prompts without it."""
  path = str(HF_BOS / "no_post_processor" / "tokenizer.json")
  assert tokenizers.load("huggingface", path).encode_prompt("ROMEO.") == [0, 51, 48, 46, 38, 48, 15]
  assert tokenizers.load("huggingface", path, add_bos="false").encode_prompt("ROMEO.") == [51, 48, 46, 38, 48, 15]


@pytest.mark.parametrize("name, add_bos", [("no_post_processor", False), ("post_processor_bos", True)])
def test_import_records_add_bos_in_config_yml(tmp_path, name, add_bos):
  hf_dir = make_bos_cases.checkpoint(HF_BOS / name, tmp_path / "hf")
  lines = []
  path = importer.import_checkpoint(hf_dir, tmp_path / "out", log=lines.append)
  text = path.read_text()
  assert yaml.safe_load(text)["add_bos"] is add_bos
  assert f"# add_bos: {str(add_bos).lower()}, as transformers 5 reads the tokenizer files: " in text
  assert any(line.startswith(f"add_bos: {str(add_bos).lower()} (tokenizer.json") for line in lines), lines
  cfg = config.load(path, [])
  assert cfg.add_bos == str(add_bos).lower()
  ids = REFERENCE["cases"][name]["prompt_ids"]["ROMEO."]
  assert (
    tokenizers.load(cfg.tokenizer_type, cfg.tokenizer_path, cfg.vocab_size, cfg.add_bos).encode_prompt("ROMEO.") == ids
  )


def _export(hf_tiny_import, tmp_path, *overrides):
  cfg = config.load(hf_tiny_import / "config.yml", list(overrides))
  lines = []
  exporter.export(cfg, cfg.load_parameters_path, tmp_path / "out", log=lines.append)
  value, _ = prompt_start.read(tmp_path / "out")
  tok = tokenizers.load("huggingface", str(tmp_path / "out" / "tokenizer.json"), add_bos=value)
  return value, tok, lines


def test_an_export_starts_prompts_as_its_model_was_trained(hf_tiny_import, tmp_path):
  """A tokenizer.json without post-processor that trained with BOS (add_bos=auto: prepare_data.py's convention)
  gets BOS in its export's post-processor, the template transformers reads in the post_processor_bos case."""
  (tmp_path / "tok").mkdir()
  shutil.copyfile(HF_BOS / "no_post_processor" / "tokenizer.json", tmp_path / "tok" / "tokenizer.json")
  value, tok, lines = _export(hf_tiny_import, tmp_path, f"tokenizer_path={tmp_path / 'tok' / 'tokenizer.json'}")
  reference = REFERENCE["cases"]["post_processor_bos"]["prompt_ids"]
  assert value == "true" and all(tok.encode_prompt(p) == ids for p, ids in reference.items())
  assert any("starts a prompt with <|begin_of_text|>" in line for line in lines), lines


def test_an_export_with_add_bos_false_starts_prompts_without_bos(hf_tiny_import, tmp_path):
  value, tok, lines = _export(hf_tiny_import, tmp_path, "add_bos=false")
  reference = REFERENCE["cases"]["no_post_processor"]["prompt_ids"]
  assert value == "false" and all(tok.encode_prompt(p) == ids for p, ids in reference.items())
  assert any("starts a prompt with no BOS" in line for line in lines), lines
