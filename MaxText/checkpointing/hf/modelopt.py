"""NVIDIA ModelOpt's NVFP4 Hugging Face checkpoint layout (what vLLM and TensorRT-LLM load): a quantized Linear's
packed E2M1 `weight`, E4M3 `weight_scale`, f32 `weight_scale_2` and `input_scale`, and the two config files.

Per quantized Linear `<module>` (weight [out, in] in torch's layout):
  <module>.weight          uint8 [out, in / 2]: two E2M1 codes per byte along `in`, the even element in the low
                           nibble; a code is sign << 3 | index into E2M1_VALUES
  <module>.weight_scale    float8_e4m3fn [out, in / 16]: each 1x16 block's decode scale (a 16x16 tile's scale
                           repeats on its 16 rows)
  <module>.weight_scale_2  float32 []: the global decode scale, so that weight = e2m1 * weight_scale * weight_scale_2
                           (ModelOpt's amax / (6 * 448), not inverted)
  <module>.input_scale     float32 []: activation amax / (6 * 448); an engine quantizes activations with the global
                           encode scale 1 / input_scale and multiplies the GEMM by input_scale * weight_scale_2
hf_quant_config.json holds {"producer", "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo", "group_size",
"exclude_modules"}} (the nested form every ModelOpt reader takes); config.json's `quantization_config` the flat form
(`quant_method: modelopt`, `ignore`, `config_groups`), which vLLM and transformers detect the method from.
"""

import numpy as np

GROUP_SIZE = 16
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
E2M1_MAX, E4M3_MAX = 6.0, 448.0
TENSORS = ("weight", "weight_scale", "weight_scale_2", "input_scale")  # a quantized Linear's, in this order


def pack_e2m1(values):
  """E2M1 values [rows, cols] (any float dtype, cols even) -> uint8 codes [rows, cols / 2], even column low.
  ValueError for a value off the E2M1 grid (a bug upstream, never rounded here)."""
  v = np.asarray(values, np.float32)
  magnitude = np.abs(v)
  index = np.minimum(np.searchsorted(E2M1_VALUES, magnitude), len(E2M1_VALUES) - 1)
  off_grid = E2M1_VALUES[index] != magnitude
  if off_grid.any():
    where = tuple(int(i) for i in np.argwhere(off_grid)[0])
    raise ValueError(f"pack_e2m1: element {where} = {v[where]!r} is not an E2M1 value")
  codes = (index | (np.signbit(v).astype(np.int64) << 3)).astype(np.uint8)  # -0.0 keeps its sign: code 8
  return codes[:, 0::2] | (codes[:, 1::2] << 4)


def input_scale(amax):
  """An activation amax as ModelOpt's input_scale: amax / (6 * 448) in f32 (one rounding)."""
  return np.float32(amax) / np.float32(E2M1_MAX * E4M3_MAX)


def hf_quant_config(exclude_modules, producer, extra=None):
  """hf_quant_config.json: the nested form, with `extra` top-level fields (ours: how the export was made)."""
  config = {
    "producer": producer,
    "quantization": {
      "quant_algo": "NVFP4",
      "kv_cache_quant_algo": None,
      "group_size": GROUP_SIZE,
      "exclude_modules": list(exclude_modules),
    },
  }
  return {**config, **(extra or {})}


def quantization_config(quant_config):
  """config.json's `quantization_config` for an hf_quant_config.json: ModelOpt's flat form."""
  inner = quant_config["quantization"]
  fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": inner["group_size"]}
  return {
    "quant_method": "modelopt",
    "quant_algo": inner["quant_algo"],
    "producer": quant_config["producer"],
    "group_size": inner["group_size"],
    "ignore": inner["exclude_modules"],
    "config_groups": {"group_0": {"input_activations": fp4, "weights": dict(fp4), "targets": ["Linear"]}},
  }
