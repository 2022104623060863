"""An output directory written whole or not at all: refused if it holds anything, filled in a hidden temporary
directory beside it and renamed into place only when complete."""

import contextlib
import os
import pathlib
import re
import shutil

from MaxText.checkpointing.hf import HFError

# tensorstore reports storage faults as ValueError("<STATUS_CODE>: ...").
_STORAGE_FAULT = re.compile(r"^(RESOURCE_EXHAUSTED|PERMISSION_DENIED|UNAVAILABLE|DATA_LOSS|INTERNAL|UNKNOWN): ")


def check_output_dir(out_dir):
  """HFError unless `out_dir` is new or empty and can be made where it is (missing parents are made, as mkdir -p)."""
  out_dir = pathlib.Path(out_dir).absolute()
  if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
    raise HFError(f"output directory {out_dir} exists and is not empty; give a new directory (nothing was written)")
  existing = next(p for p in out_dir.parents if p.exists())
  if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
    raise HFError(f"output directory {out_dir} can't be made: {existing} is not a writable directory")


def _make_parents(out_dir):
  """Make `out_dir`'s missing parents; the topmost one made (to remove on failure), or None."""
  missing = [p for p in out_dir.parents if not p.exists()]
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  return missing[-1] if missing else None


@contextlib.contextmanager
def staged(out_dir):
  """A temporary directory beside `out_dir`, renamed to it on success and removed on any failure (with any parent
  directories made for it)."""
  out_dir = pathlib.Path(out_dir).absolute()
  check_output_dir(out_dir)
  made = _make_parents(out_dir)
  tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  try:
    tmp.mkdir()
    yield tmp
    if out_dir.exists():
      out_dir.rmdir()  # empty (checked above)
    tmp.rename(out_dir)
  except BaseException as e:
    shutil.rmtree(tmp, ignore_errors=True)
    for parent in out_dir.parents if made is not None else ():  # the directories this call made, while empty
      with contextlib.suppress(OSError):
        parent.rmdir()
      if parent == made:
        break
    if isinstance(e, OSError) or (isinstance(e, ValueError) and _STORAGE_FAULT.match(str(e))):
      reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:200]
      raise HFError(
        f"writing {out_dir} failed ({reason}); nothing was left behind: free space or fix permissions and rerun"
      ) from None
    raise
