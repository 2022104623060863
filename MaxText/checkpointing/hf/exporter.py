"""Our parameters -> a Hugging Face Llama directory: config.json, sharded safetensors with their index,
generation_config.json and the tokenizer.

The export is a list of named tensors, each with the function that computes it in blocks of rows
(`ExportTensor`), laid out into files of at most max_shard_bytes before any is computed, then computed and written
one parameter kind at a time: host memory holds one stacked parameter (restored from the checkpoint as a NumPy
array) and one block of at most BLOCK_BYTES. A variant that writes other tensors for some parameters (the
NVFP4 serving export) passes its own list to `write_tensors` and its own config fields to `write_model_files`.
"""

import dataclasses
import json
import math
import pathlib
import shutil
import typing

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp

from MaxText.checkpointing import checkpointer
from MaxText.checkpointing.hf import HFError, model_config, names, prompt_start
from MaxText.checkpointing.hf.checkpoint import INDEX, write_index
from MaxText.checkpointing.hf.output_dir import staged
from MaxText.checkpointing.hf.safetensors_file import SafetensorsWriter

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # transformers' long-standing default shard size
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
BLOCK_BYTES = 64 << 20  # a tensor is computed and written this many bytes of rows at a time


@dataclasses.dataclass(frozen=True)
class ExportTensor:
  """One tensor of the export: name, dtype, shape, and `blocks()` -> (first row, rows) pairs that together are the
  tensor (called once, in list order; `whole(fn)` makes one block of fn())."""

  name: str
  dtype: typing.Any
  shape: tuple
  blocks: typing.Callable[[], typing.Iterable]

  @property
  def nbytes(self):
    return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def whole(compute):
  """`blocks` of a tensor computed at once."""
  return lambda: iter([(0, compute())])


class CheckpointParams:
  """The parameters of a checkpoint step directory, restored one stacked array at a time onto the host CPU, in the
  dtype they were stored in (an import's bf16 stays bf16, a training run's f32 master weights stay f32)."""

  def __init__(self, step_dir):
    self.step_dir = pathlib.Path(step_dir)
    tree = checkpointer.state_metadata(self.step_dir)  # CheckpointError: not a checkpoint, or a damaged one
    self.stored = {}  # our parameter path -> (shape, dtype)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
      if keys and keys[0] == "params" and keys[-1] == "value" and hasattr(leaf, "shape"):
        self.stored["/".join(keys[1:-1])] = (tuple(leaf.shape), np.dtype(leaf.dtype))

  def check(self, cfg):
    """HFError unless the checkpoint holds exactly `cfg`'s parameters, in its shapes."""
    wanted = {e.param: names.param_shape(cfg, e) for e in names.entries(cfg)}
    for path in sorted(set(wanted) | set(self.stored)):
      if path not in self.stored or path not in wanted or self.stored[path][0] != wanted[path]:
        found = self.stored.get(path, (None,))[0]
        raise HFError(
          f"{self.step_dir}: parameter {path} is {list(found) if found else 'absent'} in the checkpoint "
          f"but {list(wanted[path]) if path in wanted else 'absent'} in the config "
          "(logits_via_embedding or the model shape differ); export with the config it was trained with"
        )

  def read(self, path):
    shape, dtype = self.stored[path]
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    target = {"params": {}}
    node = target["params"]
    parts = path.split("/")
    for part in parts[:-1]:
      node = node.setdefault(part, {})
    node[parts[-1]] = {"value": jax.ShapeDtypeStruct(shape, dtype, sharding=cpu)}
    # Restored straight into NumPy: no second, device-side copy.
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray, dtype=dtype), target)
    args = ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)
    try:
      with checkpointer.quiet_item_access(), ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as orbax_checkpointer:
        restored = orbax_checkpointer.restore(self.step_dir / "state", args=args)
    except Exception as e:  # damaged or truncated files
      raise checkpointer.UnreadableCheckpoint.of(self.step_dir, e) from None
    node = restored["params"]
    for part in parts:
      node = node[part]
    return np.asarray(node["value"])


def weight_tensors(cfg, params, dtype, skip=lambda entry, layer: False):
  """The plain export's ExportTensors in `dtype`, one parameter kind after another (each read once, when its
  first tensor is computed); `skip(entry, layer)` leaves tensors out for a variant to replace."""
  held = {}

  def blocks(entry, layer):
    if held.get("path") != entry.param:
      held.clear()
      held.update(path=entry.param, array=params.read(entry.param))
    hf_view = names.to_hf_layout(entry, held["array"][layer] if entry.per_layer else held["array"])
    rows = max(1, BLOCK_BYTES // (math.prod(hf_view.shape[1:]) * np.dtype(dtype).itemsize))
    for start in range(0, hf_view.shape[0], rows):
      yield start, hf_view[start : start + rows].astype(dtype)

  out = []
  for entry in names.entries(cfg):
    for layer in range(cfg.base_num_decoder_layers) if entry.per_layer else (None,):
      if not skip(entry, layer):
        out.append(
          ExportTensor(
            entry.hf_name(layer),
            dtype,
            names.hf_shape(cfg, entry),
            lambda entry=entry, layer=layer: blocks(entry, layer),
          )
        )
  return out


def shard_files(tensors, max_shard_bytes):
  """[[ExportTensor]] per file, in order, each file at most max_shard_bytes (a bigger tensor gets a file alone)."""
  files, size = [[]], 0
  for t in tensors:
    if files[-1] and size + t.nbytes > max_shard_bytes:
      files.append([])
      size = 0
    files[-1].append(t)
    size += t.nbytes
  return files


def write_tensors(out_dir, tensors, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES):
  """The safetensors files (model.safetensors, or model-0000i-of-0000n.safetensors with the index) of `tensors`."""
  files = shard_files(tensors, max_shard_bytes)
  names_ = (
    ["model.safetensors"]
    if len(files) == 1
    else [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
  )
  writers, where = [], {}
  try:
    for filename, group in zip(names_, files):
      writers.append(
        SafetensorsWriter(
          pathlib.Path(out_dir) / filename, {t.name: (t.dtype, t.shape) for t in group}, metadata={"format": "pt"}
        )
      )
      where.update({t.name: (filename, writers[-1]) for t in group})
    for t in tensors:
      for row, block in t.blocks():
        where[t.name][1].write(t.name, np.asarray(block, t.dtype), row)
  except BaseException:
    for w in writers:  # the failure is the news: closing must not replace it with "not written in full"
      w.abort()
    raise
  for w in writers:
    w.close()
  if len(files) > 1:
    write_index(out_dir, {name: filename for name, (filename, _) in where.items()}, sum(t.nbytes for t in tensors))
  return names_


def companion_dir(cfg):
  """The directory of a Hugging Face tokenizer.json the config names: where the files that came with the weights
  (config.json, generation_config.json, the tokenizer's) are taken from."""
  if cfg.tokenizer_type == "huggingface" and cfg.tokenizer_path and pathlib.Path(cfg.tokenizer_path).is_file():
    return pathlib.Path(cfg.tokenizer_path).parent
  return None


def write_model_files(out_dir, cfg, dtype_name, *, extra_config=None, log=print):
  """config.json, generation_config.json and the tokenizer files beside the tensors."""
  out_dir, source = pathlib.Path(out_dir), companion_dir(cfg)
  base = None
  if source is not None and (source / "config.json").is_file():
    base = model_config.read_json(source / "config.json", "config.json")
    base = base if base.get("model_type", "llama") == "llama" else None
  bos = eos = None
  if source is not None:
    from MaxText.data import tokenizers  # pylint: disable=import-outside-toplevel  (tokenizers is optional)

    tok = tokenizers.load("huggingface", cfg.tokenizer_path, add_bos=cfg.add_bos)
    bos, eos = tok.bos_id, tok.eos_id
    shutil.copyfile(cfg.tokenizer_path, out_dir / "tokenizer.json")
    for name in TOKENIZER_FILES:
      if (source / name).is_file():
        shutil.copyfile(source / name, out_dir / name)
    prompt_start.match_in_export(out_dir, tok.start_ids, log)
  else:
    log(
      f"note: tokenizer_type={cfg.tokenizer_type} is no Hugging Face tokenizer.json: the export has no tokenizer; "
      "add the model's own tokenizer files to it"
    )
  config = model_config.to_config_json(cfg, base, dtype=dtype_name, bos_id=bos, eos_id=eos)
  config.update(extra_config or {})
  (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
  if source is not None and (source / "generation_config.json").is_file():
    shutil.copyfile(source / "generation_config.json", out_dir / "generation_config.json")
  else:
    generation = {
      k: v
      for k, v in (("bos_token_id", config.get("bos_token_id")), ("eos_token_id", config.get("eos_token_id")))
      if v is not None
    }
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def export(cfg, step_dir, out_dir, *, dtype="bfloat16", max_shard_bytes=DEFAULT_MAX_SHARD_BYTES, log=print):
  """Checkpoint `step_dir` of `cfg`'s model -> a Hugging Face directory `out_dir` (written whole or not at all)."""
  if dtype not in DTYPES:
    raise HFError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
  params = CheckpointParams(step_dir)
  params.check(cfg)
  with staged(out_dir, log) as tmp:
    tensors = weight_tensors(cfg, params, DTYPES[dtype])
    files = write_tensors(tmp, tensors, max_shard_bytes)
    write_model_files(tmp, cfg, dtype, log=log)
  size = sum(t.nbytes for t in tensors)
  log(
    f"exported {step_dir} -> {out_dir}: {len(tensors)} tensors, {size / 1e6:,.1f} MB {dtype} in {len(files)} "
    f"file(s){' with ' + INDEX if len(files) > 1 else ''}"
  )
  return out_dir
