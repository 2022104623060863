"""A MaxText user's command line means here what it means in MaxText: models by name (their published parameter
counts), the override_model_config rule, no YAML, MaxText's config paths, its GPU scripts' keys and value spellings,
its keys that do nothing here (one warning line each) and typo suggestions."""

import jax
import numpy as np
import pytest

from MaxText import config, train
from MaxText.config import models
from MaxText.model.decoder import abstract_model
from tests.conftest import REPO


@pytest.mark.parametrize("name", sorted(models.PUBLISHED_PARAMETERS) + ["llama3-tiny"])
def test_each_named_model_dry_runs_with_its_published_parameter_count(name, capsys):
  assert train.main([f"model_name={name}", "dry_run=true", "per_device_batch_size=1", "max_target_length=128"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == f"model: {name}"
  printed = int(next(l for l in out if l.startswith("parameters: ")).split()[1])
  _, params, _ = abstract_model(config.load(None, [f"model_name={name}"]))
  built = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  assert printed == built == models.PUBLISHED_PARAMETERS.get(name, 3_410_176)


def test_model_definitions_match_the_published_configs():
  c = config.load(None, ["model_name=llama3.2-1b"])
  assert (c.base_emb_dim, c.head_dim, c.base_num_decoder_layers, c.logits_via_embedding) == (2048, 64, 16, True)
  assert (c.rope_type, c.rope_scaling_factor, c.rope_original_max_position) == ("llama3.1", 32.0, 8192)
  assert config.load(None, ["model_name=llama3.1-70b"]).rope_scaling_factor == 8.0
  assert config.load(None, ["model_name=llama3-70b"]).rope_type == "default"
  assert config.load(None, ["model_name=llama3.1-8b-Instruct"]).base_emb_dim == 4096  # MaxText's suffix
  thin = config.load(REPO / "configs" / "llama3_8b.yml").to_dict()
  assert thin == config.load(None, ["model_name=llama3-8b", "max_target_length=8192"]).to_dict()


def test_a_named_models_keys_are_its_own_unless_override_model_config(tmp_path):
  with pytest.raises(config.ConfigError) as e:
    config.load(REPO / "configs" / "llama3_8b.yml", ["base_num_decoder_layers=4"])
  assert str(e.value).startswith(
    "command line: base_num_decoder_layers=4 differs from model_name=llama3-8b's base_num_decoder_layers=32"
  )
  assert "override_model_config=true" in str(e.value)
  assert config.load(REPO / "configs" / "llama3_8b.yml", ["base_num_decoder_layers=32"]).base_num_decoder_layers == 32
  c = config.load(REPO / "configs" / "llama3_8b.yml", ["override_model_config=true", "base_num_decoder_layers=4"])
  assert (c.base_num_decoder_layers, c.base_emb_dim) == (4, 4096)
  # A YAML's model key is refused too (MaxText silently lets the model file win there); base.yml is the defaults.
  mine = tmp_path / "mine.yml"
  mine.write_text(f"base_config: {REPO / 'configs' / 'base.yml'}\nmodel_name: llama3-70b\nvocab_size: 32000\n")
  with pytest.raises(config.ConfigError, match=r"mine.yml: vocab_size=32000 differs from model_name=llama3-70b's"):
    config.load(mine)
  with pytest.raises(config.ConfigError) as e:
    config.load(None, ["model_name=llama2-7b"])
  assert str(e.value) == (
    "command line: model_name='llama2-7b' is not a model here; known: default, llama3-8b, llama3-70b, llama3.1-8b, "
    "llama3.1-70b, llama3.1-405b, llama3.3-70b, llama3.2-1b, llama3.2-3b, llama3-tiny"
  )


def test_no_yaml_and_maxtexts_base_yml_paths(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert config.split_argv(["steps=3", "model_name=llama3-8b"]) == (None, ["steps=3", "model_name=llama3-8b"])
  defaults = config.load(None, ["run_name=a"]).to_dict()
  for path in ("MaxText/configs/base.yml", "src/maxtext/configs/base.yml", "/deps/src/MaxText/configs/base.yml"):
    assert config.load(path, ["run_name=a"]).to_dict() == defaults
  assert defaults["model_name"] == "default" and defaults["base_emb_dim"] == 2048


def test_gpu_script_spellings(capsys):
  c = config.load(
    None,
    [
      "quantization=fp8",
      "attention=cudnn_flash_te",
      "eval_interval=-1",
      "learning_rate_final_fraction=0.2",
      "opt_type=adam_pax",
      "matmul_precision=float32",
      "max_segments_per_seq=32",
      "ici_expert_parallelism=1",
    ],
  )
  # MaxText's fp8: Flax's delayed-scaling FP8 of every Dense layer (the logits and attention core stay bf16).
  assert (c.quantization, c.quantization_scope) == ("te_fp8_delayedscaling", "all_dense")
  assert (c.amax_history_len, c.amax_compute_algo) == (1024, "max")
  assert config.load(None, ["quantization=fp8", "quantization_scope=mlp"]).quantization_scope == "mlp"
  assert (c.attention, c.eval_interval, c.cosine_learning_rate_final_fraction) == ("cudnn_flash", -1, 0.2)
  assert capsys.readouterr().err == ""  # all of them mean here what they mean in MaxText: nothing to warn about


def test_keys_with_no_effect_here_warn_once_each(capsys):
  config.load(None, ["use_iota_embed=true", "monitor_goodput=false", "force_unroll=true", "megablox=false"])
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 3, err  # monitor_goodput=false is MaxText's default and what happens here: no line
  assert err[0].startswith("warning: command line: megablox=false has no effect here: it is a mixture-of-experts")
  assert err[1].startswith("warning: use_iota_embed=true has no effect here: the embedding is a gather")
  assert err[2].startswith("warning: force_unroll=true has no effect here: it only affects MaxText's")


@pytest.mark.parametrize(
  "override, message",
  [
    ("opt_typ=sgd", "unknown key 'opt_typ' (did you mean 'opt_type'?)"),
    ("rope_typ=default", "unknown key 'rope_typ' (did you mean 'rope_type'?)"),
    ("optimizer_type=sgd", "unknown key 'optimizer_type'"),
    ("ici_expert_parallelism=4", "'ici_expert_parallelism' is MaxText's expert mesh axis"),
    ("hf_data_files=x", "the key is hf_train_files"),
    ("opt_type=muon", "opt_type='muon' is not one of: adamw, adam_pax, sgd"),
    ("base_config=base.yml", "'base_config' is a YAML key"),
    ("dataset_type=hf", "dataset_type=hf needs hf_path"),
  ],
)
def test_refusals_are_one_line_and_suggest_only_real_near_misses(override, message):
  with pytest.raises(config.ConfigError) as e:
    config.load(None, [override])
  assert message in str(e.value) and "\n" not in str(e.value)
  if override.startswith("optimizer_type"):
    assert "did you mean" not in str(e.value)


def test_suggestions_are_typos_not_shared_words():
  assert config.schema.near_misses("opt_type", config.SCHEMA) == ["opt_type"]  # itself, not rope_type
  assert config.schema.near_misses("ici_expert_parallelism", config.SCHEMA) == []
  assert config.schema.near_misses("maxtarget_length", config.SCHEMA) == ["max_target_length"]


def test_cudnn_attention_is_refused_before_compiling_without_a_gpu(tmp_path, capsys):
  argv = ["configs/llama3_tiny.yml", "attention=cudnn_flash_te", "dataset_type=synthetic"]
  assert train.main([str(REPO / argv[0]), *argv[1:], f"base_output_directory={tmp_path}"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [
    "error: attention=cudnn_flash runs cuDNN's fused attention on an NVIDIA GPU, but jax sees 1 cpu device(s) here; "
    "use attention=dot_product"
  ]
  assert not any(tmp_path.iterdir())  # nothing written
