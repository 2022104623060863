"""python -m MaxText.decode: prompts from a file in batches, MaxText's output lines, the JSONL records (prompt encoded
with one BOS, transformers' greedy continuation; without BOS for a checkpoint whose tokenizer adds none), and
one-line errors for bad keys or prompts."""

import json
import subprocess
import sys

import pytest

from MaxText import decode
from tests.conftest import REPO, cpu_subprocess_env
from tests.checkpointing.hf import tiny


def _decode(*args):
  return subprocess.run(
    [sys.executable, "-m", "MaxText.decode", *map(str, args)],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=False,
    env=cpu_subprocess_env(1),
  )


def test_decodes_a_prompts_file_in_batches_to_jsonl(hf_tiny_import, tmp_path):
  records, _ = tiny.reference()
  (tmp_path / "prompts.txt").write_text("".join(r["prompt"] + "\n" for r in records[:3]), encoding="utf-8")
  result = _decode(
    hf_tiny_import / "config.yml",
    f"prompts_file={tmp_path / 'prompts.txt'}",
    "per_device_batch_size=2",
    "max_prefill_predict_length=16",
    "max_target_length=48",
    "dtype=float32",
    f"decode_output_file={tmp_path / 'out.jsonl'}",
  )
  assert result.returncode == 0, result.stderr[-2000:]
  lines = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
  assert [l["prompt"] for l in lines] == [r["prompt"] for r in records[:3]]
  for line, record in zip(lines, records):
    assert line["prompt_ids"] == record["prompt_ids"] and line["prompt_ids"][:2].count(0) == 1  # one BOS
    assert line["completion_ids"][:20] == record["greedy_ids"]
    assert line["completion"].startswith(record["greedy_text"])
    assert line["prefill_tokens_per_second"] > 0 and line["decode_tokens_per_second"] > 0
    assert f"Input `{record['prompt']}` -> `" in result.stdout


def test_an_import_whose_tokenizer_adds_no_bos_decodes_as_transformers_does(tmp_path):
  """tests/data/hf_tiny's weights with a tokenizer.json without post-processor (issue 43's checkpoint): the import
  records add_bos: false, and our float32 greedy decode of three prompts equals transformers' 40 tokens (5.24,
  recorded by scripts/make_bos_cases.py; every greedy step's top-1/top-2 margin there >= 0.005)."""
  from MaxText.checkpointing.hf import importer  # pylint: disable=import-outside-toplevel
  from scripts import make_bos_cases  # pylint: disable=import-outside-toplevel

  case = json.loads((REPO / "tests/data/hf_bos/reference.json").read_text(encoding="utf-8"))["cases"]
  case = case["no_post_processor"]
  hf_dir = make_bos_cases.checkpoint(REPO / "tests/data/hf_bos/no_post_processor", tmp_path / "hf")
  importer.import_checkpoint(hf_dir, tmp_path / "imported", log=lambda *_: None)
  greedy = case["greedy"]["prompts"]
  (tmp_path / "prompts.txt").write_text("".join(g["prompt"] + "\n" for g in greedy), encoding="utf-8")
  result = _decode(
    tmp_path / "imported" / "config.yml",
    f"prompts_file={tmp_path / 'prompts.txt'}",
    "per_device_batch_size=3",
    "max_prefill_predict_length=16",
    "max_target_length=56",
    "dtype=float32",
    f"decode_output_file={tmp_path / 'out.jsonl'}",
  )
  assert result.returncode == 0, result.stderr[-2000:]
  lines = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
  for line, g in zip(lines, greedy, strict=True):
    assert line["prompt_ids"] == case["prompt_ids"][g["prompt"]] and line["prompt_ids"][0] != 0  # no BOS
    assert len(g["greedy_ids"]) == 40 and line["completion_ids"][:40] == g["greedy_ids"]


@pytest.mark.parametrize(
  "args, message",
  [
    (["max_prefill_predict_length=4"], "prompt 1 ('ROMEO.'...) is 7 tokens, more than max_prefill_predict_length=4"),
    (["max_prefill_predict_length=64", "max_target_length=64"], "must be < max_target_length=64"),
    (["decode_sampling_strategy=nucleus"], "decode_sampling_nucleus_p in (0, 1]"),
    (["decode_sampling_strategy=topk"], "decode_sampling_top_k in [1, vocab_size=384]"),
    (["prompts_file=/nonexistent/prompts.txt"], "no such file"),
    (["load_parameters_path=", "run_name=never_ran"], "nothing to decode"),
    (["decode_sampling_strategy=beam"], "is not one of: greedy, weighted, topk, nucleus"),
  ],
)
def test_bad_decode_settings_are_one_line_errors(hf_tiny_import, capsys, args, message):
  assert decode.main([str(hf_tiny_import / "config.yml"), "prompt=ROMEO.", *args]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
