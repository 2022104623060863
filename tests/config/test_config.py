"""Config loading: inheritance, coercion, every error path (one line, exit 2), base.yml in sync."""

import os
import subprocess
import sys

import pytest

from MaxText import config
from MaxText.config import schema
from tests.conftest import REPO

BASE = REPO / "configs" / "base.yml"


def test_base_yml_is_generated_from_the_schema():
  assert BASE.read_text() == config.write_base_yml(None), "run: python -m MaxText.config > configs/base.yml"


def test_defaults_inheritance_and_overrides(tmp_path):
  parent = tmp_path / "parent.yml"
  parent.write_text(f"base_config: {BASE}\nsteps: 7\nlearning_rate: 1e-3\n")
  child = tmp_path / "sub" / "child.yml"
  child.parent.mkdir()
  child.write_text("base_config: ../parent.yml\nsteps: 9\n")
  cfg = config.load(child, ["scan_layers=false", "mlp_activations=gelu,linear", "per_device_batch_size=2"])
  assert cfg.steps == 9 and cfg.learning_rate == 1e-3 and cfg.scan_layers is False
  assert cfg.mlp_activations == ["gelu", "linear"] and cfg.per_device_batch_size == 2.0
  assert cfg.vocab_size == config.SCHEMA["vocab_size"].default


def test_llama_configs_have_the_published_shapes():
  c8 = config.load(REPO / "configs" / "llama3_8b.yml")
  assert (
    c8.base_emb_dim,
    c8.base_num_query_heads,
    c8.base_num_kv_heads,
    c8.base_num_decoder_layers,
    c8.base_mlp_dim,
    c8.head_dim,
    c8.vocab_size,
    c8.rope_max_timescale,
    c8.normalization_layer_epsilon,
  ) == (4096, 32, 8, 32, 14336, 128, 128256, 500000.0, 1e-5)
  c405 = config.load(REPO / "configs" / "llama3.1_405b.yml")
  assert (
    c405.base_emb_dim,
    c405.base_num_query_heads,
    c405.base_num_kv_heads,
    c405.base_num_decoder_layers,
    c405.base_mlp_dim,
  ) == (16384, 128, 8, 126, 53248)


@pytest.mark.parametrize(
  "override, message",
  [
    ("learning_rat=1", "unknown key 'learning_rat' (did you mean 'learning_rate'?)"),
    ("steps=abc", "steps='abc' is not a valid int"),
    ("steps=1.5", "steps='1.5' is not a valid int"),
    ("scan_layers=maybe", "scan_layers='maybe' is not a valid bool"),
    (
      "remat_policy=some",
      "remat_policy='some' is not one of: auto, none, minimal, minimal_with_context, minimal_with_quantization,",
    ),
    ("quantization=te_nvfp5", "quantization='te_nvfp5' is not one of"),
    ("steps=0", "steps=0 must be > 0"),
    ("base_num_kv_heads=3", "must be a multiple of base_num_kv_heads=3"),
    ("novalue", "expected key=value, got 'novalue'"),
    ("amax_history_len=0", "amax_history_len=0 must be > 0"),
    ("ici_fsdp_parallelism=x", "ici_fsdp_parallelism"),
    ("steps=1e400", "steps='1e400' is not a valid int"),
    ("seed=99999999999999999999", "seed='99999999999999999999' is out of range (a 64-bit integer)"),
    ("seed=-1", "seed=-1 must be in [0, 4294967295]"),
    ("seed=4294967296", "seed=4294967296 must be at most 4294967295"),
    ("steps=2147483648", "steps=2147483648 must be at most 2147483647"),
    ("adam_b1=1", "adam_b1=1.0 must be in [0, 1)"),
    ("adam_b2=-0.1", "adam_b2=-0.1 must be in [0, 1)"),
    ("adam_eps=0", "adam_eps=0.0 must be > 0"),
    ("learning_rate=inf", "learning_rate=inf must be a finite number"),
    ("learning_rate=nan", "learning_rate=nan must be a finite number"),
    ("learning_rate=-1e-3", "learning_rate=-0.001 must be >= 0"),
    ("adam_weight_decay=-0.1", "adam_weight_decay=-0.1 must be >= 0"),
    ("gradient_clipping_threshold=-inf", "gradient_clipping_threshold=-inf must be a finite number"),
    ("cosine_learning_rate_final_fraction=1.5", "cosine_learning_rate_final_fraction=1.5 must be in [0, 1]"),
    ("per_device_batch_size=0", "per_device_batch_size=0.0 must be > 0"),
    ("normalization_layer_epsilon=0", "normalization_layer_epsilon=0.0 must be > 0"),
    ("hardware_memory_gib=nan", "hardware_memory_gib=nan must be a finite number"),
    ("grain_worker_count=100000", "grain_worker_count=100000 must be in [0, 1024]"),
    ("warmup_steps=-2", "warmup_steps=-2 must be >= -1"),
    ("ici_fsdp_parallelism=0", "ici_fsdp_parallelism=0 must be -1 (the remaining devices) or >= 1"),
    ("rope_type=llama3.1", "rope_high_freq_factor=4.0 must be > rope_low_freq_factor="),
    ("base_output_directory=$MAXTEXT_TEST_UNSET/runs", "the environment variable MAXTEXT_TEST_UNSET is not set"),
    ("run_name=../../x", "run_name='../../x' must be a plain directory name"),
    ("run_name=..", "run_name='..' must be a plain directory name"),
  ],
)
def test_override_errors(override, message):
  extra = ["rope_low_freq_factor=4"] if override == "rope_type=llama3.1" else []
  with pytest.raises(config.ConfigError) as e:
    config.load(BASE, [override, *extra])
  assert message in str(e.value) and "\n" not in str(e.value)


def test_every_default_is_in_its_range():
  """A Key's range can't be wrong about a value the schema itself uses; numeric keys without one get the int32 /
  finite bound; only numeric keys have one."""
  for name, key in config.SCHEMA.items():
    if key.type in (int, float):
      schema.check_number(name, key.default, "SCHEMA")
  assert all(config.SCHEMA[name].type in (int, float) for name in config.RANGES), "a range on a non-numeric key"
  assert config.RANGES["steps"] is config.SCHEMA["steps"].range == schema.COUNT


def test_only_the_winning_value_is_checked(tmp_path):
  """A bad value that a later file or the command line overrides is not an error (MaxText: the last one wins); the
  winning value is, naming where it was given. E.g. an import's config.yml with max_target_length: 0."""
  parent = tmp_path / "parent.yml"
  parent.write_text(f"base_config: {BASE}\nmax_target_length: 0\nsteps: ten\n")
  child = tmp_path / "child.yml"
  child.write_text("base_config: parent.yml\nsteps: 10\n")
  assert config.load(child, ["max_target_length=64"]).max_target_length == 64
  with pytest.raises(config.ConfigError, match=rf"^{parent}: max_target_length=0 must be > 0$"):
    config.load(child)
  with pytest.raises(config.ConfigError, match=r"^command line: steps='x' is not a valid int$"):
    config.load(child, ["max_target_length=64", "steps=x"])


def test_yaml_infinity_is_refused_with_the_file(tmp_path):
  path = tmp_path / "lr.yml"
  path.write_text(f"base_config: {BASE}\nlearning_rate: .inf\n")
  with pytest.raises(config.ConfigError, match=rf"^{path}: learning_rate=inf must be a finite number$"):
    config.load(path)


def test_paths_expand_home_and_variables_when_loaded(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.setenv("MAXTEXT_TEST_DATA", "/data/shards")
  path = tmp_path / "paths.yml"
  path.write_text(f"base_config: {BASE}\nbase_output_directory: ~/runs\n")
  cfg = config.load(
    path,
    [
      "grain_train_files=${MAXTEXT_TEST_DATA}/train-*.array_record",
      "tokenizer_path=$MAXTEXT_TEST_DATA/tok.json",
      "load_parameters_path=~/ckpt/5",
    ],
  )
  assert cfg.base_output_directory == f"{tmp_path}/runs"
  assert cfg.grain_train_files == "/data/shards/train-*.array_record"
  assert cfg.tokenizer_path == "/data/shards/tok.json" and cfg.load_parameters_path == f"{tmp_path}/ckpt/5"
  assert cfg.replace(dataset_path="~/tfds").dataset_path == f"{tmp_path}/tfds"
  assert config.load("~/paths.yml").base_output_directory == f"{tmp_path}/runs"  # the config path itself too


def test_relative_paths_are_made_absolute_against_the_working_directory_once(tmp_path, monkeypatch):
  """Read against the directory the command starts in, at load: nothing later (a subprocess, Orbax) can read them
  against another. Empty paths and URLs stay as they are."""
  (tmp_path / "work").mkdir()
  monkeypatch.chdir(tmp_path / "work")
  cfg = config.load(
    os.path.relpath(REPO / "configs" / "llama3_tiny.yml"),
    [
      "base_output_directory=runs",
      "tokenizer_path=../tok dir/tokenizer.json",
      "grain_eval_files=data/eval-*.array_record",
      "load_parameters_path=./runs/a/checkpoints/4",
      "jax_cache_dir=cache",
      "dataset_path=gs://bucket/tfds",
      "load_full_state_path=",
    ],
  )
  work = tmp_path / "work"
  assert cfg.base_output_directory == f"{work}/runs" and cfg.jax_cache_dir == f"{work}/cache"
  assert cfg.tokenizer_path == f"{tmp_path}/tok dir/tokenizer.json"
  assert cfg.grain_train_files == f"{work}/data/shakespeare/train-*.array_record"  # the YAML's, against the cwd
  assert cfg.grain_eval_files == f"{work}/data/eval-*.array_record"
  assert cfg.load_parameters_path == f"{work}/runs/a/checkpoints/4"
  assert cfg.dataset_path == "gs://bucket/tfds" and cfg.load_full_state_path == ""
  assert config.load(REPO / "configs" / "llama3_tiny.yml").base_output_directory == f"{work}/outputs"  # default
  monkeypatch.chdir(tmp_path)
  assert cfg.replace(base_output_directory="runs").base_output_directory == f"{tmp_path}/runs"
  assert config.absolute_path(cfg.base_output_directory) == cfg.base_output_directory  # idempotent


@pytest.mark.parametrize(
  "nodes, gpus, message",
  [
    (20, 4, "--nodes 20: the config's dcn_data_parallelism=-1, dcn_fsdp_parallelism=32 needs a multiple of 32 node(s)"),
    (32, 8, "--gpus-per-node 8: the config's ici_fsdp_parallelism=4 needs exactly 4 GPU(s) per node"),
  ],
)
def test_check_job_fits_the_mesh_to_nodes_and_gpus(nodes, gpus, message):
  cfg = config.load(REPO / "configs" / "gb300" / "llama3.1_405b_nvfp4.yml", ["dcn_data_parallelism=-1"])
  config.check_job(cfg, 64, 4)  # 2 data-parallel replicas of the 32-node FSDP group
  with pytest.raises(config.ConfigError) as e:
    config.check_job(cfg, nodes, gpus)
  assert str(e.value).startswith(message)
  with pytest.raises(config.ConfigError, match="needs exactly 32 node"):
    config.check_job(cfg.replace(dcn_data_parallelism=1), 64, 4)


def test_check_cli_needs_pyyaml_but_not_jax(tmp_path):
  """submit.sh runs `python -m MaxText.config --check` on login nodes: with jax unimportable it still checks."""
  shim = tmp_path / "jax"
  shim.mkdir()
  (shim / "__init__.py").write_text("raise ImportError('no jax on this machine')\n")
  run = lambda *args: subprocess.run(
    [sys.executable, "-m", "MaxText.config", *args],
    cwd=REPO,
    text=True,
    capture_output=True,
    timeout=120,
    env={**os.environ, "PYTHONPATH": str(tmp_path)},
  )
  ok = run(
    "--check",
    "--nodes",
    "64",
    "--gpus-per-node",
    "4",
    "configs/gb300/llama3.1_405b_nvfp4.yml",
    "dcn_data_parallelism=-1",
  )
  assert (ok.returncode, ok.stdout) == (0, "config ok\n"), ok.stderr
  bad = run("--check", "configs/gb300/llama3.1_405b_nvfp4.yml", "quantization=te_nvfp5")
  assert bad.returncode == 2 and bad.stderr.startswith("error: command line: quantization='te_nvfp5' is not one of")
  assert run("--help").returncode == 0 and run("--nope").returncode == 2


def test_file_errors(tmp_path):
  with pytest.raises(config.ConfigError, match="config file not found"):
    config.load(tmp_path / "missing.yml")
  bad = tmp_path / "bad.yml"
  bad.write_text("steps: [1,\n")
  with pytest.raises(config.ConfigError, match="not valid YAML"):
    config.load(bad)
  typo = tmp_path / "typo.yml"
  typo.write_text("stesp: 3\n")
  with pytest.raises(config.ConfigError, match=r"typo.yml: unknown key 'stesp' \(did you mean 'steps'\?\)"):
    config.load(typo)
  twice = tmp_path / "twice.yml"
  twice.write_text("steps: 3\nlearning_rate: 0.1\nsteps: 4\n")
  with pytest.raises(config.ConfigError, match="twice.yml line 3: not valid YAML \\(duplicate key 'steps'\\)"):
    config.load(twice)
  latin1 = tmp_path / "latin1.yml"
  latin1.write_bytes("run_name: caf\u00e9\n".encode("latin-1"))
  with pytest.raises(config.ConfigError, match="latin1.yml: not UTF-8 text \\(byte 13\\)"):
    config.load(latin1)
  unreadable = tmp_path / "dir.yml"
  unreadable.mkdir()
  with pytest.raises(config.ConfigError, match="config file .*dir.yml is a directory; give a YAML file$"):
    config.load(unreadable)
  with pytest.raises(config.ConfigError, match=r"is a directory; give a YAML file \(in it: base.yml, llama3.1_405b"):
    config.load(REPO / "configs")
  loop = tmp_path / "loop.yml"
  loop.write_text("base_config: loop.yml\n")
  with pytest.raises(config.ConfigError, match="cycle"):
    config.load(loop)


def test_run_shape_derivations():
  cfg = config.load(BASE, ["per_device_batch_size=2", "gradient_accumulation_steps=4", "max_target_length=64"])
  shape = config.RunShape.of(cfg, 4)
  assert (shape.global_batch_size, shape.micro_batch_size, shape.tokens_per_step) == (8, 2, 512)
  with pytest.raises(config.ConfigError, match="not divisible by gradient_accumulation_steps"):
    config.RunShape.of(cfg.replace(gradient_accumulation_steps=3), 4)
  with pytest.raises(config.ConfigError, match="whole number"):
    config.RunShape.of(cfg.replace(per_device_batch_size=0.5), 1)


@pytest.mark.parametrize(
  "args, message",
  [
    (
      ["configs/llama3_tiny.yml", "learning_rat=0.1"],
      "command line: unknown key 'learning_rat' (did you mean 'learning_rate'?)",
    ),
    (["configs/llama3_tiny.yml", "steps=ten"], "command line: steps='ten' is not a valid int"),
    (["configs/nope.yml"], "config file not found: configs/nope.yml"),
  ],
)
def test_cli_errors_are_one_line_with_exit_code_2(args, message):
  proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [f"error: {message}"]
  assert "Traceback" not in proc.stderr
