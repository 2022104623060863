"""Export: import then export is the original checkpoint bit for bit; a te_nvfp4 fine-tune (started from the HF
directory directly) exports, and the export re-imports to the trained parameters; refusals in one line."""

import json

import jax
import ml_dtypes
import numpy as np
import pytest

from MaxText import config, convert_hf
from MaxText.trainer import run as train
from MaxText.checkpointing.hf import exporter, importer
from MaxText.checkpointing.hf.checkpoint import INDEX, HFCheckpoint
from tests.conftest import HF_TINY, JAX_CACHE
from tests.checkpointing.hf import tiny


def _tensors(hf_dir):
  with HFCheckpoint(hf_dir) as hf:
    return {n: hf.read(n) for n in hf._where}  # pylint: disable=protected-access


def _bits(a):
  return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def test_import_then_export_is_the_original_bit_for_bit(hf_tiny_import, tmp_path):
  cfg = config.load(hf_tiny_import / "config.yml")
  exporter.export(cfg, cfg.load_parameters_path, tmp_path / "out", max_shard_bytes=150_000, log=lambda *_: None)
  original, exported = _tensors(HF_TINY), _tensors(tmp_path / "out")
  assert sorted(original) == sorted(exported)
  for name, a in original.items():
    assert exported[name].dtype == a.dtype and np.array_equal(_bits(exported[name]), _bits(a)), name
  assert len(list((tmp_path / "out").glob("model-*-of-00003.safetensors"))) == 3
  index = json.loads((tmp_path / "out" / INDEX).read_text())
  assert index["metadata"]["total_size"] == sum(a.nbytes for a in original.values())
  written, source = (json.loads((d / "config.json").read_text()) for d in (tmp_path / "out", HF_TINY))
  assert {k: written[k] for k in ("vocab_size", "max_position_embeddings", "bos_token_id", "rms_norm_eps")} == {
    k: source[k] for k in ("vocab_size", "max_position_embeddings", "bos_token_id", "rms_norm_eps")
  }
  for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    assert (tmp_path / "out" / name).read_bytes() == (HF_TINY / name).read_bytes()


def test_float32_export_holds_the_same_values(hf_tiny_import, tmp_path):
  cfg = config.load(hf_tiny_import / "config.yml")
  exporter.export(cfg, cfg.load_parameters_path, tmp_path / "out", dtype="float32", log=lambda *_: None)
  original, exported = _tensors(HF_TINY), _tensors(tmp_path / "out")
  assert (tmp_path / "out" / "model.safetensors").is_file() and not (tmp_path / "out" / INDEX).exists()
  for name, a in original.items():
    assert exported[name].dtype == np.float32 and np.array_equal(exported[name], a.astype(np.float32)), name


@pytest.mark.slow
def test_a_te_nvfp4_fine_tune_exports_and_reimports_to_its_parameters(hf_tiny_import, tmp_path):
  overrides = [
    "steps=3",
    "quantization=te_nvfp4",
    "enable_checkpointing=true",
    "checkpoint_period=3",
    "dataset_type=synthetic",
    "max_target_length=32",
    "per_device_batch_size=2",
    "learning_rate=1e-2",
    "remat_policy=none",
    "enable_tensorboard=false",
    f"base_output_directory={tmp_path}",
    "run_name=ft",
    f"jax_cache_dir={JAX_CACHE}",
  ]
  # Trained from the Hugging Face directory itself (load_parameters_path=HF_TINY: the direct load in the trainer).
  direct = importer.import_checkpoint(HF_TINY, tmp_path / "direct", direct=True, log=lambda *_: None)
  losses = train.train(config.load(direct, overrides))
  assert len(losses) == 3 and np.isfinite(losses).all()
  cfg, step_dir = convert_hf.export_source(tmp_path / "ft")  # the run's newest checkpoint, its recorded config
  assert step_dir.name == "3" and cfg.quantization == "te_nvfp4"
  _, _, trained, _ = tiny.load(hf_tiny_import / "config.yml", path=step_dir)
  _, _, start, _ = tiny.load(hf_tiny_import / "config.yml")
  trained, start = jax.tree.map(np.asarray, trained), jax.tree.map(np.asarray, start)
  assert not np.array_equal(trained["layers"]["mlp"]["up"]["kernel"][...], start["layers"]["mlp"]["up"]["kernel"][...])
  for dtype, rounded in (
    ("float32", lambda a: a),
    ("bfloat16", lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32)),
  ):
    exporter.export(cfg, step_dir, tmp_path / dtype, dtype=dtype, log=lambda *_: None)
    importer.import_checkpoint(tmp_path / dtype, tmp_path / f"re-{dtype}", log=lambda *_: None)
    _, _, back, _ = tiny.load(tmp_path / f"re-{dtype}" / "config.yml")
    jax.tree.map(lambda b, t: np.testing.assert_array_equal(np.asarray(b), rounded(t)), back, trained)


def test_a_checkpoint_of_another_model_is_refused_in_one_line(hf_tiny_import, tmp_path):
  cfg = config.load(hf_tiny_import / "config.yml", ["logits_via_embedding=true"])
  with pytest.raises(exporter.HFError, match="parameter lm_head is .* in the checkpoint but absent in the config"):
    exporter.export(cfg, cfg.load_parameters_path, tmp_path / "out", log=lambda *_: None)
  assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


def test_a_fused_mlp_import_joins_gate_and_up_and_its_export_splits_them_back(tmp_path):
  assert convert_hf.main(["to-maxtext", str(HF_TINY), str(tmp_path / "fused"), "--fused-mlp"]) == 0
  cfg = config.load(tmp_path / "fused" / "config.yml")
  assert cfg.fused_mlp
  stored = exporter.CheckpointParams(cfg.load_parameters_path).stored
  assert stored["layers/mlp/gate_up/kernel"][0] == (3, 64, 2, 160) and "layers/mlp/gate/kernel" not in stored
  assert convert_hf.main(["to-hf", str(tmp_path / "fused" / "config.yml"), str(tmp_path / "out")]) == 0
  original, exported = _tensors(HF_TINY), _tensors(tmp_path / "out")
  assert sorted(original) == sorted(exported)
  for name, a in original.items():
    assert np.array_equal(_bits(exported[name]), _bits(a)), name
