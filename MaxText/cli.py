"""What the command lines (train, decode, convert_hf) share: --help, logging, and a user's mistake, a storage fault or
a stop signal as one line."""

import logging
import signal
import sys

from MaxText.errors import UserError, storage_fault
from MaxText.quantization.errors import QuantizationError

# What a command line prints as one line (exit code 2): the trainer's user errors and the quantization library's.
USER_ERRORS = (UserError, QuantizationError)


def run(doc, argv, command, *, after_user_error=None):
  """`command(argv)`'s exit code (None is 0), with the conventions of every command line here: no arguments or
  -h/--help print `doc`; a UserError or QuantizationError, and a storage fault wherever it is raised (a full disk, a
  file-size limit, a quota, permissions, a name too long: errors.storage_fault), is `error: ...` on stderr and exit
  code 2 (after `after_user_error()`, if given); Ctrl-C before a command took the signal over is exit code 130, and
  a signal a command raises as an exception (preemption.raising) is its line and exit code 128 + its number."""
  argv = sys.argv[1:] if argv is None else argv
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
  if not argv or argv[0] in ("-h", "--help"):
    print(doc.strip())
    return 0 if argv else 2
  try:
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
