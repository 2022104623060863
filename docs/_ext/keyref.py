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
  """[(section title, [key names])] in SCHEMA's order, from its `# -- title` comments: a key the source scan doesn't
  see by name (one made by a comprehension, such as the mesh keys) joins the section of the key before it."""
  titles, section_of = [], {}
  for line in SCHEMA_PY.read_text(encoding="utf-8").splitlines():
    if m := _SECTION.match(line):
      titles.append(m.group(1))
    elif (m := _KEY.match(line)) and titles:
      section_of[m.group(1)] = titles[-1]
  keys_of = {t: [] for t in titles or ["keys"]}
  current = next(iter(keys_of))
  for name in schema.SCHEMA:
    current = section_of.get(name, current)
    keys_of[current].append(name)
  return [(title, keys) for title, keys in keys_of.items() if keys]


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


def _split_title(title):
  """A schema section comment as (heading, the rest as a sentence): 'decode (python -m ...)' -> ('Decode',
  '(python -m ...)'); 'x that do nothing here: accepted, ...' -> ('X that do nothing here', 'Accepted, ...')."""
  cut = min((i for i in (title.find(" ("), title.find(": ")) if i > 0), default=len(title))
  heading, rest = title[:cut], title[cut:].lstrip(": ").strip()
  rest = rest[0].upper() + rest[1:] if rest and rest[0] != "(" else rest
  return heading[0].upper() + heading[1:], rest


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
    heading, note = _split_title(title)
    lines += [f"## {heading}", ""] + ([note, ""] if note else [])
    lines += ["| key | type | default | values | doc |", "|---|---|---|---|---|"]
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
