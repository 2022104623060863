"""docs/precision/recipes.md has one row for every quantization value the config accepts, and no row for one it
doesn't."""

import re

from MaxText.quantization.recipes import ALIASES, recipe_names
from tests.conftest import REPO

PAGE = REPO / "docs" / "precision" / "recipes.md"


def _rows():
  """{first cell's names: the row} of the page's recipe table."""
  rows = {}
  lines = PAGE.read_text(encoding="utf-8").splitlines()
  body = lines[lines.index(next(line for line in lines if line.startswith("|---"))) + 1 :]
  for line in body:
    if line.startswith("| `"):
      first = line.split("|")[1]
      for name in re.findall(r"`([^`]*)`", first):
        rows[name.strip('"')] = line
  return rows


def test_every_recipe_and_alias_has_a_row():
  rows = _rows()
  accepted = {n for n in recipe_names() if n} | set(ALIASES)
  assert accepted <= set(rows) | {""}, sorted(accepted - set(rows))
  assert set(rows) - {""} <= accepted, sorted(set(rows) - accepted)


def test_every_row_fills_every_column():
  for name, line in _rows().items():
    assert line.count("|") == 8, name  # 7 columns
    assert all(cell.strip() for cell in line.split("|")[1:-1]), name
