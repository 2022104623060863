"""Clean stops: the first SIGTERM or SIGINT asks the running loop to checkpoint and stop; a second one ends the process.

Process-wide, so harnesses that run several trainings in one process (benchmarks/parity.py) see the same
request the trainer saw:

    with preemption.installed():
      train(cfg)
      if preemption.requested():
        ...stop cleanly, exit preemption.exit_code()

Handlers can only be installed from the main thread; elsewhere `installed()` does nothing (and a signal
keeps its default meaning).
"""

import contextlib
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_state = {"signal": None, "depth": 0}


def requested():
  """Whether a stop was asked for since the outermost `installed()` began."""
  return _state["signal"] is not None


def signal_name():
  """'SIGTERM' or 'SIGINT' (the first one received), or None."""
  return None if _state["signal"] is None else signal.Signals(_state["signal"]).name


def exit_code():
  """The process's exit status after a clean stop: 0 for SIGTERM (a scheduler's preemption), 130 for SIGINT."""
  return 130 if _state["signal"] == signal.SIGINT else 0


def request(signum=signal.SIGTERM):
  """Ask for a stop as a signal would (tests, and code that finds it must stop)."""
  if _state["signal"] is None:
    _state["signal"] = signum


def _handle(signum, frame):
  del frame
  if _state["signal"] is not None:
    # The second signal: the user insists. No cleanup can be trusted to finish (it may be what hangs).
    print(f"{signal.Signals(signum).name} again: exiting now without a checkpoint", file=sys.stderr, flush=True)
    os._exit(128 + signum)  # pylint: disable=protected-access
  _state["signal"] = signum
  print(
    f"{signal.Signals(signum).name}: stopping after the current step (send it again to exit at once)",
    file=sys.stderr,
    flush=True,
  )


@contextlib.contextmanager
def installed():
  """Within the block (re-entrant), SIGTERM and SIGINT request a stop instead of ending the process."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  if _state["depth"] == 0:
    _state["signal"] = None
    previous = {s: signal.signal(s, _handle) for s in SIGNALS}
  _state["depth"] += 1
  try:
    yield
  finally:
    _state["depth"] -= 1
    if _state["depth"] == 0:
      for s, handler in previous.items():
        signal.signal(s, handler)
