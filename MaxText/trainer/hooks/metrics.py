"""Per-step metrics: MaxText's stdout line, a JSON-lines file and TensorBoard events under the run dir (MetricsHook)."""

import contextlib
import json
import os
import time

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


class TensorBoardEvents:
  """TensorBoard scalars written by this thread into one event file under `log_dir` (tensorboardX's record format,
  local, gs:// or s3://): a write that fails raises here, where the run can say it once. (tensorboardX's
  SummaryWriter writes from a thread of its own: a full disk kills that thread with a traceback, its queue then
  blocks the run, and its exit hook prints more tracebacks.)"""

  def __init__(self, log_dir):
    from tensorboardX import event_file_writer, record_writer  # pylint: disable=import-outside-toplevel  (optional)

    record_writer.directory_check(log_dir)
    self._events = event_file_writer.EventsWriter(os.path.join(log_dir, "events"))

  def write(self, step, scalars):
    from tensorboardX.proto import event_pb2, summary_pb2  # pylint: disable=import-outside-toplevel
    from tensorboardX.summary import scalar  # pylint: disable=import-outside-toplevel

    values = [scalar(name, value).value[0] for name, value in scalars.items()]
    event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values))
    self._events.write_event(event)

  def flush(self):
    self._events.flush()

  def close(self):
    self._events.close()


class MetricsWriter:
  """Writes metrics.jsonl and (optionally) TensorBoard events into `run_dir`; flushes every `flush_period` steps.

  Rows of steps >= `first_step` left by an earlier, interrupted run are dropped first (see _drop_rows_from). A
  write that fails is one MetricsError; after it, closing the writer says nothing more (the run is already failing
  with that line).
  """

  def __init__(self, run_dir, *, tensorboard=True, flush_period=10, enabled=True, first_step=0):
    self.enabled = enabled  # only the first process writes files in a multi-process job
    self.run_dir = str(run_dir)  # a local path or a URL (MaxText.storage)
    self.tb = None
    self.failed = False
    if not enabled:
      return
    self.flush_period = flush_period
    with self._reported("open"):
      storage.makedirs(self.run_dir)
      _drop_rows_from(os.path.join(self.run_dir, "metrics.jsonl"), first_step)
      self.jsonl = storage.AppendFile(os.path.join(self.run_dir, "metrics.jsonl"))
      if tensorboard:
        self.tb = TensorBoardEvents(os.path.join(self.run_dir, "tensorboard"))

  @contextlib.contextmanager
  def _reported(self, what):
    """OSError inside the block -> one MetricsError line naming the directory and the cause."""
    try:
      yield
    except OSError as e:
      self.failed = True
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
        self.tb.write(step, {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    if step % self.flush_period == 0:
      self.flush()

  def flush(self):
    if not self.enabled or self.failed:
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
      for f in (self.jsonl, self.tb):
        try:
          if f is not None:
            f.close()
        except OSError:
          pass  # flushed above (or failed already, and said so): nothing left to lose or to say


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
