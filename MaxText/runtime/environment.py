"""The environment variables the commands read through jax, checked before jax reads them, each mistake one line
naming the variable: JAX_PLATFORMS (a platform jax doesn't know, or one this machine can't start), XLA_FLAGS (a flag
or value XLA doesn't know makes XLA abort the process with its usage text, so it is tried in a child process first)
and XLA_PYTHON_CLIENT_MEM_FRACTION (the share of each GPU's memory jax's allocator takes). Importable without jax."""

import hashlib
import os
import re
import subprocess
import sys
import tempfile

from MaxText.errors import UserError

DEFAULT_MEM_FRACTION = 0.75  # jax's, when XLA_PYTHON_CLIENT_MEM_FRACTION is unset
# What XLA's flag parser says before it aborts (parse_flags_from_env.cc, command_line_flags.cc).
_UNKNOWN = re.compile(r"Unknown flags? in XLA_FLAGS: (.*)")
_BAD_VALUE = re.compile(r"Couldn't interpret value (.*) for flag (\S+?)\.?$")
_NOT_A_FLAG = re.compile(r'Could not open file "([^"]*)" to read flags')
_FATAL = re.compile(r"^F\d{4} [\d:.]+\s+\d+ [^\]]+\] (.*)")


class EnvError(UserError):
  """An environment variable jax or XLA would refuse, or a platform this machine can't start: one line."""


def check(environ=None):
  """XLA_PYTHON_CLIENT_MEM_FRACTION and XLA_FLAGS, before jax starts (JAX_PLATFORMS is start_backend's, where jax
  starts): EnvError naming the first one it would refuse."""
  environ = os.environ if environ is None else environ
  check_mem_fraction(environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"))
  check_xla_flags(environ.get("XLA_FLAGS", ""))


def check_mem_fraction(value):
  """XLA_PYTHON_CLIENT_MEM_FRACTION is a number in (0, 1]: jax's allocator takes that share of each GPU's memory,
  and the memory check (train.py, train_compile) counts on it."""
  if value is None:
    return
  try:
    fraction = float(value)
  except ValueError:
    fraction = None
  if fraction is None or not 0 < fraction <= 1:
    raise EnvError(
      f"XLA_PYTHON_CLIENT_MEM_FRACTION={value!r} must be a number in (0, 1]: the share of each GPU's memory jax's "
      f"allocator takes (unset: {DEFAULT_MEM_FRACTION}); e.g. XLA_PYTHON_CLIENT_MEM_FRACTION=0.9, or unset it"
    )


def _xla_parsed_already():
  """Whether XLA read XLA_FLAGS in this process already (jax started a backend): it doesn't read them again."""
  bridge = sys.modules.get("jax._src.xla_bridge")
  return bool(getattr(bridge, "_backends", None))


def _verdict_path(flags):
  """Where a passed check of `flags` under this jaxlib is remembered (a cache: the same flags pass again)."""
  try:
    import jaxlib  # pylint: disable=import-outside-toplevel

    lib = os.path.join(os.path.dirname(jaxlib.__file__), "_jax.so")
    stamp = f"{lib} {os.stat(lib).st_mtime_ns} {flags}"
  except (ImportError, OSError):
    return None
  digest = hashlib.sha256(stamp.encode()).hexdigest()[:32]
  return os.path.join(tempfile.gettempdir(), "maxtext_xla_flags_checked", digest)


def check_xla_flags(flags):
  """XLA_FLAGS as XLA's own parser reads it, in a child process (XLA aborts the process that parses a flag it doesn't
  know, or a value it can't read, after printing its usage): EnvError naming the flag."""
  if not flags.strip() or _xla_parsed_already():
    return
  remembered = _verdict_path(flags)
  if remembered is not None and os.path.exists(remembered):
    return
  try:
    child = subprocess.run(
      [sys.executable, "-c", "from jaxlib import _jax; _jax.CompileOptions()"],
      env={**os.environ, "XLA_FLAGS": flags},
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
    )
  except (OSError, subprocess.TimeoutExpired):
    return  # no verdict: jax reads the flags itself
  if child.returncode == 0:
    _remember(remembered)
    return
  raise EnvError(f"XLA_FLAGS={flags!r}: {_refusal(child.stderr)}")


def _remember(path):
  if path is None:
    return
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8"):
      pass
  except OSError:
    pass  # remembering is only a saving


def _refusal(stderr):
  """What XLA's parser said, as the rest of the line: the flag it refused and what to do."""
  lines = stderr.splitlines()
  for line in lines:
    found = _UNKNOWN.search(line)
    if found:
      names = found.group(1).strip()
      return (
        f"XLA has no flag {names} (it would abort on it); check its spelling against XLA's flags "
        "(xla/debug_options_flags.cc) or remove it"
      )
    found = _BAD_VALUE.search(line)
    if found:
      return f"XLA can't read the value {found.group(1)!r} of --{found.group(2)}; give a value of the flag's type"
    found = _NOT_A_FLAG.search(line)
    if found:
      return (
        f"{found.group(1)!r} doesn't start with '--' (XLA reads such a word as a file of flags); write each flag as "
        "--name=value"
      )
  fatal = next((m.group(1) for m in map(_FATAL.match, lines) if m), None)
  last = fatal or next((l for l in reversed(lines) if l.strip()), "it exited with an error")
  return f"XLA refuses it ({last.strip()[:200]}); fix or unset XLA_FLAGS"


def start_backend():
  """jax's devices, starting its backend: a platform JAX_PLATFORMS names that this machine can't start is one line
  (jax asserts, or raises with its own advice, and a plugin may print pages of tracebacks)."""
  import jax  # pylint: disable=import-outside-toplevel

  asked = os.environ.get("JAX_PLATFORMS", "")
  try:
    return jax.devices()
  except (RuntimeError, AssertionError) as e:  # jax asserts when JAX_PLATFORMS=cuda finds no NVIDIA GPU
    why = str(e).strip().splitlines()[0][:200] if str(e).strip() else "none of the platforms it names is present"
    raise EnvError(
      f"jax can't start JAX_PLATFORMS={asked!r} here ({why}); unset JAX_PLATFORMS to use what "
      "this machine has, or run where that platform is"
    ) from None
