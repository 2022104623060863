"""Checkpoints: Orbax saves and resumes of the training state (checkpointer.py)."""

from MaxText.checkpointing.checkpointer import (
  DATA_KEYS,
  CheckpointError,
  Checkpointer,
  meta_record,
  restore_step_dir,
  settings_difference,
  structure_difference,
)

__all__ = [
  "DATA_KEYS",
  "CheckpointError",
  "Checkpointer",
  "meta_record",
  "restore_step_dir",
  "settings_difference",
  "structure_difference",
]
