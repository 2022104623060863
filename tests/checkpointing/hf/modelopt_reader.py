"""An independent reader of ModelOpt NVFP4 Llama checkpoints, written for the tests from the format's definition (no
MaxText code): E2M1 codes (sign bit 3, magnitude index into 0, .5, 1, 1.5, 2, 3, 4, 6), two per byte with the even
element in the low nibble; E4M3 block scales decoded from their bits; weight = e2m1 * weight_scale * weight_scale_2.
And a Llama forward pass from a checkpoint directory alone (config.json + safetensors), as a serving engine runs it:
quantized projections dequantized, their activations quantized with the static `input_scale` per 16-element block
(vLLM's NVFP4 emulation: block scale E4M3(global * amax16 / 6), values rounded to E2M1), f32 arithmetic."""

import fnmatch
import json
import math
import pathlib
import struct

import ml_dtypes
import numpy as np

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)


def read_safetensors(directory):
  """{name: array} of every *.safetensors file in `directory`, parsed from the format's definition."""
  dtypes = {
    "BF16": ml_dtypes.bfloat16,
    "F32": np.float32,
    "U8": np.uint8,
    "F8_E4M3": np.uint8,  # its bits: decoded by e4m3_value
  }
  out = {}
  for path in sorted(pathlib.Path(directory).glob("*.safetensors")):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    for name, entry in header.items():
      if name == "__metadata__":
        continue
      begin, end = (8 + n + o for o in entry["data_offsets"])
      out[name] = (np.frombuffer(raw[begin:end], dtypes[entry["dtype"]]).reshape(entry["shape"]), entry["dtype"])
  return out


def e4m3_value(bits):
  """float8_e4m3fn bits -> f32: sign bit 7, exponent bits 6..3 (bias 7), mantissa 2..0; exponent 0 is subnormal
  (m / 8 * 2**-6); S.1111.111 is NaN (no infinities)."""
  bits = bits.astype(np.int64)
  sign = np.where(bits & 0x80, -1.0, 1.0)
  exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
  value = np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
  value = np.where((exponent == 15) & (mantissa == 7), np.nan, value)
  return (sign * value).astype(np.float32)


def e2m1_codes(packed):
  """uint8 [rows, cols / 2] -> codes [rows, cols]: the low nibble is the even element."""
  return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)


def e2m1_value(codes):
  magnitude = E2M1[codes & 0x7]
  return np.where(codes & 0x8, -magnitude, magnitude).astype(np.float32)  # code 8 is -0.0


def dequantize(tensors, module):
  """f32 [out, in]: (e2m1 * block scale) * weight_scale_2, in that order (the block-scaled value is exact)."""
  codes = e2m1_codes(tensors[f"{module}.weight"][0])
  scales = np.repeat(e4m3_value(tensors[f"{module}.weight_scale"][0]), 16, axis=1)
  return (e2m1_value(codes) * scales) * np.float32(tensors[f"{module}.weight_scale_2"][0])


def quantize_activations(x, input_scale):
  """x [tokens, K] f32 quantized and dequantized as a serving engine's NVFP4 GEMM does with a static input_scale
  (vLLM's ref_nvfp4_quant: global = 1/input_scale, per 16 elements scale = E4M3(global * amax / 6) clamped to 448,
  values x / (scale / global) clamped to +-6 and rounded to E2M1, ties to even)."""
  global_scale = np.float32(1.0) / np.float32(input_scale)
  blocks = x.reshape(x.shape[0], -1, 16)
  amax = np.abs(blocks).max(-1, keepdims=True)
  scale = np.clip(global_scale * (amax * np.float32(1 / 6)), -448, 448).astype(ml_dtypes.float8_e4m3fn)
  scale = scale.astype(np.float32)
  with np.errstate(divide="ignore"):
    output_scale = np.where(scale == 0, 0, np.float32(1) / (scale * (np.float32(1) / global_scale)))
  q = np.clip(blocks * output_scale, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
  return (q * scale / global_scale).reshape(x.shape).astype(np.float32)


class Checkpoint:
  """A Llama checkpoint directory: config.json, hf_quant_config.json (if any) and its tensors."""

  def __init__(self, directory):
    self.dir = pathlib.Path(directory)
    self.config = json.loads((self.dir / "config.json").read_text())
    quant = self.dir / "hf_quant_config.json"
    self.quant = json.loads(quant.read_text()) if quant.is_file() else None
    self.tensors = read_safetensors(self.dir)

  def excluded(self, module):
    patterns = self.quant["quantization"]["exclude_modules"] if self.quant else []
    return any(fnmatch.fnmatchcase(module, p) for p in patterns)

  def quantized(self, module):
    return f"{module}.weight_scale" in self.tensors

  def weight(self, module):
    """f32 [out, in], dequantized where quantized."""
    if self.quantized(module):
      return dequantize(self.tensors, module)
    return self.tensors[f"{module}.weight"][0].astype(np.float32)

  def linear(self, x, module):
    """x [tokens, in] . weight^T, activations quantized with input_scale where the module is."""
    if self.quantized(module):
      x = quantize_activations(x, self.tensors[f"{module}.input_scale"][0])
    return x @ self.weight(module).T

  def inverse_frequencies(self):
    c = self.config
    dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    rope = c.get("rope_scaling") or c.get("rope_parameters") or {}
    base = c.get("rope_theta", rope.get("rope_theta", 10000.0))
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if rope.get("rope_type") == "llama3":  # transformers' _compute_llama3_parameters
      factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
      old = rope["original_max_position_embeddings"]
      wavelen = 2 * math.pi / inv
      scaled = np.where(wavelen > old / low, inv / factor, inv)
      smooth = (old / wavelen - low) / (high - low)
      medium = (wavelen >= old / high) & (wavelen <= old / low)
      inv = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return inv

  def logits(self, tokens):
    """f32 logits [T, vocab] of one sequence of token ids."""
    c, t = self.config, len(tokens)
    h, kv = c["num_attention_heads"], c["num_key_value_heads"]
    dh = c.get("head_dim") or c["hidden_size"] // h
    eps = np.float32(c["rms_norm_eps"])
    norm = lambda x, name: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * self.tensors[name][0].astype(np.float32)
    angles = np.arange(t)[:, None] * self.inverse_frequencies()[None]
    cos, sin = (np.concatenate([f(angles)] * 2, -1).astype(np.float32)[:, None] for f in (np.cos, np.sin))
    rotate = lambda x: np.concatenate([-x[..., dh // 2 :], x[..., : dh // 2]], -1)
    rope = lambda x: x * cos + rotate(x) * sin
    x = self.tensors["model.embed_tokens.weight"][0].astype(np.float32)[np.asarray(tokens)]
    for i in range(c["num_hidden_layers"]):
      p = f"model.layers.{i}"
      y = norm(x, f"{p}.input_layernorm.weight")
      q = rope(self.linear(y, f"{p}.self_attn.q_proj").reshape(t, h, dh))
      k = rope(self.linear(y, f"{p}.self_attn.k_proj").reshape(t, kv, dh))
      v = self.linear(y, f"{p}.self_attn.v_proj").reshape(t, kv, dh)
      k, v = np.repeat(k, h // kv, axis=1), np.repeat(v, h // kv, axis=1)
      s = np.einsum("qhd,khd->hqk", q, k) / np.float32(math.sqrt(dh))
      s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
      w = np.exp(s - s.max(-1, keepdims=True))
      ctx = np.einsum("hqk,khd->qhd", w / w.sum(-1, keepdims=True), v).reshape(t, h * dh)
      x = x + self.linear(ctx, f"{p}.self_attn.o_proj")
      y = norm(x, f"{p}.post_attention_layernorm.weight")
      gate, up = self.linear(y, f"{p}.mlp.gate_proj"), self.linear(y, f"{p}.mlp.up_proj")
      x = x + self.linear(gate / (1 + np.exp(-gate)) * up, f"{p}.mlp.down_proj")
    head = "lm_head" if "lm_head.weight" in self.tensors else "model.embed_tokens"
    return self.linear(norm(x, "model.norm.weight"), head)

  def greedy(self, prompt, steps):
    """`steps` greedy tokens after `prompt`, the whole sequence recomputed for each."""
    tokens = list(prompt)
    for _ in range(steps):
      tokens.append(int(np.argmax(self.logits(tokens)[-1])))
    return tokens[len(prompt) :]
