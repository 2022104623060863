"""Clean stops: the first SIGTERM or SIGINT asks the running loop to checkpoint and stop; a second one ends the process.

Process-wide, so harnesses that run several trainings in one process (benchmarks/parity.py) see the same
request the trainer saw:

    with preemption.installed():
      train(cfg)
      if preemption.requested():
        ...stop cleanly, exit preemption.exit_code()

Python runs a signal's handler in the main thread, between two bytecodes: while the main thread is inside
one long native call (XLA compiling a step: minutes for a large model) the handler waits for the call to
return. So a thread watches the signals as they arrive (signal.set_wakeup_fd: the interpreter's C-level
handler writes each signal's number to a pipe at once), and the second signal ends the process from there,
whatever the main thread is doing. The first is taken at once too (the request is set, the line printed,
the listeners told: a multi-process job's stop agreement, runtime/job_stop.py).

Handlers can only be installed from the main thread; elsewhere `installed()` does nothing (and a signal
keeps its default meaning).

A command with nothing to save but a half-written output to remove (a conversion) takes the signals as an exception
instead: within `raising()` they raise Stopped where the main thread is (`deferred()` holds it back around code that
starts background work and records it, `ignored()` around the cleanup).

From the first line of a command's main until one of those takes over (and again after), `exit_on_signals()`: a
signal ends the process at once with one line and exit code 128 + its number, from the watching thread too, so
neither a signal during the imports nor one inside a library's native call or callback is lost, swallowed or
turned into a traceback or a crash at exit. `deferred()` holds that exit back around a write renamed into place.

Tests deliver a signal at a defined point of a run, not after a sleep: with MAXTEXT_SIGNAL_AT=POINT:SIGNAL[+SIGNAL...]
in its environment a process sends itself those signals the first time it reaches `point(POINT)` (POINTS).
"""

import contextlib
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# depth: installed()'s nesting; exiting: exit_on_signals()'s line while it is on (else None); watcher: the watching
# thread, shared by the blocks inside the one that started it.
_state = {"signal": None, "origin": None, "depth": 0, "count": 0, "watcher": None, "exiting": None}
_lock = threading.RLock()  # re-entrant: a signal's handler can interrupt the main thread while it holds it
_held = threading.Condition(_lock)  # deferred()'s end, which a pending exit waits for
_listeners = []


def requested():
  """Whether a stop was asked for since the outermost `installed()` began."""
  return _state["signal"] is not None


def signal_name():
  """'SIGTERM' or 'SIGINT' (the first one received), or None."""
  return None if _state["signal"] is None else signal.Signals(_state["signal"]).name


def reason():
  """What asked for the stop, for the line that says where the run stopped: 'SIGTERM', or 'SIGTERM to process 1'
  when another process of the job received it (None without a request)."""
  if _state["signal"] is None:
    return None
  return signal_name() if _state["origin"] is None else f"{signal_name()} to {_state['origin']}"


def exit_code():
  """The process's exit status after a clean stop: 0 for SIGTERM (a scheduler's preemption), 130 for SIGINT."""
  return 130 if _state["signal"] == signal.SIGINT else 0


def request(signum=signal.SIGTERM, origin=None):
  """Ask for a stop as a signal would (tests, code that finds it must stop, and the stop a job's processes agreed
  on: `origin` names the process that received the signal). Listeners are not told: only signals are news."""
  with _lock:
    if _state["signal"] is None:
      _state["signal"], _state["origin"] = signum, origin


def on_first_signal(listener):
  """Call `listener(signum)` when the first stop signal arrives (from the watching thread or the main thread; it
  must be quick). Returns the function that removes it."""
  _listeners.append(listener)
  return lambda: _listeners.remove(listener) if listener in _listeners else None


def _first(signum):
  """The first stop signal: the request, the line, the listeners (once, whichever thread sees it first)."""
  with _lock:
    if _state["signal"] is not None:
      return
    _state["signal"] = signum
    print(
      f"{signal.Signals(signum).name}: stopping after the current step (send it again to exit at once)",
      file=sys.stderr,
      flush=True,
    )
    for listener in list(_listeners):
      try:
        listener(signum)
      except Exception as e:  # pylint: disable=broad-except  (the local stop must happen whatever a listener does)
        print(f"warning: passing the stop on failed ({e}); this process stops on its own", file=sys.stderr, flush=True)


def _again(signum):
  # The second signal: the user insists. No cleanup can be trusted to finish (it may be what hangs).
  print(f"{signal.Signals(signum).name} again: exiting now without a checkpoint", file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(128 + signum)  # pylint: disable=protected-access


def _handle(signum, frame):
  """The main thread's handler. Outside installed() (exit_on_signals) it ends the process; inside, with the watching
  thread it only makes sure the request is set before the main thread goes on (the thread counts the signals);
  without it, it counts them itself."""
  del frame
  if _state["depth"] == 0:
    _exit_now(signum)
    return
  if _state["watcher"] is None and _state["signal"] is not None:
    _again(signum)
  _first(signum)


def _watch(read_fd):
  """Every stop signal's number, as the interpreter's C handler writes it: outside installed() it ends the process;
  inside, the first requests, the second exits. A signal whose handler is not ours (raising(), ignored()) is left to
  that handler."""
  while True:
    try:
      data = os.read(read_fd, 64)
    except OSError:
      return
    if not data:  # the write end closed: the watching is over
      return
    for signum in data:
      if signum not in SIGNALS or signal.getsignal(signum) is not _handle:
        continue
      if _state["depth"] == 0:
        _exit_now(signum)
        continue
      _state["count"] += 1
      if _state["count"] == 1:
        _first(signum)
      else:
        _again(signum)


def _exit_now(signum):
  """exit_on_signals()'s end of the process: its line, exit code 128 + the signal's number; after deferred()'s block
  where one is running (the main thread's handler leaves the exit to the block's end, the watching thread waits)."""
  with _held:
    if _deferred["depth"]:
      if threading.current_thread() is threading.main_thread():
        _deferred["exit"] = _deferred["exit"] or signum
        return
      _held.wait_for(lambda: not _deferred["depth"])
    line = _state["exiting"] or "stopped"
    print(f"{signal.Signals(signum).name}: {line}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(128 + signum)  # pylint: disable=protected-access


def _start_watcher():
  """A thread reading the interpreter's wakeup fd, or None where another one is set (asyncio's): the handler then
  counts."""
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  try:
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
  except ValueError:
    previous = None
  if previous != -1:
    if previous is not None:
      signal.set_wakeup_fd(previous)
    os.close(read_fd)
    os.close(write_fd)
    return None
  thread = threading.Thread(target=_watch, args=(read_fd,), name="signal-watcher", daemon=True)
  thread.start()
  return thread, read_fd, write_fd


def _stop_watcher(watcher):
  thread, read_fd, write_fd = watcher
  signal.set_wakeup_fd(-1)
  os.close(write_fd)
  thread.join(timeout=5.0)
  os.close(read_fd)


@contextlib.contextmanager
def _watching():
  """The watching thread for the block: started here unless an enclosing block started it (shared, then)."""
  if _state["watcher"] is not None:
    yield
    return
  _state["watcher"] = _start_watcher()
  try:
    yield
  finally:
    if _state["watcher"] is not None:
      _stop_watcher(_state["watcher"])
      _state["watcher"] = None


def reclaim():
  """Take SIGTERM and SIGINT back inside `installed()` after a library replaced their handlers at the C level
  (jax.distributed's preemption notifier does, with one that only sets a flag): a second signal must still end the
  process, and the first reach the job's stop agreement (runtime/job_stop.py) from here."""
  if _state["depth"] and threading.current_thread() is threading.main_thread():
    for s in SIGNALS:
      signal.signal(s, _handle)


@contextlib.contextmanager
def installed():
  """Within the block (re-entrant), SIGTERM and SIGINT request a stop instead of ending the process."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  if _state["depth"] == 0:
    _state.update(signal=None, origin=None, count=0)
  outermost = _state["depth"] == 0
  with _watching() if outermost else contextlib.nullcontext():
    previous = {s: signal.signal(s, _handle) for s in SIGNALS} if outermost else {}
    _state["depth"] += 1
    try:
      yield
    finally:
      _state["depth"] -= 1
      for s, handler in previous.items():
        signal.signal(s, handler)


@contextlib.contextmanager
def exit_on_signals(line="stopped before the command finished; nothing was written"):
  """Within the block (a command's main, from its first line), outside installed() and raising(), SIGTERM and SIGINT
  end the process at once: `<SIGNAL>: <line>` on stderr, exit code 128 + the signal's number. A signal the process
  was started ignoring (a background job's SIGINT) stays ignored. Re-entrant: the outermost line holds."""
  if threading.current_thread() is not threading.main_thread() or _state["exiting"] is not None:
    yield
    return
  _state["exiting"] = line
  try:
    with _watching(), _handlers(_handle):
      yield
  finally:
    _state["exiting"] = None


class Stopped(KeyboardInterrupt):
  """A stop signal raised as an exception (`raising()`): `signum`, and `message`, the line the command line prints
  (what the stop left undone), once the code it interrupted says so."""

  def __init__(self, signum, message=None):
    super().__init__(message or f"stopped by {signal.Signals(signum).name}")
    self.signum, self.message = signum, message


# depth: deferred()'s nesting; stop: the signal raising() turns into Stopped at its end; exit: the signal
# exit_on_signals() ends the process with at its end.
_deferred = {"depth": 0, "stop": None, "exit": None}


def _raise_stopped(signum, frame):
  del frame
  if _deferred["depth"]:
    _deferred["stop"] = _deferred["stop"] or signum
    return
  raise Stopped(signum)


@contextlib.contextmanager
def deferred():
  """Within the block, a signal that raising() turns into Stopped is raised at the block's end instead: around code
  that starts work in the background and records it (a write in flight that a cleanup must wait for is never lost
  between starting and recording); and one that exit_on_signals() ends the process with ends it at the block's end:
  around a file written and renamed into place (no temporary file left behind)."""
  with _held:
    _deferred["depth"] += 1
  try:
    yield
  finally:
    with _held:
      _deferred["depth"] -= 1
      last = not _deferred["depth"]
      stop, exit_ = (_deferred["stop"], _deferred["exit"]) if last else (None, None)
      if last:
        _deferred.update(stop=None, exit=None)
      _held.notify_all()
    if exit_ is not None:
      _exit_now(exit_)
    if stop is not None:
      raise Stopped(stop)  # pylint: disable=lost-exception


@contextlib.contextmanager
def _handlers(handler):
  """`handler` for SIGTERM and SIGINT within the block, except one the process was started ignoring (a background
  job of a script ignores SIGINT: it stays ignored)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {s: signal.signal(s, handler) for s in SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
  try:
    yield
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


def raising():
  """Within the block (main thread), SIGTERM and SIGINT raise Stopped where the main thread is, so the `except` and
  `finally` blocks of what it interrupted remove what it had half written (a conversion's partial output); the
  command line exits 128 + the signal's number. Elsewhere a signal keeps its meaning."""
  return _handlers(_raise_stopped)


def ignored():
  """Within the block (main thread), SIGTERM and SIGINT are ignored: around a cleanup that must not be cut short by
  a second signal (it takes milliseconds)."""
  return _handlers(signal.SIG_IGN)


SIGNAL_AT = "MAXTEXT_SIGNAL_AT"
# The points a test can stop a command at: start (a command's main, before its heavy imports), save (a training
# checkpoint started: Orbax's temporary directory is being written), write (a conversion wrote its first block).
POINTS = ("start", "save", "write")
_points_reached = set()


def point(name):
  """A defined point of a command. With MAXTEXT_SIGNAL_AT=<name>:<SIGNAL>[+<SIGNAL>...] (e.g. save:SIGTERM+SIGTERM)
  this process sends itself those signals here, the first time it gets here: tests stop a run at a defined point
  instead of after a sleep."""
  spec = os.environ.get(SIGNAL_AT, "")
  where, _, names = spec.partition(":")
  if where != name or name in _points_reached:
    return
  _points_reached.add(name)
  for signame in names.split("+"):
    os.kill(os.getpid(), signal.Signals[signame])
