"""The training entry point: config -> precision plan -> a built run -> the step loop and its hooks (metrics, eval,
checkpoints, profiler, stops).

    python train.py [CONFIG.yml] [key=value ...]     (same as python -m MaxText.train ...)

Without a CONFIG.yml the run starts from the defaults (configs/base.yml), as MaxText's does; MaxText's
MaxText/configs/base.yml (any of its layouts) names that file. model_name=llama3-8b picks a model by name.

A mistake in the config or the environment is one line on stderr and exit code 2; SIGTERM is a clean stop
(exit 0), SIGINT too (exit 130); in a multi-process job, a process that dies or hangs is named in one line by the
others, which exit 75 (rerun to resume).
"""

import logging
import sys
import traceback

from MaxText import config as config_lib
from MaxText.errors import UserError
from MaxText.quantization.errors import QuantizationError
from MaxText.runtime import peers, preemption
from MaxText.trainer.run import train

# What the CLI prints as one line (exit code 2): the trainer's user errors and the quantization library's.
USER_ERRORS = (UserError, QuantizationError)
__all__ = ["USER_ERRORS", "main", "train"]


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
  if not argv or argv[0] in ("-h", "--help"):
    print(__doc__.strip())
    return 0 if argv else 2
  try:
    cfg = config_lib.load(*config_lib.split_argv(argv))
    train(cfg)
  except USER_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    peers.exit_if_failed(2)
    return 2
  except KeyboardInterrupt:  # Ctrl-C before the trainer took over the signal: nothing started
    print("interrupted", file=sys.stderr)
    return 130
  except Exception:  # a bug; in a failed multi-process job, said without waiting for jax's shutdown
    if peers.failed():
      traceback.print_exc()
      peers.exit_if_failed(1)
    raise
  return preemption.exit_code() if preemption.requested() else 0


if __name__ == "__main__":
  sys.exit(main())
