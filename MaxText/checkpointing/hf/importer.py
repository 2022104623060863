"""Hugging Face Llama directory -> a parameter checkpoint and a config.yml the trainer runs as is, streamed.

Each HF tensor is read in blocks of rows (safetensors positioned reads), put in our layout (transposed, into its
layer's slot of the stacked array) and written to the checkpoint's zarr arrays block by block: host memory holds
a few blocks, never a tensor, let alone the model. The checkpoint keeps the published dtype (bf16 stays bf16, bit
for bit); training restores it into weight_dtype. Everything goes to a hidden temporary directory beside OUT_DIR,
renamed to OUT_DIR only when complete.
"""

import pathlib
import shutil

import numpy as np
import yaml

from MaxText import config as config_lib
from MaxText.checkpointing.hf import HFError, model_config, names, prompt_start
from MaxText.checkpointing.hf.checkpoint import HFCheckpoint
from MaxText.checkpointing.hf.orbax_writer import ParamCheckpointWriter
from MaxText.checkpointing.hf.output_dir import check_output_dir, staged

CHECKPOINT = "checkpoints/0"  # OUT_DIR/checkpoints/0/state: a run directory's layout, step 0, parameters only
COMPANIONS = "hf"  # OUT_DIR/hf: the tokenizer and config files that came with the weights


def config_from_keys(keys, where):
  """A validated Config of our defaults with `keys`; HFError carrying the validation's message."""
  defaults = {n: k.default for n, k in config_lib.SCHEMA.items()}
  try:
    return config_lib.Config(**{**defaults, **keys})
  except config_lib.ConfigError as e:
    raise HFError(f"{where}: the model it describes doesn't fit our config: {e}") from None


def _storage_dtypes(hf, cfg):
  """{parameter path: dtype it is stored in}: the published dtype (the widest, should a kind's layers differ)."""
  out = {}
  for name, (entry, _) in names.hf_names(cfg).items():
    dtype = hf.info(name).dtype.newbyteorder("=")
    out[entry.param] = dtype if entry.param not in out else np.promote_types(out[entry.param], dtype)
  return out


def write_params(hf, cfg, state_dir, log=print):
  """Streams every tensor of `hf` into an Orbax parameter checkpoint at `state_dir`; returns bytes read."""
  dtypes = _storage_dtypes(hf, cfg)
  arrays = {}
  for entry in names.entries(cfg):
    shape = names.param_shape(cfg, entry)
    unit_axes = (0,) * entry.per_layer + ((len(shape) - 2,) if entry.part is not None else ())
    arrays[entry.param] = (shape, dtypes[entry.param], names.rows_axis(entry, len(shape)), unit_axes)
  writer = ParamCheckpointWriter(state_dir, arrays)
  done = 0
  try:
    for name, (entry, layer) in names.hf_names(cfg).items():
      shape, dtype, axis, _ = arrays[entry.param]
      rows = names.hf_shape(cfg, entry)[0]
      step = writer.block_rows(entry.param, axis)
      for start in range(0, rows, step):
        stop = min(start + step, rows)
        block = names.to_param_layout(entry, hf.read(name, (slice(start, stop),)))  # a transposed view: no copy
        block = block if block.dtype == dtype else block.astype(dtype)
        writer.write(entry.param, names.param_index(entry, slice(start, stop), layer, len(shape)), block)
      done += hf.info(name).nbytes
    writer.finish()
  except BaseException:
    writer.abort()  # before the partial output is removed
    raise
  log(f"wrote {len(names.hf_names(cfg))} tensors ({done / 1e6:,.1f} MB) into {len(arrays)} parameter arrays")
  return done


def config_yml(keys, out_dir, hf_dir, load_path, tokenizer, add_bos=None):
  """The text of OUT_DIR/config.yml: the model, where its parameters and tokenizer are.

  The model keys are always written out (config.json is the truth about the weights); model_name names the model
  whose definition they equal (e.g. llama3.1-8b for Meta's Llama-3.1-8B), else it is left at default. `add_bos`:
  (value, why) of prompt_start.read, how the tokenizer starts a prompt."""
  defaults = {n: k.default for n, k in config_lib.SCHEMA.items()}
  named = config_lib.models.matching({**defaults, **keys})
  body = {
    **({"model_name": named} if named else {}),
    **keys,
    "max_target_length": min(2048, int(keys.pop("max_target_length", 2048))),
    "load_parameters_path": str(load_path),
  }
  if tokenizer:
    body.update(tokenizer_type="huggingface", tokenizer_path=str(tokenizer))
  if add_bos:
    body["add_bos"] = {"true": True, "false": False}.get(add_bos[0], add_bos[0])
  header = (
    f"# Imported from the Hugging Face checkpoint {pathlib.Path(hf_dir).absolute()} by\n"
    f"#   python -m MaxText.convert_hf to-maxtext {hf_dir} {out_dir}\n"
    "# Train it as is: python train.py THIS_FILE steps=... quantization=te_nvfp4 (fresh optimizer, step 0).\n"
    + (f"# add_bos: {add_bos[0]}, as transformers 5 reads the tokenizer files: {add_bos[1]}.\n" if add_bos else "")
  )
  return header + yaml.safe_dump(body, sort_keys=False, default_flow_style=None)


def import_checkpoint(hf_dir, out_dir, *, direct=False, fused_mlp=False, log=print):
  """HF_DIR -> OUT_DIR/{config.yml, checkpoints/0/state, hf/}; with `direct`, only config.yml, whose
  load_parameters_path is HF_DIR itself (the trainer then reads each device's slices from the safetensors).
  `fused_mlp`: a model with gate_proj and up_proj joined into one kernel (config.yml sets fused_mlp: true)."""
  hf_dir, out_dir = pathlib.Path(hf_dir).absolute(), pathlib.Path(out_dir).absolute()
  check_output_dir(out_dir)
  with HFCheckpoint(hf_dir) as hf:
    keys = dict(hf.keys, max_target_length=hf.config.get("max_position_embeddings", 2048))
    if fused_mlp:
      keys["fused_mlp"] = True
    cfg = config_from_keys({k: v for k, v in keys.items() if k != "max_target_length"}, hf_dir / "config.json")
    hf.check(cfg)
    add_bos = None
    if not (hf_dir / "tokenizer.json").is_file():
      log(
        f"warning: {hf_dir} has no tokenizer.json; config.yml names no tokenizer (set tokenizer_type and "
        "tokenizer_path to decode or to train on text)"
      )
    else:
      add_bos = prompt_start.read(hf_dir)
      log(f"add_bos: {add_bos[0]} ({add_bos[1]})")
    with staged(out_dir, log) as tmp:
      companions = out_dir / COMPANIONS if not direct else hf_dir
      if not direct:
        write_params(hf, cfg, tmp / CHECKPOINT / "state", log)
        (tmp / COMPANIONS).mkdir()
        for name in model_config.COMPANION_FILES:
          if (hf_dir / name).is_file():
            shutil.copyfile(hf_dir / name, tmp / COMPANIONS / name)
      tokenizer = companions / "tokenizer.json" if (hf_dir / "tokenizer.json").is_file() else None
      load_path = hf_dir if direct else out_dir / CHECKPOINT
      (tmp / "config.yml").write_text(config_yml(keys, out_dir, hf_dir, load_path, tokenizer, add_bos))
  log(f"imported {hf_dir} -> {out_dir}/config.yml (load_parameters_path={load_path})")
  return out_dir / "config.yml"
