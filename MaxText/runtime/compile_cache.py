"""JAX's persistent compilation cache (key jax_cache_dir): a restart loads what an earlier start compiled.

On by default, in one directory per user shared by every run and run name on the machine (entries are
keyed by the program, its compile options and the backend, so runs of different configs never mix). A
cache directory that can't be created or written, or a full disk, costs compile time, never the run:
it is a warning and the run compiles as if there were no cache.
"""

import functools
import os
import pathlib
import re
import tempfile
import warnings

import jax


def _writable(path):
  """None when `path` is (made) a directory we can write a file into, else why not."""
  try:
    pathlib.Path(path).mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
      pass
  except OSError as e:
    return e.strerror or str(e)
  return None


def _reset_if_moved(path):
  """JAX opens its cache once per process; a later run in the same process naming another directory
  (tests, benchmark harnesses) must reopen it there."""
  try:
    from jax._src import compilation_cache  # pylint: disable=import-outside-toplevel
  except ImportError:
    return
  if jax.config.jax_compilation_cache_dir != path and getattr(compilation_cache, "_cache", None) is not None:
    compilation_cache.reset_cache()


_CACHE_IO = re.compile(r"Error (writing|reading) persistent compilation cache entry .*?: (\w+: )?(.*)", re.S)


@functools.cache
def _one_line_cache_warnings():
  """JAX warns (several lines, once per program) when a cache entry can't be written or read (a full disk, a
  read-only directory): say it once, in one line; the run goes on compiling."""
  previous = warnings.showwarning

  def show(message, category, filename, lineno, file=None, line=None):
    found = _CACHE_IO.search(str(message))
    if found is None:
      return previous(message, category, filename, lineno, file, line)
    verb = {"writing": "write", "reading": "read"}[found.group(1)]
    _say_once(
      f"warning: compilation cache: can't {verb} entries in {jax.config.jax_compilation_cache_dir} "
      f"({found.group(3).strip().splitlines()[0][:120]}); compiling without them"
    )
    return None

  warnings.showwarning = show


@functools.cache
def _say_once(text):
  print(text, flush=True)


def configure(cache_dir):
  """Point JAX's persistent cache at `cache_dir` ('' turns it off); returns the directory used, or None."""
  if not cache_dir:
    _reset_if_moved(None)
    jax.config.update("jax_compilation_cache_dir", None)
    return None
  path = os.path.abspath(os.path.expandvars(os.path.expanduser(cache_dir)))
  problem = _writable(path)
  if problem is not None:
    print(
      f"warning: compilation cache {path} is not usable ({problem}): compiling without it; set "
      "jax_cache_dir to a writable directory (or '' to turn the cache off)",
      flush=True,
    )
    _reset_if_moved(None)
    jax.config.update("jax_compilation_cache_dir", None)
    return None
  _reset_if_moved(path)
  _one_line_cache_warnings()
  jax.config.update("jax_compilation_cache_dir", path)
  # Every program, however quick to compile: the train step of a small model compiles in seconds too,
  # and the whole point is that a restart compiles nothing it compiled before.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  return path
