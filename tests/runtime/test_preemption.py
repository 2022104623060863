"""Clean stops: SIGTERM/SIGINT request a stop (exit status 0 / 130), a second signal ends the process at once, also
while XLA compiles."""

import signal
import subprocess
import sys
import textwrap
import time

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


def test_a_second_signal_ends_train_py_while_xla_compiles(tmp_path):
  """A real trainer compiling its first step (a fresh compilation cache, unrolled layers: seconds in XLA's compiler,
  one native call): SIGTERM, then SIGTERM again, and the process is gone within 2 s of the second (#35)."""
  from tests.trainer.test_train import SMALL  # pylint: disable=import-outside-toplevel

  args = [
    sys.executable,
    "train.py",
    "configs/llama3_tiny.yml",
    *SMALL,
    "scan_layers=false",
    "base_num_decoder_layers=6",
  ]
  args += ["steps=3", f"base_output_directory={tmp_path}", f"jax_cache_dir={tmp_path / 'cache'}"]
  # The profiler's warning is the last line before the loop: the state is built, the first step compiles next.
  args += ["profiler=xplane", "skip_first_n_steps_for_profiler=5"]
  proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    while not proc.stdout.readline().startswith("warning: profiler=xplane"):
      assert proc.poll() is None, proc.stderr.read()
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 2.0 and proc.returncode == 128 + signal.SIGTERM, err[-2000:]
  finally:
    proc.kill()
  assert "completed step" not in out and err.strip().endswith("SIGTERM again: exiting now without a checkpoint")
