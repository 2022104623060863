"""to-hf --nvfp4: the ModelOpt NVFP4 export read back by an independent NumPy reader (modelopt_reader.py) is the
training forward pass's weights bit for bit (fused runs; unfused runs but for the re-quantized projection of each
pair, which is what a fused run of the same weights computes); its other tensors are the BF16 export's; the config
files carry what vLLM, TensorRT-LLM and transformers read; a forward pass from the files alone reproduces ours.

The runs are the committed tiny Llama with every weight perturbed in f32 (as a fine-tune's master weights are), written
as parameter checkpoints: a fused and an unfused copy of the same numbers."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from MaxText import config, convert_hf, precision
from MaxText.data import tokenizers
from MaxText.inference.generate import Generator
from MaxText.trainer import run as train
from MaxText.checkpointing import restore_params
from MaxText.checkpointing.hf import exporter, importer, modelopt, names, nvfp4_export
from MaxText.checkpointing.hf.orbax_writer import ParamCheckpointWriter
from MaxText.model.decoder import abstract_model
from MaxText.quantization.backends import emulated
from MaxText.quantization.formats import nvfp4
from MaxText.runtime import sharding
from tests.checkpointing.hf import modelopt_reader as reader
from tests.checkpointing.hf import tiny
from tests.conftest import HF_TINY, JAX_CACHE

BASE = ["quantization=te_nvfp4", "dataset_type=synthetic", "max_target_length=32", "per_device_batch_size=1"]
VARIANTS = {  # name: (fused, overrides)
  "fused": (True, []),
  "unfused": (False, []),
  "fused_4over6": (True, ["nvfp4_4over6=weights", "nvfp4_4over6_err_mode=mae"]),
  "unfused_no_rht_1x16_bf16_edge": (
    False,
    ["quantization=te_nvfp4_no_rht", "disable_2d_quantization=true", "quantization_bf16_first_layers=1"],
  ),
}
QUIET = dict(log=lambda *_: None)


def _write_checkpoint(step_dir, arrays):
  writer = ParamCheckpointWriter(step_dir / "state", {p: (a.shape, a.dtype, a.ndim - 1, ()) for p, a in arrays.items()})
  for path, a in arrays.items():
    writer.write(path, (slice(None),) * a.ndim, a)
  writer.finish()


@pytest.fixture(scope="module")
def checkpoints(hf_tiny_import, tmp_path_factory):
  """{fused: step directory}: the tiny model's weights times (1 + 0.01 N(0, 1)), f32, unfused and fused."""
  _, _, params, _ = tiny.load(hf_tiny_import / "config.yml")
  rng = np.random.default_rng(0)
  arrays = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    a = np.asarray(leaf, np.float32)
    arrays[sharding.param_path(path)] = (a * (1 + 0.01 * rng.standard_normal(a.shape))).astype(np.float32)
  root = tmp_path_factory.mktemp("nvfp4_runs")
  _write_checkpoint(root / "unfused", arrays)
  gate, up = arrays.pop("layers/mlp/gate/kernel"), arrays.pop("layers/mlp/up/kernel")
  _write_checkpoint(root / "fused", {**arrays, "layers/mlp/gate_up/kernel": np.stack([gate, up], axis=-2)})
  return {False: root / "unfused", True: root / "fused"}


def _overrides(checkpoints, variant):
  fused, extra = VARIANTS[variant]
  return [f"load_parameters_path={checkpoints[fused]}", f"fused_mlp={fused}", *BASE, *extra]


@pytest.fixture(scope="module")
def exports(hf_tiny_import, checkpoints, tmp_path_factory):
  """{variant: (cfg, export directory)}: "fused" through the CLI (calibrated on 2 batches), the others with its
  activation amaxes (read back from its input_scale)."""
  root, config_yml = tmp_path_factory.mktemp("nvfp4_exports"), str(hf_tiny_import / "config.yml")
  out = {}
  argv = ["to-hf", config_yml, str(root / "fused"), *_overrides(checkpoints, "fused"), "--nvfp4"]
  assert convert_hf.main([*argv, "--calibration-batches", "2"]) == 0
  scales = reader.read_safetensors(root / "fused")
  input_amax = {
    (layer, gemm): float(scales[f"{names.mlp_module(layer, gemm)}.input_scale"][0]) * 2688
    for layer in range(3)
    for gemm in names.MLP_PROJECTIONS
  }
  for variant in VARIANTS:
    cfg, step_dir = convert_hf.export_source(config_yml, _overrides(checkpoints, variant))
    if variant != "fused":
      nvfp4_export.export(cfg, step_dir, root / variant, input_amax, {"source": "test"}, **QUIET)
    out[variant] = (cfg, root / variant)
  return out


def _forward_weight(kernel_KxN, recipe):
  """The forward pass's dequantized weight [N, K]: its weight operand (what qmatmul's forward quantizes) times the
  global decode scale."""
  q = emulated.quantize_for_gemm(jnp.asarray(kernel_KxN), recipe, "w", transpose=True)
  return np.asarray(q.values, np.float32) * np.float32(nvfp4.decode_scale(q))


def _stacked(cfg, path):
  return exporter.CheckpointParams(cfg.load_parameters_path).read(path)


def _codes_of(values):
  """E2M1 codes of exact E2M1 values, from the definition (sign bit 3, magnitude index)."""
  magnitude = np.abs(values)
  index = np.argmax(reader.E2M1[None, :] == magnitude.reshape(-1, 1), axis=1).reshape(values.shape)
  assert np.array_equal(reader.E2M1[index], magnitude)
  return index | (np.signbit(values) << 3)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dequantized_export_is_the_training_forward_weight_bit_for_bit(exports, variant):
  cfg, out = exports[variant]
  tensors = reader.read_safetensors(out)
  recipe = precision.configured_recipes(cfg)[0]
  quantized_layers = range(cfg.quantization_bf16_first_layers, cfg.base_num_decoder_layers)
  f = cfg.base_mlp_dim
  if cfg.fused_mlp:
    gate_up, down = _stacked(cfg, "layers/mlp/gate_up/kernel"), _stacked(cfg, "layers/mlp/down/kernel")
  else:
    gate, up, down = (_stacked(cfg, f"layers/mlp/{g}/kernel") for g in ("gate", "up", "down"))
  requantized = {
    r["module"]: r for r in json.loads((out / "hf_quant_config.json").read_text())["maxtext"]["requantized"]
  }
  for layer in quantized_layers:
    mod = lambda g, layer=layer: names.mlp_module(layer, g)
    assert np.array_equal(reader.dequantize(tensors, mod("down")), _forward_weight(down[layer], recipe))
    if cfg.fused_mlp:
      both = _forward_weight(gate_up[layer].reshape(cfg.base_emb_dim, 2 * f), recipe)
      for g, rows in (("gate", both[:f]), ("up", both[f:])):
        assert np.array_equal(reader.dequantize(tensors, mod(g)).view(np.uint32), rows.view(np.uint32)), mod(g)
      continue
    # Unfused: the projection with the larger amax is exported as trained; the other is what a fused run of these
    # weights computes (one quantization of the pair), and the codes that changed are counted.
    pair = _forward_weight(np.concatenate([gate[layer], up[layer]], axis=1), recipe)
    for g, kernel, rows in (("gate", gate[layer], pair[:f]), ("up", up[layer], pair[f:])):
      exported = reader.dequantize(tensors, mod(g))
      assert np.array_equal(exported.view(np.uint32), rows.view(np.uint32)), mod(g)
      trained = _forward_weight(kernel, recipe)
      if mod(g) not in requantized:
        assert np.array_equal(exported.view(np.uint32), trained.view(np.uint32)), mod(g)
        continue
      trained_q = nvfp4.quantize(kernel.T, **emulated.nvfp4_options(recipe, "w", None))
      trained_codes = _codes_of(np.asarray(trained_q.values, np.float32))
      codes = reader.e2m1_codes(tensors[f"{mod(g)}.weight"][0])
      assert requantized[mod(g)]["codes_changed"] == int(np.sum(codes != trained_codes)) > 0
      assert requantized[mod(g)]["own_amax"] < requantized[mod(g)]["shared_amax"]
    assert tensors[f"{mod('gate')}.weight_scale_2"][0] == tensors[f"{mod('up')}.weight_scale_2"][0]
    assert tensors[f"{mod('gate')}.input_scale"][0] == tensors[f"{mod('up')}.input_scale"][0]
  if not cfg.fused_mlp:
    assert len(requantized) == len(quantized_layers)  # one per pair (equal amaxes are vanishingly unlikely)


def test_an_unfused_export_serves_what_a_fused_run_of_the_same_weights_computes(exports):
  fused, unfused = (reader.read_safetensors(exports[v][1]) for v in ("fused", "unfused"))
  for layer in range(3):
    for gemm in ("gate", "up"):
      for tensor in ("weight", "weight_scale", "weight_scale_2"):
        name = f"{names.mlp_module(layer, gemm)}.{tensor}"
        assert np.array_equal(fused[name][0], unfused[name][0]), name


def test_the_export_differs_from_the_float32_export_by_nvfp4_sized_errors(exports, tmp_path):
  cfg, out = exports["unfused"]
  exporter.export(cfg, cfg.load_parameters_path, tmp_path / "f32", dtype="float32", **QUIET)
  f32, nv = reader.Checkpoint(tmp_path / "f32"), reader.Checkpoint(out)
  for layer in range(3):
    for gemm in names.MLP_PROJECTIONS:
      module = names.mlp_module(layer, gemm)
      ref = f32.weight(module)
      rel = np.sqrt(np.sum((nv.weight(module) - ref) ** 2) / np.sum(ref**2))
      assert 0.01 < rel < 0.25, (module, rel)  # measured 0.10-0.12


def test_config_files_and_every_other_tensor(exports, tmp_path):
  cfg, out = exports["unfused_no_rht_1x16_bf16_edge"]
  quant = json.loads((out / "hf_quant_config.json").read_text())
  assert quant["quantization"] == {
    "quant_algo": "NVFP4",
    "kv_cache_quant_algo": None,
    "group_size": 16,
    "exclude_modules": ["lm_head"] + [f"model.layers.{i}.self_attn*" for i in range(3)] + ["model.layers.0.mlp*"],
  }
  assert quant["producer"]["name"] == "maxtext_nvfp4" and quant["maxtext"]["recipe"] == "te_nvfp4_no_rht"
  qc = json.loads((out / "config.json").read_text())["quantization_config"]
  assert (qc["quant_method"], qc["quant_algo"], qc["group_size"]) == ("modelopt", "NVFP4", 16)
  assert qc["ignore"] == quant["quantization"]["exclude_modules"] and qc["producer"] == quant["producer"]
  assert qc["config_groups"]["group_0"]["weights"] == {
    "dynamic": False,
    "num_bits": 4,
    "type": "float",
    "group_size": 16,
  }
  # Every Linear is either quantized (its four tensors, the right dtypes and shapes) or excluded, never both.
  ck = reader.Checkpoint(out)
  linears = ["lm_head"] + [
    f"model.layers.{i}.{m}"
    for i in range(3)
    for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
    + tuple(f"mlp.{p}" for p in names.MLP_PROJECTIONS.values())
  ]
  for module in linears:
    assert ck.quantized(module) != ck.excluded(module), module
    if ck.quantized(module):
      w, dtype = ck.tensors[f"{module}.weight"]
      out_f, in_f = names.hf_shape(cfg, names.hf_names(cfg)[f"{module}.weight"][0])
      assert (dtype, w.shape, w.dtype) == ("U8", (out_f, in_f // 2), np.uint8)
      assert ck.tensors[f"{module}.weight_scale"][1] == "F8_E4M3"
      assert ck.tensors[f"{module}.weight_scale"][0].shape == (out_f, in_f // 16)
      for scalar in ("weight_scale_2", "input_scale"):
        assert ck.tensors[f"{module}.{scalar}"][0].shape == () and ck.tensors[f"{module}.{scalar}"][1] == "F32"
  # The rest is the BF16 export, bit for bit.
  exporter.export(cfg, cfg.load_parameters_path, tmp_path / "bf16", **QUIET)
  bf16 = reader.read_safetensors(tmp_path / "bf16")
  plain = {
    n: t for n, t in ck.tensors.items() if not n.rsplit(".", 1)[0].endswith(tuple(names.MLP_PROJECTIONS.values()))
  }
  plain.update({n: t for n, t in ck.tensors.items() if n.startswith("model.layers.0.mlp.")})  # the BF16 edge layer
  assert sorted(plain) == sorted(n for n in bf16 if not (".mlp." in n and not n.startswith("model.layers.0.")))
  for name, (a, dtype) in plain.items():
    assert dtype == "BF16" and np.array_equal(a.view(np.uint16), bf16[name][0].view(np.uint16)), name
  for name in ("tokenizer.json", "generation_config.json"):
    assert (out / name).read_bytes() == (tmp_path / "bf16" / name).read_bytes()


@pytest.mark.slow
def test_a_forward_pass_from_the_files_alone_reproduces_ours(exports):
  cfg, out = exports["fused"]
  cfg = cfg.replace(dtype="float32", disable_stochastic_rounding=True)
  graphdef, abstract, rest = abstract_model(cfg)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  params = restore_params(
    cfg.load_parameters_path, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), abstract)
  )
  # The tensors the export keeps unquantized, rounded as it writes them: our forward then reads what the files hold.
  as_exported = lambda path, a: a if "mlp/" in sharding.param_path(path) else a.astype(jnp.bfloat16).astype(a.dtype)
  params = jax.tree_util.tree_map_with_path(as_exported, params)
  plans = {True: precision.plan_from_config(cfg).layer_ranges, False: None}  # te_nvfp4, BF16
  forward = jax.jit(
    lambda tokens, nvfp4: nnx.merge(graphdef, params, rest)(tokens, layer_precisions=plans[nvfp4]), static_argnums=1
  )
  served = reader.Checkpoint(out)

  class TrainingScales(reader.Checkpoint):
    """Activations quantized with each GEMM's own amax, as training does, instead of the static input_scale."""

    def linear(self, x, module):
      scale = np.float32(np.abs(x).max()) / np.float32(2688) if self.quantized(module) else None
      return (reader.quantize_activations(x, scale) if scale else x) @ self.weight(module).T

  dynamic = TrainingScales(out)
  rel = lambda a, b: float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b**2)))
  served_err, bf16_err = [], []
  for record in tiny.reference()[0]:
    tokens = record["prompt_ids"]
    ours = np.asarray(forward(jnp.asarray([tokens]), True)[0])
    # The export's codes and scales are the forward pass's: with training's activation scales, the same logits.
    assert rel(dynamic.logits(tokens), ours) < 1e-5
    served_err.append(rel(served.logits(tokens), ours))
    bf16_err.append(rel(np.asarray(forward(jnp.asarray([tokens]), False)[0]), ours))
  # A serving engine's static input_scale (calibrated on the run's data) rounds activations differently: measured
  # 0.09-0.12 relative RMS of the logits, less than our own NVFP4 forward's distance from BF16 (0.12-0.15).
  assert max(served_err) < 0.2 and np.mean(served_err) < np.mean(bf16_err), (served_err, bf16_err)


def test_pack_e2m1_puts_the_even_element_in_the_low_nibble():
  values = np.array([[0.0, -0.0, 0.5, -0.5, 1.0, -1.5, 2.0, -3.0, 4.0, -6.0, 6.0, 1.5]], np.float32)
  packed = modelopt.pack_e2m1(values)
  assert packed.dtype == np.uint8 and packed.shape == (1, 6)
  assert np.array_equal(reader.e2m1_value(reader.e2m1_codes(packed)).view(np.uint32), values.view(np.uint32))
  assert packed[0, 0] == 0x80 and packed[0, 1] == 0x91  # (0, -0): 0 | 8 << 4; (0.5, -0.5): 1 | 9 << 4
  with pytest.raises(ValueError, match="not an E2M1 value"):
    modelopt.pack_e2m1(np.array([[0.75, 1.0]], np.float32))
  assert modelopt.input_scale(2688.0) == np.float32(1.0)


@pytest.mark.parametrize(
  "args, message",
  [
    (["quantization=mxfp4"], r"the run's MLP GEMMs are MXFP4 \(quantization='mxfp4'\), not NVFP4"),
    (["quantization=te_fp8_currentscaling"], r"are FP8 \(quantization='te_fp8_currentscaling'\)"),
    (["quantization="], r"are BF16 \(quantization='bf16'\)"),
    (["quantization_bf16_first_layers=2", "quantization_bf16_last_layers=1"], "keep all 3 layers in BF16"),
    (["--dtype", "float32"], "--nvfp4 writes its unquantized tensors in bfloat16"),
  ],
)
def test_refusals_are_one_line_and_write_nothing(hf_tiny_import, checkpoints, tmp_path, capsys, args, message):
  overrides = [a for a in args if "=" in a]
  options = [a for a in args if "=" not in a]
  argv = ["to-hf", str(hf_tiny_import / "config.yml"), str(tmp_path / "out"), *_overrides(checkpoints, "fused")]
  assert convert_hf.main([*argv, *overrides, "--nvfp4", *options]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: ") and re.search(message, err), err
  assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_the_export_is_not_imported_back(exports, tmp_path, capsys):
  assert convert_hf.main(["to-maxtext", str(exports["fused"][1]), str(tmp_path / "back")]) == 2
  assert "a quantized checkpoint (quantization_config quant_method='modelopt')" in capsys.readouterr().err


def test_calibration_batches_without_nvfp4_is_refused(hf_tiny_import, tmp_path, capsys):
  argv = ["to-hf", str(hf_tiny_import / "config.yml"), str(tmp_path / "out"), "--calibration-batches", "4"]
  assert convert_hf.main(argv) == 2
  assert "--calibration-batches applies to --nvfp4 exports only" in capsys.readouterr().err


@pytest.mark.slow
def test_greedy_continuations_after_a_te_nvfp4_fine_tune_side_by_side(hf_tiny_import, tmp_path, capsys):
  records, _ = tiny.reference()
  longest = max(len(r["prompt_ids"]) for r in records)
  steps = 20
  direct = importer.import_checkpoint(HF_TINY, tmp_path / "direct", direct=True, fused_mlp=True, **QUIET)
  overrides = [
    "steps=3",
    "quantization=te_nvfp4",
    "enable_checkpointing=true",
    "dataset_type=synthetic",
    "max_target_length=32",
    "per_device_batch_size=2",
    "learning_rate=1e-4",
    "enable_tensorboard=false",
    f"base_output_directory={tmp_path}",
    "run_name=ft",
    f"jax_cache_dir={JAX_CACHE}",
  ]
  train.train(config.load(direct, overrides))
  assert convert_hf.main(["to-hf", str(tmp_path / "ft"), str(tmp_path / "nvfp4"), "--nvfp4"]) == 0
  cfg, step_dir = convert_hf.export_source(
    tmp_path / "ft", [f"max_prefill_predict_length={longest}", f"max_target_length={longest + steps}"]
  )
  graphdef, abstract, rest = abstract_model(cfg)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  params = restore_params(
    step_dir, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), abstract)
  )
  plan = precision.plan_from_config(cfg.replace(disable_stochastic_rounding=True)).layer_ranges
  ours = Generator(cfg, graphdef, rest, plan, 1, use_cache=False)
  served = reader.Checkpoint(tmp_path / "nvfp4")
  tokenizer = tokenizers.load("huggingface", str(HF_TINY / "tokenizer.json"))
  bf16 = Generator(cfg, graphdef, rest, None, 1, use_cache=False)
  text = lambda ids: repr(tokenizer.decode(ids))[:36]
  lines, same = [], []
  for record in records:
    prompt = record["prompt_ids"]
    a = ours(params, [prompt]).completions[0][:steps]
    b, c = served.greedy(prompt, steps), bf16(params, [prompt]).completions[0][:steps]
    # Teacher-forced on our continuation: where the served model's next token is ours (no divergence compounding).
    served_next = served.logits(prompt + a[:-1])[len(prompt) - 1 :].argmax(-1)
    same += list(served_next == np.asarray(a))
    lines.append(f"{record['prompt'][:22]:22} | {text(a):36} | {text(b):36} | {text(c)}")
  with capsys.disabled():
    print(f"\n{'prompt':22} | {'ours (te_nvfp4 forward)':36} | {'served (export, NumPy)':36} | ours in BF16")
    print("\n".join(lines))
    print(f"served next token = ours, teacher-forced on our continuations: {np.mean(same):.0%} of {len(same)}")
  assert np.mean(same) >= 0.75, same  # measured 90% (72 of 80)
