"""An output directory written whole or not at all: refused if it holds anything, filled in a hidden `.partial`
directory beside it and renamed into place only when complete; removed on any failure or stop signal, and what a
killed conversion left is removed by the next one (or named, while its process still runs)."""

import contextlib
import errno
import fcntl
import os
import pathlib
import re
import shutil

from MaxText.checkpointing.hf import HFError
from MaxText.errors import storage_fault
from MaxText.runtime import preemption

_PARTIAL = re.compile(r"\.partial-(\d+)$")


def partial_dir(out_dir, pid=None):
  """Where `out_dir` is written before it is complete: `.<name>.partial-<pid>` beside it."""
  return out_dir.parent / f".{out_dir.name}.partial-{os.getpid() if pid is None else pid}"


def check_output_dir(out_dir):
  """HFError unless `out_dir` is new or empty and can be made where it is (missing parents are made, as mkdir -p)."""
  out_dir = pathlib.Path(out_dir).absolute()
  try:
    os.stat(partial_dir(out_dir))  # a name too long for the filesystem fails here, before any work
  except (FileNotFoundError, NotADirectoryError):
    pass
  except OSError as e:
    raise _output_fault(out_dir, e) from None
  taken = out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir()))
  existing = next(p for p in out_dir.parents if p.exists())
  if taken:
    raise HFError(f"output directory {out_dir} exists and is not empty; give a new directory (nothing was written)")
  if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
    raise HFError(f"output directory {out_dir} can't be made: {existing} is not a writable directory")


def _output_fault(out_dir, e):
  fault = storage_fault(e)
  if fault is None:
    return HFError(f"output directory {out_dir}: {e.strerror or e} (nothing was written)")
  return HFError(f"output directory {fault.renamed(partial_dir(out_dir), out_dir)}; nothing was written")


def _make_parents(out_dir):
  """Make `out_dir`'s missing parents; the topmost one made (to remove on failure), or None."""
  missing = [p for p in out_dir.parents if not p.exists()]
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  return missing[-1] if missing else None


def _lock(path):
  """An open descriptor of directory `path` holding its flock (the kernel drops it when the process dies), or None
  where the filesystem has no flock; BlockingIOError when another process holds it."""
  fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    os.close(fd)
    if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF):
      return None
    raise
  return fd


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def remove_stale_partials(out_dir, log=print):
  """Removes the partial outputs of `out_dir` that conversions killed midway left (their flock is gone: the process
  died); HFError naming one whose process still writes it."""
  for path in sorted(out_dir.parent.glob(f".{out_dir.name}.partial-*")):
    found = _PARTIAL.search(path.name)
    if not found or not path.is_dir() or int(found.group(1)) == os.getpid():
      continue
    pid = int(found.group(1))
    try:
      fd = _lock(path)
    except BlockingIOError:
      fd, held = None, True
    except FileNotFoundError:
      continue  # its process just finished
    else:
      held = fd is None and _alive(pid)  # no flock here: the pid says
    if held:
      raise HFError(
        f"output directory {out_dir} is being written by process {pid} (into {path}); wait for it to finish or stop "
        "it, or give another directory (nothing was written)"
      )
    try:
      shutil.rmtree(path, ignore_errors=True)
    finally:
      if fd is not None:
        os.close(fd)
    log(f"removed {path}: the partial output of a conversion that was killed (process {pid}, no longer running)")


@contextlib.contextmanager
def staged(out_dir, log=print):
  """A `.partial` directory beside `out_dir`, renamed to it on success. On any failure, SIGTERM or SIGINT
  (preemption.raising) it is removed, with any parent directories made for it, and the error is the one that
  happened: a storage fault becomes one line naming the file."""
  out_dir = pathlib.Path(out_dir).absolute()
  check_output_dir(out_dir)
  try:
    remove_stale_partials(out_dir, log)
    made = _make_parents(out_dir)
  except OSError as e:
    raise _output_fault(out_dir, e) from None
  tmp, fd = partial_dir(out_dir), None
  with preemption.raising():
    try:
      shutil.rmtree(tmp, ignore_errors=True)
      tmp.mkdir()
      fd = _lock(tmp)
      yield tmp
      if out_dir.exists():
        out_dir.rmdir()  # empty (checked above)
      tmp.rename(out_dir)
    except BaseException as e:
      with preemption.ignored():  # a second signal doesn't cut the cleanup short
        _remove(tmp, made, out_dir)
      fault = storage_fault(e) if isinstance(e, Exception) else None
      if fault is not None:
        raise HFError(
          f"writing {fault.renamed(tmp, out_dir)}; nothing was written (the partial output was removed)"
        ) from None
      if isinstance(e, preemption.Stopped):
        e.message = f"{e}: {out_dir} was not written (the partial output was removed)"
      raise
    finally:
      if fd is not None:
        os.close(fd)


def _remove(tmp, made, out_dir):
  shutil.rmtree(tmp, ignore_errors=True)
  for parent in out_dir.parents if made is not None else ():  # the directories this call made, while empty
    with contextlib.suppress(OSError):
      parent.rmdir()
    if parent == made:
      break
