"""Tests of the documentation site's generators (docs/_ext/, put on sys.path here: docs/ is not a package)."""

import sys

from tests.conftest import REPO

if str(REPO / "docs" / "_ext") not in sys.path:
  sys.path.insert(0, str(REPO / "docs" / "_ext"))
