"""A Hugging Face Llama directory loaded straight into sharded parameters: each process reads, for each tensor, only
the slices its devices hold (no conversion step before a large run)."""

import jax
import numpy as np

from MaxText.config.models import MODEL_KEYS
from MaxText.runtime import sharding
from MaxText.checkpointing.hf import HFError, names
from MaxText.checkpointing.hf.checkpoint import HFCheckpoint


def check_agrees(cfg, hf):
  """HFError naming the first model key (config.models.MODEL_KEYS: what a checkpoint's config.json fixes) where the
  run's config and the checkpoint's config.json differ."""
  for key in MODEL_KEYS:
    if key in hf.keys and hf.keys[key] != getattr(cfg, key):
      raise HFError(
        f"{hf.dir}/config.json gives {key}={hf.keys[key]!r} but the config has {getattr(cfg, key)!r}; "
        f"set {key}={hf.keys[key]} (python -m MaxText.convert_hf to-maxtext {hf.dir} OUT --direct "
        "writes a config that agrees)"
      )


def read_region(hf, entries, index, dtype):
  """Our parameter's `index` (a tuple of bounded step-1 slices, the layer axis first for stacked ones) from the HF
  tensors of its `entries` (one, or a fused parameter's parts, stacked on its second-to-last axis)."""
  if entries[0].part is None:
    return _read_tensors(hf, entries[0], index, dtype)
  parts = range(index[-2].start, index[-2].stop)
  return np.stack([_read_tensors(hf, entries[p], index, dtype) for p in parts], axis=-2)


def _read_tensors(hf, entry, index, dtype):
  """The entry's HF tensor (each layer's, stacked) at our `index` (its part axis, if any, dropped)."""
  if not entry.per_layer:
    return names.to_param_layout(entry, hf.read(entry.hf_name(), names.hf_index(entry, index))).astype(dtype)
  layers = range(index[0].start, index[0].stop)
  rest = names.hf_index(entry, index[1:])
  return np.stack([names.to_param_layout(entry, hf.read(entry.hf_name(layer), rest)).astype(dtype) for layer in layers])


def _full(index, shape):
  return tuple(slice(*s.indices(d)) for s, d in zip(index, shape))


def load(cfg, hf_dir, params_template):
  """Parameters shaped, typed and sharded like `params_template` (an nnx Param state of jax arrays or
  ShapeDtypeStructs with shardings), read from `hf_dir`'s safetensors."""
  entries = {}  # our parameter -> its HF tensors' entries (a fused one's in part order)
  for e in names.entries(cfg):
    entries.setdefault(e.param, []).append(e)
  with HFCheckpoint(hf_dir) as hf:
    check_agrees(cfg, hf)
    hf.check(cfg)

    def leaf(path, template):
      param_entries = entries[sharding.param_path(path)]
      dtype, shape = np.dtype(template.dtype), template.shape
      regions = {}  # devices holding the same slice (replicas) share one read

      def callback(index):
        index = _full(index, shape)
        key = tuple((s.start, s.stop) for s in index)  # slices aren't hashable before Python 3.12
        if key not in regions:
          regions[key] = read_region(hf, param_entries, index, dtype)
        return regions[key]

      return jax.make_array_from_callback(shape, template.sharding, callback)

    return jax.tree_util.tree_map_with_path(leaf, params_template)
