"""Hugging Face Llama checkpoints in and out:

python -m MaxText.convert_hf to-maxtext HF_DIR OUT_DIR [--direct] [--fused-mlp]
    HF_DIR (config.json, *.safetensors, tokenizer.json) -> OUT_DIR/config.yml, OUT_DIR/checkpoints/0 (the
    parameters, streamed) and OUT_DIR/hf (the tokenizer and config files); `python train.py OUT_DIR/config.yml`
    continues from the published weights. --direct writes only config.yml, whose load_parameters_path is HF_DIR:
    the trainer then reads each device's slices straight from the safetensors (no conversion). --fused-mlp joins
    gate_proj and up_proj into one kernel (config.yml sets fused_mlp: true).
python -m MaxText.convert_hf to-hf CONFIG_OR_RUN_DIR OUT_DIR [--dtype bfloat16|float32]
    [--max-shard-size BYTES] [--nvfp4 [--calibration-batches N]] [key=value ...]
    a config's parameters (its run's newest checkpoint, else its load_parameters_path) or a run directory's newest
    checkpoint -> OUT_DIR: config.json, sharded *.safetensors with model.safetensors.index.json,
    generation_config.json and the tokenizer (default dtype bfloat16, as Llama is published).
    --nvfp4: an NVFP4 run (te_nvfp4, te_nvfp4_no_rht) in NVIDIA ModelOpt's NVFP4 layout, as vLLM and TensorRT-LLM
    load it: the MLP projections its plan ran in NVFP4 as its forward pass's codes and scales (packed E2M1, E4M3
    block scales, global scale), input_scale from the activation amax over N batches of the config's data (default
    32) run through the trained model, the rest in bf16; hf_quant_config.json and config.json's quantization_config.

OUT_DIR is written into .OUT_DIR.partial-PID beside it and renamed when complete: a failure, SIGTERM or SIGINT
leaves nothing (a killed conversion's leftovers are removed by the next one), an existing OUT_DIR is never touched.
A run's newest checkpoint that can't be read is said in one line and the one before it exported, as train.py
resumes.
"""

import argparse
import pathlib
import sys

from MaxText import checkpointing, cli, config as config_lib
from MaxText.checkpointing import parameters
from MaxText.checkpointing.hf import HFError, exporter, importer, nvfp4_export
from MaxText.checkpointing.hf.checkpoint import is_hf_dir
from MaxText.checkpointing.checkpointer import reading
from MaxText.checkpointing.hf.output_dir import check_output_dir
from MaxText.inference import calibration


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    raise HFError(f"{message} (python -m MaxText.convert_hf --help)")


def _positive_int(text):
  """argparse's type of a count or size: an integer >= 1."""
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"{value} must be >= 1")
  return value


def _path(text):
  """argparse's type of a path: absolute (against the directory the command started in), ~ expanded, once."""
  return pathlib.Path(config_lib.absolute_path(text))


def _parser():
  parser = _Parser(
    prog="python -m MaxText.convert_hf",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog=__doc__.split("\n", 2)[2],
  )
  sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
  to_maxtext = sub.add_parser("to-maxtext", help="import a Hugging Face Llama checkpoint")
  to_maxtext.add_argument("hf_dir", type=_path)
  to_maxtext.add_argument("out_dir", type=_path)
  to_maxtext.add_argument("--direct", action="store_true", help="write config.yml only; the trainer reads HF_DIR")
  to_maxtext.add_argument("--fused-mlp", action="store_true", help="gate and up as one kernel (fused_mlp: true)")
  to_hf = sub.add_parser("to-hf", help="export parameters as a Hugging Face Llama checkpoint")
  to_hf.add_argument("source", metavar="CONFIG_OR_RUN_DIR", type=_path)
  to_hf.add_argument("out_dir", type=_path)
  to_hf.add_argument("--dtype", default="bfloat16", choices=sorted(exporter.DTYPES))
  to_hf.add_argument("--max-shard-size", type=_positive_int, default=exporter.DEFAULT_MAX_SHARD_BYTES, metavar="BYTES")
  to_hf.add_argument("--nvfp4", action="store_true", help="ModelOpt NVFP4 MLPs, the training forward's codes")
  to_hf.add_argument(
    "--calibration-batches",
    type=_positive_int,
    default=None,
    metavar="N",
    help="--nvfp4: batches measuring input_scale (32)",
  )
  to_hf.add_argument("overrides", nargs="*", metavar="key=value")
  return parser


def _config_of_step(step_dir, fallback):
  """The config a checkpoint was written under (its meta item), else the run directory's config.yml."""
  try:
    meta = checkpointing.read_meta(step_dir)
  except Exception as e:  # pylint: disable=broad-except  (orbax raises many types for a damaged item)
    raise checkpointing.UnreadableCheckpoint.of(step_dir, e) from None
  if meta.get("config"):
    defaults = {n: k.default for n, k in config_lib.SCHEMA.items()}
    stored = {k: v for k, v in meta["config"].items() if k in config_lib.SCHEMA}
    # Checkpoints written before paths were made absolute at load hold them as given: read against this directory.
    stored.update({k: config_lib.absolute_path(v) for k, v in stored.items() if k in config_lib.PATH_KEYS})
    return config_lib.Config(**{**defaults, **stored})
  if fallback.is_file():
    return config_lib.load(fallback)
  raise HFError(f"{step_dir} records no config and {fallback} doesn't exist; export with the config file instead")


def _metadata_only(cfg, step_dir):
  """export_source's default `export`: the checkpoint's parameters listed (cheap), nothing written."""
  del cfg
  exporter.CheckpointParams(step_dir)


def export_source(source, overrides=(), *, export=_metadata_only, log=print):
  """(config, checkpoint step directory) exported by `export(config, step_dir)`: a run directory's newest readable
  checkpoint with the config it recorded, or a config file's run's newest readable checkpoint, else its
  load_parameters_path. Where a run's checkpoints are listed, a newer one that can't be read is said in one line and
  the previous one exported, as a resuming run does."""
  path = pathlib.Path(source)

  def step(step_dir, config_of):
    with reading(step_dir):
      checkpointing.checkpointer.state_metadata(step_dir)  # a damaged step is that, before its config is asked for
      cfg = config_of(step_dir)
      export(cfg, step_dir)
    return cfg, step_dir

  if path.is_dir() and parameters.has_checkpoints(path):
    changes = config_lib.parse_overrides(overrides)

    def config_of(step_dir):
      cfg = _config_of_step(step_dir, path / "config.yml")
      return cfg.replace(**changes) if changes else cfg

    return parameters.read_newest(path, lambda step_dir: step(step_dir, config_of), log)[1]
  if path.is_dir():
    if not (path / "config.yml").is_file():
      raise HFError(
        f"{path}: no checkpoints/<step> and no config.yml; give a run directory with checkpoints or a config file"
      )
    path = path / "config.yml"
  cfg = config_lib.load(path, overrides)
  run_dir = pathlib.Path(cfg.base_output_directory) / cfg.run_name if cfg.run_name else None
  if run_dir is not None and parameters.has_checkpoints(run_dir):
    return parameters.read_newest(run_dir, lambda step_dir: step(step_dir, lambda _: cfg), log)[1]
  if not cfg.load_parameters_path:
    raise HFError(
      f"{path}: nothing to export: the run {cfg.base_output_directory}/{cfg.run_name or '<run_name>'} "
      "has no checkpoint and load_parameters_path is empty"
    )
  if is_hf_dir(cfg.load_parameters_path):
    raise HFError(
      f"{path}: load_parameters_path={cfg.load_parameters_path} is a Hugging Face directory already and "
      "the run has no checkpoint: nothing to export"
    )
  return step(pathlib.Path(cfg.load_parameters_path), lambda _: cfg)


def export_nvfp4(args, log=print):
  """to-hf --nvfp4: the run's recipe checked, the activation amax calibrated, then the export."""
  if args.dtype != "bfloat16":
    raise HFError(f"--nvfp4 writes its unquantized tensors in bfloat16; drop --dtype {args.dtype}")
  batches = calibration.DEFAULT_BATCHES if args.calibration_batches is None else args.calibration_batches

  def export(cfg, step_dir):
    nvfp4_export.nvfp4_layers(cfg)  # a recipe that isn't NVFP4 is refused before any work
    check_output_dir(args.out_dir)
    input_amax, description = calibration.calibrate(cfg, step_dir, batches, log=log)
    nvfp4_export.export(
      cfg, step_dir, args.out_dir, input_amax, description, max_shard_bytes=args.max_shard_size, log=log
    )

  export_source(args.source, args.overrides, export=export, log=log)


def _convert(argv):
  args = _parser().parse_args(argv)
  if args.command == "to-maxtext":
    importer.import_checkpoint(args.hf_dir, args.out_dir, direct=args.direct, fused_mlp=args.fused_mlp)
  elif args.nvfp4:
    export_nvfp4(args)
  else:
    if args.calibration_batches is not None:
      raise HFError("--calibration-batches applies to --nvfp4 exports only")

    def export(cfg, step_dir):
      exporter.export(cfg, step_dir, args.out_dir, dtype=args.dtype, max_shard_bytes=args.max_shard_size)

    export_source(args.source, args.overrides, export=export)


def main(argv=None):
  return cli.run(__doc__, argv, _convert)


if __name__ == "__main__":
  sys.exit(main())
