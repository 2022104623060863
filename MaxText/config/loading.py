"""Loading a Config: YAML files (with base_config inheritance, duplicate keys refused) and key=value overrides, each
value read by the schema; the Config is validated when it is made."""

import dataclasses
import os
import pathlib
import sys

import yaml

from MaxText.config import compat, models
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
  """[(key, raw value, where, is_defaults)] of a YAML file after those of the files it inherits (base_config) in
  order. Values are read by the schema in `load`, once it knows which one wins.

  A file named base.yml is the defaults layer, as MaxText's base.yml: beneath a named model's definition. Every other
  file sets its keys above it, like the command line."""
  if path.is_dir():
    found = sorted(p.name for p in path.glob("*.yml"))[:4]
    raise ConfigError(
      f"config file {path} is a directory; give a YAML file" + (f" (in it: {', '.join(found)}, ...)" if found else "")
    )
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
  entries = []
  base = raw.pop("base_config", None)
  if base:
    entries += _load_yaml(path.parent / base, seen + (path.resolve(),))
  for name, value in raw.items():
    name = _known(name, str(path), value)
    if name is not None:
      entries.append((name, value, str(path), path.name == "base.yml"))
  return entries


def _known(name, where, value=None):
  """`name` as a key here (MaxText's renamed keys under ours); None for a MaxText key this trainer lacks whose value
  means the same here (compat.ignored); ConfigError for any other name."""
  name = compat.RENAMED.get(name, name)
  if name in SCHEMA:
    return name
  try:
    reason = compat.ignored(name, value, where)
  except KeyError:
    raise unknown_key(name, where) from None
  if reason:
    raise ConfigError(reason)
  return None


def parse_overrides(args):
  """['key=value', ...] -> {key: raw value}; errors name the argument."""
  out = {}
  for arg in args:
    name, sep, value = arg.partition("=")
    if not sep or not name:
      raise ConfigError(f"command line: expected key=value, got '{arg}'")
    name = _known(name, "command line", value)
    if name is not None:
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


def _model(values, explicit):
  """The named model's definition (None for 'default'); ConfigError for an unknown name, or for a model key set to
  another value than the model's without override_model_config=true (MaxText's rule)."""
  name = values["model_name"]
  try:
    model = models.definition(name)
  except KeyError:
    where = explicit.get("model_name", (None, "model_name"))[1]
    raise ConfigError(
      f"{where}: model_name={name!r} is not a model here; known: {', '.join(models.known_names())}"
    ) from None
  if model is None or values["override_model_config"]:
    return model
  for key, (value, where) in explicit.items():
    if key in model and value != model[key]:
      raise ConfigError(
        f"{where}: {key}={value} differs from model_name={name}'s {key}={model[key]}: a named model's keys are "
        "its own (MaxText's rule); drop it, set override_model_config=true, or use model_name=default and set the "
        "model keys yourself"
      )
  return model


def load(config_path=None, overrides=()):
  """The validated Config from a YAML file (with base_config inheritance; None: the defaults alone, as MaxText
  without a YAML) and key=value overrides.

  Precedence, lowest first: the schema's defaults, base.yml files, the named model's definition (model_name), other
  YAML files, the command line."""
  values = {n: absolute_path(k.default) if n in PATH_KEYS else k.default for n, k in SCHEMA.items()}
  entries = []
  if config_path is not None:
    entries = _load_yaml(pathlib.Path(os.path.expanduser(str(compat.config_path(config_path)))))
  for name, raw in parse_overrides(overrides).items():
    entries.append((name, raw, "command line", False))
  # Only the value that wins is read and checked (a later file or the command line overrides an earlier value, bad
  # or not, as in MaxText); an error names where the winning value was given.
  defaults = {n: (v, where) for n, v, where, is_defaults in entries if is_defaults}
  explicit = {n: (v, where) for n, v, where, is_defaults in entries if not is_defaults}
  explicit = {n: (coerce(n, v, where), where) for n, (v, where) in explicit.items()}
  defaults = {n: coerce(n, v, where) for n, (v, where) in defaults.items() if n not in explicit}
  values.update(defaults)
  values.update({n: v for n, (v, _) in explicit.items() if n in ("model_name", "override_model_config")})
  values.update(_model(values, explicit) or {})
  values.update({n: v for n, (v, _) in explicit.items()})
  values.update(compat.maxtext_values(values, explicit))
  cfg = Config(**values)
  for name, key in SCHEMA.items():
    if key.no_effect and getattr(cfg, name) != key.default:
      value = str(getattr(cfg, name)).lower() if key.type is bool else getattr(cfg, name)
      print(f"warning: {name}={value} has no effect here: {key.no_effect}", file=sys.stderr, flush=True)
  return cfg


def split_argv(argv):
  """(config file or None, [key=value, ...]) of a command line: the first argument is a config file unless it is a
  key=value (no YAML: the defaults, as MaxText)."""
  if argv and "=" not in argv[0]:
    return argv[0], list(argv[1:])
  return None, list(argv)
