"""Orbax checkpoints of the training state (parameters, optimizer state, step, data position) and resume.

Layout: <run dir>/checkpoints/<step>/{state, data}; <step> = steps completed. Orbax writes each
checkpoint to a temporary directory and renames it when complete, so a run killed mid-save leaves
no half checkpoint behind; a checkpoint that is there but unreadable (corrupt files) is reported
and the previous one is used instead. Never a silent restart from step 0.
"""

import pathlib

import jax
import orbax.checkpoint as ocp

class CheckpointError(Exception):
  """No usable checkpoint where one is expected: a user error."""


def _state_args(state, restore):
  if restore:
    return ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, state))
  return ocp.args.StandardSave(state)


class Checkpointer:
  """Saves every `period` steps (and on demand), keeps `max_to_keep` (0 = all), restores the newest readable."""

  def __init__(self, directory, *, period, max_to_keep, async_save):
    self.directory = pathlib.Path(directory).absolute()
    self.period = period
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=("state", "data"),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep or None, enable_async_checkpointing=async_save,
                                             create=True, cleanup_tmp_directories=True))

  def steps(self):
    return sorted(self._manager.all_steps())

  def save(self, step, state, data_state, *, force=False):
    """Checkpoint after `step` completed steps, if it is a period boundary or `force`; True if one was written."""
    if not force and step % self.period:
      return False
    if step in self._manager.all_steps():
      return False
    return self._manager.save(step, args=ocp.args.Composite(state=_state_args(state, False),
                                                            data=ocp.args.JsonSave(data_state)), force=True)

  def restore_latest(self, state_template):
    """(step, state, data_state) from the newest readable checkpoint, or None when there is none.

    An unreadable checkpoint is reported and skipped; if every one is unreadable, CheckpointError.
    """
    steps = self.steps()
    failures = []
    for step in reversed(steps):
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(state=_state_args(state_template, True),
                                                                       data=ocp.args.JsonRestore()))
      except Exception as e:  # orbax/tensorstore raise many types for damaged files
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        failures.append(step)
        print(f"warning: checkpoint {self.directory}/{step} is unreadable ({reason}); trying the previous one",
              flush=True)
        continue
      return step, restored["state"], dict(restored["data"] or {})
    if failures:
      raise CheckpointError(f"no readable checkpoint in {self.directory} (tried steps {failures}); move the "
                            "directory away (or pick another run_name) to start from step 0")
    return None

  def wait(self):
    self._manager.wait_until_finished()

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()


def restore_step_dir(path, state_template):
  """(state, data_state) from one checkpoint step directory (load_full_state_path / load_parameters_path)."""
  path = pathlib.Path(path).absolute()
  if not (path / "state").is_dir():
    raise CheckpointError(f"{path} is not a checkpoint step directory (no {path.name}/state); point at "
                          "<run dir>/checkpoints/<step>")
  try:
    state = ocp.StandardCheckpointer().restore(path / "state", jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                                                             state_template))
    data_state = ocp.JsonCheckpointHandler().restore(path / "data") if (path / "data").is_dir() else {}
  except Exception as e:
    raise CheckpointError(f"can't read checkpoint {path}: {str(e).splitlines()[0][:200]}") from e
  return state, dict(data_state or {})
