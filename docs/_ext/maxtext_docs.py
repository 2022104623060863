"""The site's Sphinx extension: before the pages are read, writes docs/_generated/ (the key reference from SCHEMA, the
figures and results tables from the repository's data) and fails the build where the committed README picture
(docs/images/precision_plan.svg) is not what the plan draws today."""

import pathlib

from sphinx.errors import ExtensionError

import figures
import keyref

DOCS = pathlib.Path(__file__).resolve().parents[1]
GENERATED = DOCS / "_generated"


def generate(app):
  """docs/_generated/: keys.md (every SCHEMA key; the build stops if one is missing) and results/ (figures.py)."""
  GENERATED.mkdir(exist_ok=True)
  text = keyref.markdown()
  missing = keyref.missing_keys(text)
  if missing:
    raise ExtensionError(f"the key reference lacks {', '.join(missing)}")
  _write_if_changed(GENERATED / "keys.md", text)
  figures.generate(GENERATED)
  drawn = (GENERATED / "results" / "precision_plan.svg").read_text(encoding="utf-8")
  if figures.README_FIGURE.read_text(encoding="utf-8") != drawn:
    raise ExtensionError(
      f"{figures.README_FIGURE.relative_to(figures.REPO)} is not the plan drawn today: "
      "run `python docs/_ext/figures.py --readme-figure` and commit it"
    )


def _write_if_changed(path, text):
  if not path.exists() or path.read_text(encoding="utf-8") != text:
    path.write_text(text, encoding="utf-8")


def setup(app):
  app.connect("builder-inited", generate)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
