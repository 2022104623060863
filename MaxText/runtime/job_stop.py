"""Stops a multi-process job agrees on: a stop request on any process (SIGTERM, SIGINT, jax's preemption notice)
makes every process stop after the same step, through JAX's preemption sync manager.

JAX's mechanism (multihost_utils.reached_preemption_sync_point, xla/tsl preemption_sync_manager.cc): a notice is
the coordination service's key RECEIVED_PREEMPTION_NOTICE; every process watches it, and when it appears each
publishes the last step id it passed to reached_preemption_sync_point, waits for the others at a barrier, and
takes the largest plus one as the step where every process's call returns True. Ids must go up by one per call,
from the same start on every process (here: 1 at the first step this invocation runs). The calls cost a mutex and
a comparison (no RPC) except while the agreement is being made.

jax.distributed installs a SIGTERM handler that feeds that notice, but it replaces ours (no second-signal exit,
no SIGINT) and knows nothing of which signal it was: the trainer takes SIGTERM back (preemption.reclaim) and this
module posts the notice itself at the first signal, with the signal and the process under maxtext/stop, so every
process can say why it stopped and exit as the signalled one does (0 for SIGTERM, 130 for SIGINT).
"""

import datetime
import signal

from jax.experimental import multihost_utils

from MaxText.runtime import preemption

NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"  # the key JAX's preemption sync manager watches (its notifier's)
STOP_KEY = "maxtext/stop"  # '<signal name> <process index>': which process got which signal


def _now_rfc3339():
  """The notice's value: its 'death time', now (absl::RFC3339_full), so the agreement starts at once."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat()


class JobStop:
  """The agreed stop of a multi-process job; `client`: jax.distributed's client, `reached`: reached_preemption_sync_
  point. `poll(step)` once per step before dispatching it (the same steps on every process); `requested()` then
  says whether the job stops there."""

  def __init__(self, client, process_index, reached=None):
    self.client, self.process_index = client, process_index
    self.reached = reached or multihost_utils.reached_preemption_sync_point
    self.agreed = False
    self.calls = 0
    self._forget = preemption.on_first_signal(self._notify)
    if preemption.requested():  # a signal that came before this existed (while the job formed)
      self._notify(signal.Signals[preemption.signal_name()])

  def _notify(self, signum):
    """Tell every process (the first signal of this process): who got what, then JAX's notice."""
    for key, value in ((STOP_KEY, f"{signal.Signals(signum).name} {self.process_index}"), (NOTICE_KEY, None)):
      try:
        self.client.key_value_set(key, value or _now_rfc3339())
      except Exception:  # pylint: disable=broad-except  (ALREADY_EXISTS: another process was first)
        pass

  def poll(self, step):
    """Asks JAX whether this is the step the processes agreed to stop before; `step` only for the record."""
    del step
    if self.agreed:
      return
    self.calls += 1
    if self.reached(self.calls):
      self.agreed = True
      signum, origin = self._origin()
      preemption.request(signum, origin=origin)

  def requested(self):
    return self.agreed

  def _origin(self):
    """(signal, 'process N' or None when it was this one) of the stop; a notice nobody posted under maxtext/stop
    (jax's own SIGTERM handler got it first) is a SIGTERM from the scheduler."""
    try:
      name, process = self.client.key_value_try_get(STOP_KEY).split()
    except Exception:  # pylint: disable=broad-except  (NOT_FOUND)
      return signal.SIGTERM, "a process of the job (jax's preemption notice)"
    return signal.Signals[name], None if int(process) == self.process_index else f"process {process}"

  def close(self):
    self._forget()
