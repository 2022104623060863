"""Sphinx configuration of the documentation site (`make docs`: Sphinx + MyST Markdown, as upstream MaxText's docs).

Warnings are errors (`make docs` passes -W): a broken link or anchor, a missing image, a page in no toctree. The key
reference and the results figures are generated before the pages are read (_ext/maxtext_docs.py)."""

import os
import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the plan figure loads configs; nothing needs an accelerator

project = "maxtext-nvfp4"
author = "the maxtext-nvfp4 developers"
copyright = "the maxtext-nvfp4 developers"  # noqa: A001 (Sphinx's name)

extensions = ["myst_parser", "maxtext_docs"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_generated/**", "_ext", "images"]
root_doc = "index"
nitpicky = True
smartquotes = False  # '' is an empty value in these pages, never a closing quote

myst_heading_anchors = 4  # "[...](page.md#a-heading)" links are checked against the headings
myst_enable_extensions = ["colon_fence", "deflist"]
suppress_warnings = []

html_theme = "sphinx_book_theme"
html_title = "maxtext-nvfp4"
html_theme_options = {
  "show_navbar_depth": 1,
  "show_toc_level": 2,
  "home_page_in_toc": True,
  "navigation_with_keys": False,
}
html_static_path = []
html_last_updated_fmt = None
