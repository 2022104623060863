"""A trained NVFP4 run -> a Hugging Face Llama directory in ModelOpt's NVFP4 layout (modelopt.py): the MLP projections
its precision plan ran in NVFP4 as the codes and scales its forward pass computes, everything else as the BF16 export.

Bit-exact to training: each projection's weight is quantized by the quantizer the forward pass runs (the recipe's
options for the weight: 16x16 tiles unless disable_2d_quantization, Four Over Six where it covers weights, the same
global amax), and `weight_scale_2` is that quantization's global decode scale 1/S_enc (amax / (6 * 448), or
amax / (6 * 256) under 4/6, as ModelOpt writes its own 4/6 exports): e2m1 * weight_scale * weight_scale_2 is the
forward pass's dequantized weight, bit for bit. Serving engines run gate_proj and up_proj as one GEMM with one
global scale: a fused_mlp run quantized them as one kernel, so its export is exact; an unfused run's pair is exported
with the larger of the two amaxes, the other projection quantized again with it, and the codes that changed counted
and printed.
"""

import json
import subprocess

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from MaxText import precision
from MaxText.checkpointing.hf import HFError, exporter, modelopt, names
from MaxText.checkpointing.hf.output_dir import staged
from MaxText.quantization.backends import emulated
from MaxText.quantization.formats import Format, grids, nvfp4

QUANT_CONFIG = "hf_quant_config.json"


def nvfp4_layers(cfg):
  """{layer: Recipe} of the layers whose MLP GEMMs the run's plan put in NVFP4; a one-line HFError where the recipe
  isn't NVFP4 or no layer is."""
  plan = precision.plan_from_config(cfg)
  recipe = precision.configured_recipes(cfg)[0]
  if recipe.format is not Format.NVFP4:
    raise HFError(
      f"--nvfp4: the run's MLP GEMMs are {recipe.format.label} (quantization={recipe.name or 'bf16'!r}), not NVFP4; "
      "export it without --nvfp4"
    )
  layers = {
    layer: prec["gate"].recipe
    for start, stop, prec in plan.layer_ranges
    if prec["gate"].recipe.format is Format.NVFP4
    for layer in range(start, stop)
  }
  if not layers:
    raise HFError(
      f"--nvfp4: quantization_bf16_first_layers={cfg.quantization_bf16_first_layers} and "
      f"quantization_bf16_last_layers={cfg.quantization_bf16_last_layers} keep all {cfg.base_num_decoder_layers} "
      "layers in BF16: no NVFP4 MLP to export; export it without --nvfp4"
    )
  for key in ("base_emb_dim", "base_mlp_dim"):
    if getattr(cfg, key) % modelopt.GROUP_SIZE:
      raise HFError(f"--nvfp4: {key}={getattr(cfg, key)} is not a multiple of {modelopt.GROUP_SIZE} (NVFP4's blocks)")
  return layers


def exclude_modules(cfg, layers):
  """The Linear modules the export keeps in BF16, as ModelOpt names them (prefix wildcards, matched with fnmatch by
  vLLM and TensorRT-LLM): the lm head, every layer's attention, the MLPs of the layers the plan kept in BF16."""
  out = ["lm_head"] + [f"model.layers.{i}.self_attn*" for i in range(cfg.base_num_decoder_layers)]
  return out + [f"model.layers.{i}.mlp*" for i in range(cfg.base_num_decoder_layers) if i not in layers]


def _exported(q, input_amax):
  """The four tensors of a QuantizedTensor [out, in] (E2M1 values, E4M3 scales, amax) and its input amax."""
  return {
    "weight": modelopt.pack_e2m1(np.asarray(q.values)),
    "weight_scale": np.asarray(q.scales).astype(ml_dtypes.float8_e4m3fn),
    "weight_scale_2": np.asarray(nvfp4.decode_scale(q), np.float32),
    "input_scale": modelopt.input_scale(input_amax),
  }


def _changed(trained, exported):
  """(E2M1 codes, block scales) that differ between two exports of a projection."""
  diff = trained["weight"] ^ exported["weight"]
  codes = int(np.count_nonzero(diff & 0x0F) + np.count_nonzero(diff & 0xF0))
  scales = int(np.count_nonzero(trained["weight_scale"].view(np.uint8) != exported["weight_scale"].view(np.uint8)))
  return codes, scales


class ProjectionQuantizer:
  """The four NVFP4 tensors of each (layer, gemm) the plan quantized, computed when the first is asked for (the four
  are written one after another: one projection is held at a time), from the checkpoint's parameters read one
  stacked parameter at a time (the BF16 export's memory bound). `requantized` lists the unfused projections whose
  scale came from their partner, with what changed."""

  def __init__(self, cfg, params, layers, input_amax):
    self.cfg, self.params, self.layers, self.input_amax = cfg, params, layers, input_amax
    self.entries = {g: e for e in names.entries(cfg) for g, hf in names.MLP_PROJECTIONS.items() if f".{hf}." in e.hf}
    self.requantized = []
    self._held, self._current = {}, (None, None)
    self.pair_amax = {} if cfg.fused_mlp else self._pair_amax()

  def _stacked(self, param):
    if self._held.get("param") != param:
      self._held = {}  # dropped before the next is read
      self._held = {"param": param, "array": self.params.read(param)}
    return self._held["array"]

  def _kernel(self, gemm, layer):
    """The GEMM's weight [out, in] (HF's layout) as the checkpoint stores it; a fused one's gate and up together."""
    entry = self.entries[gemm]
    w = self._stacked(entry.param)[layer]
    if entry.part is not None:  # [emb, 2, mlp] -> [2 * mlp, emb], as the forward pass multiplies it
      return w.reshape(w.shape[0], -1).T
    return names.to_hf_layout(entry, w)

  def _pair_amax(self):
    """{layer: max(amax of gate, amax of up)}: the one global amax of the pair (unfused runs)."""
    amax = {}
    for gemm in ("gate", "up"):
      for layer in self.layers:
        own = float(grids.abs_max(jnp.asarray(self._kernel(gemm, layer), jnp.float32)))
        amax[layer] = max(amax.get(layer, own), own)
    return amax

  def _input_amax(self, layer, gemm):
    kinds = ("gate", "up") if gemm in ("gate", "up") else ("down",)  # gate and up read the same activations
    found = [self.input_amax[(layer, g)] for g in kinds if (layer, g) in self.input_amax]
    if not found:
      raise HFError(f"--nvfp4: no activation amax for layer {layer}'s {gemm} GEMM (the calibration didn't reach it)")
    amax = max(found)
    if not np.isfinite(amax) or amax <= 0:
      raise HFError(
        f"--nvfp4: layer {layer}'s {gemm} GEMM saw activation amax {amax} in calibration; its input_scale would be "
        "unusable (a diverged model, or inputs that are all zero)"
      )
    return amax

  def get(self, layer, gemm):
    """{tensor name: array} of the projection."""
    if self._current[0] != (layer, gemm):
      self._current = ((layer, gemm), None)  # the previous one dropped first
      self._current = ((layer, gemm), self._compute(layer, gemm))
    return self._current[1]

  def _compute(self, layer, gemm):
    options = emulated.nvfp4_options(self.layers[layer], "w", None)
    w = self._kernel(gemm, layer)
    q = nvfp4.quantize(w, **options)
    out = _exported(q, self._input_amax(layer, gemm))
    if self.cfg.fused_mlp and gemm != "down":  # the forward pass's one quantization of both: this one's rows
      rows = slice(0, self.cfg.base_mlp_dim) if gemm == "gate" else slice(self.cfg.base_mlp_dim, None)
      return {**out, "weight": out["weight"][rows], "weight_scale": out["weight_scale"][rows]}
    shared = self.pair_amax.get(layer) if gemm != "down" else None
    if shared is not None and shared > float(q.global_scale):  # the pair's scale is the partner's: quantize again
      trained, out = (
        out,
        _exported(nvfp4.quantize(w, **options, global_amax=jnp.float32(shared)), self._input_amax(layer, gemm)),
      )
      codes, scales = _changed(trained, out)
      self.requantized.append(
        {
          "module": names.mlp_module(layer, gemm),
          "own_amax": float(q.global_scale),
          "shared_amax": shared,
          "codes_changed": codes,
          "codes": trained["weight"].size * 2,
          "scales_changed": scales,
          "scales": trained["weight_scale"].size,
        }
      )
    return out


def tensors(cfg, params, layers, quantizer):
  """The export's ExportTensors: the BF16 export's, with each NVFP4 projection's four tensors in its weight's place."""
  gemm_of = {v: k for k, v in names.MLP_PROJECTIONS.items()}
  quantized = lambda entry, layer: layer in layers and entry.hf.split(".")[-2] in gemm_of
  plain = {t.name: t for t in exporter.weight_tensors(cfg, params, ml_dtypes.bfloat16, skip=quantized)}
  out = []
  for name, (entry, layer) in names.hf_names(cfg).items():
    if not quantized(entry, layer):
      out.append(plain[name])
      continue
    module, gemm = name.rsplit(".", 1)[0], gemm_of[entry.hf.split(".")[-2]]
    for tensor in modelopt.TENSORS:
      array_of = lambda layer=layer, gemm=gemm, tensor=tensor: quantizer.get(layer, gemm)[tensor]
      shape, dtype = _shape_dtype(cfg, entry, tensor)
      out.append(exporter.ExportTensor(f"{module}.{tensor}", dtype, shape, exporter.whole(array_of)))
  return out


def _shape_dtype(cfg, entry, tensor):
  rows, cols = names.hf_shape(cfg, entry)
  return {
    "weight": ((rows, cols // 2), np.uint8),
    "weight_scale": ((rows, cols // modelopt.GROUP_SIZE), ml_dtypes.float8_e4m3fn),
  }.get(tensor, ((), np.float32))


def producer():
  """hf_quant_config.json's producer: this repository, at its commit where git knows it."""
  try:
    commit = subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"],
      capture_output=True,
      text=True,
      check=True,
      cwd=__file__.rsplit("/", 1)[0],
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    commit = "unknown"
  return {"name": "maxtext_nvfp4", "version": commit}


def export(
  cfg, step_dir, out_dir, input_amax, calibration, *, max_shard_bytes=exporter.DEFAULT_MAX_SHARD_BYTES, log=print
):
  """Checkpoint `step_dir` of `cfg`'s NVFP4 run -> `out_dir` in ModelOpt's NVFP4 layout (whole or not at all).

  `input_amax`: {(layer, gemm): activation amax} of the NVFP4 GEMMs; `calibration`: where it came from (recorded in
  hf_quant_config.json)."""
  layers = nvfp4_layers(cfg)
  params = exporter.CheckpointParams(step_dir)
  params.check(cfg)
  quantizer = ProjectionQuantizer(cfg, params, layers, input_amax)
  recipe = next(iter(layers.values()))
  with staged(out_dir, log) as tmp:
    export_tensors = tensors(cfg, params, layers, quantizer)
    files = exporter.write_tensors(tmp, export_tensors, max_shard_bytes)
    notes = {"recipe": recipe.name, "weights": _weights_note(cfg, recipe), "input_scale": calibration}
    quant_config = modelopt.hf_quant_config(
      exclude_modules(cfg, layers), producer(), {"maxtext": {**notes, "requantized": quantizer.requantized}}
    )
    (tmp / QUANT_CONFIG).write_text(json.dumps(quant_config, indent=2) + "\n")
    extra = {"quantization_config": modelopt.quantization_config(quant_config)}
    exporter.write_model_files(tmp, cfg, "bfloat16", extra_config=extra, log=log)
  if not cfg.fused_mlp:
    r = quantizer.requantized
    codes, total = sum(x["codes_changed"] for x in r), sum(x["codes"] for x in r)
    scales, blocks = sum(x["scales_changed"] for x in r), sum(x["scales"] for x in r)
    log(
      f"unfused run: gate_proj and up_proj share the larger global scale (serving engines need one); {len(r)} "
      f"projection(s) quantized again: {codes} of {total} codes ({codes / max(total, 1):.1%}) and {scales} of "
      f"{blocks} block scales differ from the training forward pass (fused_mlp=true trains them exactly)"
    )
  size = sum(t.nbytes for t in export_tensors)
  log(
    f"exported {step_dir} -> {out_dir}: {recipe.name} MLPs of {len(layers)} of {cfg.base_num_decoder_layers} layers "
    f"in ModelOpt NVFP4, {size / 1e6:,.1f} MB in {len(files)} file(s); input_scale {calibration['source']}"
  )
  return out_dir


def _weights_note(cfg, recipe):
  tile = "16x16 tiles" if recipe.tile_2d("w") else "1x16 blocks"
  four_six = f", Four Over Six ({recipe.four_over_six('w')})" if recipe.four_over_six("w") else ""
  pair = (
    "gate and up quantized as one kernel (fused_mlp)"
    if cfg.fused_mlp
    else "gate and up share the larger global amax (unfused run: see requantized)"
  )
  return f"the training forward pass's codes and scales ({tile}{four_six}); {pair}"
