"""The run configuration: every key's schema (schema.py), loading YAML files with base_config and key=value
overrides (loading.py), checks across keys (validation.py), derived values (derived.py) and the generated
configs/base.yml (base_yml.py); `python -m MaxText.config` prints base.yml or --checks a config. Importable
without JAX (submit.sh checks configs on login nodes)."""

from MaxText.config import models
from MaxText.config.base_yml import write_base_yml
from MaxText.config.derived import RunShape
from MaxText.config.loading import Config, load, parse_overrides, split_argv
from MaxText.config.schema import INT32_MAX, MESH_AXES, PATH_KEYS, RANGES, SCHEMA, ConfigError, Key, absolute_path
from MaxText.config.validation import check_job

__all__ = [
  "INT32_MAX",
  "MESH_AXES",
  "PATH_KEYS",
  "RANGES",
  "SCHEMA",
  "Config",
  "ConfigError",
  "Key",
  "RunShape",
  "absolute_path",
  "check_job",
  "load",
  "models",
  "parse_overrides",
  "split_argv",
  "write_base_yml",
]
