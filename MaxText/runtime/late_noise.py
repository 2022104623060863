"""Where libraries' late tracebacks go: into a log file, not around the one line a command prints for a failure.

Orbax and TensorStore finish their work on background threads and event loops. After a write or read that failed
(or one Orbax swallowed: its metadata() returns None for damaged files), TensorStore's callbacks still run and hit
Orbax's closed event loop, each an "unraisable" RuntimeError("Event loop is closed") that Python prints from another
thread at any time; and once a command has failed, those threads raise more, and coroutines never awaited are warned
about at exit. Python reports all of these through three process-wide hooks, so they are replaced here, and only
here: sys.unraisablehook (once, keeping the previous hook for everything it doesn't route), and after a failure
threading.excepthook and warnings.showwarning too.

  closed_loop_to(path)   from now on, the closed-event-loop tracebacks go to `path` (returns the function that stops
                         it; the innermost route wins)
  everything_to(path)    from now on (a command failed), every unraisable exception, thread exception, warning and
                         asyncio error log goes to `path` (the first call of the process decides the file)
"""

import logging
import pathlib
import sys
import threading
import traceback
import warnings

_routes = []  # the files closed-event-loop tracebacks go to, innermost last
_state = {"previous": None, "everything": None}


class AppendOnWrite:
  """A text file appended to, opened (and its directory made) at the first write: no empty log files. A write that
  fails (the storage that failed the command may fail this too) is dropped: the command reports its own failure."""

  def __init__(self, path):
    self.path, self._file = pathlib.Path(path), None

  def write(self, text):
    try:
      if self._file is None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # pylint: disable=consider-using-with  (until exit)
      self._file.write(text)
      self._file.flush()
    except OSError:
      pass
    return len(text)

  def flush(self):
    pass


def _is_closed_loop(unraisable):
  return isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(unraisable.exc_value)


def _unraisable(unraisable):
  log = _state["everything"] or (_routes[-1] if _routes and _is_closed_loop(unraisable) else None)
  if log is None:
    _state["previous"](unraisable)
    return
  traceback.print_exception(unraisable.exc_value, file=log)


def _install():
  if _state["previous"] is None:
    _state["previous"] = sys.unraisablehook
    sys.unraisablehook = _unraisable


def closed_loop_to(path):
  """The closed-event-loop tracebacks go to the log at `path` until the returned function is called."""
  _install()
  log = AppendOnWrite(path)
  _routes.append(log)
  return lambda: _routes.remove(log) if log in _routes else None


def everything_to(path):
  """From now on every late traceback and warning of the process goes to the log at `path` (once per process: a
  later call keeps the first file)."""
  if _state["everything"] is not None:
    return
  _install()
  log = _state["everything"] = AppendOnWrite(path)
  threading.excepthook = lambda args: traceback.print_exception(args.exc_value, file=log)
  warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: log.write(
    warnings.formatwarning(message, category, filename, lineno, line)
  )
  asyncio_logger = logging.getLogger("asyncio")  # "Task exception was never retrieved", at garbage collection
  asyncio_logger.addHandler(logging.StreamHandler(log))
  asyncio_logger.propagate = False
