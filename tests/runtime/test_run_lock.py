"""One owner per run directory: a live owner refuses others (named), a dead owner's lock never blocks."""

import os
import subprocess
import sys

import pytest

from MaxText.runtime import run_lock
from tests.conftest import REPO


def _hold(run_dir):
  """A process that takes the lock, says so, and waits for stdin to close."""
  code = (
    f"import sys; from MaxText.runtime import run_lock; lock = run_lock.RunLock({str(run_dir)!r}).acquire(); "
    "print('held', flush=True); sys.stdin.read()"
  )
  proc = subprocess.Popen(
    [sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
  )
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_a_live_owner_refuses_a_second_one_and_is_named(tmp_path):
  owner = _hold(tmp_path / "run")
  try:
    with pytest.raises(run_lock.RunLockError, match=rf"is in use by pid {owner.pid} on .*pick another run_name"):
      run_lock.RunLock(str(tmp_path / "run")).acquire()
  finally:
    owner.stdin.close()
    owner.wait(timeout=30)
  run_lock.RunLock(str(tmp_path / "run")).acquire().release()  # free once it exits


def test_a_killed_owner_leaves_no_lock(tmp_path):
  owner = _hold(tmp_path / "run")
  owner.kill()
  owner.wait(timeout=30)
  assert (tmp_path / "run" / ".lock").exists()  # the file stays; the kernel dropped the lock with the process
  with run_lock.RunLock(str(tmp_path / "run")) as lock:
    assert f'"pid": {os.getpid()}' in open(lock.path, encoding="utf-8").read()


def test_without_flock_a_dead_pid_on_this_host_is_taken_over(tmp_path):
  lock = run_lock.RunLock(str(tmp_path))
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  (tmp_path / ".lock").write_text(
    '{"host": "%s", "pid": %s, "since": "then"}' % (os.uname().nodename, dead.stdout.strip())
  )
  assert lock._acquire_by_file() is lock  # pylint: disable=protected-access
  (tmp_path / ".lock").write_text('{"host": "%s", "pid": 1, "since": "then"}' % os.uname().nodename)  # alive
  with pytest.raises(run_lock.RunLockError, match="in use by pid 1"):
    run_lock.RunLock(str(tmp_path))._acquire_by_file()  # pylint: disable=protected-access
