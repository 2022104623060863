"""configs/base.yml: every key with its default and doc, generated from the schema."""

import pathlib

import yaml

from MaxText.config.schema import SCHEMA


def write_base_yml(path):
  """configs/base.yml: every key with its default and doc, generated from SCHEMA."""
  lines = [
    "# All keys with their defaults. Generated from MaxText/config/schema.py SCHEMA:",
    "#   python -m MaxText.config > configs/base.yml",
    "",
  ]
  for name, key in SCHEMA.items():
    choices = f" [{', '.join(repr(c) if c == '' else str(c) for c in key.choices)}]" if key.choices else ""
    lines.append(f"# {key.doc}{choices}")
    lines.append(yaml.safe_dump({name: key.default}, default_flow_style=True).strip().strip("{}"))
  text = "\n".join(lines) + "\n"
  if path is None:
    return text
  pathlib.Path(path).write_text(text)
  return text
