"""Packed runs: K trainer processes at once on one machine, each with its share of the CPU cores and GPU memory.

Each job is `python train.py CONFIG key=value...` started through this file's launcher, which pins the
process to its slot's cores (XLA:CPU sizes its thread pool from the affinity mask), asks the kernel to
send it SIGTERM if the harness dies, and then becomes the trainer (exec). On a GPU every process gets
XLA_PYTHON_CLIENT_MEM_FRACTION = 0.9 / K of the device's memory (unless the caller set it). Children run
in their own session, so a Ctrl-C or a process-group signal reaches the harness alone; it forwards one
SIGTERM/SIGINT to every child that did not get it directly (e.g. from a scheduler that signals every
process), and each child checkpoints and stops as the trainer does.
"""

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

TRAIN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")
PR_SET_PDEATHSIG = 1
# What MaxText/runtime/preemption.py prints when a process took a stop request: that child needs no forwarded signal.
STOP_MARK = ": stopping after the current step"


def cpu_slots(parallel, cpus=None):
  """K disjoint, near-equal lists of the CPUs this process may use (shared round-robin when there are fewer)."""
  cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
  if len(cpus) < parallel:
    return [[cpus[i % len(cpus)]] for i in range(parallel)]
  bounds = [round(i * len(cpus) / parallel) for i in range(parallel + 1)]
  return [cpus[bounds[i] : bounds[i + 1]] for i in range(parallel)]


def child_env(parallel, environ=None):
  env = dict(os.environ if environ is None else environ)
  env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / parallel:.3f}")
  env["PYTHONUNBUFFERED"] = "1"
  return env


class Job:
  """One trainer process: its label (for the output prefix), trainer arguments and, once started, its process."""

  def __init__(self, label, train_args):
    self.label, self.train_args = label, list(train_args)
    self.proc, self.thread, self.took_stop, self.last_line = None, None, False, ""

  def start(self, cpus, env, out):
    cmd = [sys.executable, os.path.abspath(__file__), ",".join(map(str, cpus)), str(os.getpid()), *self.train_args]
    self.proc = subprocess.Popen(
      cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, start_new_session=True, bufsize=1
    )
    self.thread = threading.Thread(target=self._relay, args=(out,), daemon=True)
    self.thread.start()

  def _relay(self, out):
    for line in self.proc.stdout:
      line = line.rstrip("\n")
      if STOP_MARK in line:
        self.took_stop = True
      if line.strip():
        self.last_line = line
      print(f"[{self.label}] {line}", file=out, flush=True)

  def finish(self):
    rc = self.proc.wait()
    self.thread.join()
    return rc


def run(jobs, parallel, stop_requested, stop_signal, out=sys.stdout, environ=None):
  """Run every Job, `parallel` at once; {label: exit code} of those started. Environment: `environ` or this one's.

  stop_requested() is polled: once true no job starts, and each running child gets stop_signal() once
  (unless it printed that it took a stop itself); then all are waited for. A failed child (exit code other
  than 0) stops the others the same way.
  """
  slots, env = cpu_slots(parallel), child_env(parallel, environ)
  pending, running, codes, forwarded, failed = list(jobs), {}, {}, False, False
  while pending or running:
    stopping = failed or stop_requested()
    while pending and not stopping and len(running) < parallel:
      slot = min(set(range(parallel)) - set(running))
      running[slot] = pending.pop(0)
      running[slot].start(slots[slot], env, out)
    if stopping and not forwarded and running:
      time.sleep(0.5)  # a signal sent to every process reaches the children too: let them say so first
      for job in running.values():
        if not job.took_stop and job.proc.poll() is None:
          job.proc.send_signal(stop_signal())
      forwarded = True
    for slot, job in list(running.items()):
      if job.proc.poll() is not None:
        codes[job.label] = job.finish()
        failed = failed or codes[job.label] != 0
        del running[slot]
    if stopping and not running:
      break
    time.sleep(0.1)
  return codes


def _launch(argv):
  """In the child: pin to the slot's CPUs, die with the harness, then exec the trainer."""
  cpus, parent = [int(c) for c in argv[0].split(",")], int(argv[1])
  os.sched_setaffinity(0, cpus)
  try:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
  except (OSError, AttributeError):
    pass  # not Linux: an orphaned child then finishes its run (its checkpoints stay valid)
  if os.getppid() != parent:  # the harness died before prctl took effect
    return 0
  os.execv(sys.executable, [sys.executable, TRAIN_PY, *argv[2:]])
  return 1


if __name__ == "__main__":
  sys.exit(_launch(sys.argv[1:]))
