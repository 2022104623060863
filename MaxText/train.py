"""The training entry point: python -m MaxText.train CONFIG.yml [key=value ...] (or python train.py ...)."""

import sys

from MaxText.trainer.loop import *  # noqa: F401,F403
from MaxText.trainer.loop import USER_ERRORS, main, train  # noqa: F401

if __name__ == "__main__":
  sys.exit(main())
