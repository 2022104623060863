"""A Hugging Face Llama model directory opened for reading: its config.json, which safetensors file holds each tensor
(model.safetensors.index.json, or the files themselves), every tensor checked against config.json before any is
read, and reads of whole tensors or slices of them."""

import json
import pathlib

import numpy as np

from MaxText.checkpointing.hf import HFError, model_config, names
from MaxText.checkpointing.hf.safetensors_file import SafetensorsFile

INDEX = "model.safetensors.index.json"
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
# Buffers some older exports saved beside the weights; they are recomputed from config.json, never read.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def is_hf_dir(path):
  """Whether `path` looks like a Hugging Face model directory (config.json beside safetensors)."""
  path = pathlib.Path(path)
  return (path / "config.json").is_file() and (any(path.glob("*.safetensors")) or (path / INDEX).is_file())


class HFCheckpoint:
  """`config` (config.json), `keys` (our config keys for it), `dtypes` ({tensor: numpy dtype}), `read`."""

  def __init__(self, hf_dir):
    self.dir = pathlib.Path(hf_dir)
    if not self.dir.is_dir():
      raise HFError(
        f"{self.dir}: no such directory; give a Hugging Face model directory (config.json, "
        "*.safetensors, tokenizer.json)"
      )
    self.config = model_config.read_json(self.dir / "config.json", "config.json")
    self.keys = model_config.to_keys(self.config, str(self.dir / "config.json"))
    self._files, self._where = {}, {}
    try:
      self._open_files()
    except BaseException:
      self.close()
      raise

  def _open(self, filename):
    if filename not in self._files:
      path = self.dir / filename
      if not path.is_file():
        raise HFError(f"{self.dir / INDEX} names {filename}, which is not in {self.dir}; the download is incomplete")
      self._files[filename] = SafetensorsFile(path)
    return self._files[filename]

  def _open_files(self):
    if (self.dir / INDEX).is_file():
      weight_map = model_config.read_json(self.dir / INDEX, INDEX).get("weight_map")
      if not isinstance(weight_map, dict):
        raise HFError(f"{self.dir / INDEX}: no weight_map; the index is damaged")
      for name, filename in weight_map.items():
        if not isinstance(filename, str) or not filename or pathlib.PurePath(filename).name != filename:
          raise HFError(
            f"{self.dir / INDEX}: weight_map puts tensor {name} in {json.dumps(filename)}, which is not a file name "
            "beside the index; the index is damaged: fetch it again"
          )
        if name not in self._open(filename).names:
          raise HFError(f"{self.dir / INDEX} puts tensor {name} in {filename}, whose header doesn't hold it")
        self._where[name] = filename
      return
    files = sorted(p.name for p in self.dir.glob("*.safetensors"))
    if not files:
      raise HFError(
        f"{self.dir}: no *.safetensors files (PyTorch .bin checkpoints aren't read; save the model "
        "with safe_serialization, the default of transformers' save_pretrained)"
      )
    for filename in files:
      for name in self._open(filename).names:
        if name in self._where:
          raise HFError(f"{self.dir}: tensor {name} is in both {self._where[name]} and {filename}")
        self._where[name] = filename

  def check(self, cfg):
    """HFError naming the first tensor that is missing, extra, of a shape config.json doesn't imply, or not a float."""
    quantized = self.config.get("quantization_config")
    if quantized:
      method = quantized.get("quant_method") if isinstance(quantized, dict) else quantized
      raise HFError(
        f"{self.dir}/config.json: a quantized checkpoint (quantization_config quant_method={method!r}); its "
        "packed weights aren't read: import a bfloat16 or float32 checkpoint (to-hf without --nvfp4 writes one)"
      )
    expected = names.hf_names(cfg)
    present = {n for n in self._where if not n.endswith(IGNORED_SUFFIXES)}
    if cfg.logits_via_embedding:
      present.discard(names.TIED_LM_HEAD)
    for name in expected:
      if name not in present:
        raise HFError(
          f"{self.dir}: tensor {name} is missing (config.json describes {cfg.base_num_decoder_layers} "
          f"layers{', untied lm_head' if not cfg.logits_via_embedding else ''}); the checkpoint is "
          "incomplete or config.json is not its own"
        )
    extra = sorted(present - set(expected))
    if extra:
      raise HFError(
        f"{self.dir}: unexpected tensor {extra[0]} ({len(extra)} in all) that a Llama with this config.json "
        "doesn't have; not a plain LlamaForCausalLM checkpoint (adapters, biases or more layers?)"
      )
    for name, (entry, _) in expected.items():
      info = self.info(name)
      want = names.hf_shape(cfg, entry)
      if tuple(info.shape) != tuple(want):
        raise HFError(
          f"{self._path(name)}: tensor {name} has shape {list(info.shape)} but config.json implies {list(want)}"
        )
      if info.dtype.name not in FLOAT_DTYPES:
        raise HFError(
          f"{self._path(name)}: tensor {name} is {info.dtype.name}; only {', '.join(FLOAT_DTYPES)} "
          "weights are read (quantized checkpoints aren't)"
        )

  def _path(self, name):
    return self.dir / self._where[name]

  def info(self, name):
    return self._files[self._where[name]].info(name)

  def read(self, name, index=None) -> np.ndarray:
    return self._files[self._where[name]].read(name, index)

  @property
  def total_bytes(self):
    return sum(self.info(n).nbytes for n in self._where)

  def close(self):
    for f in self._files.values():
      f.close()
    self._files = {}

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def write_index(out_dir, weight_map, total_size):
  (pathlib.Path(out_dir) / INDEX).write_text(
    json.dumps({"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}, indent=2)
  )
