"""Orbax checkpoints of the training state (parameters, optimizer state, step, data position) and resume.

Layout: <run dir>/checkpoints/<step>/{state, data}; <step> = steps completed. Orbax writes each
checkpoint to a temporary directory and renames it when complete, so a run killed mid-save leaves
no half checkpoint behind; a checkpoint that is there but unreadable (corrupt files) is reported
and the previous one is used instead. Never a silent restart from step 0.
"""

import contextlib
import functools
import io
import logging
import pathlib
import re
import sys
import threading
import traceback
import warnings

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
    self._log_path = self.directory.parent / "checkpoint_errors.log"
    self.directory.parent.mkdir(parents=True, exist_ok=True)
    with _kept_in(self._log_path) as log, _logger_to("absl", log):  # its warnings about junk dirs
      self._manager = ocp.CheckpointManager(
          self.directory, item_names=("state", "data"),
          options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep or None, enable_async_checkpointing=async_save,
                                               create=True, cleanup_tmp_directories=True))

  def steps(self):
    return sorted(self._manager.all_steps())

  def due(self, step, force=False):
    """Whether `save(step, ..., force=force)` would consider writing: a period boundary, or forced."""
    return force or step % self.period == 0

  def save(self, step, state, data_state, *, force=False):
    """Checkpoint after `step` completed steps, if it is a period boundary or `force`; True if one was written."""
    if not self.due(step, force):
      return False
    if step in self._manager.all_steps():
      return False
    return self._manager.save(step, args=ocp.args.Composite(state=_state_args(state, False),
                                                            data=ocp.args.JsonSave(data_state)), force=True)

  def restore_latest(self, state_template):
    """(step, state, data_state) from the newest readable checkpoint, or None when there is none.

    Unreadable newer checkpoints are reported and moved aside to `<step>.corrupt`, so that the run
    writes those steps again and retention only ever counts readable ones. A checkpoint of another
    model shape is a CheckpointError (the config changed), as is having no readable one at all.
    Orbax's tracebacks from the failed reads go to `<run dir>/checkpoint_errors.log`, not stderr.
    """
    failures = []
    with _kept_in(self._log_path) as log, contextlib.redirect_stderr(log), _logger_to("absl", log):
      for step in reversed(self.steps()):
        try:
          restored = self._manager.restore(step, args=ocp.args.Composite(
              state=_state_args(state_template, True), data=ocp.args.JsonRestore()))
        except Exception as e:  # orbax/tensorstore raise many types for damaged files
          message = str(e)
          traceback.print_exception(e, file=log)
          _late_noise_to(self._log_path)
          if "not compatible with the stored shape" in message:
            raise CheckpointError(f"checkpoint {self.directory}/{step} holds another model shape "
                                  f"({_shape_mismatch(message)}): resume with the config it was trained with, or "
                                  "pick another run_name") from None
          reason = message.splitlines()[0][:200] if message else type(e).__name__
          failures.append(step)
          print(f"warning: checkpoint {self.directory}/{step} is unreadable ({reason}); trying the previous one",
                flush=True)
          continue
        for bad in failures:
          print(f"moved the unreadable checkpoint {self.directory}/{bad} aside to "
                f"{self._move_aside(bad).name} (the run writes step {bad} again when it gets there)", flush=True)
        if failures:
          self._manager.reload()
        return step, restored["state"], dict(restored["data"] or {})
    if failures:
      raise CheckpointError(f"no readable checkpoint in {self.directory} (tried steps {failures}); move the "
                            "directory away (or pick another run_name) to start from step 0")
    return None

  def _move_aside(self, step):
    """<step> -> <step>.corrupt (.corrupt.1, ... if taken); process 0 renames, on a filesystem all processes share."""
    target = self.directory / f"{step}.corrupt"
    n = 0
    while target.exists():
      n += 1
      target = self.directory / f"{step}.corrupt.{n}"
    if jax.process_index() == 0:
      (self.directory / str(step)).rename(target)
    return target

  def wait(self):
    self._manager.wait_until_finished()

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()


@functools.cache
def _late_noise_to(path):
  """From the first failed read on, what Orbax's threads raise later goes to the log at `path` (once per process).

  A failed restore leaves tensorstore callbacks that hit a closed event loop later, each printing a
  traceback from a background thread (and coroutines never awaited, warned about at exit); they belong
  in the log, not around the one line the user needs. Later warnings of the process go there too.
  """
  log = open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with  (kept open: written until exit)
  sys.unraisablehook = lambda u: traceback.print_exception(u.exc_value, file=log)
  threading.excepthook = lambda a: traceback.print_exception(a.exc_value, file=log)
  warnings.showwarning = (lambda message, category, filename, lineno, file=None, line=None:
                          log.write(warnings.formatwarning(message, category, filename, lineno, line)))
  asyncio_logger = logging.getLogger("asyncio")  # "Task exception was never retrieved", at garbage collection
  asyncio_logger.addHandler(logging.StreamHandler(log))
  asyncio_logger.propagate = False


@contextlib.contextmanager
def _kept_in(path):
  """A text buffer for the block whose contents, if any, are appended to `path` (no empty log files)."""
  buffer = io.StringIO()
  try:
    yield buffer
  finally:
    if buffer.getvalue():
      with open(path, "a", encoding="utf-8") as f:
        f.write(buffer.getvalue())


@contextlib.contextmanager
def _logger_to(name, stream):
  """Within the block, the `name` logger writes to `stream` only."""
  logger, handler = logging.getLogger(name), logging.StreamHandler(stream)
  propagate, logger.propagate = logger.propagate, False
  logger.addHandler(handler)
  try:
    yield
  finally:
    logger.removeHandler(handler)
    logger.propagate = propagate


def _shape_mismatch(message):
  """'stored (a, b), this config (c, d)' from Orbax's shape error."""
  found = re.search(r"Requested shape: (\([^)]*\)).*?stored shape: (\([^)]*\))", message, re.S)
  return f"a parameter stored as {found.group(2)} is {found.group(1)} in this config" if found else "shapes differ"


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
