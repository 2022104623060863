"""python -m MaxText.decode: prompts from a file in batches, MaxText's output lines, the JSONL records (prompt encoded
with one BOS, transformers' greedy continuation; without BOS for a checkpoint whose tokenizer adds none), one-line
errors for bad keys or prompts, and checkpoints read as the trainer reads them (another model's, a damaged or
unfinished one: one line; a run's damaged newest: skipped)."""

import fnmatch
import json
import shutil
import subprocess
import sys

import pytest

from MaxText import decode
from MaxText.checkpointing.hf import importer
from tests.conftest import HF_TINY, REPO, cpu_subprocess_env
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
    (["prompts_file=/"], "prompts_file=/: can't read it (Is a directory); give a text file, one prompt per line"),
    (["load_parameters_path=", "run_name=never_ran"], "nothing to decode"),
    (["decode_sampling_strategy=beam"], "is not one of: greedy, weighted, topk, nucleus"),
  ],
)
def test_bad_decode_settings_are_one_line_errors(hf_tiny_import, capsys, args, message):
  assert decode.main([str(hf_tiny_import / "config.yml"), "prompt=ROMEO.", *args]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def _run_of_import(hf_tiny_import, where, steps):
  """A run directory whose checkpoints `steps` are copies of the import's parameter checkpoint."""
  for step in steps:
    shutil.copytree(hf_tiny_import / "checkpoints" / "0", where / "checkpoints" / str(step))
  return where / "checkpoints"


def _truncate_chunks(step_dir):
  for f in (step_dir / "state").rglob("*"):
    if f.is_file() and not f.name.startswith((".", "_")):
      f.write_bytes(f.read_bytes()[:10])


def test_another_models_checkpoint_is_one_line_and_nothing_after_it(hf_tiny_import, tmp_path):
  """Orbax's leftover callbacks of the failed read ("Event loop is closed" tracebacks at exit) go to a log."""
  importer.import_checkpoint(HF_TINY, tmp_path / "fused", fused_mlp=True, log=lambda *_: None)
  result = _decode(
    hf_tiny_import / "config.yml", "prompt=ROMEO.", f"load_parameters_path={tmp_path}/fused/checkpoints/0"
  )
  assert result.returncode == 2 and result.stderr == (
    f"error: checkpoint {tmp_path}/fused/checkpoints/0 can't start this config: its MLP was trained with "
    "fused_mlp=true (gate and up as one kernel) and this config has fused_mlp=false\n"
  )


def _unfinished(ckpts):
  (ckpts / "2").rename(ckpts / "3.orbax-checkpoint-tmp-1732512345")
  return ckpts / "3.orbax-checkpoint-tmp-1732512345"


def _junk(ckpts):
  (ckpts / "9" / "state").mkdir(parents=True)
  return ckpts / "9"


def _damaged(ckpts):
  _truncate_chunks(ckpts / "2")
  return ckpts / "2"


@pytest.mark.parametrize(
  "make, message",
  [
    (
      _damaged,  # the first array read to fail names its file; which one comes first varies
      'error: checkpoint {c}/2 is unreadable (FAILED_PRECONDITION: Error reading local file "{c}/2/state/params.'
      "*: Not enough data: expected at least * more; at byte 10): it is damaged or incomplete; point at another "
      "step of its run: {c}/1",
    ),
    (
      _unfinished,
      "error: {c}/3.orbax-checkpoint-tmp-1732512345 is a checkpoint Orbax had not finished writing (a save that was "
      "interrupted or failed; the next training run removes it); point at another step of its run: {c}/1",
    ),
    (
      _junk,
      "error: checkpoint {c}/9 is unreadable (its state directory is empty): it is damaged or incomplete; point at "
      "another step of its run: {c}/2 (or 1)",
    ),
  ],
)
def test_a_checkpoint_that_cant_be_read_is_named_with_the_way_on(hf_tiny_import, tmp_path, capsys, make, message):
  ckpts = _run_of_import(hf_tiny_import, tmp_path / "run", (1, 2))
  step_dir = make(ckpts)
  assert decode.main([str(hf_tiny_import / "config.yml"), "prompt=ROMEO.", f"load_parameters_path={step_dir}"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and fnmatch.fnmatchcase(err, message.format(c=ckpts) + "\n"), err


def test_a_runs_damaged_newest_checkpoint_is_skipped_as_the_trainer_skips_it(hf_tiny_import, tmp_path, capsys):
  ckpts = _run_of_import(hf_tiny_import, tmp_path / "run", (1, 2))
  _damaged(ckpts)
  argv = [str(hf_tiny_import / "config.yml"), "prompt=ROMEO.", "max_prefill_predict_length=16", "max_target_length=24"]
  argv += ["load_parameters_path=", "run_name=run", f"base_output_directory={tmp_path}"]
  assert decode.main(argv) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith(f"warning: checkpoint {ckpts}/2 is unreadable (FAILED_PRECONDITION: ") and out[0].endswith(
    "; trying the previous one"
  )
  assert out[1].startswith(f"decoding 1 prompt(s) with the parameters of {ckpts}/1, ")
  assert sorted(p.name for p in ckpts.iterdir()) == ["1", "2"]  # a command that reads moves nothing
