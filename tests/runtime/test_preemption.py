"""Clean stops: SIGTERM/SIGINT request a stop (exit status 0 / 130), a second signal ends the process at once."""

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from MaxText.runtime import preemption
    with preemption.installed():
      os.kill(os.getpid(), signal.{sig})
      time.sleep(0.1)
      print("requested", preemption.requested(), preemption.signal_name(), preemption.exit_code(), flush=True)
      if {twice}:
        os.kill(os.getpid(), signal.{sig})
        time.sleep(5)
        print("still alive", flush=True)
    sys.exit(preemption.exit_code())
""")


@pytest.mark.parametrize("sig, code", [("SIGTERM", 0), ("SIGINT", 130)])
def test_first_signal_requests_a_stop(sig, code):
  proc = subprocess.run(
    [sys.executable, "-c", _SCRIPT.format(sig=sig, twice=False)], cwd=REPO, capture_output=True, text=True, timeout=60
  )
  assert proc.stdout.strip() == f"requested True {sig} {code}"
  assert proc.returncode == code and "stopping after the current step" in proc.stderr


@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_second_signal_ends_the_process(sig, code):
  proc = subprocess.run(
    [sys.executable, "-c", _SCRIPT.format(sig=sig, twice=True)], cwd=REPO, capture_output=True, text=True, timeout=60
  )
  assert "still alive" not in proc.stdout and proc.returncode == code
  assert f"{sig} again: exiting now without a checkpoint" in proc.stderr
