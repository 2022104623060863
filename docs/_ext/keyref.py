"""The configuration key reference as Markdown, generated from MaxText/config/schema.py (SCHEMA, RANGES, PATH_KEYS):
every key with its type, default, choices or range and doc, grouped by the schema's own `# -- section` comments."""

import math
import pathlib
import re

from MaxText.config import schema

SCHEMA_PY = pathlib.Path(schema.__file__)
_SECTION = re.compile(r"^\s*# -- (.+?)\s*$")
_KEY = re.compile(r'^\s*"(\w+)": Key\(')


def sections():
  """[(section title, [key names])] in the schema's order, from its `# -- title` comments; a key the source scan
  misses (an unusual spelling) lands in a last 'other' section, so none is ever left out."""
  out, seen = [], set()
  for line in SCHEMA_PY.read_text(encoding="utf-8").splitlines():
    if m := _SECTION.match(line):
      out.append((m.group(1), []))
    elif (m := _KEY.match(line)) and m.group(1) in schema.SCHEMA and out:
      out[-1][1].append(m.group(1))
      seen.add(m.group(1))
  missed = [k for k in schema.SCHEMA if k not in seen]
  if missed:
    out.append(("other", missed))
  return [(title, keys) for title, keys in out if keys]


def _code(text):
  """`text` as inline code inside a Markdown table cell (pipes escaped, backticks fenced)."""
  text = str(text).replace("|", "\\|")
  fence = "``" if "`" in text else "`"
  pad = " " if "`" in text else ""
  return f"{fence}{pad}{text}{pad}{fence}"


def _cell(text):
  return str(text).replace("|", "\\|").replace("\n", " ")


def default_text(key):
  if key.type is str:
    return "`''`" if key.default == "" else _code(key.default)
  if key.type is bool:
    return _code(str(key.default).lower())
  if key.type is float:
    return _code(f"{key.default:g}")
  return _code(key.default)


def values_text(name, key):
  """Choices (with MaxText's aliases), else the numeric range, else '-'; a path key says so."""
  parts = []
  if key.choices:
    parts.append(", ".join("`''`" if c == "" else _code(c) for c in key.choices))
  for theirs, ours in key.aliases:
    parts.append(f"{_code(theirs)} means {_code(ours)}")
  if name in schema.RANGES:
    parts.append(_span_text(schema.RANGES[name]))
  if name in schema.PATH_KEYS:
    parts.append("a path or URL (`~`, `$VAR` expanded)")
  return "; ".join(parts) or "-"


def _span_text(span):
  """'>= 1, at most 2147483647', '> 0' or 'in [0, 1)'."""
  low, high = schema._number(span.low), schema._number(span.high)
  if span.high == math.inf:
    return f"{'>' if span.low_open else '>='} {low}"
  if span.high in (schema.INT32_MAX, 2**32 - 1):
    return f"{'>' if span.low_open else '>='} {low}, at most {high}"
  return f"in {'(' if span.low_open else '['}{low}, {high}{')' if span.high_open else ']'}"


def doc_text(key):
  doc = _cell(key.doc)
  if key.no_effect:
    doc += f". **No effect here**: {_cell(key.no_effect)} (another value is one warning line)"
  return doc


def markdown():
  """The whole reference: a table per schema section."""
  lines = [
    f"{len(schema.SCHEMA)} keys, generated from `MaxText/config/schema.py` (`SCHEMA`, `RANGES`) when the site is "
    "built: edit the schema, never this page. `configs/base.yml` is the same list as YAML "
    "(`python -m MaxText.config > configs/base.yml`). Every value is checked when the config is loaded, before "
    "anything compiles; an int key without a listed range takes any int32, a float key any finite value.",
    "",
  ]
  for title, keys in sections():
    lines += [
      f"## {title[0].upper()}{title[1:]}",
      "",
      "| key | type | default | values | doc |",
      "|---|---|---|---|---|",
    ]
    for name in keys:
      key = schema.SCHEMA[name]
      row = [_code(name), key.type.__name__, default_text(key), values_text(name, key), doc_text(key)]
      lines.append("| " + " | ".join(row) + " |")
    lines.append("")
  return "\n".join(lines)


def missing_keys(text):
  """SCHEMA keys that have no row in `text` (a rendered reference): empty when it is complete."""
  rows = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.M))
  return [k for k in schema.SCHEMA if k not in rows]
