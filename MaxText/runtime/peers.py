"""The other processes of a multi-process job: one that dies, hangs or fails is named by every other process in one
line, and they exit too (status 75, EX_TEMPFAIL: rerun the job to resume from the last complete checkpoint).

By default jax fate-shares a job: a dead peer makes the others block in a collective, then, when jax's
coordination service notices (100 s), abort with a C++ check failure and a 60-line stack trace. Here:
- every process beats once a second through the coordination service's key-value store
  (maxtext/heartbeat/<process>); a peer whose beat has not changed for `timeout` seconds
  (jax_distributed_heartbeat_timeout_seconds) is named, and so is the coordinator (process 0) when the store
  itself stops answering that long. A process that fails says so in its beat, and the others stop at once;
  one that finished says so too, and is not waited for.
- native stderr (fd 2: absl/XLA log lines, jax's abort and its stack trace) goes to a log in the run
  directory, Python's sys.stderr stays on the terminal; where jax aborts anyway (the coordinator died: its
  client aborts within a second, from a C++ thread), a SIGABRT handler turns the abort into one line read
  from that log.
jax's own heartbeat timeout is set above ours (distributed.initialize), so ours speaks first.
"""

import ctypes
import logging
import os
import re
import signal
import socket
import sys
import threading
import time

EXIT_PEER_LOST = 75  # EX_TEMPFAIL: nothing is wrong with the run; rerun the job to resume
KEY = "maxtext/heartbeat/"
LEFT, FAILED = "left", "failed"
INTERVAL = 1.0
_verdict = threading.Lock()  # one line, whichever thread (watchdog, abort handler) gets there first
_abort_handler = []  # the ctypes callback, kept alive for as long as it is installed
_left_failing = []  # set when this process left its job with an error


def _say_and_exit(line, code):
  if not _verdict.acquire(blocking=False):
    time.sleep(60)  # the other thread is printing its line and exiting
  print(line, file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(code)  # pylint: disable=protected-access  (jax's atexit shutdown would wait for the lost peer, then abort)


def _rerun(what):
  return f"{what}; rerun the job to resume from the last complete checkpoint"


class Watchdog:
  """Heartbeats of process `process_index` of `process_count` through `client` (jax.distributed's), judged every
  `interval` s; `timeout`: seconds of silence that mean a peer is lost."""

  def __init__(self, client, process_index, process_count, timeout, interval=INTERVAL):
    self.client, self.index, self.count = client, process_index, process_count
    self.timeout, self.interval = timeout, interval
    self.host = f"{socket.gethostname()} pid {os.getpid()}"
    self._stop = threading.Event()
    now = time.monotonic()
    self._last_ok = now  # when the store last answered
    self._seen = {r: (None, now) for r in range(process_count) if r != process_index}  # value, when it changed
    self._threads = [
      threading.Thread(target=self._beat, name="peer-heartbeat", daemon=True),
      threading.Thread(target=self._judge, name="peer-watchdog", daemon=True),
    ]

  def start(self):
    for t in self._threads:
      t.start()
    return self

  def _publish(self, value):
    self.client.key_value_set(f"{KEY}{self.index}", value, allow_overwrite=True)

  def _beat(self):
    beat = 0
    while not self._stop.is_set():
      beat += 1
      try:
        self._publish(f"{beat} {self.host}")
        values = dict(self.client.key_value_dir_get(KEY))
      except Exception:  # pylint: disable=broad-except  (the store is unreachable: the judge times it)
        self._stop.wait(self.interval)
        continue
      now = time.monotonic()
      for r, (old, _) in self._seen.items():
        new = values.get(f"{KEY}{r}")
        if new is not None and new != old:
          self._seen[r] = (new, now)
      self._last_ok = now
      self._stop.wait(self.interval)

  def _judge(self):
    while not self._stop.wait(self.interval / 2):
      verdict = self.verdict(time.monotonic())
      if verdict and not self._stop.is_set():
        _say_and_exit(verdict, EXIT_PEER_LOST)

  def verdict(self, now):
    """The line naming a lost peer, or None while all answer. A beat is up to an interval old when it is read,
    read every interval, and judged every half interval: silence of `timeout` less four intervals is judged, so
    that the process has ended within `timeout`."""
    me = f"process {self.index} of {self.count}"
    limit = max(self.interval, self.timeout - 4 * self.interval)
    if now - self._last_ok > limit:
      return "error: " + _rerun(
        f"the coordinator (process 0) stopped answering for {now - self._last_ok:.0f} s (it died, hangs or its "
        f"node lost the network); {me} stops too (jax_distributed_heartbeat_timeout_seconds)"
      )
    for r, (value, since) in sorted(self._seen.items()):
      if value and value.startswith(FAILED):
        return "error: " + _rerun(f"process {r} failed ({value[len(FAILED) :].strip()}); {me} stops too")
      if value == LEFT:
        continue
      if self._last_ok - since > limit:
        where = f" ({value.split(' ', 1)[1]})" if value and " " in value else ""
        return "error: " + _rerun(
          f"process {r}{where} stopped answering: no heartbeat for {self._last_ok - since:.0f} s (it died, hangs or "
          f"its node lost the network); {me} stops too (jax_distributed_heartbeat_timeout_seconds)"
        )
    return None

  def settle(self):
    """After an error in this process (a collective that failed because a peer went away): wait until the
    judge has had time to name a lost peer (it ends the process), so that its line, not the symptom, is said."""
    deadline = time.monotonic() + self.timeout + 3 * self.interval
    while time.monotonic() < deadline and not self._stop.is_set():
      if self.verdict(time.monotonic()):
        self._stop.wait(5 * self.interval)  # the judge is saying it
      time.sleep(self.interval / 4)

  def leave(self, error=None):
    """This process is done (`error`: the one line it failed with): the others stop waiting for its beats."""
    self._stop.set()
    for t in self._threads:
      t.join(timeout=self.interval + 5.0)
    if error:
      _left_failing.append(error)
    try:
      self._publish(f"{FAILED} {error}" if error else LEFT)
    except Exception:  # pylint: disable=broad-except  (the store is gone: the others will time us out)
      pass


def failed():
  """Whether this process left its job with an error."""
  return bool(_left_failing)


def exit_if_failed(code):
  """After this process left its job with an error (its line said): exit with `code` now. At a normal exit jax
  waits for every process at a shutdown barrier, which the others, gone, never reach: after its heartbeat timeout
  it aborts, with a second message. Returns where there was no failed job."""
  if _left_failing:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access


# -- native stderr and jax's abort --------------------------------------------------------------------------


def native_stderr_to(path):
  """From now on (the rest of the process) fd 2 appends to `path`; sys.stderr and logging stay on the terminal."""
  sys.stderr.flush()
  terminal = os.dup(2)
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  os.dup2(fd, 2)
  os.close(fd)
  stream = os.fdopen(terminal, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
  for handler in logging.getLogger().handlers:
    if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
      handler.setStream(stream)
  sys.stderr = stream
  _on_abort(path)


_UNHEALTHY = re.compile(r"unhealthy \(stopped sending heartbeats\):\s*((?:\d+\s*)+)")
_COORDINATOR = re.compile(r"Failed to send RPC to coordination service|leader task was preempted")


def abort_line(log_text, log_path):
  """(one line, exit status) for a process jax aborts, from the native log's tail."""
  fatal = log_text.rsplit("\nF", 1)[-1] if "\nF" in log_text else log_text
  message = fatal.split("] ", 1)[-1].split("*** Check failure stack trace", 1)[0].strip()
  unhealthy = _UNHEALTHY.search(message)
  if unhealthy:
    ranks = ", ".join(unhealthy.group(1).split())
    what = f"process(es) {ranks} stopped answering (jax's coordination service lost their heartbeats)"
  elif _COORDINATOR.search(message):
    what = "the coordinator (process 0) stopped answering (it died or its node lost the network)"
  else:
    first = " ".join(message.split())[:200]
    return f"error: native code aborted this process: {first} (the whole message: {log_path})", 134
  return "error: " + _rerun(f"{what}; jax aborted this process (details: {log_path})"), EXIT_PEER_LOST


def _on_abort(log_path):
  """SIGABRT (jax's client aborting from a C++ thread) -> abort_line's line and exit, in place of the stack trace."""

  def handle(signum):
    del signum
    try:
      with open(log_path, "rb") as f:
        f.seek(max(0, os.path.getsize(log_path) - 16384))
        text = f.read().decode("utf-8", "replace")
    except OSError:
      text = ""
    line, code = abort_line(text, log_path)
    _say_and_exit(line, code)

  callback = ctypes.CFUNCTYPE(None, ctypes.c_int)(handle)
  libc = ctypes.CDLL(None)
  libc.signal.restype, libc.signal.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_void_p]
  libc.signal(signal.SIGABRT, ctypes.cast(callback, ctypes.c_void_p))
  _abort_handler[:] = [callback]
