"""Where a run's starting parameters come from (load_parameters_path): a checkpoint step directory, whose parameters
alone are restored (an import's parameter checkpoint, or a training checkpoint without its optimizer state), or a
Hugging Face Llama directory, read directly; and a run directory's newest checkpoint."""

import pathlib

from MaxText.checkpointing.checkpointer import restore_params
from MaxText.checkpointing.hf import checkpoint as hf_checkpoint
from MaxText.checkpointing.hf import direct


def load(cfg, path, params_template):
  """Parameters from load_parameters_path `path`: a Hugging Face directory or a checkpoint step directory."""
  if hf_checkpoint.is_hf_dir(path):
    return direct.load(cfg, path, params_template)
  return restore_params(path, params_template)


def newest_step_dir(run_dir):
  """<run_dir>/checkpoints/<newest step>, or None when the run has no checkpoint."""
  root = pathlib.Path(run_dir) / "checkpoints"
  steps = (
    sorted(int(p.name) for p in root.glob("*") if p.name.isdigit() and (p / "state").is_dir()) if root.is_dir() else []
  )
  return root / str(steps[-1]) if steps else None
