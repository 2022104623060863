"""One owner per run directory: an advisory lock plus the owner's host and pid, taken before anything is written.

Two trainers writing one run directory would interleave metrics and fight over checkpoints (seen: both
crash and no checkpoint survives). The lock is `flock` on `<run dir>/.lock`, released by the kernel
when its process dies however it dies, so a lock left by a dead process never blocks. Where the
filesystem has no flock (some network filesystems), the file itself is the lock: created exclusively,
naming host and pid, and taken over when that pid is gone on this host.
"""

import errno
import fcntl
import json
import os
import socket
import time

from MaxText.errors import UserError


class RunLockError(UserError):
  """The run directory belongs to another live process: a user error."""


def _owner_record():
  return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _describe(path):
  try:
    with open(path, encoding="utf-8") as f:
      owner = json.load(f)
    return f"pid {owner['pid']} on {owner['host']} (since {owner['since']})"
  except (OSError, ValueError, KeyError, TypeError):
    return "another process"


def _refusal(run_dir, path):
  return RunLockError(
    f"run directory {run_dir} is in use by {_describe(path)}; wait for it to finish, stop it, or pick another run_name"
  )


def _alive_here(owner):
  if owner.get("host") != socket.gethostname():
    return True  # can't tell from here: assume it lives
  try:
    os.kill(int(owner["pid"]), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, ValueError, KeyError, TypeError):
    return True
  return True


class RunLock:
  """Held from `acquire()` to `release()` (or process exit)."""

  def __init__(self, run_dir):
    self.run_dir = run_dir
    self.path = os.path.join(run_dir, ".lock")
    self._fd = None
    self._exclusive_file = False

  def acquire(self):
    os.makedirs(self.run_dir, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise _refusal(self.run_dir, self.path) from None
      if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
        return self._acquire_by_file()
      raise
    try:
      os.ftruncate(fd, 0)
      os.write(fd, json.dumps(_owner_record()).encode("utf-8"))
      os.fsync(fd)
    except OSError as e:  # a full disk: said naming the file (a write to a descriptor names none)
      os.close(fd)
      raise OSError(e.errno, e.strerror, self.path) from None
    self._fd = fd
    return self

  def _acquire_by_file(self):
    """No flock here: the lock file's contents say who owns it; a dead owner on this host is taken over."""
    try:
      with open(self.path, encoding="utf-8") as f:
        owner = json.load(f)
    except (OSError, ValueError):
      owner = None
    if owner and owner.get("pid") != os.getpid() and _alive_here(owner):
      raise _refusal(self.run_dir, self.path)
    with open(self.path, "w", encoding="utf-8") as f:
      json.dump(_owner_record(), f)
    self._exclusive_file = True
    return self

  def release(self):
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None
    if self._exclusive_file:
      try:
        os.remove(self.path)
      except OSError:
        pass
      self._exclusive_file = False

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
