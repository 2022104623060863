"""python -m MaxText.config: print configs/base.yml, or --check a config (and its mesh against a job's size)
without JAX (submit.sh runs it on login nodes)."""

import sys

from MaxText.config.base_yml import write_base_yml
from MaxText.config.loading import load, split_argv
from MaxText.config.schema import ConfigError
from MaxText.config.validation import check_job

USAGE = """usage: python -m MaxText.config                  print configs/base.yml (every key, its default and doc)
       python -m MaxText.config --check [--nodes N --gpus-per-node G] [CONFIG] [key=value ...]
           validate a config (and that its mesh fits a job of N nodes x G GPUs); needs pyyaml, not jax"""


def _check_cli(args):
  """--check's arguments -> (config path, overrides, nodes or None, GPUs per node or None)."""
  job = {"--nodes": None, "--gpus-per-node": None}
  while args and args[0] in job:
    if len(args) < 2 or not args[1].isdigit() or int(args[1]) < 1:
      raise ConfigError(f"{args[0]} needs a positive integer")
    job[args[0]], args = int(args[1]), args[2:]
  if not args or args[0].startswith("-"):
    raise ConfigError(
      "--check needs a config file or key=value overrides: python -m MaxText.config --check [--nodes N "
      "--gpus-per-node G] [CONFIG] [key=value ...]"
    )
  path, overrides = split_argv(args)
  return path, overrides, job["--nodes"], job["--gpus-per-node"]


def main(argv):
  if argv[:1] in (["-h"], ["--help"]):
    print(USAGE)
    return 0
  if argv[:1] != ["--check"]:
    if argv:
      print(f"error: unknown argument {argv[0]!r}\n{USAGE}", file=sys.stderr)
      return 2
    print(write_base_yml(None), end="")
    return 0
  try:
    path, overrides, nodes, gpus = _check_cli(argv[1:])
    cfg = load(path, overrides)
    if nodes or gpus:
      check_job(cfg, nodes or 1, gpus or 1)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print("config ok")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
