"""Two real processes (jax.distributed on localhost): a stop signal to one process stops both before the same step;
a process that dies is named by the other in one line, fast, with jax's abort and stack trace kept in the log."""

import re
import signal
import subprocess
import sys
import time

import pytest

from MaxText.runtime import peers
from tests.conftest import REPO
from tests.runtime.test_distributed import _env, _free_port

WORKER = REPO / "tests" / "runtime" / "job_worker.py"


def _start(tmp_path, heartbeat_timeout=30, *extra):
  port = _free_port()
  return [
    subprocess.Popen(
      [sys.executable, str(WORKER), str(tmp_path), str(heartbeat_timeout), *extra],
      cwd=REPO,
      env=_env(rank, port),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for rank in (0, 1)
  ]


def _wait_for_step(proc, n, timeout=120):
  """Reads proc's stdout until 'step n' (gloo's lines skipped); the lines read."""
  lines, deadline = [], time.monotonic() + timeout
  while time.monotonic() < deadline:
    line = proc.stdout.readline()
    assert line, f"the process ended before step {n}: {proc.stderr.read()[-2000:]}"
    lines.append(line)
    if line.strip() == f"step {n}":
      return lines
  raise AssertionError(f"no step {n} within {timeout} s")


def _finish(procs, timeout=60):
  return [p.communicate(timeout=timeout) for p in procs]


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 0), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)])
def test_a_signal_to_one_process_stops_both_before_the_same_step(tmp_path, sig, code):
  procs = _start(tmp_path)
  try:
    _wait_for_step(procs[1], 5)
    procs[1].send_signal(sig)
    outs = _finish(procs)
  finally:
    for p in procs:
      p.kill()
  stops = [re.findall(r"^stopped before step (\d+): (.*)$", out, re.M) for out, _ in outs]
  assert [p.returncode for p in procs] == [code, code], [err[-2000:] for _, err in outs]
  assert stops[0][0][0] == stops[1][0][0], stops  # the same step on both
  assert stops[0][0][1] == f"{sig.name} to process 1" and stops[1][0][1] == sig.name
  assert (
    outs[0][1] == ""
    and outs[1][1].strip() == f"{sig.name}: stopping after the current step (send it again to exit at once)"
  )


def test_a_second_sigterm_ends_a_process_of_a_job_at_once_even_while_xla_compiles(tmp_path):
  """jax.distributed's own SIGTERM handler (it only sets a flag) is replaced by ours, and a thread sees the
  signals while the main thread is inside XLA's compiler: the second SIGTERM ends the process at once (#35)."""
  procs = _start(tmp_path, 30, "compile")
  try:
    while procs[1].stdout.readline().strip() != "compiling":
      pass
    time.sleep(0.5)
    procs[1].send_signal(signal.SIGTERM)
    time.sleep(0.5)
    procs[1].send_signal(signal.SIGTERM)
    start = time.monotonic()
    out, err = procs[1].communicate(timeout=30)
    assert time.monotonic() - start < 2.0 and procs[1].returncode == 128 + signal.SIGTERM, err
    assert "step 0" not in out  # it was still compiling
    assert err.strip().splitlines()[-2:] == [
      "SIGTERM: stopping after the current step (send it again to exit at once)",
      "SIGTERM again: exiting now without a checkpoint",
    ]
  finally:
    for p in procs:
      p.kill()


@pytest.mark.parametrize("victim", [1, 0])
def test_a_dead_process_is_named_by_the_other_in_one_line(tmp_path, victim):
  """kill -9 of one process: the other says which process stopped answering within the heartbeat timeout (the
  coordinator's death within moments), exits 75, and keeps jax's abort and stack trace out of stderr."""
  procs = _start(tmp_path, heartbeat_timeout=6)
  survivor = procs[1 - victim]
  try:
    _wait_for_step(survivor, 5)
    procs[victim].kill()
    start = time.monotonic()
    out, err = survivor.communicate(timeout=60)
    seconds = time.monotonic() - start
  finally:
    for p in procs:
      p.kill()
  assert survivor.returncode == peers.EXIT_PEER_LOST, err[-3000:]
  assert seconds < 6.5 and "Check failure stack trace" not in err and "Traceback" not in err, err[-3000:]
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].endswith("rerun the job to resume from the last complete checkpoint"), err
  if victim == 1:
    assert re.match(r"error: process 1 \(\S+ pid \d+\) stopped answering: no heartbeat for \d+ s", lines[0]), lines
  else:
    assert lines[0].startswith("error: the coordinator (process 0) stopped answering"), lines
    assert "Check failure stack trace" in (tmp_path / "native_stderr.process1.log").read_text()


def test_abort_lines_name_the_lost_process():
  """jax's abort messages (as jaxlib 0.10 writes them) read as the line a survivor prints."""
  heartbeats = (
    "E1125 05:00:45.670290 6200 coordination_service.cc:1549] ...\n"
    "F1125 05:00:45.670934    6211 client.h:80] Terminating process because the JAX distributed service detected "
    "fatal errors. ... absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n"
    "1\n3\nThe tasks have crashed. Check the task logs\n*** Check failure stack trace: ***\n    @ 0x7f LogMessage\n"
  )
  line, code = peers.abort_line(heartbeats, "L")
  assert code == peers.EXIT_PEER_LOST and line.startswith("error: process(es) 1, 3 stopped answering"), line
  coordinator = (
    "F1125 04:57:13.141650    3257 client.h:80] Terminating process because ... absl::Status: UNAVAILABLE: Failed "
    "to send RPC to coordination service. Either the leader task was preempted/died/restarted unexpectedly\n"
  )
  assert peers.abort_line(coordinator, "L")[0].startswith("error: the coordinator (process 0) stopped answering")
  other = "F0101 00:00:00.0 1 something.cc:12] Check failed: x == y (1 vs. 2)\n*** Check failure stack trace: ***\n"
  assert peers.abort_line(other, "L") == (
    "error: native code aborted this process: Check failed: x == y (1 vs. 2) (the whole message: L)",
    134,
  )
