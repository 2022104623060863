"""UserError: a mistake the user can fix (or an environment fault they must), printed as one line, exit code 2; and
the storage faults every command line tells as one (a full disk, a file-size limit, a quota, permissions, a name too
long), from the operating system's errors or TensorStore's."""

import errno
import os
import re


class UserError(Exception):
  """What went wrong, where, and what to do: the CLI prints it as one line on stderr and exits 2."""


# What to do about each storage fault, by errno.
_ACCESS = "fix its permissions, or use a path you have access to"
STORAGE_ERRNOS = {
  errno.ENOSPC: "the filesystem is full: free space on it (or write elsewhere) and rerun",
  errno.EDQUOT: "your disk quota is used up: free space under it (or raise it) and rerun",
  errno.EFBIG: "the file outgrew the file-size limit (ulimit -f) or the largest file the filesystem takes: raise "
  "the limit or write elsewhere",
  errno.EACCES: _ACCESS,
  errno.EPERM: _ACCESS,
  errno.EROFS: "the filesystem is read-only: choose a writable place",
  errno.ENAMETOOLONG: "shorten the name (a file name holds at most 255 bytes, a path 4095)",
  errno.EIO: "the storage failed (input/output error): check the disk or the mount and rerun",
}
# TensorStore raises ValueError("<STATUS>: ... [os_error_code='28'] ...") (older builds: "[OS error: 28]").
_TENSORSTORE_STATUS = re.compile(r"^([A-Z][A-Z_]+): ")
_TENSORSTORE_OS_CODE = re.compile(r"\[os_error_code='?(\d+)'?\]|\[OS error: (\d+)\]|\bos error (\d+)\b")
_TENSORSTORE_PATH = re.compile(r'"(/[^"]+)"')
_TENSORSTORE_RESOURCE = ("RESOURCE_EXHAUSTED", "OUT_OF_RANGE", "PERMISSION_DENIED")


class StorageFault(UserError):
  """A storage fault on `path`: the file, the system's words for the cause, what to do (one line)."""

  def __init__(self, path, code, cause):
    self.path, self.errno, self.cause = path, code, cause
    self.advice = STORAGE_ERRNOS[code]
    super().__init__(f"{path or 'a file'}: {cause}: {self.advice}")

  def renamed(self, old_prefix, new_prefix):
    """The same fault with `path` under `new_prefix` instead of `old_prefix` (a staging directory's real name; where
    the fault named no file, `new_prefix` itself)."""
    path = self.path or str(new_prefix)
    if path == str(old_prefix) or path.startswith(f"{old_prefix}/"):
      path = str(new_prefix) + path[len(str(old_prefix)) :]
    return StorageFault(path, self.errno, self.cause)


def exception_chain(e):
  """`e` and the exceptions it was raised from or while handling, outermost first (no cycles; `from None` ends it)."""
  seen = []
  while e is not None and all(e is not s for s in seen):
    seen.append(e)
    e = e.__cause__ if e.__cause__ is not None or e.__suppress_context__ else e.__context__
  return seen


def _tensorstore_fault(message):
  if not _TENSORSTORE_STATUS.match(message):
    return None
  found = _TENSORSTORE_OS_CODE.search(message)
  code = int(next(g for g in found.groups() if g)) if found else None
  if code is None and message.startswith("RESOURCE_EXHAUSTED: "):
    code = errno.ENOSPC
  if code not in STORAGE_ERRNOS or not message.startswith(_TENSORSTORE_RESOURCE + ("UNKNOWN", "INTERNAL")):
    return None
  path = _TENSORSTORE_PATH.search(message)
  return StorageFault(path.group(1) if path else None, code, os.strerror(code))


def storage_fault(e):
  """The StorageFault an exception is (an OSError whose errno is a storage fault, or TensorStore's status error for
  one, anywhere in its chain), else None."""
  if isinstance(e, UserError):  # said already; a fault only if it is one
    return e if isinstance(e, StorageFault) else None
  for link in exception_chain(e):
    if isinstance(link, UserError):
      return link if isinstance(link, StorageFault) else None
    if isinstance(link, OSError) and link.errno in STORAGE_ERRNOS:
      path = None if link.filename is None else os.fsdecode(link.filename)
      return StorageFault(path, link.errno, link.strerror or os.strerror(link.errno))
    if isinstance(link, (ValueError, RuntimeError)):
      fault = _tensorstore_fault(str(link).strip())
      if fault is not None:
        return fault
  return None
