"""Import of the committed tiny Llama against transformers' own numbers: float32 logits and greedy continuations;
the config it writes; a tied-embedding checkpoint; every bad input a one-line error that leaves nothing behind."""

import json
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from MaxText import config, convert_hf
from MaxText.inference.generate import Generator
from MaxText.checkpointing.hf import importer
from MaxText.checkpointing.hf.checkpoint import INDEX
from MaxText.checkpointing.hf.safetensors_file import SafetensorsFile, SafetensorsWriter
from MaxText.precision import uniform
from tests.conftest import HF_TINY, REPO
from tests.checkpointing.hf import tiny


@jax.default_matmul_precision("highest")
def test_float32_logits_match_transformers(hf_tiny_import):
  _, graphdef, params, rest = tiny.load(hf_tiny_import / "config.yml")
  model = nnx.merge(graphdef, params, rest)
  records, logits = tiny.reference()
  for record, theirs in zip(records, logits):
    ours = np.asarray(model(jnp.asarray([record["prompt_ids"]]))[0])
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * np.abs(theirs).max())


@jax.default_matmul_precision("highest")
def test_greedy_continuations_match_transformers_token_for_token(hf_tiny_import):
  records, _ = tiny.reference()
  longest = max(len(r["prompt_ids"]) for r in records)
  cfg, graphdef, params, rest = tiny.load(
    hf_tiny_import / "config.yml", f"max_prefill_predict_length={longest}", f"max_target_length={longest + 20}"
  )
  # One batch of prompts of different lengths, no EOS stop (as the reference).
  generate = Generator(cfg, graphdef, rest, [(0, cfg.base_num_decoder_layers, uniform())], len(records))
  result = generate(params, [r["prompt_ids"] for r in records])
  for record, completion in zip(records, result.completions):
    assert completion[:20] == record["greedy_ids"], record["prompt"]


def test_the_written_config_runs_as_is(hf_tiny_import):
  cfg = config.load(hf_tiny_import / "config.yml")
  assert (cfg.base_emb_dim, cfg.base_num_kv_heads, cfg.rope_type, cfg.rope_original_max_position) == (
    64,
    2,
    "llama3.1",
    64,
  )
  assert cfg.load_parameters_path == str(hf_tiny_import / "checkpoints" / "0")
  assert cfg.tokenizer_type == "huggingface" and cfg.tokenizer_path == str(hf_tiny_import / "hf" / "tokenizer.json")
  assert sorted(p.name for p in (hf_tiny_import / "hf").iterdir()) == [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
  ]


def _copy(tmp_path):
  out = tmp_path / "hf"
  shutil.copytree(HF_TINY, out)
  return out


def _rewrite(path, drop=(), add=None, retype=None):
  """A safetensors file rewritten by our writer without `drop`, with `add` ({name: array}) and `retype` applied."""
  with SafetensorsFile(path) as f:
    arrays = {n: f.read(n) for n in f.names if n not in drop}
  arrays.update(add or {})
  if retype:
    arrays = {n: retype(n, a) for n, a in arrays.items()}
  writer = SafetensorsWriter(path, {n: (a.dtype, a.shape) for n, a in arrays.items()})
  for n, a in arrays.items():
    writer.write(n, a)
  writer.close()


def _edit_index(hf, change):
  index = json.loads((hf / INDEX).read_text())
  change(index["weight_map"])
  (hf / INDEX).write_text(json.dumps(index))


def _file_of(hf, name):
  return hf / json.loads((hf / INDEX).read_text())["weight_map"][name]


def test_tied_embeddings_import_as_logits_via_embedding_and_export_back(tmp_path):
  hf = _copy(tmp_path)
  cfg_json = json.loads((hf / "config.json").read_text())
  (hf / "config.json").write_text(json.dumps({**cfg_json, "tie_word_embeddings": True}))
  _rewrite(_file_of(hf, "lm_head.weight"), drop=("lm_head.weight",))
  _edit_index(hf, lambda m: m.pop("lm_head.weight"))
  out = importer.import_checkpoint(hf, tmp_path / "imported", log=lambda *_: None)
  cfg, graphdef, params, rest = tiny.load(out)
  assert cfg.logits_via_embedding and "lm_head" not in params
  model = nnx.merge(graphdef, params, rest)
  x = model.hidden(jnp.asarray([[0, 51, 48]]))
  np.testing.assert_array_equal(model.logits(x), jnp.einsum("bld,vd->blv", x, params["embed"]["embedding"][...]))
  from MaxText.checkpointing.hf import exporter  # pylint: disable=import-outside-toplevel

  exporter.export(cfg, tmp_path / "imported" / "checkpoints" / "0", tmp_path / "exported", log=lambda *_: None)
  exported = json.loads((tmp_path / "exported" / "config.json").read_text())
  assert exported["tie_word_embeddings"] is True
  with SafetensorsFile(tmp_path / "exported" / "model.safetensors") as f:
    assert "lm_head.weight" not in f.names and len(f.names) == 29


def _cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "MaxText.convert_hf", *map(str, args)], cwd=REPO, capture_output=True, text=True, check=False
  )


def _not_llama(hf):
  c = json.loads((hf / "config.json").read_text())
  (hf / "config.json").write_text(json.dumps({**c, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))


def _shape(hf):
  c = json.loads((hf / "config.json").read_text())
  (hf / "config.json").write_text(json.dumps({**c, "intermediate_size": 176}))


def _extra(hf):
  _rewrite(
    hf / "model-00002-of-00002.safetensors", add={"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)}
  )
  _edit_index(hf, lambda m: m.update({"model.layers.0.self_attn.q_proj.bias": "model-00002-of-00002.safetensors"}))


def _set_config(hf, **changes):
  c = json.loads((hf / "config.json").read_text())
  (hf / "config.json").write_text(json.dumps({**c, **changes}))


def _truncate(hf):
  path = hf / "model-00002-of-00002.safetensors"
  path.write_bytes(path.read_bytes()[:-100])


def _int8(hf):
  name = "model.layers.2.mlp.up_proj.weight"
  _rewrite(_file_of(hf, name), retype=lambda n, a: a.astype(np.int8) if n == name else a)


def _header_dtype_list(hf):
  """A header whose dtype is a JSON list (a writer's bug): the reader names the tensor instead of a TypeError."""
  path = hf / "model-00002-of-00002.safetensors"
  data = path.read_bytes()
  size = int.from_bytes(data[:8], "little")
  header = json.loads(data[8 : 8 + size])
  header["model.norm.weight"]["dtype"] = ["BF16"]
  text = json.dumps(header).encode()
  text += b" " * (-len(text) % 8)
  path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size :])


@pytest.mark.parametrize(
  "damage, message",
  [
    (_not_llama, "not a Llama architecture"),
    (_header_dtype_list, r"tensor model.norm.weight has dtype \['BF16'\], which this reader doesn't know"),
    (
      lambda hf: _edit_index(hf, lambda m: m.update({"model.norm.weight": 2})),
      r"weight_map puts tensor model.norm.weight in 2, which is not a file name beside the index",
    ),
    (
      lambda hf: _edit_index(hf, lambda m: m.update({"model.norm.weight": "../model.safetensors"})),
      'in "../model.safetensors", which is not a file name',
    ),
    (lambda hf: _set_config(hf, max_position_embeddings=0), r"max_position_embeddings=0 \(the longest sequence"),
    (lambda hf: _set_config(hf, rms_norm_eps=None), r"rms_norm_eps=null \(the RMSNorm epsilon\)"),
    (
      lambda hf: _edit_index(hf, lambda m: m.pop("model.layers.1.mlp.up_proj.weight")),
      "tensor model.layers.1.mlp.up_proj.weight is missing",
    ),
    (_extra, "unexpected tensor model.layers.0.self_attn.q_proj.bias"),
    (_shape, r"model.layers.0.mlp.gate_proj.weight has shape \[160, 64\] but config.json implies \[176, 64\]"),
    (_truncate, "truncated"),
    (_int8, "model.layers.2.mlp.up_proj.weight is int8"),
    (lambda hf: (hf / "config.json").unlink(), "no config.json"),
  ],
)
def test_bad_checkpoints_are_one_line_errors_and_write_nothing(tmp_path, capsys, damage, message):
  hf = _copy(tmp_path)
  damage(hf)
  assert convert_hf.main(["to-maxtext", str(hf), str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: ") and re.search(message, err), err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no output, no temporary directory


def test_an_output_directory_that_is_not_empty_is_refused(tmp_path):
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "keep.txt").write_text("mine")
  result = _cli("to-maxtext", HF_TINY, tmp_path / "out")
  assert result.returncode == 2 and "exists and is not empty" in result.stderr and result.stderr.count("\n") == 1
  assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_a_storage_fault_mid_import_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
  from MaxText.checkpointing.hf import orbax_writer  # pylint: disable=import-outside-toplevel

  def full_disk(*_):
    raise ValueError("RESOURCE_EXHAUSTED: Error writing file: No space left on device [OS error: 28]")

  monkeypatch.setattr(orbax_writer.ParamCheckpointWriter, "write", full_disk)
  # Into directories that don't exist yet: made for the output (as mkdir -p), and gone with it after the failure.
  assert convert_hf.main(["to-maxtext", str(HF_TINY), str(tmp_path / "new" / "deeper" / "out")]) == 2
  err = capsys.readouterr().err
  assert err == (
    f"error: writing {tmp_path}/new/deeper/out: No space left on device: the filesystem is full: free space on it (or "
    "write elsewhere) and rerun; nothing was written (the partial output was removed)\n"
  )
  assert not list(tmp_path.iterdir())
