"""Which Transformer Engine is installed, beside the release scripts/te/requirements.txt pins (the one our te backend
is tested against). Reads the installed distributions' metadata only (no import, no GPU); the Dockerfile runs it on
the base image's TE.

  python scripts/te/check_version.py [--mode report|strict]

report (the default): one line naming both versions, exit 0 whatever they are -- the te backend checks at run time
what it needs from TE and refuses with one line where it is missing. strict: a TE other than the pinned release, or
none, stops with one line on stderr and exit code 2.
"""

import argparse
import importlib.metadata
import pathlib
import re
import sys

PINS = pathlib.Path(__file__).resolve().with_name("requirements.txt")
MODES = ("report", "strict")


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


def finding(version, cuda, found):
  """(matches, one line): what is installed against the pinned release."""
  install = f"pip install --no-build-isolation 'transformer_engine[jax,core_{cuda}]=={version}'"
  if not found:
    return False, f"no Transformer Engine is installed (tested: {version}); the te backend needs one: {install}"
  have = ", ".join(f"{d} {v}" for d, v in sorted(found.items()))
  if all(release(v) == version for v in found.values()):
    return True, f"Transformer Engine {have}: the release this project is tested against ({version})"
  return False, (
    f"Transformer Engine {have} is installed; this project is tested against {version} (scripts/te/requirements.txt): "
    f"the te backend checks what it needs when a run starts; to pin the tested release: {install}"
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
  parser.add_argument("--mode", default="report", help="report (default: name both versions, exit 0) or strict")
  args = parser.parse_args(argv)
  if args.mode not in MODES:
    print(f"error: --mode {args.mode!r} (TE_CHECK): use one of {', '.join(MODES)}", file=sys.stderr)
    return 2
  matches, line = finding(*pinned(), installed())
  if matches or args.mode == "report":
    print(line if matches else f"note: {line}")
    return 0
  print(f"error: {line} (TE_CHECK=strict; build with the default TE_CHECK=report to accept it)", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
