"""A stop request (SIGTERM, SIGINT: runtime/preemption.py; in a multi-process job the stop every process agreed on,
runtime/job_stop.py) as the loop's event: the line saying where the run stopped and what was saved."""

from MaxText.runtime import preemption
from MaxText.trainer.loop import Hook


class StopHook(Hook):
  """Says where a stopped run stopped; `checkpoint_dir`: where its checkpoints go (None without checkpointing)."""

  def __init__(self, checkpoint_dir=None):
    self.checkpoint_dir = checkpoint_dir

  def on_stop(self, progress, trained):
    step = progress.state.step
    if not trained:
      print(
        f"{preemption.reason()} before step {step}: stopped, nothing trained"
        + (f" (the checkpoint at step {step} is unchanged)" if step else ""),
        flush=True,
      )
      return
    where = (
      f", checkpoint {self.checkpoint_dir}/{step}"
      if self.checkpoint_dir is not None
      else " (enable_checkpointing=false: nothing saved)"
    )
    print(f"{preemption.reason()}: stopped after step {step - 1}{where}", flush=True)
