"""Per-step metrics: MaxText's stdout line, a JSON-lines file and TensorBoard events under the run dir."""

import json
import pathlib


def step_line(step, seconds, tflops_per_device, tokens_per_device, total_weights, loss):
  """Exactly MaxText's per-step line, so existing log parsers work."""
  return (f"completed step: {step}, seconds: {seconds:.3f}, TFLOP/s/device: {tflops_per_device:.3f}, "
          f"Tokens/s/device: {tokens_per_device:.3f}, total_weights: {int(total_weights)}, loss: {loss:.3f}")


class MetricsWriter:
  """Writes metrics.jsonl and (optionally) TensorBoard events into `run_dir`; flushes every `flush_period` steps."""

  def __init__(self, run_dir, *, tensorboard=True, flush_period=10, enabled=True):
    self.enabled = enabled  # only the first process writes files in a multi-process job
    self.run_dir = pathlib.Path(run_dir)
    self.tb = None
    if not enabled:
      return
    self.run_dir.mkdir(parents=True, exist_ok=True)
    self.jsonl = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8")
    self.flush_period = flush_period
    if tensorboard:
      from tensorboardX import SummaryWriter  # imported here: optional for library users
      self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))

  def write(self, step, metrics: dict):
    if not self.enabled:
      return
    self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
    if self.tb is not None:
      for name, value in metrics.items():
        if isinstance(value, (int, float)):
          self.tb.add_scalar(name, value, step)
    if step % self.flush_period == 0:
      self.flush()

  def flush(self):
    if not self.enabled:
      return
    self.jsonl.flush()
    if self.tb is not None:
      self.tb.flush()

  def close(self):
    if not self.enabled:
      return
    self.flush()
    self.jsonl.close()
    if self.tb is not None:
      self.tb.close()
