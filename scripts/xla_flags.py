"""The XLA flags for NVIDIA GPUs (MaxText/runtime/xla_flags.py, where they live): this script prints them.

python3 scripts/xla_flags.py TOTAL_GPUS      # prints them (no jax needed), as train.sbatch does
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from MaxText.runtime.xla_flags import *  # noqa: E402,F401,F403  (the benchmarks import this module)
from MaxText.runtime.xla_flags import main  # noqa: E402

if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
