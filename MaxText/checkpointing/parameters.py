"""Where a run's starting parameters come from (load_parameters_path): a checkpoint step directory, whose parameters
alone are restored (an import's parameter checkpoint, or a training checkpoint without its optimizer state), or a
Hugging Face Llama directory, read directly; and a run directory's newest readable checkpoint, for the commands that
read one (decode, convert_hf): an unreadable newer one is said and skipped, as a resuming run does."""

import pathlib

from MaxText.checkpointing.checkpointer import newest_readable, restore_params, step_numbers
from MaxText.checkpointing.hf import checkpoint as hf_checkpoint
from MaxText.checkpointing.hf import direct


def load(cfg, path, params_template):
  """Parameters from load_parameters_path `path`: a Hugging Face directory or a checkpoint step directory."""
  if hf_checkpoint.is_hf_dir(path):
    return direct.load(cfg, path, params_template)
  return restore_params(path, params_template)


def has_checkpoints(run_dir):
  """Whether `run_dir`/checkpoints holds any step (readable or not)."""
  return bool(step_numbers(pathlib.Path(run_dir) / "checkpoints"))


def read_newest(run_dir, read, log=print):
  """(step directory, read(step directory)) of `run_dir`'s newest checkpoint that `read` can read (each newer one
  it finds unreadable said in one line and skipped), or None when the run has no checkpoint; CheckpointError when
  none is readable."""
  root = pathlib.Path(run_dir) / "checkpoints"
  found = newest_readable(
    root,
    step_numbers(root),
    lambda step: read(root / str(step)),
    log=log,
    if_none="train the run again, or point at another checkpoint",
  )
  return None if found is None else (root / str(found[0]), found[1])
