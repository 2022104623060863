"""Thin entry point: python train.py CONFIG.yml [key=value ...] (same as python -m MaxText.train)."""

import sys

from MaxText.train import main

if __name__ == "__main__":
  sys.exit(main())
