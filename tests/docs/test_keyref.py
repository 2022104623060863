"""docs/_ext/keyref.py: the key reference has a row for every SCHEMA key, in the schema's sections, with its type,
default, values (choices, MaxText's aliases, RANGES) and doc."""

import re

import keyref
from MaxText.config import schema
from MaxText.quantization.recipes import recipe_names


def _rows(text):
  """{key: [type, default, values, doc]} from the rendered tables (cells split on unescaped pipes)."""
  rows = {}
  for line in text.splitlines():
    m = re.match(r"^\| `(\w+)` \| (.*) \|$", line)
    if m:
      rows[m.group(1)] = [c.strip() for c in re.split(r"(?<!\\) \| ", m.group(2))]
  return rows


def test_every_key_has_one_row_with_its_type_and_doc():
  text = keyref.markdown()
  rows = _rows(text)
  assert list(rows) == [k for _, keys in keyref.sections() for k in keys]
  assert set(rows) == set(schema.SCHEMA) and len(rows) == len(schema.SCHEMA)
  for name, key in schema.SCHEMA.items():
    type_, _, _, doc = rows[name]
    assert type_ == key.type.__name__, name
    assert doc.startswith(key.doc.replace("|", "\\|")), name
  assert keyref.missing_keys(text) == []


def test_a_missing_row_is_found():
  text = keyref.markdown()
  without = "\n".join(line for line in text.splitlines() if not line.startswith("| `learning_rate` |"))
  assert keyref.missing_keys(without) == ["learning_rate"]


def test_sections_follow_the_schema_comments():
  titles = [t for t, _ in keyref.sections()]
  assert titles[:4] == ["run", "batch", "optimizer", "precision"]
  assert keyref._split_title("decode (python -m MaxText.decode)") == ("Decode", "(python -m MaxText.decode)")
  assert keyref._split_title("keys that do nothing: accepted") == ("Keys that do nothing", "Accepted")
  placed = [k for _, keys in keyref.sections() for k in keys]
  assert sorted(placed) == sorted(schema.SCHEMA)
  assert dict(keyref.sections())["optimizer"][0] == "learning_rate"


def test_defaults_values_and_ranges():
  rows = _rows(keyref.markdown())
  assert rows["steps"][1:3] == ["`100`", ">= 1, at most 2147483647"]
  assert rows["seed"][2] == ">= 0, at most 4294967295"
  assert rows["adam_b1"][1:3] == ["`0.9`", "in [0, 1)"]
  assert rows["learning_rate"][1:3] == ["`0.0003`", ">= 0"]
  assert rows["adam_eps"][2] == "> 0"
  assert rows["dry_run"][1] == "`false`"
  assert rows["run_name"][1] == "`''`"
  assert rows["base_output_directory"][2] == "a path or URL (`~`, `$VAR` expanded)"
  quantization = rows["quantization"][2]
  assert quantization.startswith("`''`, ")
  assert all(f"`{name}`" in quantization for name in recipe_names())
  assert "`cudnn_flash_te` means `cudnn_flash`" in rows["attention"][2]


def test_keys_without_effect_say_so():
  rows = _rows(keyref.markdown())
  no_effect = [n for n, k in schema.SCHEMA.items() if k.no_effect]
  assert no_effect
  for name in no_effect:
    assert "**No effect here**" in rows[name][3], name
