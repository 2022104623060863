"""Checkpoints as the loop's events: every checkpoint_period steps, after the last step and at a stop (the metrics
flushed first, so they reach disk no later than the checkpoint that covers them); a failed background save is
noticed at the next step."""

from MaxText.checkpointing import Checkpointer
from MaxText.trainer.loop import Hook


class CheckpointHook(Hook):
  """Saves the loop's state through `checkpointer` where due; `gather_positions(position)`: every process's data
  position (each reads its own slice); `before_save()`: what must be on disk first (the metrics)."""

  def __init__(self, checkpointer: Checkpointer, *, last_step, gather_positions, before_save=lambda: None):
    self.checkpointer, self.last_step = checkpointer, last_step
    self.gather_positions, self.before_save = gather_positions, before_save

  def needs_sync(self, step):
    return self.checkpointer.due(step)

  def after_dispatch(self, step):
    self.checkpointer.check()  # a failed background save stops the run now, not a period later

  def after_steps(self, results, progress, sync):
    return sync and self._save(progress, force=progress.state.step == self.last_step)

  def on_stop(self, progress, trained):
    return trained and self._save(progress, force=True)

  def _save(self, progress, force):
    """Whether it saved (or tried: a step already saved is not written again)."""
    state = progress.state
    if not self.checkpointer.due(state.step, force):
      return False
    self.before_save()
    self.checkpointer.save(state.step, state.checkpoint_tree(), self.gather_positions(progress.position), force=force)
    return True

  def close(self):
    self.checkpointer.close()
