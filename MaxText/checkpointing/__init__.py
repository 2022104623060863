"""Checkpoints: Orbax saves and resumes of the training state (checkpointer.py), where a run's starting parameters
come from (parameters.py), and Hugging Face checkpoints in and out (hf/)."""

from MaxText.checkpointing.checkpointer import (
  DATA_KEYS,
  CheckpointError,
  Checkpointer,
  UnreadableCheckpoint,
  meta_record,
  newest_readable,
  read_meta,
  restore_params,
  restore_step_dir,
  settings_difference,
  step_numbers,
  structure_difference,
)

__all__ = [
  "DATA_KEYS",
  "CheckpointError",
  "Checkpointer",
  "UnreadableCheckpoint",
  "meta_record",
  "newest_readable",
  "read_meta",
  "restore_params",
  "restore_step_dir",
  "settings_difference",
  "step_numbers",
  "structure_difference",
]
