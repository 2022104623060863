"""What the hostile tests share: a command line run as a new user would run it (a subprocess, this checkout's code,
on the CPU), judged by the one-line promise, and the storage faults it runs under.

The promise: a mistake or a fault is `error: ...` alone on stderr and exit code 2; a stop signal is one line and exit
code 128 + its number (or, once training runs, a clean stop); never a traceback, a native abort or a crash; nothing
half-written left behind (no `.partial-*` or `.tmp` name). A logged warning is not an error line (it goes to stdout).
Signals are delivered at a defined point, not after a sleep: MAXTEXT_SIGNAL_AT=POINT:SIGNAL (MaxText/runtime/
preemption.py) makes the process send itself the signal when it reaches POINT (start, save, write).

Storage faults are real: a file-size limit (RLIMIT_FSIZE), a small tmpfs that is full or read-only (needs the right
to mount: else the case is skipped), a directory this process may not write (root without CAP_DAC_OVERRIDE, through
util-linux's setpriv; skipped without it)."""

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, cpu_subprocess_env
from tests.trainer.test_train import SMALL

SETPRIV = shutil.which("setpriv")
NO_DAC = [SETPRIV, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search", "--"]
DEBRIS = (".partial-", ".tmp")  # in the name of something a command half-wrote
TINY = [str(REPO / "configs" / "llama3_tiny.yml"), *SMALL]  # the suite's tiny model: its compilations are cached


def env(**extra):
  """The environment of a command: this checkout first on the path, one CPU device, the suite's compiler flags;
  `extra` set (None: removed)."""
  path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
  environ = cpu_subprocess_env(1, PYTHONUNBUFFERED="1", PYTHONPATH=path)
  environ.pop("MAXTEXT_SIGNAL_AT", None)
  for name, value in extra.items():
    if value is None:
      environ.pop(name, None)
    else:
      environ[name] = str(value)
  return environ


def module(name, *args):
  return [sys.executable, "-m", f"MaxText.{name}", *map(str, args)]


def train_py(*args):
  return [sys.executable, str(REPO / "train.py"), *map(str, args)]


def _limits(fsize):
  def apply():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as from a terminal (a background job of a shell ignores it)
    if fsize:
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of the process dying
      resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

  return apply


def run(argv, cwd=REPO, *, fsize=0, no_dac=False, timeout=900, **environ):
  """The finished command `argv` (stdout, stderr as text); `environ`: variables to set (None: to unset)."""
  argv = [str(a) for a in argv]
  if no_dac:
    if not SETPRIV:
      pytest.skip("no setpriv here to drop CAP_DAC_OVERRIDE")
    argv = NO_DAC + argv
  return subprocess.run(
    argv,
    cwd=cwd,
    env=env(**environ),
    capture_output=True,
    text=True,
    check=False,
    timeout=timeout,
    preexec_fn=_limits(fsize),
  )


def stderr_lines(proc):
  """The lines of its stderr that say something."""
  return [l for l in proc.stderr.splitlines() if l.strip()]


def assert_one_line(proc, code, needle="", prefix="error: "):
  """Exit code `code`, no traceback, and stderr one line starting with `prefix` and holding `needle`; the line."""
  lines = stderr_lines(proc)
  assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
  assert proc.returncode == code, f"exit {proc.returncode}, not {code}: {lines[-5:]}"
  assert len(lines) == 1, lines[:6]
  assert lines[0].startswith(prefix) and needle in lines[0], lines[0]
  return lines[0]


def debris(directory):
  """What a command half-wrote under `directory`: names holding `.partial-` or `.tmp`."""
  return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if any(d in p.name for d in DEBRIS))


@contextlib.contextmanager
def mounted(kind, where):
  """A 200 KB tmpfs at `where`: "full" (empty), "filled" (no byte left), "ro" (read-only), or "nearly" (24 KB left).
  Skips the test where this process may not mount."""
  where.mkdir()
  options = "size=200k,ro" if kind == "ro" else "size=200k"
  proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, check=False)
  if proc.returncode != 0:
    pytest.skip("no right to mount a tmpfs here")
  try:
    if kind == "nearly":
      (where / "filler").write_bytes(b"x" * ((200 - 24) * 1024))
    if kind == "filled":
      with contextlib.suppress(OSError), open(where / "filler", "wb") as f:
        while True:
          f.write(b"x" * 4096)
          f.flush()
    yield where
  finally:
    subprocess.run(["umount", str(where)], capture_output=True, check=False)
