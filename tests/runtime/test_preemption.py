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


_RAISING = textwrap.dedent("""
    import os, signal, sys, time
    from MaxText.runtime import preemption
    events = []
    with preemption.raising():
      try:
        with preemption.deferred():  # work started and recorded: the stop waits for the block's end
          os.kill(os.getpid(), signal.SIGTERM)
          time.sleep(0.1)
          events.append("recorded")
      except preemption.Stopped as e:
        events.append(f"stopped {e.signum} after the block")
      try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        events.append("not interrupted")
      except preemption.Stopped as e:
        with preemption.ignored():
          os.kill(os.getpid(), signal.SIGTERM)  # during a cleanup: ignored
          time.sleep(0.1)
        events.append(f"stopped {e.signum} at once, cleanup done")
    print(events, signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
""")


def test_raising_turns_stop_signals_into_exceptions_deferred_or_ignored_where_asked():
  proc = subprocess.run([sys.executable, "-c", _RAISING], cwd=REPO, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == (
    f"['recorded', 'stopped {signal.SIGTERM.value} after the block', 'stopped {signal.SIGINT.value} at once, cleanup "
    "done'] True"
  )


def test_a_signal_ignored_from_the_start_stays_ignored():
  """A background job of a shell script starts with SIGINT ignored: raising() doesn't take it back."""
  script = (
    "import os, signal, time\nfrom MaxText.runtime import preemption\nwith preemption.raising():\n"
    "  os.kill(os.getpid(), signal.SIGINT)\n  time.sleep(0.1)\nprint('went on', flush=True)"
  )
  proc = subprocess.run(
    [sys.executable, "-c", script],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=60,
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
  )
  assert proc.returncode == 0 and proc.stdout == "went on\n", proc.stderr[-2000:]
