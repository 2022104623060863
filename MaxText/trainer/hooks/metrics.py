"""Per-step metrics: MaxText's stdout line, a JSON-lines file and TensorBoard events under the run dir (MetricsHook)."""

import contextlib
import json
import os

import jax

from MaxText import precision, storage
from MaxText.errors import UserError
from MaxText.trainer.loop import Hook


class MetricsError(UserError):
  """The metrics files can't be written (disk full, directory gone): an environment error, one line."""


def step_line(step, seconds, tflops_per_device, tokens_per_device, total_weights, loss):
  """Exactly MaxText's per-step line, so existing log parsers work."""
  return (
    f"completed step: {step}, seconds: {seconds:.3f}, TFLOP/s/device: {tflops_per_device:.3f}, "
    f"Tokens/s/device: {tokens_per_device:.3f}, total_weights: {int(total_weights)}, loss: {loss:.3f}"
  )


def _drop_rows_from(path, first_step):
  """Rewrite metrics.jsonl without rows of steps >= first_step: a resumed run writes those steps again, so the
  file holds each step once, as the resumed run computed it."""
  if storage.size_if_file(path) is None:
    return
  lines = storage.read_text(path).splitlines(keepends=True)
  kept = [l for l in lines if l.strip() and json.loads(l).get("step", -1) < first_step]
  if len(kept) != len(lines):
    storage.write_text(path, "".join(kept))


class MetricsWriter:
  """Writes metrics.jsonl and (optionally) TensorBoard events into `run_dir`; flushes every `flush_period` steps.

  Rows of steps >= `first_step` left by an earlier, interrupted run are dropped first (see _drop_rows_from).
  """

  def __init__(self, run_dir, *, tensorboard=True, flush_period=10, enabled=True, first_step=0):
    self.enabled = enabled  # only the first process writes files in a multi-process job
    self.run_dir = str(run_dir)  # a local path or a URL (MaxText.storage)
    self.tb = None
    if not enabled:
      return
    self.flush_period = flush_period
    with self._reported("open"):
      storage.makedirs(self.run_dir)
      _drop_rows_from(os.path.join(self.run_dir, "metrics.jsonl"), first_step)
      self.jsonl = storage.AppendFile(os.path.join(self.run_dir, "metrics.jsonl"))
    if tensorboard:
      from tensorboardX import SummaryWriter  # imported here: optional for library users

      self.tb = SummaryWriter(os.path.join(self.run_dir, "tensorboard"))

  @contextlib.contextmanager
  def _reported(self, what):
    """OSError inside the block -> one MetricsError line naming the directory and the cause."""
    try:
      yield
    except OSError as e:
      raise MetricsError(
        f"can't {what} the metrics in {self.run_dir} ({e.strerror or e}); free space or fix the "
        "directory, then rerun (checkpoints resume the run)"
      ) from None

  def write(self, step, metrics: dict):
    if not self.enabled:
      return
    with self._reported(f"write step {step} of"):
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
    with self._reported("flush"):
      self.jsonl.flush()
      if self.tb is not None:
        self.tb.flush()

  def close(self):
    if not self.enabled:
      return
    try:
      self.flush()
    finally:
      try:
        self.jsonl.close()
      except OSError:
        pass
      if self.tb is not None:
        self.tb.close()


class MetricsHook(Hook):
  """Each finished step: MaxText's line on stdout and its record (loss, seconds, TFLOP/s and tokens/s per device,
  weights, gradient norm, learning rate, quantization telemetry) for `writer`; records are written when the loop
  hands the steps over, after other hooks (eval) added theirs."""

  def __init__(self, writer: MetricsWriter, *, flops, tokens_per_device, schedule, notes=None):
    self.writer, self.flops, self.tokens_per_device, self.schedule = writer, flops, tokens_per_device, schedule
    self.notes = notes or {}  # what the first row this run writes also records (a recipe change on resume)

  def on_step(self, result, progress):
    seconds = result.seconds
    result.record.update(
      {
        "loss": result.loss,
        "seconds": seconds,
        "TFLOP/s/device": self.flops.tflops / seconds,
        "Tokens/s/device": self.tokens_per_device / seconds,
        "total_weights": float(result.metrics["total_weights"]),
        "grad_norm": float(result.metrics["grad_norm"]),
        "learning_rate": float(self.schedule(result.step)),
      }
    )
    if "quant_stats" in result.metrics:
      result.record.update(precision.stats_record(result.plan, jax.device_get(result.metrics["quant_stats"])))
    result.record.update(self.notes)
    self.notes = {}
    record = result.record
    print(
      step_line(
        result.step, seconds, record["TFLOP/s/device"], record["Tokens/s/device"], record["total_weights"], result.loss
      ),
      flush=True,
    )

  def after_steps(self, results, progress, sync):
    for result in results:
      self.writer.write(result.step, result.record)

  def flush(self):
    self.writer.flush()

  def close(self):
    self.writer.close()
