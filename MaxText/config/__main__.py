"""python -m MaxText.config: print configs/base.yml, or --check a config (see USAGE)."""

import sys

from MaxText.config.schema import main

sys.exit(main(sys.argv[1:]))
