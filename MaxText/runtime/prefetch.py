"""Batches read and placed on the devices ahead of the step that needs them, by a background thread.

Each batch travels with the data iterator's position after it, so a checkpoint saves the position of
the last batch a step consumed, not of the batches read ahead. The consumer waits in short slices,
so a stop request (SIGTERM/SIGINT) is seen while it waits, whatever the pipeline is doing.
"""

import queue
import threading
import typing

_POLL_SECONDS = 0.2


class Placed(typing.NamedTuple):
  """One batch as global device arrays, and the iterator position after it."""

  arrays: dict
  position: dict


class _Failed(typing.NamedTuple):
  error: BaseException


class Prefetcher:
  """Yields Placed batches from `iterator` through `place` (host batch -> device arrays), `depth` ahead.

  depth 0 reads each batch when asked (in the caller's thread). Errors raised by the iterator reach
  the caller of `next` as they were raised, in order, after the batches read before them.
  """

  def __init__(self, iterator, place, depth):
    self._iterator, self._place, self._depth = iterator, place, depth
    self._queue = queue.Queue(maxsize=max(depth, 1))
    self._closed = threading.Event()
    self._thread = None
    if depth > 0:
      self._thread = threading.Thread(target=self._fill, name="batch-prefetch", daemon=True)
      self._thread.start()

  def _read(self):
    batch = next(self._iterator)
    return Placed(self._place(batch), self._iterator.get_state())

  def _fill(self):
    while not self._closed.is_set():
      try:
        item = self._read()
      except BaseException as e:  # pylint: disable=broad-except  (handed to the consumer, which raises it)
        item = _Failed(e)
      while not self._closed.is_set():
        try:
          self._queue.put(item, timeout=_POLL_SECONDS)
          break
        except queue.Full:
          continue
      if isinstance(item, _Failed):
        return

  def next(self, should_stop=lambda: False):
    """The next Placed batch, or None when `should_stop()` became true while waiting for it."""
    if self._thread is None:
      return None if should_stop() else self._read()
    while True:
      try:
        item = self._queue.get(timeout=_POLL_SECONDS)
      except queue.Empty:
        if should_stop():
          return None
        continue
      if isinstance(item, _Failed):
        raise item.error
      return item

  def close(self, timeout=60.0):
    """Stop reading ahead and wait for the reader to finish the batch it is on: a thread still inside jax or
    the pipeline while the interpreter shuts down can abort the process. A reader stuck longer than
    `timeout` (a hung pipeline) is left behind: it is a daemon and never blocks the exit."""
    self._closed.set()
    if self._thread is not None and self._thread is not threading.current_thread():
      self._thread.join(timeout)
