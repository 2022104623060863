"""What the command lines (train, decode, convert_hf) share: --help, logging, and a user's mistake as one line."""

import logging
import sys

from MaxText.errors import UserError
from MaxText.quantization.errors import QuantizationError

# What a command line prints as one line (exit code 2): the trainer's user errors and the quantization library's.
USER_ERRORS = (UserError, QuantizationError)


def run(doc, argv, command, *, after_user_error=None):
  """`command(argv)`'s exit code (None is 0), with the conventions of every command line here: no arguments or
  -h/--help print `doc`; a UserError or QuantizationError is `error: ...` on stderr and exit code 2 (after
  `after_user_error()`, if given); Ctrl-C before a command took the signal over is exit code 130."""
  argv = sys.argv[1:] if argv is None else argv
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
  if not argv or argv[0] in ("-h", "--help"):
    print(doc.strip())
    return 0 if argv else 2
  try:
    return command(argv) or 0
  except USER_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    if after_user_error is not None:
      after_user_error()
    return 2
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    return 130
