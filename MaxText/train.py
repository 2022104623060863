"""The training entry point: config -> precision plan -> a built run -> the step loop and its hooks (metrics, eval,
checkpoints, profiler, stops).

    python train.py [CONFIG.yml] [key=value ...]     (same as python -m MaxText.train ...)

Without a CONFIG.yml the run starts from the defaults (configs/base.yml), as MaxText's does; MaxText's
MaxText/configs/base.yml (any of its layouts) names that file. model_name=llama3-8b picks a model by name.

A mistake in the config or the environment is one line on stderr and exit code 2; SIGTERM is a clean stop
(exit 0), SIGINT too (exit 130), and before the run starts (start-up: jax loading, the config read) either one ends
the process at once with one line (exit 143 / 130); in a multi-process job, a process that dies or hangs is named in
one line by the others, which exit 75 (rerun to resume).
"""

import sys
import traceback

from MaxText import cli, config as config_lib
from MaxText.runtime import peers, preemption

USER_ERRORS = cli.USER_ERRORS
__all__ = ["USER_ERRORS", "main", "train"]


def train(cfg):
  """MaxText.trainer.run.train, imported at the first call: `python train.py` takes the stop signals (cli.run)
  before jax and the trainer load."""
  from MaxText.trainer.run import train as run_train  # pylint: disable=import-outside-toplevel

  return run_train(cfg)


def _train(argv):
  try:
    train(config_lib.load(*config_lib.split_argv(argv)))
  except cli.USER_ERRORS:
    raise
  except Exception:  # a bug; in a failed multi-process job, said without waiting for jax's shutdown
    if peers.failed():
      traceback.print_exc()
      peers.exit_if_failed(1)
    raise
  return preemption.exit_code() if preemption.requested() else 0


def main(argv=None):
  return cli.run(
    __doc__,
    argv,
    _train,
    after_user_error=lambda: peers.exit_if_failed(2),
    stopped="stopped during start-up, before training; nothing was written",
  )


if __name__ == "__main__":
  sys.exit(main())
