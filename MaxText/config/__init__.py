"""The run configuration: every key's schema, loading (YAML, base_config, key=value overrides), validation and
derived values. Importable without JAX (submit.sh checks configs on login nodes)."""

from MaxText.config.schema import (INT32_MAX, MESH_AXES, RANGES, SCHEMA, Config, ConfigError, Key, RunShape,
                                   _check_number, check_job, load, parse_overrides, write_base_yml)

__all__ = ["INT32_MAX", "MESH_AXES", "RANGES", "SCHEMA", "Config", "ConfigError", "Key", "RunShape", "_check_number",
           "check_job", "load", "parse_overrides", "write_base_yml"]
