"""What the command lines (train, train_compile, decode, convert_hf) share: --help, logging, the environment checked,
and a user's mistake, a storage fault or a stop signal as one line."""

import logging
import signal
import sys

from MaxText.errors import UserError, storage_fault
from MaxText.quantization.errors import QuantizationError
from MaxText.runtime import environment, preemption

# What a command line prints as one line (exit code 2): the trainer's user errors and the quantization library's.
USER_ERRORS = (UserError, QuantizationError)
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def run(doc, argv, command, *, after_user_error=None, stopped="stopped; nothing was written"):
  """`command(argv)`'s exit code (None is 0), with the conventions of every command line here: no arguments or
  -h/--help print `doc`; a UserError or QuantizationError, a storage fault wherever it is raised (a full disk, a
  file-size limit, a quota, permissions, a name too long: errors.storage_fault) and an environment variable jax or XLA
  would refuse (runtime/environment.py) is `error: ...` on stderr and exit code 2 (after `after_user_error()`, if
  given); a stop signal before a command takes the signals over (from this first line: preemption.exit_on_signals)
  is `<SIGNAL>: <stopped>` and exit code 128 + its number, as is one a command raises as an exception
  (preemption.raising). Logged warnings go to stdout with the command's other lines: stderr holds the error alone."""
  with preemption.exit_on_signals(stopped):
    preemption.point("start")
    argv = sys.argv[1:] if argv is None else argv
    _log_to_stdout()
    if not argv or argv[0] in ("-h", "--help"):
      print(doc.strip())
      return 0 if argv else 2
    try:
      environment.check()
      return command(argv) or 0
    except Exception as e:  # pylint: disable=broad-except  (re-raised unless it is one of the two kinds said in a line)
      error = e if isinstance(e, USER_ERRORS) else storage_fault(e)
      if error is None:
        raise
      print(f"error: {error}", file=sys.stderr, flush=True)
      if after_user_error is not None:
        after_user_error()
      return 2
    except KeyboardInterrupt as e:
      print(getattr(e, "message", None) or str(e) or "interrupted", file=sys.stderr, flush=True)
      return 128 + getattr(e, "signum", signal.SIGINT)


def _log_to_stdout():
  """Log records (WARNING and up) on stdout, MaxText's format; also where a library's first log call already set
  up Python's default handler on stderr (absl does, at import)."""
  defaults = [h for h in logging.root.handlers if type(h) is logging.StreamHandler and h.stream is sys.stderr]
  for handler in defaults:
    handler.setStream(sys.stdout)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
  logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, stream=sys.stdout)
