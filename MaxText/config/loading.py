"""Loading a Config: YAML files (with base_config inheritance, duplicate keys refused) and key=value overrides, each
value read by the schema; the Config is validated when it is made."""

import dataclasses
import os
import pathlib

import yaml

from MaxText.config.schema import PATH_KEYS, SCHEMA, ConfigError, Key, absolute_path, coerce, unknown_key
from MaxText.config.validation import validate


class _UniqueKeyLoader(yaml.SafeLoader):
  """safe_load that refuses a key given twice in one mapping (YAML would silently keep the last)."""

  def construct_mapping(self, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
      key = self.construct_object(key_node, deep=deep)
      if key in seen:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
      seen.add(key)
    return super().construct_mapping(node, deep)


def _load_yaml(path: pathlib.Path, seen=()):
  if not path.is_file():
    raise ConfigError(f"config file not found: {path}")
  if path.resolve() in seen:
    raise ConfigError(f"{path}: base_config cycle through {path.name}")
  try:
    raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
  except OSError as e:
    raise ConfigError(f"{path}: can't read the config file ({e.strerror or e})") from None
  except UnicodeDecodeError as e:
    raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); save the config as UTF-8") from None
  except yaml.YAMLError as e:
    line = getattr(getattr(e, "problem_mark", None), "line", None)
    at = f" line {line + 1}" if line is not None else ""
    raise ConfigError(f"{path}{at}: not valid YAML ({getattr(e, 'problem', e)})") from None
  if not isinstance(raw, dict):
    raise ConfigError(f"{path}: expected a mapping of key: value")
  values = {}
  base = raw.pop("base_config", None)
  if base:
    values.update(_load_yaml(path.parent / base, seen + (path.resolve(),)))
  for name, value in raw.items():
    if name not in SCHEMA:
      raise unknown_key(name, str(path))
    values[name] = coerce(name, value, str(path))
  return values


def parse_overrides(args):
  """['key=value', ...] -> {key: raw value}; errors name the argument."""
  out = {}
  for arg in args:
    name, sep, value = arg.partition("=")
    if not sep or not name:
      raise ConfigError(f"command line: expected key=value, got '{arg}'")
    if name not in SCHEMA:
      raise unknown_key(name, "command line")
    out[name] = value
  return out


def _replace(self, **changes):
  """A copy with keys changed (values coerced and validated like overrides)."""
  for name in changes:
    if name not in SCHEMA:
      raise unknown_key(name, "replace")
  return dataclasses.replace(self, **{n: coerce(n, v, "replace") for n, v in changes.items()})


def _field(key: Key):
  if isinstance(key.default, list):
    return dataclasses.field(default_factory=lambda d=key.default: list(d))
  return dataclasses.field(default=key.default)


# A validated run configuration: every SCHEMA key as a frozen attribute.
Config = dataclasses.make_dataclass(
  "Config",
  [(n, k.type, _field(k)) for n, k in SCHEMA.items()],
  frozen=True,
  namespace={
    "__post_init__": lambda self: validate(self),
    "replace": _replace,
    "to_dict": lambda self: {n: getattr(self, n) for n in SCHEMA},
  },
)


def load(config_path, overrides=()):
  """The validated Config from a YAML file (with base_config inheritance) and key=value overrides."""
  values = {n: absolute_path(k.default) if n in PATH_KEYS else k.default for n, k in SCHEMA.items()}
  values.update(_load_yaml(pathlib.Path(os.path.expanduser(str(config_path)))))
  for name, raw in parse_overrides(overrides).items():
    values[name] = coerce(name, raw, "command line")
  return Config(**values)
