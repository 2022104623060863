"""Is the installed Transformer Engine the release scripts/te/requirements.txt pins? Reads the installed distributions'
metadata only (no import, no GPU): the Dockerfile runs it on the base image's TE; `--warn` reports without failing.

  python scripts/te/check_version.py [--warn]
"""

import argparse
import importlib.metadata
import pathlib
import re
import sys

PINS = pathlib.Path(__file__).resolve().with_name("requirements.txt")


def pinned():
  """(version, CUDA suffix) of transformer-engine-cuXX==version in requirements.txt."""
  match = re.search(r"^transformer-engine-(cu\d+)==([\d.]+)\s*$", PINS.read_text(), re.M)
  if not match:
    raise SystemExit(f"error: {PINS} pins no transformer-engine-cuXX==VERSION")
  return match.group(2), match.group(1)


def installed():
  """{distribution: version} of the Transformer Engine distributions present (a source build is one,
  'transformer_engine'; PyPI's are the metapackage, the core wheel and transformer_engine_jax)."""
  found = {}
  for dist in importlib.metadata.distributions():
    name = re.sub(r"[-_.]+", "_", (dist.metadata["Name"] or "").lower())
    if name == "transformer_engine" or name.startswith(("transformer_engine_cu", "transformer_engine_jax")):
      found[name] = dist.version
  return found


def release(version):
  """2.20.2 of 2.20.2, 2.20.2.post1 or a source build's 2.20.2.dev0+abc1234 / 2.20.2+abc1234."""
  return re.match(r"\d+(?:\.\d+)*", version).group(0)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--warn", action="store_true", help="report a mismatch as a warning (exit 0)")
  args = parser.parse_args(argv)
  version, cuda = pinned()
  found = installed()
  install = f"pip install --no-build-isolation 'transformer_engine[jax,core_{cuda}]=={version}'"
  if not found:
    problem = f"no Transformer Engine is installed (this project pins {version}); install it with: {install}"
  else:
    wrong = {d: v for d, v in found.items() if release(v) != version}
    if not wrong:
      print(f"Transformer Engine {version} ({', '.join(sorted(found))}): the release scripts/te/requirements.txt pins")
      return 0
    problem = (
      f"Transformer Engine {', '.join(f'{d} {v}' for d, v in sorted(wrong.items()))} is installed, but this "
      f"project pins {version} (scripts/te/requirements.txt), the release its te backend is tested against; "
      f"install it ({install}), or accept this one (Docker: --build-arg TE_CHECK=warn)"
    )
  if args.warn:
    print(f"warning: {problem}")
    return 0
  print(f"error: {problem}", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
